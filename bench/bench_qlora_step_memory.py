"""The plan's QLoRA step against a real one, term by term: live tensors of a real LoRA and QLoRA step.

    .venv/bin/python bench/bench_qlora_step_memory.py [--model 27m|smollm2] [--micro 8] [--seq-len 256]

The real step is built as trl_cpu builds it (base loaded in fp32, for qlora through transformers'
BitsAndBytesConfig: nf4, double-quantized, bf16 compute; peft's LoRA of the default recipe; for qlora the
trainable parameters cast to bf16 as TRL casts them), then two steps (forward under bf16 autocast, backward,
AdamW) run under the plan's own MemTracker (`xtrain.plan.memory.TrainableMemTracker`), on real tensors. The plan's
side is `xtrain.plan.memory.traced` on the same step (bitsandbytes' layers do not run on fake tensors, so its
QLoRA breakdown is LoRA's trace with the 4-bit terms of `memory.quantized`). Live tensors only: what the process
holds besides them (the interpreter, libraries, what the allocator keeps) is bench_plan_real.py's to measure.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
MIB = 2**20


def real_step(model_dir: Path, train, micro: int, seq_len: int) -> dict[str, int]:
    """Bytes at the peak of a real step, by the plan's breakdown keys."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from xtrain.plan.memory import TrainableMemTracker, peak_breakdown

    torch.manual_seed(0)
    quantized = {}
    if train.method == "qlora":
        settings = train.quantization
        quantized = {"device_map": {"": "cpu"}, "quantization_config": BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type=settings.quant_type,
            bnb_4bit_use_double_quant=settings.double_quant, bnb_4bit_compute_dtype=torch.bfloat16)}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **quantized)
    model = get_peft_model(model, LoraConfig(**train.lora.peft_kwargs()))
    if train.method == "qlora":  # TRL's cast of a quantized model's adapters
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.data = parameter.data.to(torch.bfloat16)
    model.train()
    ids = torch.randint(10, 1000, (micro, seq_len))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], fused=True)
    tracker = TrainableMemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        for _ in range(2):  # the second step, with optimizer states, as the plan traces it
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            tracker.reset_mod_stats()
    return peak_breakdown(tracker)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["27m", "smollm2"], default="27m")
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    args = parser.parse_args()
    from xtrain.plan.memory import BREAKDOWN_KEYS, Step, traced
    from xtrain.plan.model import count_parameters
    from xtrain.recipe import Train

    with tempfile.TemporaryDirectory(prefix="xtrain-qlora-step-") as folder:
        if args.model == "27m":
            sys.path.insert(0, str(ROOT / "bench"))
            from bench_trl_throughput import model_with_tokenizer

            model_dir = model_with_tokenizer(Path(folder))
        else:
            model_dir = ROOT / "models/SmolLM2-135M-Instruct"
        step = Step(args.micro, args.seq_len, "bf16", "fp32", checkpointing=False)
        print(f"{args.model}, micro-batch {args.micro} × {args.seq_len} tokens, bf16 autocast (MiB)\n")
        print("| method | term | real step | plan | plan / real |")
        print("| --- | --- | --- | --- | --- |")
        for method in ("lora", "qlora"):
            train = Train(method=method)
            real = real_step(model_dir, train, args.micro, args.seq_len)
            plan = traced(model_dir, train, step, params=count_parameters(model_dir, train)).breakdown
            for key in (*BREAKDOWN_KEYS, "total"):
                measured = sum(real.values()) if key == "total" else real[key]
                predicted = sum(plan.values()) if key == "total" else plan[key]
                ratio = f"{predicted / measured:.3f}" if measured else "-"
                print(f"| {method} | {key} | {measured / MIB:,.1f} | {predicted / MIB:,.1f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
