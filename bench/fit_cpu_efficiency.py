"""The share of the CPU probe's matmul rate each kept training run needed, and the share a set of them fits
(xtrain.plan.speed's CPU_MATMUL_EFFICIENCY, CPU_FULL_BF16_EFFICIENCY).

    .venv/bin/python bench/fit_cpu_efficiency.py DIR [--fit NAME ...]

DIR holds the runs `bench/bench_plan_real.py ... --keep DIR` kept (each run's plan.json and train_metrics.json). A
run's plan time is its matmuls (the planned tokens × the traced FLOPs per token over the probe's rate × the share)
plus what does not scale with the share (ops, the attention's measured difference, QLoRA's dequantization); the share
a run needed makes the matmuls of the tokens it trained take the measured time less the rest. `--fit` names the runs
(file names without .json) whose mean need is the fit for their method; the others are the check.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def needed_share(run: dict) -> tuple[str, float, float]:
    """(method kind, the plan's share, the share the run needed) of one kept run."""
    plan, metrics = run["plan"], run["metrics"]
    time = plan["time"]
    probe = time["cpu_probe"]["matmul_flops"]
    planned_tokens = time["steps"] * time["tokens_per_step"]
    matmuls = planned_tokens * time["flops_per_token"] / time["device_flops"]
    rest = time["seconds"] - (time.get("reference_precompute_seconds") or 0) - matmuls
    needed_rate = metrics["tokens_seen"] * time["flops_per_token"] / (metrics["trainer_runtime_seconds"] - rest)
    full = plan["model"]["trainable"] == plan["model"]["total"]
    return f"{'full' if full else 'adapters'} {plan['precision']}", time["device_flops"] / probe, needed_rate / probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--fit", nargs="*", default=[], help="the runs the fit is taken from")
    args = parser.parse_args()
    runs = {path.stem: json.loads(path.read_text()) for path in sorted(args.folder.glob("*.json"))}
    shares = {name: needed_share(run) for name, run in runs.items()}
    print("| run | kind | plan's share | needed share | in the fit |")
    print("| --- " * 5 + "|")
    for name, (kind, planned, needed) in shares.items():
        print(f"| {name} | {kind} | {planned:.3f} | {needed:.3f} | {'yes' if name in args.fit else ''} |")
    for kind in sorted({kind for kind, _, _ in shares.values()}):
        fitted = [needed for name, (k, _, needed) in shares.items() if k == kind and name in args.fit]
        if fitted:
            print(f"\n{kind}: fit {statistics.mean(fitted):.3f} from {len(fitted)} run(s)")


if __name__ == "__main__":
    main()
