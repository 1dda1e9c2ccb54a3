"""Fit an allocator's host-memory allowance (the plan's `HOST_RETENTION`) to real runs: peak RSS = 680 MiB (the
process) + a fixed part + a factor × the traced step (+ a 4-bit base's mapped checkpoint).

    .venv/bin/python bench/fit_host_retention.py DIR [DIR ...] [--extra NAME:PEAK_MIB:TRACED_MIB ...]
        [--check SUBSTRING ...] [--given FIXED_MIB:FACTOR]

DIR: folders written by `bench_plan_real.py --keep` (each run's plan and peak RSS). `--extra`: runs measured
elsewhere (bench_host_memory.py's showcase cuts print their peak and traced step). Runs whose name contains a
`--check` substring are left out of the fit and shown as its check. The grid: fixed part -80 to 620 MiB by 10,
factor 0.95 to 1.45 by 0.005; the pick puts the most fitted runs' prediction inside 0.8-1.0 of their peak (the
request, × 1.25, inside 1.0-1.25×), then the least squared log distance to 0.9. `--given`: no fit, these constants
(the plan's, to check them on new runs). Prints a Markdown table of predicted / peak per run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from xtrain.plan.planner import CPU_PROCESS_BYTES, HOST_REQUEST_MARGIN  # noqa: E402

MIB = 2**20
PROCESS_MIB = CPU_PROCESS_BYTES / MIB
WINDOW, TARGET = (1 / HOST_REQUEST_MARGIN, 1.0), 0.9  # a prediction whose request (x the margin) is 1.0-1.25x the peak


def kept_runs(folders: list[Path]) -> list[tuple[str, float, float, float]]:
    """(name, peak RSS MiB, traced step MiB, mapped checkpoint MiB) of each kept run."""
    runs = []
    for folder in folders:
        for path in sorted(folder.glob("*.json")):
            kept = json.loads(path.read_text())
            plan = kept["plan"]
            runs.append((f"{folder.name}/{path.stem}", kept["peak_rss_mib"], plan["memory"]["peak_bytes_per_device"] / MIB,
                         (plan["model"].get("quantized_stored_bytes") or 0) / MIB))
    return runs


def predicted(fixed: float, factor: float, traced: float, mapped: float) -> float:
    return PROCESS_MIB + fixed + factor * traced + mapped


def fit(runs: list[tuple[str, float, float, float]]) -> tuple[int, float]:
    def score(fixed: int, factor: float) -> tuple[int, float]:
        ratios = [predicted(fixed, factor, traced, mapped) / peak for _, peak, traced, mapped in runs]
        return (-sum(WINDOW[0] <= r <= WINDOW[1] for r in ratios), sum(math.log(r / TARGET) ** 2 for r in ratios))

    grid = [(fixed, factor / 1000) for fixed in range(-80, 621, 10) for factor in range(950, 1451, 5)]
    return min(grid, key=lambda point: score(*point))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--extra", nargs="*", default=[], help="NAME:PEAK_MIB:TRACED_MIB")
    parser.add_argument("--check", nargs="*", default=[], help="runs named so are the check, not fitted")
    parser.add_argument("--given", help="FIXED_MIB:FACTOR: check these constants instead of fitting")
    args = parser.parse_args()
    runs = kept_runs(args.folders) + [(name, float(peak), float(traced), 0.0)
                                      for name, peak, traced in (extra.split(":") for extra in args.extra)]
    checked = [run for run in runs if any(part in run[0] for part in args.check)]
    if args.given:
        fixed, factor = (float(value) for value in args.given.split(":"))
    else:
        fixed, factor = fit([run for run in runs if run not in checked])
    print(f"peak RSS = {PROCESS_MIB:g} MiB + {fixed:g} MiB + {factor:g} x the traced step (+ the mapped checkpoint)\n")
    print("| run | peak RSS MiB | predicted / peak | request / peak |\n| --- | --- | --- | --- |")
    for name, peak, traced, mapped in runs:
        ratio = predicted(fixed, factor, traced, mapped) / peak
        print(f"| {name}{' (check)' if (name, peak, traced, mapped) in checked else ''} | {peak:,.0f} | {ratio:.2f} | "
              f"{ratio * HOST_REQUEST_MARGIN:.2f} |")


if __name__ == "__main__":
    main()
