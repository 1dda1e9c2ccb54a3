"""AdamW's update on the CPU: torch's fused kernel (every backend's optimizer, train.backends.contract.ADAMW) against
the single-tensor loop torch picks on a CPU when not asked, and the multi-tensor (foreach) path.

    .venv/bin/python bench/bench_optimizer.py   # ~1 min on 2 quiet cores with SmolLM2 built

Models: the 27M Llama of bench_plan (random-init) and SmolLM2-135M-Instruct (models/, `make showcase-model`; left out
when absent), every weight trainable (a full fine-tune: the update is a LoRA run's only where its adapters are
large), fp32 weights and random gradients. Each implementation is measured in its own process under the train job's
allocator; an update's seconds are the median of updates 3-8 (the first makes AdamW's states).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from bench_plan import ROOT, build_27m, under_train_job_allocator

sys.path.insert(0, str(ROOT / "src"))
SMOLLM2 = ROOT / "models" / "SmolLM2-135M-Instruct"
IMPLEMENTATIONS = {"fused": {"fused": True}, "single-tensor": {"foreach": False}, "foreach": {"foreach": True}}


def update_seconds(model_dir: str, implementation: str) -> tuple[float, int]:
    """The median seconds of one AdamW update over every weight of the model, and the weights' count."""
    import time

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    weights = [p for p in model.parameters() if p.requires_grad]
    for weight in weights:
        weight.grad = torch.randn_like(weight)
    optimizer = torch.optim.AdamW(weights, lr=1e-5, **IMPLEMENTATIONS[implementation])
    seconds = []
    for _ in range(8):
        started = time.perf_counter()
        optimizer.step()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds[2:]), sum(weight.numel() for weight in weights)


def measure(model_dir: Path, implementation: str) -> tuple[float, int]:
    seconds, count = under_train_job_allocator(__file__, "--measure", str(model_dir), implementation).split()
    return float(seconds), int(count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", nargs=2, metavar=("MODEL", "IMPLEMENTATION"), help="internal")
    args = parser.parse_args()
    if args.measure:
        print(*update_seconds(*args.measure))
        return
    with tempfile.TemporaryDirectory() as tmp:
        models = {"27M": build_27m(Path(tmp) / "27m")}
        if (SMOLLM2 / "config.json").is_file():
            models["SmolLM2-135M"] = SMOLLM2
        print("| model | weights | " + " | ".join(f"{name} s" for name in IMPLEMENTATIONS) +
              " | fused's speed-up over single-tensor |")
        print("| --- " * (len(IMPLEMENTATIONS) + 3) + "|")
        for name, model in models.items():
            measured = {implementation: measure(model, implementation) for implementation in IMPLEMENTATIONS}
            seconds = {implementation: figures[0] for implementation, figures in measured.items()}
            print(f"| {name} | {measured['fused'][1]:,} | " +
                  " | ".join(f"{seconds[implementation]:.3f}" for implementation in IMPLEMENTATIONS) +
                  f" | {seconds['single-tensor'] / seconds['fused']:.1f}× |")


if __name__ == "__main__":
    main()
