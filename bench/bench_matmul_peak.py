"""This CPU's bf16 and fp32 matmul peak: square matmuls of several sizes on all the cores, best of N windows after a
warm-up, next to the plan's probe shape ((2048 × width) @ (width × width)) at the demo models' widths.

    .venv/bin/python bench/bench_matmul_peak.py                 # ~2-4 minutes on 2 cores
    .venv/bin/python bench/bench_matmul_peak.py --windows 10 --sizes 512 1024 2048

Prints a Markdown table (GFLOP/s per shape and precision, the best size of each precision in bold) with the
machine's load before and after, and says how far the probe's shape reads below the peak: the question of
whether model FLOPs utilisation can be taken over the probe's figure (it cannot where the probe reads low, so the
train job measures the peak itself: `xtrain.plan.peak`, with the sizes this bench finds fastest). Each rate is
`xtrain.plan.peak.matmul_rate`, the library's own measurement.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from xtrain.plan.peak import PEAK_SIZES, matmul_rate
from xtrain.plan.probe import PROBE_ROWS, load_per_core, seconds_per_call

PRECISIONS = ("bf16", "fp32")
# The 27M demo Llama's width and SmolLM2-135M's: the probe's shapes the plans of BENCHMARKS.md rest on.
WIDTHS = (512, 576)


def probe_rate(precision: str, width: int, threads: int, windows: int, window: float) -> float:
    """The probe's matmul shape at `width`, timed as `matmul_rate` times a square one."""
    from xtrain.plan.memory import torch_dtype

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dtype = torch_dtype(precision)
        a, b = torch.randn(PROBE_ROWS, width, dtype=dtype), torch.randn(width, width, dtype=dtype)
        return max(2 * PROBE_ROWS * width * width / seconds_per_call(lambda: a @ b, window) for _ in range(windows))
    finally:
        torch.set_num_threads(previous)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 1536, 2048, 3072, 4096])
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    parser.add_argument("--windows", type=int, default=8, help="timed windows per shape; the best is kept")
    parser.add_argument("--window", type=float, default=0.25, help="seconds per window (one call at least)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: every core)")
    args = parser.parse_args()
    started, load_before = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()
    shapes = [(f"{n}²", lambda p, n=n: matmul_rate(p, n, args.threads, args.windows, args.window)) for n in args.sizes]
    shapes += [(f"probe, width {w}", lambda p, w=w: probe_rate(p, w, args.threads, args.windows, args.window))
               for w in args.widths]
    rates = {(name, p): measure(p) / 1e9 for name, measure in shapes for p in PRECISIONS}
    load_after = os.getloadavg()
    best = {p: max((rates[name, p], name) for name, _ in shapes[:len(args.sizes)]) for p in PRECISIONS}

    print(f"{started}; torch {torch.__version__}, {args.threads} threads, best of {args.windows} windows of "
          f"{args.window} s; load average {' / '.join(f'{x:.2f}' for x in load_before)} before, "
          f"{' / '.join(f'{x:.2f}' for x in load_after)} after ({load_per_core()} per core now)\n")
    print("| matmul | " + " | ".join(f"{p} GFLOP/s" for p in PRECISIONS) + " |")
    print("| --- |" + " --- |" * len(PRECISIONS))
    for name, _ in shapes:
        cells = [f"**{rates[name, p]:.1f}**" if best[p][1] == name else f"{rates[name, p]:.1f}" for p in PRECISIONS]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    for p in PRECISIONS:
        peak, size = best[p]
        probes = ", ".join(f"width {w}: {rates[f'probe, width {w}', p] / peak:.0%}" for w in args.widths)
        print(f"{p}: peak {peak:.1f} GFLOP/s at {size}; the probe's shape reaches {probes} of it")
    print(f"library sizes (xtrain.plan.peak.PEAK_SIZES): {PEAK_SIZES}")


if __name__ == "__main__":
    main()
