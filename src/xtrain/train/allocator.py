"""The train job's memory allocator: the system's TCMalloc, else the lock's mimalloc, preloaded by re-execution.

glibc's malloc keeps what a training step frees in its arenas; with the batch shapes of a real run (length-grouped,
each batch its own length) the heap grows by each new shape's leftovers, so the process's peak RSS drifts far above
the step the plan traced (the showcase: 17.3 GiB against a 9.9 GiB prediction). Measured on the showcase's first 16
steps (BENCHMARKS.md, "Host memory of a real run"): TCMalloc peaks 16% lower than glibc and trains 1.35x faster;
jemalloc peaks 20% lower at 0.8x glibc's speed; glibc's own knobs (MALLOC_MMAP_THRESHOLD_, MALLOC_ARENA_MAX)
cut the peak as much but train 1.8x slower.

A fresh clone or a cluster node where the user is not root has neither TCMalloc nor jemalloc, so the lock itself
ships an allocator: mimalloc, from the cmeel-mimalloc wheel (envs/xtrain.lock), found by where pip installed it
(the distribution's files), never by the system's search, and run with the OPTIONS below. The order of CANDIDATES is
by measurement (BENCHMARKS.md, "The allocator from the lock"; the showcase's 16-step cut, quiet, 2026-12-07):
TCMalloc first (198 s, 14,067 MiB); the lock's mimalloc next, as fast within 5% (207 s, 14,898 MiB; 273 s with
mimalloc's default options); jemalloc last (0.8x glibc's speed), for an interpreter without the lock's wheel (a
lane's conda env). glibc trained the cut in 209 s, but its peak wanders from run to run (13,393 to 17,010 MiB) by
how its arenas fragment. The train job runs under the first candidate this machine has and can load, and under glibc
otherwise; the plan's host-memory request allows for the one it will get (`for_train_job`).

A library must be loaded before the process's first allocation: the train job re-executes itself with LD_PRELOAD
set (`preload`), and the processes it launches (torchrun workers, a lane's own interpreter in .venvs/<lane>/)
inherit it: the lock's library is named by its absolute path, so it loads in any process on the machine, whichever
Python runs there. An LD_PRELOAD the user set is left as it is.
"""

from __future__ import annotations

import ctypes.util
import functools
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

# Where an allocator library comes from: ("system", name as ctypes.util.find_library knows it: Debian's
# libtcmalloc-minimal4 or libgoogle-perftools4, libjemalloc2; RHEL's gperftools-libs, jemalloc) or ("lock",
# distribution, library file it installs), in the order they are preferred.
LOCKED_MIMALLOC = ("lock", "cmeel-mimalloc", "libmimalloc.so")
CANDIDATES = (("system", "tcmalloc_minimal"), ("system", "tcmalloc"), LOCKED_MIMALLOC, ("system", "jemalloc"))
ALLOCATORS = ("tcmalloc", "mimalloc", "jemalloc")  # what `name` recognises in a library's file name
# The options each allocator's library runs with in a train job (a variable the user set wins). mimalloc returns the
# memory a step frees to the system with MADV_DONTNEED by default (its `purge_decommits`), so the next step faults
# every page in again: on the showcase's 8-step cut, 1.2 million page faults and 189 s. With MADV_FREE the pages stay
# mapped until the system needs them: 0.19 million faults, 134 s (TCMalloc's 133 s), peak RSS 14,850 MiB against
# 13,873 (BENCHMARKS.md, "The allocator from the lock").
OPTIONS = {"mimalloc": {"MIMALLOC_PURGE_DECOMMITS": "0"}}


def locked_library(distribution: str, file_name: str) -> str | None:
    """The absolute path of `file_name` as the installed `distribution` recorded it (its RECORD), or None when the
    distribution (or the file) is not installed in this interpreter's environment."""
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    path = next((Path(file.locate()) for file in files if file.name == file_name), None)
    return str(path.resolve()) if path is not None and path.is_file() else None


@functools.cache
def preloadable(library: str) -> bool:
    """Whether the dynamic loader can preload `library` here: a wheel's library needs the system's libatomic, and
    ld.so only warns (`cannot be preloaded ... ignored`) and runs on under glibc where a dependency is missing."""
    probe = subprocess.run([sys.executable, "-S", "-c", ""], env={**os.environ, "LD_PRELOAD": library},
                           capture_output=True, text=True)
    return probe.returncode == 0 and "cannot be preloaded" not in probe.stderr


def find(candidate: tuple[str, ...]) -> str | None:
    """A candidate's library: a soname LD_PRELOAD finds (system) or an absolute path (lock); None if absent."""
    return ctypes.util.find_library(candidate[1]) if candidate[0] == "system" else locked_library(*candidate[1:])


def available() -> str | None:
    """The preferred allocator library this machine has and can load, as LD_PRELOAD names it, or None."""
    return next((library for library in map(find, CANDIDATES) if library and preloadable(library)), None)


def name(library: str) -> str:
    """'tcmalloc', 'mimalloc', 'jemalloc' or 'glibc' (no library, or one that is none of them) for an LD_PRELOAD
    value or a library's path."""
    return next((allocator for allocator in ALLOCATORS if allocator in Path(library).name), "glibc")


def running() -> str:
    """The allocator this process runs under: the one its LD_PRELOAD names, if the loader mapped it (a library that
    could not be preloaded leaves the process under glibc)."""
    preloaded = {name(entry) for entry in os.environ.get("LD_PRELOAD", "").replace(":", " ").split()} - {"glibc"}
    maps = Path("/proc/self/maps")
    if not preloaded or not maps.is_file():
        return next(iter(preloaded), "glibc")
    mapped = {name(line.split()[-1]) for line in maps.read_text().splitlines() if "/" in line}
    return next((allocator for allocator in ALLOCATORS if allocator in preloaded & mapped), "glibc")


def variables(library: str) -> dict[str, str]:
    """What a process preloading `library` starts with: LD_PRELOAD and its allocator's OPTIONS."""
    return {**OPTIONS.get(name(library), {}), "LD_PRELOAD": library}


def train_job_variables() -> dict[str, str]:
    """The variables a train job started now on this machine adds (`preload`); none where it has no allocator."""
    library = available()
    return variables(library) if library else {}


def for_train_job() -> str:
    """The allocator a train job started now on this machine runs under (`preload`)."""
    return name(os.environ.get("LD_PRELOAD") or available() or "")


def preload(argv: list[str] | None = None) -> None:
    """Re-execute this Python process with the preferred allocator preloaded, with its OPTIONS where the user set
    none of their own, unless it already runs under one (or the user's own LD_PRELOAD), or the machine has none.
    Call it before anything heavy is imported."""
    library = None if os.environ.get("LD_PRELOAD") else available()
    if library is None:
        return
    environment = {**variables(library), **os.environ, "LD_PRELOAD": library}
    os.execve(sys.executable, [sys.executable, *(sys.argv if argv is None else argv)], environment)
