"""Predicted vs measured peak GPU memory for a ~0.5B model: one call on a machine with one CUDA/ROCm GPU.

    .venv/bin/python bench/gpu_check_plan.py [--gpu-model h200]     # ~3-5 min; needs no network

For a session that has a GPU (this project's GPU machine is one H200). It builds a Qwen2.5-0.5B-shaped
Llama (hidden 896, 24 layers, 14 heads / 2 KV heads, intermediate 4864, vocab 151936, tied; 494M
parameters) with random weights, and for three configurations asks the plan for its traced and
analytical peak (computed on CPU fake tensors, as the plan stage does) and then trains three real steps
on the GPU, measuring `torch.cuda.max_memory_allocated` over steps 2-3 (optimizer states exist, as in the
trace). Prints a Markdown table for BENCHMARKS.md and exits 1 when a traced prediction is off by more
than 10%. The plan's `reserved_bytes_per_device` adds context and allocator slack, which
max_memory_allocated does not see; the table shows `torch.cuda.max_memory_reserved` beside it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
GIB = 2**30
CONFIGS = [  # (method, micro-batch, seq_len, checkpointing)
    ("full", 4, 1024, False),
    ("full", 8, 2048, True),
    ("lora", 8, 2048, False),
]


# The shape of Qwen2.5-0.5B as a Llama (494M parameters with its vocabulary).
QWEN_05B_SHAPE = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                      max_position_embeddings=4096)
TOLERANCE = 0.10  # a traced prediction further off than this from max_memory_allocated fails the check


def model_config(tokenizer=None):
    """The ~0.5B-shaped LlamaConfig; with `tokenizer` (any whose ids fit the vocabulary), its special tokens."""
    from transformers import LlamaConfig

    ids = {} if tokenizer is None else {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                                        "pad_token_id": tokenizer.pad_token_id}
    return LlamaConfig(**QWEN_05B_SHAPE, **ids)


def build_model(folder: Path, tokenizer=None) -> Path:
    """The ~0.5B-shaped model with random weights (initialised on the GPU: seconds, not minutes), saved into
    `folder` with `tokenizer` when given."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("cuda"):
        model = LlamaForCausalLM(model_config(tokenizer))
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    del model
    torch.cuda.empty_cache()
    return folder


def prediction_error(predicted: int, measured: int) -> float:
    """How far a predicted peak is from the measured one, as a signed share of the measured."""
    return predicted / measured - 1


def predicted(model_dir: Path, method: str, micro: int, seq_len: int, checkpointing: bool, gpu: str) -> dict:
    from xtrain.plan.memory import analytical
    from xtrain.plan.model import count_parameters
    from xtrain.plan.planner import Planner, first_step
    from xtrain.recipe import Hardware, Train

    train = Train(method=method)
    hardware = Hardware(accelerator="cuda", gpus=1, gpu_model=gpu)
    planner = Planner(model_dir, train, hardware, count_parameters(model_dir, train))
    precision = "bf16"
    step = first_step(planner, precision, micro, seq_len, checkpointing)
    peak = sum(planner.breakdown(step, "single").values())
    return {"traced": peak, "reserved": planner.reserved(peak), "step": step,
            "analytical": sum(analytical(planner.params, method, step).values())}


def measured(model_dir: Path, method: str, step) -> dict:
    """Three real steps as the plan lays them out (weights dtype, autocast, checkpointing, fused AdamW)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from xtrain.plan.memory import torch_dtype
    from xtrain.recipe import Train

    torch.cuda.empty_cache()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype(step.weights_dtype), device_map="cuda")
    if method == "lora":
        model = get_peft_model(model, LoraConfig(**Train(method="lora").lora.peft_kwargs()))
    if step.checkpointing:
        model.activation_checkpointing_enable()
        if method == "lora":
            model.enable_input_require_grads()
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], fused=True)
    ids = torch.randint(0, model.config.vocab_size, (step.micro_batch, step.seq_len), device="cuda")
    autocast = torch.autocast("cuda", dtype=torch_dtype(step.precision)) if step.precision != "fp32" else nullcontext()
    started = None
    for iteration in range(3):
        if iteration == 1:  # steady state: optimizer states exist, as in the trace's second step
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
        with autocast:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    result = {"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved(),
              "step_seconds": (time.perf_counter() - started) / 2}
    del model, optimizer
    return result


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-model", default="h200", help="key of xtrain.models.gpus.GPUS for the device under test")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA/ROCm device: this check needs the GPU machine", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, planned as {args.gpu_model}")
    print("| method | micro × seq | checkpointing | max_memory_allocated GiB | traced GiB (err) | "
          "analytical GiB (err) | max_memory_reserved GiB | plan reserved GiB | step s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp))
        for method, micro, seq_len, checkpointing in CONFIGS:
            guess = predicted(model_dir, method, micro, seq_len, checkpointing, args.gpu_model)
            real = measured(model_dir, method, guess["step"])
            err = prediction_error(guess["traced"], real["allocated"])
            analytical_err = prediction_error(guess["analytical"], real["allocated"])
            worst = max(worst, abs(err))
            print(f"| {method} | {micro} × {seq_len} | {checkpointing} | {real['allocated'] / GIB:.2f} | "
                  f"{guess['traced'] / GIB:.2f} ({100 * err:+.1f}%) | {guess['analytical'] / GIB:.2f} "
                  f"({100 * analytical_err:+.1f}%) | {real['reserved'] / GIB:.2f} | "
                  f"{guess['reserved'] / GIB:.2f} | {real['step_seconds']:.3f} |", flush=True)
    print(f"worst traced error: {100 * worst:.1f}% (goal: within {100 * TOLERANCE:.0f}%)")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
