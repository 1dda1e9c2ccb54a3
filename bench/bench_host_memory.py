"""Host memory of a real CPU training run under each allocator: peak RSS against the plan's `mem_mb` request.

    .venv/bin/python bench/bench_host_memory.py [--steps 16] [--recipe recipes/showcase/smollm2_alpaca.yaml]
        [--allocators glibc,glibc-tuned,jemalloc,tcmalloc]

Needs the recipe's prepared data (`snakemake prepared/<recipe>`; the showcase's: `make showcase` or
`snakemake --config recipes=recipes/showcase prepared/smollm2_alpaca`). The recipe is cut to `--steps` optimizer
steps and planned for this machine as the plan stage does; then, for each allocator, a fresh process trains it
through the real train stage (`xtrain.train.run_training`, the recipe's backend, length-grouped batches as in a
real run) and its peak RSS (the child's ru_maxrss) and wall time are measured:
- glibc: no MALLOC_* variable (what a real run has);
- glibc-tuned: MALLOC_ARENA_MAX=2, MALLOC_TRIM_THRESHOLD_=64 MiB, MALLOC_TOP_PAD_=64 MiB;
- glibc-mmap: MALLOC_MMAP_THRESHOLD_=65536 (every block over 64 KiB its own mapping, unmapped when freed: what
  bench/bench_plan.py's fixed-shape table runs under);
- jemalloc / tcmalloc: LD_PRELOAD of the library ctypes.util.find_library names (Debian: libjemalloc2,
  libtcmalloc-minimal4), skipped when not installed.
Prints a Markdown table for BENCHMARKS.md: allocator, peak RSS, the plan's request, request / peak, train seconds.
The request is the plan made here, for the allocator a train job on this machine gets (`resources.allocator`:
TCMalloc where it is installed), whichever allocator the row measures.
"""

from __future__ import annotations

import argparse
import ctypes.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
MIB = 2**20
ALLOCATORS = {
    "glibc": {},
    "glibc-tuned": {"MALLOC_ARENA_MAX": "2", "MALLOC_TRIM_THRESHOLD_": str(64 * MIB), "MALLOC_TOP_PAD_": str(64 * MIB)},
    "glibc-mmap": {"MALLOC_MMAP_THRESHOLD_": "65536"},
    "jemalloc": {"LD_PRELOAD": ctypes.util.find_library("jemalloc")},
    "tcmalloc": {"LD_PRELOAD": ctypes.util.find_library("tcmalloc_minimal")},
}
TRAIN = """
import json, logging, sys
from pathlib import Path
from xtrain.recipe import load_recipe
from xtrain.train import run_training
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
            "seconds": plan.time.seconds}


def measure(recipe_path: Path, plan: Path, steps: int, allocator: str, out: Path, multiple: int) -> dict:
    """One training run in a fresh process; its peak RSS and wall time."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("MALLOC_")}
    env.update(ALLOCATORS[allocator])
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", TRAIN, str(recipe_path), str(plan), str(out), str(steps), str(multiple)],
                   cwd=ROOT,
                   env=env, check=True)
    seconds = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # this process's only child
    metrics = json.loads((out / "checkpoint" / "train_metrics.json").read_text())
    return {"peak_mib": peak_kib / 1024, "seconds": seconds, "final_loss": metrics["loss"][-1]["loss"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, default=Path("recipes/showcase/smollm2_alpaca.yaml"))
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--allocators", default=",".join(ALLOCATORS))
    parser.add_argument("--pad-to-multiple-of", type=int, default=1,
                        help="pad each batch to a multiple of this many tokens (TRL's pad_to_multiple_of); 1: off")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="xtrain-host-memory-") as folder:
        work = Path(folder)
        planned = plan_for(args.recipe, args.steps, work)
        rows = []
        for allocator in args.allocators.split(","):
            if ALLOCATORS[allocator].get("LD_PRELOAD", "") is None:  # a preload this machine lacks
                rows.append(f"| {allocator} | not installed | | | | |")
                continue
            run = work / allocator
            run.mkdir()
            result = (json.loads(subprocess.run(
                [sys.executable, __file__, "--one", allocator, str(args.recipe), str(work / "plan.json"),
                 str(args.steps), str(run), str(args.pad_to_multiple_of)], cwd=ROOT, check=True, capture_output=True, text=True).stdout
                .splitlines()[-1]))
            rows.append(f"| {allocator} | {result['peak_mib']:,.0f} | {planned['mem_mb']:,} | "
                        f"{planned['mem_mb'] / result['peak_mib']:.2f} | {result['seconds']:.0f} | "
                        f"{result['final_loss']:.4f} |")
            print(rows[-1], file=sys.stderr, flush=True)
    print(f"{args.recipe}, {args.steps} steps, batches padded to a multiple of {args.pad_to_multiple_of}; plan: traced step peak {planned['peak_mib']:,.0f} MiB, request "
          f"{planned['mem_mb']:,} MiB, {planned['seconds']:.0f} s predicted\n")
    print("| allocator | peak RSS (MiB) | plan mem_mb | request / peak | wall (s) | last logged loss |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        allocator, recipe, plan, steps, out, multiple = sys.argv[2:8]
        print(json.dumps(measure(Path(recipe), Path(plan), int(steps), allocator, Path(out), int(multiple))))
    else:
        main()
