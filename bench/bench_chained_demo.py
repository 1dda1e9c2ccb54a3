"""Benchmark of the chained DPO demo (not a test): what building recipes/demo_dpo.yaml on the SFT demo adds.

    .venv/bin/python bench/bench_chained_demo.py [--work /tmp/xtrain-bench-chain] [--cores 2]

One copy of the workflow holds recipes/demo.yaml, recipes/demo_dpo.yaml (model.recipe: demo) and `dpo_direct`,
the same DPO recipe on models/tiny-llama (what demo_dpo was before it was chained). The SFT checkpoint is built
first, untimed (the default build makes it anyway). Then, each a separate `snakemake --cores N` timed from start to
end: dpo_direct up to its gate; bases/demo (rule merge_base, the one job the chain adds); demo_dpo up to its gate
on the merged base. Printed: the wall times, the added time (merge_base + chained gate - direct gate), each DPO
recipe's first loss, held-out reward accuracy and gate verdict, and each job's own seconds (benchmarks/*.tsv).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from conftest import SNAKEMAKE, copy_workflow  # noqa: E402  (the tests' own workflow copy)

from xtrain.evaluate.gate import describe  # noqa: E402

CHAINED = (ROOT / "recipes/demo_dpo.yaml").read_text()
DIRECT = CHAINED.replace("  recipe: demo\n", "  path: models/tiny-llama\n")


def timed(root: Path, cores: int, target: str) -> float:
    started = time.perf_counter()
    result = subprocess.run([SNAKEMAKE, "--cores", str(cores), target], cwd=root, capture_output=True, text=True,
                            stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise SystemExit(f"snakemake {target} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return time.perf_counter() - started


def job_seconds(root: Path, recipe: str) -> dict[str, float]:
    """Each job's own wall seconds from Snakemake's benchmark files (rules with a `benchmark:` directive)."""
    seconds = {}
    for path in sorted((root / "benchmarks" / recipe).glob("*.tsv")):
        with path.open() as handle:
            seconds[path.stem] = float(next(csv.DictReader(handle, delimiter="\t"))["s"])
    return seconds


def summary(root: Path, recipe: str) -> str:
    first = json.loads((root / f"checkpoints/{recipe}/train_metrics.json").read_text())["loss"][0]["loss"]
    metrics = json.loads((root / f"reports/{recipe}/eval.json").read_text())
    verdicts = json.loads((root / f"reports/{recipe}/gate.json").read_text())  # written only when all pass
    return (f"{recipe}: first loss {first:.4f}, reward_accuracy {metrics['reward_accuracy']:.3f}; gate: "
            f"{'; '.join(describe(verdict) for verdict in verdicts)}; jobs (s): {job_seconds(root, recipe)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/xtrain-bench-chain"))
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    root = copy_workflow(args.work, {"demo": (ROOT / "recipes/demo.yaml").read_text(), "demo_dpo": CHAINED,
                                     "dpo_direct": DIRECT})
    sft = timed(root, args.cores, "checkpoints/demo")
    direct = timed(root, args.cores, "reports/dpo_direct/gate.json")
    merge = timed(root, args.cores, "bases/demo")
    chained = timed(root, args.cores, "reports/demo_dpo/gate.json")
    print(f"SFT demo up to its checkpoint (with the tiny model, untimed in the sum): {sft:.1f} s")
    print(f"dpo_direct up to its gate: {direct:.1f} s")
    print(f"merge_base (bases/demo): {merge:.1f} s")
    print(f"demo_dpo up to its gate on bases/demo: {chained:.1f} s")
    print(f"added by the chain: {merge + chained - direct:+.1f} s")
    print(summary(root, "dpo_direct"))
    print(summary(root, "demo_dpo"))


if __name__ == "__main__":
    main()
