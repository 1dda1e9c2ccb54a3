"""Attention on the CPU: a LoRA step under transformers' default (torch's fused SDPA) against its eager attention,
and what the plan's attention probe (xtrain.plan.attention) predicts for each shape.

    .venv/bin/python bench/bench_attention.py [--rounds N]   # ~6 min on 2 quiet cores with SmolLM2 built

Models: the 27M Llama of bench_plan (random-init) and SmolLM2-135M-Instruct (models/, `make showcase-model`; left out
when absent). LoRA r 16 on q/k/v/o (the recipe's default), bf16 autocast over fp32 weights, 4,096 tokens a step at
each length (rows × length), rows of random ids, the first quarter of each unsupervised; torch AdamW. Each
measurement is its own process under the train job's allocator, the two attentions alternate, and a step's seconds
are the median of steps 3-6. The probe's columns are the plan's own figures for the shape (one layer's forward and
backward under each, over every layer), from the record in $XDG_CACHE_HOME/xtrain/cpu-attention.json (measured there
the first time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_plan import ROOT, build_27m, under_train_job_allocator

sys.path.insert(0, str(ROOT / "src"))
TOKENS = 4096
LENGTHS = (256, 512, 1024, 2048)
SMOLLM2 = ROOT / "models" / "SmolLM2-135M-Instruct"


def step_seconds(model_dir: str, implementation: str, length: int) -> float:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from xtrain.recipe import Train

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=implementation)
    model.config.use_cache = False
    model = get_peft_model(model, LoraConfig(**Train(method="lora").lora.peft_kwargs(), task_type="CAUSAL_LM"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    ids = torch.randint(10, 1000, (TOKENS // length, length))
    labels = ids.clone()
    labels[:, : length // 4] = -100
    seconds = []
    for _ in range(6):
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds[2:])


def probe(model_dir: str, length: int) -> tuple[float, float]:
    """The plan's attention seconds for a micro-step of this shape: (sdpa, eager)."""
    from xtrain.plan import attention
    from xtrain.plan.generation import attention_shape

    heads = attention_shape(model_dir, False)
    shape = attention.shape(heads, TOKENS // length, length, "bf16")
    measured = attention.cached_seconds(shape, os.cpu_count() or 1)  # the planner's threads: every core
    return tuple(attention.Seconds(*measured[kind]).micro_step(heads.layers, False) for kind in ("sdpa", "eager"))


def measure(model_dir: Path, implementation: str, length: int) -> float:
    return float(under_train_job_allocator(__file__, "--measure", str(model_dir), implementation, str(length)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", nargs=3, metavar=("MODEL", "IMPLEMENTATION", "LENGTH"), help="internal")
    parser.add_argument("--rounds", type=int, default=1, help="alternating measurements of each attention")
    args = parser.parse_args()
    if args.measure:
        model, implementation, length = args.measure
        print(step_seconds(model, implementation, int(length)))
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        models = {"27M": build_27m(Path(tmp) / "27m")}
        if (SMOLLM2 / "config.json").is_file():
            models["SmolLM2-135M"] = SMOLLM2
        print("| model | rows × length | step s, sdpa | step s, eager | eager's speed-up | probe s, sdpa | "
              "probe s, eager | measured difference s | probe's difference s | plan's pick |")
        print("| --- " * 10 + "|")
        for name, model in models.items():
            for length in LENGTHS:
                runs = {"sdpa": [], "eager": []}
                for _ in range(args.rounds):
                    for implementation in runs:
                        runs[implementation].append(measure(model, implementation, length))
                sdpa, eager = (statistics.median(runs[kind]) for kind in ("sdpa", "eager"))
                probed = probe(str(model), length)
                print(f"| {name} | {TOKENS // length} × {length} | {sdpa:.3f} | {eager:.3f} | {sdpa / eager:.2f}× | "
                      f"{probed[0]:.3f} | {probed[1]:.3f} | {eager - sdpa:+.3f} | {probed[1] - probed[0]:+.3f} | "
                      f"{'eager' if probed[1] < probed[0] else 'sdpa'} |", flush=True)
    print(f"\n{args.rounds} alternating round(s) per row (median); {time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
