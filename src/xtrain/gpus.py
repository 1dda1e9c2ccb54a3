"""Known accelerators: memory, peak dense throughput and 16-bit support, for the recipe and the plan.

A plain table with no torch import, so the recipe schema can name its keys. Peaks are the vendors'
dense (no sparsity) tensor-core figures with fp32 accumulation; memory is what torch reports as the
device's total, which is a little under the marketed size.
"""

from __future__ import annotations

from typing import NamedTuple


class Gpu(NamedTuple):
    vendor: str  # the recipe's hardware.accelerator that drives it: cuda or rocm
    memory_gib: float
    peak_tflops_16bit: float  # bf16 where supported, else fp16
    bf16: bool


GPUS: dict[str, Gpu] = {
    "h200": Gpu("cuda", 139.8, 989, True),
    "h100": Gpu("cuda", 79.2, 989, True),
    "h100_pcie": Gpu("cuda", 79.2, 756, True),
    "a100": Gpu("cuda", 79.2, 312, True),
    "a100_40gb": Gpu("cuda", 39.4, 312, True),
    "l40s": Gpu("cuda", 44.4, 362, True),
    "rtx4090": Gpu("cuda", 23.6, 165, True),
    "rtx3090": Gpu("cuda", 23.6, 71, True),
    "v100": Gpu("cuda", 31.7, 125, False),
    "t4": Gpu("cuda", 14.6, 65, False),
    "mi300x": Gpu("rocm", 191.5, 1307, True),
    "mi250x": Gpu("rocm", 127.98, 383, True),
}
# What a recipe that names no gpu_model is planned for.
DEFAULT_GPU = {"cuda": "h100", "rocm": "mi300x"}
