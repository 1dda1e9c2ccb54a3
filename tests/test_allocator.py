"""The train job's allocator: the system's TCMalloc, else the lock's mimalloc (else the system's jemalloc),
preloaded by re-execution."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO, HANG_SECONDS

from xtrain.plan import make_plan, write_plan
from xtrain.recipe import Hardware, Train
from xtrain.train import allocator

CHILD = f"""
import sys
sys.path.insert(0, {str(REPO / "src")!r})
from xtrain.train import allocator
allocator.preload()
mapped = [line.split()[-1] for line in open("/proc/self/maps") if "malloc" in line.split()[-1]]
print(allocator.running(), sorted(set(mapped)), sys.argv[1:])
"""

# scripts/dispatch.py as the train rule runs it: Snakemake writes one file of its `snakemake` object (here a stand-in
# holding what the rule passes) followed by the script, and runs it, so preload() re-executes that whole file. On a
# machine whose loader knows no allocator library: ctypes.util.find_library finds none, in this process and again in
# the one preload() re-executes. The process then reports what its loader mapped.
DISPATCH = f"""
import ctypes.util, json, os, sys
from types import SimpleNamespace
ctypes.util.find_library = lambda name: None  # no TCMalloc or jemalloc on this machine
model, prepared, plan, out, work, log = sys.argv[1:7]
snakemake = SimpleNamespace(
    scriptdir={str(REPO / "scripts")!r}, input=SimpleNamespace(model=model, prepared=prepared, plan=plan, upstream=[]),
    output=[out], log=[log], threads=1, config={{"recipes": "recipes"}}, wildcards=SimpleNamespace(recipe="demo"),
    params=SimpleNamespace(recipe={{"train": {{"max_steps": 2, "global_batch_size": 4, "report_to": []}},
                                    "hardware": {{}}}}, work_dir=work))
dispatch = {str(REPO / "scripts" / "dispatch.py")!r}
exec(compile(open(dispatch).read(), dispatch, "exec"), {{"snakemake": snakemake, "__name__": "__main__"}})
print(json.dumps([sorted({{line.split()[-1] for line in open("/proc/self/maps") if "malloc" in line}}),
                  {{name: value for name, value in os.environ.items() if name.startswith("MIMALLOC_")}}]))
"""


def test_a_process_starts_again_under_the_allocator_the_machine_has(tmp_path):
    """Where the machine (or the lock) has an allocator, the script runs again under it with its own arguments (as
    Snakemake runs the train rule's script); where it has none, it runs on as it is, under glibc."""
    library = allocator.available()
    script = tmp_path / "script.py"
    script.write_text(CHILD)
    output = subprocess.run([sys.executable, str(script), "first", "second"], capture_output=True, text=True,
                            check=True, env={"PATH": "/usr/bin:/bin"}).stdout.split(" ", 1)
    assert output[0] == allocator.for_train_job() == ("glibc" if library is None else allocator.name(library))
    if library is None:
        assert output[1].startswith("[]")
    else:
        assert Path(library).name.split(".so")[0] in output[1]
    assert output[1].rstrip().endswith("['first', 'second']")


def test_the_train_job_preloads_the_locks_mimalloc_where_the_machine_has_no_allocator(tiny_model, prepared,
                                                                                        tmp_path):
    """A fresh clone with nothing installed by hand: scripts/dispatch.py re-executes itself under the mimalloc that
    envs/xtrain.lock installed (cmeel-mimalloc), the loader maps it, and train_metrics.json records it."""
    from xtrain.artifacts import read_json

    manifest = read_json(prepared / "manifest.json")
    plan = tmp_path / "plan.json"
    write_plan(plan, make_plan(tiny_model, manifest, Train(max_steps=2, global_batch_size=4), Hardware()))
    script = tmp_path / "dispatch_here.py"
    script.write_text(DISPATCH)
    out = tmp_path / "checkpoint"
    environment = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, str(script), str(tiny_model), str(prepared), str(plan), str(out),
                          str(tmp_path / "runs"), str(tmp_path / "train.log")], cwd=tmp_path, env=environment,
                         capture_output=True, text=True, timeout=HANG_SECONDS)
    assert run.returncode == 0, run.stderr[-3000:]
    mapped, options = json.loads(run.stdout.splitlines()[-1])
    locked = allocator.find(allocator.LOCKED_MIMALLOC)
    assert locked is not None and Path(locked).is_relative_to(Path(sys.prefix)), locked  # the lock's, not the system's
    assert [Path(path).name for path in mapped] == [Path(locked).name]
    assert options == {"MIMALLOC_PURGE_DECOMMITS": "0"}  # freed pages kept mapped: TCMalloc's speed, not 0.7x
    assert read_json(out / "train_metrics.json")["allocator"] == "mimalloc"


def test_the_system_tcmalloc_comes_before_the_locks_mimalloc(monkeypatch):
    """On the showcase's cut TCMalloc trained 5% faster than the lock's mimalloc and kept 6% less; jemalloc trained at
    0.8x glibc's speed (BENCHMARKS.md, "The allocator from the lock"): the machine's TCMalloc wins, the lock's
    mimalloc comes before the machine's jemalloc."""
    monkeypatch.setattr(allocator.ctypes.util, "find_library",
                        lambda name: {"tcmalloc_minimal": "libtcmalloc_minimal.so.4"}.get(name))
    monkeypatch.setattr(allocator, "preloadable", lambda library: True)
    assert allocator.available() == "libtcmalloc_minimal.so.4"
    monkeypatch.setattr(allocator.ctypes.util, "find_library", lambda name: {"jemalloc": "libjemalloc.so.2"}.get(name))
    assert allocator.name(allocator.available()) == "mimalloc"


def test_a_library_the_loader_cannot_preload_is_passed_over(monkeypatch, tmp_path):
    """ld.so only warns and runs on under glibc when a preloaded library (or one it needs) is missing."""
    broken = tmp_path / "libmimalloc.so"
    broken.write_text("not a shared object")
    assert not allocator.preloadable(str(broken))
    monkeypatch.setattr(allocator.ctypes.util, "find_library", lambda name: None)
    monkeypatch.setattr(allocator, "locked_library", lambda *candidate: str(broken))
    assert allocator.available() is None and allocator.for_train_job() == "glibc"


def test_a_preload_the_loader_did_not_map_is_not_reported_as_running(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "libjemalloc.so.2")  # set now: this process was not started under it
    assert allocator.running() == "glibc"


def test_the_users_own_preload_is_left_as_it_is(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "libjemalloc.so.2")
    monkeypatch.setattr(allocator.os, "execve", lambda *args: (_ for _ in ()).throw(AssertionError("re-executed")))
    allocator.preload()
    assert allocator.for_train_job() == "jemalloc"


def test_preload_re_executes_the_same_command_with_the_library(monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setattr(allocator, "available", lambda: "libtcmalloc_minimal.so.4")
    calls = []
    monkeypatch.setattr(allocator.os, "execve", lambda *args: calls.append(args))
    allocator.preload(["script.py", "--flag"])
    [(executable, argv, environment)] = calls
    assert argv == [sys.executable, "script.py", "--flag"] and environment["LD_PRELOAD"] == "libtcmalloc_minimal.so.4"


def test_mimalloc_runs_with_its_options_unless_the_user_set_their_own(monkeypatch):
    """The lock's mimalloc keeps freed pages mapped (MADV_FREE), where its default's MADV_DONTNEED faulted every page
    in again each step (1.4x slower on the showcase's cut); a MIMALLOC_* variable the user set is theirs."""
    library = "/venv/lib/python3.11/site-packages/cmeel.prefix/lib/libmimalloc.so"
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("MIMALLOC_PURGE_DECOMMITS", raising=False)
    monkeypatch.setattr(allocator, "available", lambda: library)
    calls = []
    monkeypatch.setattr(allocator.os, "execve", lambda *args: calls.append(args[2]))
    allocator.preload(["script.py"])
    monkeypatch.setenv("MIMALLOC_PURGE_DECOMMITS", "1")
    allocator.preload(["script.py"])
    assert [environment["MIMALLOC_PURGE_DECOMMITS"] for environment in calls] == ["0", "1"]
    assert allocator.train_job_variables() == {"MIMALLOC_PURGE_DECOMMITS": "0", "LD_PRELOAD": library}
    assert allocator.variables("libtcmalloc_minimal.so.4") == {"LD_PRELOAD": "libtcmalloc_minimal.so.4"}


def test_each_library_is_named_by_its_allocator():
    assert [allocator.name(library) for library in (
        "libtcmalloc_minimal.so.4", "/usr/lib/libtcmalloc.so.4", "libjemalloc.so.2",
        "/venv/lib/python3.11/site-packages/cmeel.prefix/lib/libmimalloc.so", "", "libasan.so.8",
        "/home/tcmalloc/libasan.so.8")] == ["tcmalloc", "tcmalloc", "jemalloc", "mimalloc", "glibc", "glibc", "glibc"]
