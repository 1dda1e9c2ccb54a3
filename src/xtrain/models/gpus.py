"""Known accelerators: memory, peak dense throughput and 16-bit support, for the recipe and the plan.

A plain table with no torch import, so the recipe schema can name its keys. Peaks are the vendors'
dense (no sparsity) tensor-core figures with fp32 accumulation; memory is what torch reports as the
device's total, which is a little under the marketed size; bandwidth is the datasheet's peak memory bandwidth,
which bounds a decode step that reads every weight once per new token (plan.generation).
"""

from __future__ import annotations

from typing import NamedTuple


class Gpu(NamedTuple):
    vendor: str  # the recipe's hardware.accelerator that drives it: cuda or rocm
    memory_gib: float
    peak_tflops_16bit: float  # bf16 where supported, else fp16
    bf16: bool
    compute_capability: tuple[int, int]  # torch's get_device_properties major.minor (ROCm: the gfx version)
    memory_tbs: float  # peak memory bandwidth, TB/s (10^12 bytes a second), of the board named


GPUS: dict[str, Gpu] = {
    "h200": Gpu("cuda", 139.8, 989, True, (9, 0), 4.8),
    "h100": Gpu("cuda", 79.2, 989, True, (9, 0), 3.35),
    "h100_pcie": Gpu("cuda", 79.2, 756, True, (9, 0), 2.0),
    "a100": Gpu("cuda", 79.2, 312, True, (8, 0), 2.039),
    "a100_40gb": Gpu("cuda", 39.4, 312, True, (8, 0), 1.555),
    "l40s": Gpu("cuda", 44.4, 362, True, (8, 9), 0.864),
    "rtx4090": Gpu("cuda", 23.6, 165, True, (8, 9), 1.008),
    "rtx3090": Gpu("cuda", 23.6, 71, True, (8, 6), 0.936),
    "v100": Gpu("cuda", 31.7, 125, False, (7, 0), 0.9),
    "t4": Gpu("cuda", 14.6, 65, False, (7, 5), 0.32),
    "mi300x": Gpu("rocm", 191.5, 1307, True, (9, 4), 5.3),  # gfx942
    "mi250x": Gpu("rocm", 127.98, 383, True, (9, 0), 3.2768),  # gfx90a
}
# What a recipe that names no gpu_model is planned for.
DEFAULT_GPU = {"cuda": "h100", "rocm": "mi300x"}


def probed_capabilities(name: str) -> dict[str, bool | str]:
    """What a framework's start-up probe of this GPU answers (Axolotl's `gpu_capabilities`, transformers'
    `is_torch_bf16_gpu_available` / `is_torch_tf32_available`), so a config can be validated as that GPU's node
    would validate it: fp8 from compute capability 9.0 (Axolotl's rule), tf32 on CUDA from 8.0 (ROCm: never)."""
    gpu = GPUS[name]
    major, minor = gpu.compute_capability
    return {"bf16": gpu.bf16, "fp8": (major, minor) >= (9, 0), "tf32": gpu.vendor == "cuda" and major >= 8,
            "compute_capability": f"sm_{major}{minor}"}
