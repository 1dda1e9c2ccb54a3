"""The CPU probe: what this machine's cores do per second in a training step's matmuls and small ops, and how fast
they stream weights from memory (what bounds decoding a model whose weights do not fit the caches).

Measured once per machine, CPU count, torch version, precision and model width (the memory figure: in fp32 whatever
the precision), rounded to two significant figures and recorded in the cache
(`$XDG_CACHE_HOME/xtrain/cpu-probe.json`); every later plan reads the record, never the machine's current load, so
planning a recipe twice gives the same plan.json. The record is taken again only by `python -m xtrain.plan.probe
--refresh`, which says whether the machine looked busy and keeps the faster figures (a busy machine only ever reads
slow). `XTRAIN_CPU_PROBE="<matmul FLOP/s>,<seconds per op>[,<memory bytes/s>]"` gives fixed figures instead (the
tests use it; it also plans for another machine's CPU); without the third figure the memory bandwidth is
`DEFAULT_MEMORY_BYTES_PER_SECOND`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

PROBE_ROWS = 2048  # rows of the probe matmul: a micro-batch's tokens, as training multiplies them
PROBE_SECONDS = 0.5  # per measurement, split in five windows
BUSY_LOAD = 0.5  # load average per core above which a probe may have read the neighbours, not the device
FIXED = "XTRAIN_CPU_PROBE"
# The memory probe streams this many bytes of fp32 weights per call through one-row matmuls (`F.linear`, as a decode
# step multiplies each new token), in matrices of the model's width as input features (the rate depends on it: one
# thread here streams 512-wide rows at 1.0e10 bytes/s, 2048-wide at 1.7e10) and at least MEMORY_PROBE_OUT outputs
# (so that a small width is not read through per-call overhead): more than a server CPU's last-level cache, so the
# figure is the rate weights come from memory, as decoding a model that does not fit the caches reads them.
MEMORY_PROBE_BYTES = 256 * 2**20
MEMORY_PROBE_OUT = 2048
# The memory bandwidth an XTRAIN_CPU_PROBE without a third figure plans with: about one core's rate (this 2-core
# AMD EPYC streams 1.1e10 bytes a second on one thread by the probe above).
DEFAULT_MEMORY_BYTES_PER_SECOND = 1.0e10


def cache_file(name: str = "cpu-probe.json") -> Path:
    """A record of this machine's figures in xtrain's cache folder (the probe's; `peak` keeps its own beside it)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "xtrain" / name


def probe_key(precision: str, width: int, cpus: int) -> str:
    import torch

    return f"{cpu_name()}|{cpus} threads|torch {torch.__version__}|{precision}|width {width}"


def memory_key(width: int, cpus: int) -> str:
    import torch

    return f"{cpu_name()}|{cpus} threads|torch {torch.__version__}|width {width}|memory"


def cached_memory_bandwidth(width: int, cpus: int) -> float:
    """The recorded bytes per second `cpus` threads stream a model of this width's weights from memory at, measured
    only the first time (a record of its own beside the probe's: older records, and plans from them, stand)."""
    if os.environ.get(FIXED):
        return fixed_probe(os.environ[FIXED])["memory_bytes_per_second"]
    key, entries = memory_key(width, cpus), read_cache()
    if key not in entries:
        entries[key] = measure_memory(width, cpus)
        write_cache(entries)
    return entries[key]["memory_bytes_per_second"]


def cached_cpu_probe(precision: str, width: int, cpus: int) -> dict[str, float]:
    """The recorded probe figures for this machine and shape, measured (and recorded) only the first time."""
    if os.environ.get(FIXED):
        return fixed_probe(os.environ[FIXED])
    key, entries = probe_key(precision, width, cpus), read_cache()
    if key not in entries:
        entries[key] = measure(precision, width, cpus)
        write_cache(entries)
    return entries[key]


def fixed_probe(text: str) -> dict[str, float]:
    """XTRAIN_CPU_PROBE's figures; a memory bandwidth it does not give is DEFAULT_MEMORY_BYTES_PER_SECOND (the
    two-figure form predates the memory probe)."""
    try:
        matmul, op, *memory = (float(part) for part in text.split(","))
        if len(memory) > 1:
            raise ValueError
    except ValueError:
        raise SystemExit(f"{FIXED}={text!r}: give '<matmul FLOP/s>,<seconds per op>[,<memory bytes/s>]', e.g. "
                         "1.5e11,2e-6 or 1.5e11,2e-6,1e10") from None
    return {"matmul_flops": matmul, "op_seconds": op,
            "memory_bytes_per_second": memory[0] if memory else DEFAULT_MEMORY_BYTES_PER_SECOND}


def refresh() -> list[str]:
    """Measure every recorded probe again; keep the faster figures. One line per probe, saying what changed."""
    entries, lines = read_cache(), []
    load = load_per_core()
    busy = f"the machine looks busy (load {load} per core): figures may read slow" if load > BUSY_LOAD else (
        f"the machine looks quiet (load {load} per core)")
    for key, old in entries.items():
        *_, precision, width = key.split("|")
        cpus = int(key.split("|")[1].split()[0])
        if width == "memory":
            new = measure_memory(int(precision.split()[1]), cpus)  # its key's last but one field is the width
            entries[key] = faster(old, new, "memory_bytes_per_second")
            kept = "new" if entries[key] is new else "recorded"
            lines.append(f"{key}: recorded {old['memory_bytes_per_second']:.2g} bytes/s, now "
                         f"{new['memory_bytes_per_second']:.2g}: kept the {kept}")
            continue
        new = measure(precision, int(width.split()[1]), cpus)
        entries[key] = faster(old, new)
        kept = "new" if entries[key] is new else "recorded"
        lines.append(f"{key}: recorded {old['matmul_flops']:.2g} FLOP/s, now {new['matmul_flops']:.2g}: kept the {kept}")
    write_cache(entries)
    return [busy, *lines] if lines else [busy, f"no probe recorded in {cache_file()} yet: plan a recipe first"]


def measure(precision: str, width: int, cpus: int) -> dict[str, float]:
    return {**{name: significant(value) for name, value in probe_cpu(precision, width, cpus).items()},
            "load_per_core": load_per_core()}


def measure_memory(width: int, cpus: int) -> dict[str, float]:
    return {"memory_bytes_per_second": significant(probe_memory(width, cpus)), "load_per_core": load_per_core()}


def read_cache(path: Path | None = None) -> dict[str, dict[str, float]]:
    path = path or cache_file()
    return json.loads(path.read_text()) if path.is_file() else {}


def write_cache(entries: dict, path: Path | None = None) -> None:
    path = path or cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
    tmp.replace(path)


def load_per_core() -> float:
    """The 1-minute load average per core (two significant figures): how busy the machine is while it is probed."""
    return significant(os.getloadavg()[0] / (os.cpu_count() or 1))


def faster(old: dict[str, float], new: dict[str, float], figure: str = "matmul_flops") -> dict[str, float]:
    """Of two records, the one with the higher rate `figure`: a busy machine only ever reads slow."""
    return new if new[figure] > old[figure] else {**old, "load_per_core": new["load_per_core"]}


def cpu_name() -> str:
    """The CPU as /proc/cpuinfo names it, with its family, model and stepping where it gives them: a virtual machine's
    model name can be generic ("AMD EPYC" on two generations of host, whose bf16 probes differ 2x: BENCHMARKS.md,
    "Attention on the CPU"), and a home folder shared by a cluster's nodes holds one record for all of them."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
                      if ":" in line)
    except OSError:
        fields = {}
    fields = {name.strip(): value.strip() for name, value in fields.items()}
    if "model name" not in fields:
        return platform.processor() or platform.machine()
    generation = ", ".join(f"{name} {fields[name]}" for name in ("cpu family", "model", "stepping") if name in fields)
    return f"{fields['model name']} ({generation})" if generation else fields["model name"]


def significant(value: float, digits: int = 2) -> float:
    return float(f"{value:.{digits - 1}e}")


def probe_cpu(precision: str, width: int, cpus: int) -> dict[str, float]:
    """Best-of-five matmul FLOP/s at the model's width, and seconds per small autograd op.

    The best of several short windows rather than one long one: on a shared machine it reads the
    device, not the neighbours' load."""
    import torch

    from .memory import torch_dtype

    threads = torch.get_num_threads()
    torch.set_num_threads(cpus)
    try:
        dtype = torch_dtype(precision)
        a, b = torch.randn(PROBE_ROWS, width, dtype=dtype), torch.randn(width, width, dtype=dtype)
        matmul = max(2 * PROBE_ROWS * width * width / seconds_per_call(lambda: a @ b) for _ in range(5))
        x = torch.randn(64, requires_grad=True)
        op = min(seconds_per_call(lambda: x * 2.0) for _ in range(5))
    finally:
        torch.set_num_threads(threads)
    return {"matmul_flops": matmul, "op_seconds": op}


def probe_memory(width: int, cpus: int) -> float:
    """Best-of-five bytes per second one-row matmuls stream fp32 weights of `width` input features at, over
    MEMORY_PROBE_BYTES of them.

    Weights as a decode step reads them (a row per sequence, every weight once), not a plain sum over a buffer: on
    this 2-core EPYC one thread sums memory at 2.8e10 bytes/s but multiplies one row by it at 1.1e10, and the latter
    is what decoding costs per byte (BENCHMARKS.md, "GRPO: plan vs measured")."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(cpus)
    try:
        out = max(4 * width, MEMORY_PROBE_OUT)
        count = max(1, MEMORY_PROBE_BYTES // (out * width * 4))
        weights = [torch.ones(out, width) for _ in range(count)]
        row = torch.ones(1, width)

        def stream():
            for weight in weights:
                torch.nn.functional.linear(row, weight)

        with torch.no_grad():
            return max(count * weights[0].nbytes / seconds_per_call(stream) for _ in range(5))
    finally:
        torch.set_num_threads(threads)


def seconds_per_call(fn, window: float = PROBE_SECONDS / 5) -> float:
    """Seconds per call of `fn` over one window of at least `window` seconds (one call at least), after a warm-up."""
    fn()
    calls, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < window:
        fn()
        calls += 1
    return elapsed / max(calls, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description="Show, or measure again, this machine's recorded CPU probe.")
    parser.add_argument("--refresh", action="store_true", help="measure every recorded probe again, keep the faster")
    args = parser.parse_args()
    if args.refresh:
        print("\n".join(refresh()))
    else:
        print(json.dumps(read_cache(), indent=1, sort_keys=True) if read_cache() else f"no probe in {cache_file()}")


if __name__ == "__main__":
    main()
