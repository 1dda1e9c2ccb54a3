"""The train job's allocator: TCMalloc or jemalloc preloaded by re-execution when the machine has one."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

from xtrain.train import allocator

CHILD = f"""
import sys
sys.path.insert(0, {str(REPO / "src")!r})
from xtrain.train import allocator
allocator.preload()
mapped = [line.split()[-1] for line in open("/proc/self/maps") if "malloc" in line.split()[-1]]
print(allocator.running(), sorted(set(mapped)), sys.argv[1:])
"""


def test_a_process_starts_again_under_the_allocator_the_machine_has(tmp_path):
    """Where the machine has TCMalloc or jemalloc, the script runs again under it with its own arguments (as
    Snakemake runs the train rule's script); where it has neither, it runs on as it is, under glibc."""
    library = allocator.available()
    script = tmp_path / "script.py"
    script.write_text(CHILD)
    output = subprocess.run([sys.executable, str(script), "first", "second"], capture_output=True, text=True,
                            check=True, env={"PATH": "/usr/bin:/bin"}).stdout.split(" ", 1)
    assert output[0] == allocator.for_train_job() == ("glibc" if library is None else allocator.name(library))
    if library is None:
        assert output[1].startswith("[]")
    else:
        assert library.split(".so")[0] in output[1]
    assert output[1].rstrip().endswith("['first', 'second']")


def test_the_users_own_preload_is_left_as_it_is(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "libjemalloc.so.2")
    monkeypatch.setattr(allocator.os, "execve", lambda *args: (_ for _ in ()).throw(AssertionError("re-executed")))
    allocator.preload()
    assert allocator.for_train_job() == allocator.running() == "jemalloc"


def test_preload_re_executes_the_same_command_with_the_library(monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setattr(allocator, "available", lambda: "libtcmalloc_minimal.so.4")
    calls = []
    monkeypatch.setattr(allocator.os, "execve", lambda *args: calls.append(args))
    allocator.preload(["script.py", "--flag"])
    [(executable, argv, environment)] = calls
    assert argv == [sys.executable, "script.py", "--flag"] and environment["LD_PRELOAD"] == "libtcmalloc_minimal.so.4"


def test_each_library_is_named_by_its_allocator():
    assert [allocator.name(library) for library in ("libtcmalloc_minimal.so.4", "/usr/lib/libtcmalloc.so.4",
                                                     "libjemalloc.so.2", "", "libasan.so.8")] == [
        "tcmalloc", "tcmalloc", "jemalloc", "glibc", "glibc"]
