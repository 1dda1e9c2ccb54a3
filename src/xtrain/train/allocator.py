"""The train job's memory allocator: TCMalloc (else jemalloc) preloaded when the machine has it.

glibc's malloc keeps what a training step frees in its arenas; with the batch shapes of a real run (length-grouped,
each batch its own length) the heap grows by each new shape's leftovers, so the process's peak RSS drifts far above
the step the plan traced (the showcase: 17.3 GiB against a 9.9 GiB prediction). Measured on the showcase's first 16
steps (BENCHMARKS.md, "Host memory of a real run"): TCMalloc peaks 16% lower than glibc and trains 1.35x faster;
jemalloc peaks 20% lower at 0.8x glibc's speed; glibc's own knobs (MALLOC_MMAP_THRESHOLD_, MALLOC_ARENA_MAX)
cut the peak as much but train 1.8x slower. So the train job runs under the first of PRELOADS the machine has, and
under glibc as it is otherwise; the plan's host-memory request allows for the one it will get (`for_train_job`).

A library must be loaded before the process's first allocation: the train job re-executes itself with LD_PRELOAD
set (`preload`), and the processes it launches (torchrun workers, a lane's own interpreter) inherit it. An
LD_PRELOAD the user set is left as it is.
"""

from __future__ import annotations

import ctypes.util
import os
import sys

# Library names as ctypes.util.find_library knows them (Debian: libtcmalloc-minimal4 or libgoogle-perftools4,
# libjemalloc2; RHEL: gperftools-libs, jemalloc), in the order they are preferred.
PRELOADS = ("tcmalloc_minimal", "tcmalloc", "jemalloc")


def available() -> str | None:
    """The preferred allocator library this machine has (its soname, which LD_PRELOAD finds), or None."""
    return next(filter(None, map(ctypes.util.find_library, PRELOADS)), None)


def name(library: str) -> str:
    """'tcmalloc', 'jemalloc' or 'glibc' (no library, or one that is neither) for an LD_PRELOAD value."""
    return next((allocator for allocator in ("tcmalloc", "jemalloc") if allocator in library), "glibc")


def running() -> str:
    """The allocator this process was started under."""
    return name(os.environ.get("LD_PRELOAD", ""))


def for_train_job() -> str:
    """The allocator a train job started now on this machine runs under (`preload`)."""
    return name(os.environ.get("LD_PRELOAD") or available() or "")


def preload(argv: list[str] | None = None) -> None:
    """Re-execute this Python process with the preferred allocator preloaded, unless it already runs under one
    (or the user's own LD_PRELOAD), or the machine has none. Call it before anything heavy is imported."""
    library = None if os.environ.get("LD_PRELOAD") else available()
    if library is None:
        return
    environment = {**os.environ, "LD_PRELOAD": library}
    os.execve(sys.executable, [sys.executable, *(sys.argv if argv is None else argv)], environment)
