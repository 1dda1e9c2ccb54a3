"""What a QLoRA step pays on this CPU to dequantize its 4-bit base: seconds per weight of bitsandbytes'
`dequantize_4bit` (nf4 and fp4, with and without double quantization) into fp32 and bf16, on layers of
SmolLM2-135M's shapes (576 x 576, 576 x 1536) and a 7B one's (4096 x 11008).

    .venv/bin/python bench/bench_dequantize.py        # ~2 min, 2 cores

The plan (plan/speed.py, DEQUANTIZE_SECONDS_PER_WEIGHT) charges this per quantized weight for each time a
step dequantizes it: once in the forward, once in the backward (the input's gradient), once more when the
forward is recomputed under gradient checkpointing.
"""

from __future__ import annotations

import time

import bitsandbytes.functional as F
import torch

SHAPES = [(576, 576), (1536, 576), (11008, 4096)]
WINDOWS = 5


def seconds_per_weight(shape, quant_type: str, double: bool, dtype) -> float:
    weight = torch.randn(shape, dtype=dtype)
    packed, state = F.quantize_4bit(weight, quant_type=quant_type, compress_statistics=double)
    F.dequantize_4bit(packed, state)  # warm up
    best = float("inf")
    for _ in range(WINDOWS):  # the quickest window: the machine is shared, slower ones measure the others' load
        calls, started = 0, time.perf_counter()
        while time.perf_counter() - started < 0.3:
            F.dequantize_4bit(packed, state)
            calls += 1
        best = min(best, (time.perf_counter() - started) / calls)
    return best / weight.numel()


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| shape | quant | double quant | dtype | ns per weight |")
    print("| --- | --- | --- | --- | --- |")
    for shape in SHAPES:
        for quant_type in ("nf4", "fp4"):
            for double in (True, False):
                for dtype in (torch.float32, torch.bfloat16):
                    ns = seconds_per_weight(shape, quant_type, double, dtype) * 1e9
                    print(f"| {shape[0]} x {shape[1]} | {quant_type} | {double} | {str(dtype)[6:]} | {ns:.2f} |",
                          flush=True)


if __name__ == "__main__":
    main()
