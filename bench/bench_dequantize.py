"""What a QLoRA step pays on this CPU for its 4-bit base: seconds per weight of bitsandbytes' `dequantize_4bit`
(nf4 and fp4, with and without double quantization) into fp32 and bf16, on layers of SmolLM2-135M's shapes
(576 x 576, 576 x 1536) and a 7B one's (4096 x 11008); then, per layer shape, what a LoRA layer's forward and
backward under bf16 autocast costs more over a 4-bit nf4 base (bitsandbytes' Linear4bit, compute dtype bf16) than
over the same base in bf16, on 960 tokens (SmolLM2's micro-batch of 8 rows of ~120 tokens), per base weight and
pass: the kernel's own cost and everything around it (the 4-bit layer's dispatch, its casts).

    .venv/bin/python bench/bench_dequantize.py        # ~3 min, 2 cores

The plan (plan/speed.py, CPU_QUANTIZED_SECONDS_PER_WEIGHT) charges the layer's extra cost per quantized weight for
each time a step dequantizes it: once in the forward, once in the backward (the input's gradient), once more when
the forward is recomputed under gradient checkpointing.
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


def layer_seconds(layer: torch.nn.Module, tokens: torch.Tensor) -> float:
    """The quickest window's seconds per forward + backward of `layer` (a LoRA-wrapped linear) on `tokens`."""
    best = float("inf")
    for _ in range(WINDOWS + 1):  # the first window warms up
        calls, started = 0, time.perf_counter()
        while time.perf_counter() - started < 0.5:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                layer(tokens).float().sum().backward()
            calls += 1
        best = min(best, (time.perf_counter() - started) / calls)
    return best


def lora_layer(out_features: int, in_features: int, quantized: bool) -> torch.nn.Module:
    """A PEFT LoRA (r 16) over a frozen base linear: bitsandbytes' nf4 Linear4bit, or the same weights in bf16."""
    import bitsandbytes as bnb
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = torch.nn.Linear(in_features, out_features, bias=False)
    if quantized:
        four_bit = bnb.nn.Linear4bit(in_features, out_features, bias=False, compute_dtype=torch.bfloat16,
                                     quant_type="nf4")
        four_bit.weight = bnb.nn.Params4bit(base.weight.data, requires_grad=False, quant_type="nf4")
        base = four_bit.to("cpu")
    else:
        base = base.to(torch.bfloat16)
    model = torch.nn.Sequential(base)
    return get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["0"]))


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
    print("\n| shape | LoRA over bf16 base, ms | LoRA over nf4 base, ms | extra ns per base weight and pass |")
    print("| --- | --- | --- | --- |")
    for out_features, in_features in SHAPES[:2]:
        tokens = torch.randn(960, in_features, requires_grad=True)
        plain, four_bit = (layer_seconds(lora_layer(out_features, in_features, quantized), tokens)
                           for quantized in (False, True))
        extra = (four_bit - plain) / (2 * out_features * in_features) * 1e9  # forward and input-gradient passes
        print(f"| {out_features} x {in_features} | {plain * 1e3:.2f} | {four_bit * 1e3:.2f} | {extra:.2f} |", flush=True)


if __name__ == "__main__":
    main()
