"""How long a training step takes on the target device: FLOPs over throughput, plus per-op overhead.

A step costs its matmul FLOPs (counted by the trace, or 6·N per token for a full fine-tune and
4·N + 2·trainable for LoRA, plus attention and checkpointing's recomputed forward) at a share of the
device's peak, plus a fixed cost per dispatched op, which is what dominates small models on a CPU.

GPU peaks come from `xtrain.gpus`. A CPU's are measured by a short probe (a matmul at the model's width
and a run of small autograd ops), cached per machine, CPU count, torch version and shape, and rounded to
two significant figures: a plan rerun on the same machine reads the same numbers and stays byte-identical.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from ..gpus import GPUS
from ..recipe import Hardware

# Share of the probed matmul rate a CPU training step reaches, and the cost of one dispatched op in
# units of the probed bare-op time (autograd, module hooks and Python around each op); fitted by
# bench/bench_plan.py on the tiny and the 27M model on a quiet machine. bf16 autocast reaches half the
# share fp32 does: it keeps fp32 master weights and casts each one to bf16 again in every pass.
CPU_MATMUL_EFFICIENCY = {"fp32": 0.75, "bf16": 0.38}
CPU_OP_COST_FACTOR = 4.0
# Model FLOPs utilisation a tuned GPU training step reaches, and a kernel launch per op.
GPU_MFU = {"cuda": 0.4, "rocm": 0.35}
GPU_OP_SECONDS = 8e-6
PROBE_ROWS = 2048  # rows of the probe matmul: a micro-batch's tokens, as training multiplies them
PROBE_SECONDS = 0.5  # per measurement, split in five windows
BUSY_LOAD = 0.5  # load average per core above which a probe may have read the neighbours, not the device


def flops_per_token(params: dict, seq_len: int, checkpointing: bool) -> float:
    """Analytical training FLOPs per token: matmuls forward and backward, attention, recomputation."""
    n, trainable = params["total"], params["trainable"]
    # Forward 2N; backward 2N for input gradients plus 2 per trainable weight for weight gradients.
    dense = 4 * n + 2 * trainable
    attention = 12 * params["layers"] * params["hidden_size"] * seq_len  # scores and values, both passes
    recompute = (2 * n + 4 * params["layers"] * params["hidden_size"] * seq_len) if checkpointing else 0
    return dense + attention + recompute


def device_rates(hardware: Hardware, precision: str, width: int) -> dict[str, float | str]:
    """FLOP/s one device reaches in training matmuls, seconds per dispatched op, and where they came from."""
    if hardware.accelerator != "cpu":
        gpu = GPUS[hardware.gpu]
        return {"matmul_flops": gpu.peak_tflops_16bit * 1e12 * GPU_MFU[hardware.accelerator],
                "op_seconds": GPU_OP_SECONDS, "source": f"peak table: {hardware.gpu} x MFU {GPU_MFU[hardware.accelerator]}"}
    cpus = max(1, cpu_count(hardware) // hardware.processes)  # a CPU device is one process's share of the cores
    probe = cached_cpu_probe(precision, width, cpus)
    efficiency = CPU_MATMUL_EFFICIENCY[precision]
    return {"matmul_flops": probe["matmul_flops"] * efficiency,
            "op_seconds": probe["op_seconds"] * CPU_OP_COST_FACTOR,
            "source": f"cpu probe ({cpus} threads, {precision}, width {width}) x efficiency {efficiency}"}


def cpu_count(hardware: Hardware) -> int:
    return hardware.cpus or os.cpu_count() or 1


def cpu_supports_bf16() -> bool:
    """Native bf16 matmuls (AVX512-BF16 or AMX); elsewhere CPU bf16 is emulated and slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def cached_cpu_probe(precision: str, width: int, cpus: int) -> dict[str, float]:
    """The probe's figures for this machine, measured once and then read from the cache; a probe taken while
    the machine was busy (load above BUSY_LOAD per core) is taken again on a quieter machine, and the
    faster figures are kept, so one plan made under load does not slow every later plan's prediction."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "xtrain" / "cpu-probe.json"
    import torch

    key = f"{cpu_name()}|{cpus} threads|torch {torch.__version__}|{precision}|width {width}"
    entries = json.loads(cache.read_text()) if cache.is_file() else {}
    cached, load = entries.get(key), load_per_core()
    if cached is None or (cached.get("load_per_core", 0) > BUSY_LOAD and load < cached["load_per_core"]):
        fresh = {name: significant(value) for name, value in probe_cpu(precision, width, cpus).items()}
        entries[key] = {**fresh, "load_per_core": load} if cached is None else faster(cached, {**fresh, "load_per_core": load})
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
        tmp.replace(cache)
    return entries[key]


def load_per_core() -> float:
    """The 1-minute load average per core (two significant figures): how busy the machine is while it is probed."""
    return significant(os.getloadavg()[0] / (os.cpu_count() or 1))


def faster(old: dict[str, float], new: dict[str, float]) -> dict[str, float]:
    """Of two probes, the one with the higher matmul rate: a busy machine only ever reads slow."""
    return new if new["matmul_flops"] > old["matmul_flops"] else {**old, "load_per_core": new["load_per_core"]}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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


def seconds_per_call(fn) -> float:
    fn()
    calls, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < PROBE_SECONDS / 5:
        fn()
        calls += 1
    return elapsed / max(calls, 1)
