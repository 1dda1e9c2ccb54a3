"""How long a training step takes on the target device: FLOPs over throughput, plus per-op overhead.

A step costs its matmul FLOPs (counted by the trace, or 6·N per token for a full fine-tune and
4·N + 2·trainable for LoRA, plus attention and checkpointing's recomputed forward) at a share of the
device's peak, plus a fixed cost per dispatched op, which is what dominates small models on a CPU.

GPU peaks come from `xtrain.models.gpus`. A CPU's come from the machine's recorded probe (`probe`): measured once,
then read, so a plan rerun on the same machine reads the same numbers and stays byte-identical, whatever
the load; the figures a plan used are in plan.json (`time.cpu_probe`).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..models.gpus import GPUS
from ..recipe import Hardware
from .probe import cached_cpu_probe, cached_memory_bandwidth

# Share of the probed matmul rate a CPU training step reaches, and the cost of one dispatched op in
# units of the probed bare-op time (autograd, module hooks and Python around each op); fitted by
# bench/bench_plan.py on the tiny and the 27M model on a quiet machine. bf16 autocast reaches half the
# share fp32 does: it keeps fp32 master weights and casts each one to bf16 again in every pass.
CPU_MATMUL_EFFICIENCY = {"fp32": 0.75, "bf16": 0.38}
# A full fine-tune in bf16 reaches a share of its own: its weight gradients are large matmuls where an adapter's are
# rank-r slivers, and it casts and updates every weight. Fitted by bench/fit_cpu_efficiency.py on two quiet runs of
# 2026-12-07 17:08 UTC that the check does not include (SmolLM2's full-512 and the 27M's full-512 of
# bench_plan_real.py: 0.42 and 0.41 needed), checked on the issue's seven rows (BENCHMARKS.md, "The full fine-tune's
# share on a Zen 5 host"); fp32 has no full-fine-tune fit of its own. The share is the host's: an earlier host of this
# project (also "AMD EPYC", an earlier generation: half this one's bf16 probe) needed 0.49-0.57; 0.53 was fitted there.
CPU_FULL_BF16_EFFICIENCY = 0.42
CPU_OP_COST_FACTOR = 4.0
# Model FLOPs utilisation a tuned GPU training step reaches, and a kernel launch per op.
GPU_MFU = {"cuda": 0.4, "rocm": 0.35}
GPU_OP_SECONDS = 8e-6
# QLoRA on a CPU: what a LoRA layer's forward and backward costs more over bitsandbytes' 4-bit base (Linear4bit,
# nf4, compute dtype bf16) than over the same base in bf16, per base weight, paid each time a step dequantizes a layer
# (its forward, its input's gradient, and the forward again under gradient checkpointing). bench/bench_dequantize.py,
# quiet, 2026-12-07, two runs: 0.69 and 2.07 ns on SmolLM2's 576 x 576 layers, 1.74 and 1.08 on its 1536 x 576
# ones (of which the dequantize_4bit kernel itself is 0.1); 1.3-1.5 weighted by SmolLM2's layers. Checked on whole
# runs it did not see (BENCHMARKS.md, "The plan on a machine nobody set up"). On GPUs the cost is not modelled.
CPU_QUANTIZED_SECONDS_PER_WEIGHT = 1.5e-9


def quantized_layer_seconds(quantized_weights: int, checkpointing: bool, accelerator: str) -> float:
    """Seconds one QLoRA micro-step spends more on its 4-bit base than on a bf16 one (0 where it is not modelled)."""
    if accelerator != "cpu":
        return 0.0
    return (3 if checkpointing else 2) * quantized_weights * CPU_QUANTIZED_SECONDS_PER_WEIGHT


def flops_per_token(params: dict, seq_len: int, checkpointing: bool) -> float:
    """Analytical training FLOPs per token: matmuls forward and backward, attention over `seq_len` tokens (a packed
    micro-batch's whole length), recomputation."""
    n, trainable = params["total"], params["trainable"]
    # Forward 2N; backward 2N for input gradients plus 2 per trainable weight for weight gradients.
    dense = 4 * n + 2 * trainable
    attention = 12 * params["layers"] * params["hidden_size"] * seq_len  # scores and values, both passes
    recompute = (2 * n + 4 * params["layers"] * params["hidden_size"] * seq_len) if checkpointing else 0
    return dense + attention + recompute


def device_rates(hardware: Hardware, precision: str, width: int, full: bool = False) -> dict[str, float | str]:
    """FLOP/s one device reaches in training matmuls (of every weight, `full`, or of adapters over a frozen base),
    seconds per dispatched op, the bytes per second it reads weights from memory at (what bounds decoding:
    plan.generation), and where they came from."""
    if hardware.accelerator != "cpu":
        gpu = GPUS[hardware.gpu]
        return {"matmul_flops": gpu.peak_tflops_16bit * 1e12 * GPU_MFU[hardware.accelerator],
                "op_seconds": GPU_OP_SECONDS, "memory_bytes_per_second": memory_bytes_per_second(hardware, width),
                "accelerator": hardware.accelerator,
                "source": f"peak table: {hardware.gpu} x MFU {GPU_MFU[hardware.accelerator]}"}
    cpus = max(1, cpu_count(hardware) // hardware.processes)  # a CPU device is one process's share of the cores
    probe = {**cached_cpu_probe(precision, width, cpus), "memory_bytes_per_second": cached_memory_bandwidth(width, cpus)}
    efficiency = CPU_FULL_BF16_EFFICIENCY if full and precision == "bf16" else CPU_MATMUL_EFFICIENCY[precision]
    return {"matmul_flops": probe["matmul_flops"] * efficiency,
            "op_seconds": probe["op_seconds"] * CPU_OP_COST_FACTOR,
            "memory_bytes_per_second": probe["memory_bytes_per_second"], "accelerator": "cpu",
            "source": f"cpu probe ({cpus} threads, {precision}, width {width}) x efficiency {efficiency}",
            "cpu_probe": probe}


def memory_bytes_per_second(hardware: Hardware, width: int, processes: int | None = None) -> float:
    """The rate one device reads weights from memory: a GPU's datasheet bandwidth, or the CPU's recorded memory probe
    on its share of the cores (`processes` processes sharing them; the hardware's own count by default)."""
    if hardware.accelerator != "cpu":
        return GPUS[hardware.gpu].memory_tbs * 1e12
    return cached_memory_bandwidth(width, max(1, cpu_count(hardware) // (processes or hardware.processes)))


def cpu_count(hardware: Hardware) -> int:
    return hardware.cpus or os.cpu_count() or 1


def cpu_supports_bf16() -> bool:
    """Native bf16 matmuls (AVX512-BF16 or AMX); elsewhere CPU bf16 is emulated and slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags
