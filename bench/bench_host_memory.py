"""Host memory of a real CPU training run under each allocator: peak RSS against the plan's `mem_mb` request.

    .venv/bin/python bench/bench_host_memory.py [--steps 16] [--recipe recipes/showcase/smollm2_alpaca.yaml]
        [--allocators glibc,glibc-tuned,jemalloc,tcmalloc,mimalloc] [--rounds 2] [--library-dir DIR]

Needs the recipe's prepared data (`snakemake prepared/<recipe>`; the showcase's: `make showcase` or
`snakemake prepared/smollm2_alpaca --config recipes=recipes/showcase`). The recipe is cut to `--steps` optimizer
steps and planned for this machine as the plan stage does; then, for each allocator, a fresh process trains it
through the real train stage (`xtrain.train.run.run_training`, the recipe's backend, length-grouped batches as in a
real run) and its peak RSS (the child's ru_maxrss) and wall time are measured:
- glibc: no MALLOC_* variable (what a run without a preload has);
- glibc-tuned: MALLOC_ARENA_MAX=2, MALLOC_TRIM_THRESHOLD_=64 MiB, MALLOC_TOP_PAD_=64 MiB;
- glibc-mmap: MALLOC_MMAP_THRESHOLD_=65536 (every block over 64 KiB its own mapping, unmapped when freed: what
  bench/bench_plan.py's fixed-shape table runs under);
- jemalloc / tcmalloc: LD_PRELOAD of the system's library as ctypes.util.find_library names it (Debian:
  libjemalloc2, libtcmalloc-minimal4), or the one in `--library-dir` (a package unpacked there with
  `apt-get download` and `dpkg-deb -x`, so that measuring it leaves the machine's own allocator as it is);
  skipped when neither has it;
- mimalloc: LD_PRELOAD of the lock's cmeel-mimalloc library, found as the train job finds it, with the train job's
  options (`allocator.OPTIONS`); mimalloc-decommit and mimalloc-keep: the same library with other options (MIMALLOC).
With `--rounds N` the allocators run in turn N times (A B C A B C: a load on the machine hits each alike) and each
run's 1-minute load average is recorded before it starts. Each run reports the allocator train_metrics.json
recorded (`xtrain.train.allocator.running`: what the child really had mapped).
Prints Markdown tables for BENCHMARKS.md: each run, then per allocator the median peak RSS, the plan's request,
request / peak and median wall seconds. The request is the plan made here, for the allocator a train job on this
machine gets (`resources.allocator`), whichever allocator the row measures.
"""

from __future__ import annotations

import argparse
import ctypes.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from xtrain.train import allocator  # noqa: E402

MIB = 2**20
GLIBC = {
    "glibc": {},
    "glibc-tuned": {"MALLOC_ARENA_MAX": "2", "MALLOC_TRIM_THRESHOLD_": str(64 * MIB), "MALLOC_TOP_PAD_": str(64 * MIB)},
    "glibc-mmap": {"MALLOC_MMAP_THRESHOLD_": "65536"},
}
SYSTEM = {"jemalloc": "jemalloc", "tcmalloc": "tcmalloc_minimal"}  # ctypes.util.find_library's names
MIMALLOC = {  # the lock's mimalloc with the options (MIMALLOC_*, mimalloc's docs) a train job sets, and others
    "mimalloc": allocator.OPTIONS["mimalloc"],
    "mimalloc-decommit": {"MIMALLOC_PURGE_DECOMMITS": "1"},  # mimalloc's default: freed memory goes back to the OS
    "mimalloc-keep": {"MIMALLOC_PURGE_DELAY": "-1"},  # never returned
}
ALLOCATORS = (*GLIBC, *SYSTEM, *MIMALLOC)


def system_library(library: str, library_dir: Path | None) -> str | None:
    """The system allocator `library` in `library_dir` (an unpacked package), else where the loader finds it."""
    unpacked = sorted(library_dir.glob(f"lib{library}.so.*")) if library_dir else []
    return str(unpacked[0].resolve()) if unpacked else ctypes.util.find_library(library)


def environment_of(name: str, library_dir: Path | None) -> dict[str, str | None]:
    """The variables a run under allocator `name` starts with (LD_PRELOAD None: this machine lacks it)."""
    if name in GLIBC:
        return GLIBC[name]
    if name in MIMALLOC:
        return {"LD_PRELOAD": allocator.find(allocator.LOCKED_MIMALLOC), **MIMALLOC[name]}
    return {"LD_PRELOAD": system_library(SYSTEM[name], library_dir)}
TRAIN = """
import json, logging, sys
from pathlib import Path
from xtrain.recipe import load_recipe
from xtrain.train.run import run_training
logging.basicConfig(level=logging.WARNING)
recipe_path, plan, out, steps, multiple = sys.argv[1:6]
if int(multiple) > 1:  # the experiment: batches padded to a multiple of this many tokens (fewer distinct shapes)
    import xtrain.train.backends.trl as trl
    arguments = trl.sft_arguments
    trl.sft_arguments = lambda *a, **k: {**arguments(*a, **k), "pad_to_multiple_of": int(multiple)}
recipe = load_recipe(recipe_path)
name = Path(recipe_path).stem
run_training(model_dir=Path(recipe.model.path), prepared_dir=Path("prepared") / name, plan_path=Path(plan),
             train=recipe.train.model_copy(update={"max_steps": int(steps), "report_to": []}),
             hardware=recipe.hardware, out=Path(out) / "checkpoint", work_dir=Path(out) / "runs")
"""


def plan_for(recipe_path: Path, steps: int, out: Path) -> dict:
    from xtrain.artifacts import read_json
    from xtrain.plan import make_plan, write_plan
    from xtrain.recipe import load_recipe

    recipe = load_recipe(recipe_path)
    manifest = read_json(ROOT / "prepared" / recipe_path.stem / "manifest.json")
    train = recipe.train.model_copy(update={"max_steps": steps, "report_to": []})
    plan = make_plan(Path(recipe.model.path), manifest, train, recipe.hardware, recipe.model.trust_remote_code)
    write_plan(out / "plan.json", plan)
    return {"mem_mb": plan.resources.mem_mb, "peak_mib": plan.memory.peak_bytes_per_device / MIB,
            "seconds": plan.time.seconds, "allocator": plan.resources.allocator}


def measure(recipe_path: Path, plan: Path, steps: int, preload: dict, out: Path, multiple: int) -> dict:
    """One training run in a fresh process; its peak RSS and wall time."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("MALLOC_", "MIMALLOC_")) and name != "LD_PRELOAD"}
    env.update(preload)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", TRAIN, str(recipe_path), str(plan), str(out), str(steps), str(multiple)],
                   cwd=ROOT,
                   env=env, check=True)
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # this process's only child
    peak_kib = usage.ru_maxrss
    metrics = json.loads((out / "checkpoint" / "train_metrics.json").read_text())
    return {"peak_mib": peak_kib / 1024, "seconds": seconds, "final_loss": metrics["loss"][-1]["loss"],
            "recorded": metrics["allocator"], "page_faults": usage.ru_minflt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, default=Path("recipes/showcase/smollm2_alpaca.yaml"))
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--allocators", default=",".join(ALLOCATORS))
    parser.add_argument("--rounds", type=int, default=1, help="run the allocators in turn this many times")
    parser.add_argument("--library-dir", type=Path, help="look for jemalloc and TCMalloc here first (unpacked .debs)")
    parser.add_argument("--pad-to-multiple-of", type=int, default=1,
                        help="pad each batch to a multiple of this many tokens (TRL's pad_to_multiple_of); 1: off")
    args = parser.parse_args()
    names = args.allocators.split(",")
    if unknown := sorted(set(names) - set(ALLOCATORS)):
        parser.error(f"--allocators: unknown {unknown}; choose from {', '.join(ALLOCATORS)}")
    preloads = {name: environment_of(name, args.library_dir) for name in names}
    missing = [name for name in names if preloads[name].get("LD_PRELOAD", "") is None]
    names = [name for name in names if name not in missing]
    runs = []
    with tempfile.TemporaryDirectory(prefix="xtrain-host-memory-") as folder:
        work = Path(folder)
        planned = plan_for(args.recipe, args.steps, work)
        for round_ in range(1, args.rounds + 1):
            for name in names:
                run = work / f"{name}-{round_}"
                run.mkdir()
                load = os.getloadavg()[0]
                result = json.loads(subprocess.run(
                    [sys.executable, __file__, "--one", json.dumps(preloads[name]), str(args.recipe),
                     str(work / "plan.json"), str(args.steps), str(run), str(args.pad_to_multiple_of)], cwd=ROOT,
                    check=True, stdout=subprocess.PIPE, text=True).stdout.splitlines()[-1])
                runs.append({"allocator": name, "round": round_, "load": load, **result})
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    print(f"{args.recipe}, {args.steps} steps, batches padded to a multiple of {args.pad_to_multiple_of}; plan "
          f"(resources.allocator {planned['allocator']}): traced step peak {planned['peak_mib']:,.0f} MiB, request "
          f"{planned['mem_mb']:,} MiB, {planned['seconds']:.0f} s predicted; not on this machine: {missing or 'none'}\n")
    print("| round | allocator | recorded by train_metrics | load before | peak RSS (MiB) | wall (s) | last logged loss |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for run in runs:
        print(f"| {run['round']} | {run['allocator']} | {run['recorded']} | {run['load']:.2f} | {run['peak_mib']:,.0f} "
              f"| {run['seconds']:.0f} | {run['final_loss']:.4f} |")
    print("\n| allocator | peak RSS (MiB), median | plan mem_mb | request / peak | wall (s), median | vs glibc's wall |")
    print("| --- | --- | --- | --- | --- | --- |")
    medians = {name: (statistics.median(run["peak_mib"] for run in runs if run["allocator"] == name),
                      statistics.median(run["seconds"] for run in runs if run["allocator"] == name)) for name in names}
    for name, (peak, seconds) in medians.items():
        speed = f"{medians['glibc'][1] / seconds:.2f}x" if "glibc" in medians else ""
        print(f"| {name} | {peak:,.0f} | {planned['mem_mb']:,} | {planned['mem_mb'] / peak:.2f} | {seconds:.0f} | "
              f"{speed} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        preload, recipe, plan, steps, out, multiple = sys.argv[2:8]
        print(json.dumps(measure(Path(recipe), Path(plan), int(steps), json.loads(preload), Path(out), int(multiple))))
    else:
        main()
