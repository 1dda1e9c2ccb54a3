"""The device's peak matmul rate, and model FLOPs utilisation (MFU): how close training came to it.

MFU is tokens/s × the plan's training FLOPs per token (`time.flops_per_token`, counted by the trace) over the
largest rate the device sustains in the run's precision. On a GPU that peak is the datasheet's dense figure
(`xtrain.models.gpus`) per device, × the devices. A CPU has no datasheet figure, so its peak is measured: large
square matmuls on all the job's threads, best of several windows, the fastest size kept. It is not the plan's probe
(`xtrain.plan.probe`), which times a (2048 × width) @ (width × width) matmul at the model's width to predict a step:
on a narrow model that shape runs well under the machine's peak (bench/bench_matmul_peak.py; BENCHMARKS.md,
"Efficiency against this CPU's peak").

Like the probe, the peak is measured once per machine (CPU model, threads, torch version, precision), rounded to two
significant figures and recorded in `$XDG_CACHE_HOME/xtrain/cpu-peak.json`; every later run reads the record, so a
run's MFU does not move with the machine's load at the moment it ends. `python -m xtrain.plan.peak --refresh`
measures (again) and keeps the faster figure (a busy machine only ever reads slow); `XTRAIN_CPU_PEAK="<FLOP/s>"` (every
precision) or `"bf16=<FLOP/s>,fp32=<FLOP/s>"` gives fixed figures instead (the tests use it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from typing import Any

from ..models.gpus import GPUS
from .probe import cache_file, cpu_name, faster, load_per_core, read_cache, seconds_per_call, significant, write_cache

log = logging.getLogger(__name__)

FIXED = "XTRAIN_CPU_PEAK"
CACHE_NAME = "cpu-peak.json"
# Square sizes the library times, and its windows per size. bench/bench_matmul_peak.py on this 2-core machine
# (BENCHMARKS.md, "Efficiency against this CPU's peak"): under load the fastest size was 2048² in both precisions;
# at the quietest moment seen bf16 read fastest at 512² (a size that suffers most from a neighbour's load: every call
# waits for both threads). 4096² reached no more and takes seconds a call in fp32. About 4 s per precision, once.
PEAK_SIZES = (512, 1024, 2048)
PEAK_WINDOWS = 5
PEAK_WINDOW_SECONDS = 0.2


def peak_key(precision: str, threads: int) -> str:
    import torch

    return f"{cpu_name()}|{threads} threads|torch {torch.__version__}|{precision}|peak"


def matmul_rate(precision: str, size: int, threads: int, windows: int = PEAK_WINDOWS,
                window: float = PEAK_WINDOW_SECONDS) -> float:
    """FLOP/s of a `size` × `size` square matmul on `threads` threads: the best of `windows` windows, each at least
    `window` seconds after a warm-up call (the best, so a neighbour's load weighs less)."""
    import torch

    from .memory import torch_dtype

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dtype = torch_dtype(precision)
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        return max(2 * size**3 / seconds_per_call(lambda: a @ b, window) for _ in range(windows))
    finally:
        torch.set_num_threads(previous)


def measure_peak(precision: str, threads: int) -> dict[str, float]:
    """The fastest of PEAK_SIZES, its size, and the machine's load while it was measured."""
    rate, size = max((matmul_rate(precision, size, threads), size) for size in PEAK_SIZES)
    return {"matmul_flops": significant(rate), "size": size, "load_per_core": load_per_core()}


def cached_cpu_peak(precision: str, threads: int) -> dict[str, Any]:
    """This CPU's recorded peak in `precision` on `threads` threads, measured (and recorded) only the first time."""
    if os.environ.get(FIXED):
        return {"matmul_flops": fixed_peak(os.environ[FIXED], precision), "source": FIXED}
    path, key = cache_file(CACHE_NAME), peak_key(precision, threads)
    entries = read_cache(path)
    if key not in entries:
        log.info("measuring this CPU's %s matmul peak on %d threads, once (recorded in %s)", precision, threads, path)
        entries[key] = measure_peak(precision, threads)
        write_cache(entries, path)
    return {**entries[key], "source": str(path)}


def fixed_peak(text: str, precision: str) -> float:
    """XTRAIN_CPU_PEAK's figure for `precision`: one FLOP/s for every precision, or `bf16=...,fp32=...`."""
    try:
        if "=" not in text:
            return float(text)
        figures = {name.strip(): float(value) for name, value in (part.split("=") for part in text.split(","))}
    except ValueError:
        raise SystemExit(f"{FIXED}={text!r}: give '<FLOP/s>' or 'bf16=<FLOP/s>,fp32=<FLOP/s>', e.g. 2e11") from None
    if precision not in figures:
        raise SystemExit(f"{FIXED}={text!r} gives no figure for {precision}: add {precision}=<FLOP/s>")
    return figures[precision]


def device_peak(device: str, precision: str, devices: int, nodes: int) -> dict[str, Any]:
    """The peak FLOP/s the run's devices offer together in `precision`, and where it came from (`flops` None where
    none is known). `device` is plan.json's `memory.device`: a GPU model of `xtrain.models.gpus`, or `cpu`, whose
    peak is this machine's on the threads torch trains with here, once per node."""
    if device == "cpu":
        import torch

        threads = torch.get_num_threads()
        peak = cached_cpu_peak(precision, threads)
        measured = (f"measured, {peak['size']}² matmuls, load {peak['load_per_core']:g} per core; {peak['source']}"
                    if "size" in peak else f"given by {FIXED}")
        return {"flops": peak["matmul_flops"] * nodes,
                "source": f"this CPU's {precision} matmul peak on {threads} threads ({measured})"
                          + (f" × {nodes} nodes" if nodes > 1 else "")}
    gpu = GPUS.get(device)
    if gpu is None:  # a device the table does not name: no peak to take MFU over, but the run's metrics still written
        return {"flops": None, "source": f"no peak for device {device!r} in xtrain.models.gpus"}
    if precision == "fp32":  # the table holds 16-bit tensor-core peaks only
        return {"flops": None, "source": f"no fp32 peak for {device} in xtrain.models.gpus (16-bit only)"}
    return {"flops": gpu.peak_tflops_16bit * 1e12 * devices,
            "source": f"datasheet: {device}, {gpu.peak_tflops_16bit:g} TFLOP/s dense {precision}"
                      + (f" × {devices} devices" if devices > 1 else "")}


def utilisation(tokens_per_second: float | None, flops_per_token: float, peak: dict[str, Any]) -> float | None:
    """Model FLOPs utilisation: the FLOP/s training reached (tokens/s × FLOPs per token) over the devices' peak."""
    if not tokens_per_second or not peak["flops"]:
        return None
    return round(tokens_per_second * flops_per_token / peak["flops"], 4)


def train_efficiency(tokens_per_second: float | None, plan) -> dict[str, Any]:
    """train_metrics.json's MFU fields for a run of `plan` (a `Plan`) that trained at `tokens_per_second`."""
    peak = device_peak(plan.memory.device, plan.precision, plan.layout.devices, plan.layout.nodes)
    mfu = utilisation(tokens_per_second, plan.time.flops_per_token, peak)
    if mfu is not None and mfu > 1:  # a CPU peak recorded while the machine was busy reads low
        log.warning("model FLOPs utilisation %.2f is above 1: the peak (%s) reads low; measure it again on a quiet "
                    "machine with `python -m xtrain.plan.peak --refresh`", mfu, peak["source"])
    return {"mfu": mfu,
            "mfu_flops_per_token": plan.time.flops_per_token, "mfu_peak_flops": peak["flops"],
            "mfu_peak_source": peak["source"]}


def refresh() -> list[str]:
    """Measure every recorded peak again, and bf16's and fp32's on every core; keep the faster of the recorded and the
    new. One line per peak, saying what changed."""
    path = cache_file(CACHE_NAME)
    entries, lines = read_cache(path), [f"load {load_per_core()} per core before measuring"]
    keys = dict.fromkeys([*entries, *(peak_key(p, os.cpu_count() or 1) for p in ("bf16", "fp32"))])
    for key in keys:
        _, threads, _, precision, _ = key.split("|")
        new = measure_peak(precision, int(threads.split()[0]))
        old = entries.get(key)
        entries[key] = faster(old, new) if old else new
        change = (f"recorded {old['matmul_flops']:.2g} FLOP/s, now {new['matmul_flops']:.2g}: kept the "
                  f"{'new' if entries[key] is new else 'recorded'}") if old else f"{new['matmul_flops']:.2g} FLOP/s"
        lines.append(f"{key}: {change} (size {new['size']}, load {new['load_per_core']} per core)")
    write_cache(entries, path)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description="Show, or measure again, this CPU's recorded matmul peaks.")
    parser.add_argument("--refresh", action="store_true",
                        help="measure this CPU's peaks (again), keep the faster of the recorded and the new")
    args = parser.parse_args()
    if args.refresh:
        print("\n".join(refresh()))
    else:
        entries = read_cache(cache_file(CACHE_NAME))
        print(json.dumps(entries, indent=1, sort_keys=True) if entries else f"no peak in {cache_file(CACHE_NAME)}")


if __name__ == "__main__":
    main()
