"""Is the trl_cpu lane as fast as plain PyTorch? Its tokens/s against a minimal hand-written loop.

    .venv/bin/python bench/bench_trl_throughput.py    # ~6 min on 2 cores; prints the table for BENCHMARKS.md

The 27.4M Llama of FIELD-NOTES' CPU throughput reference (bench_plan.build_27m), random-init, with the demo
tokenizer; rows of exactly 512 random tokens (no padding: both sides process the same tokens), the last
three quarters of each row supervised. Both sides do the same steps: micro-batch 4, no accumulation, the
same precision, fp32 weights, torch AdamW (lr 1e-4, no weight decay), gradient clipping at 1.0 and a
cosine schedule. The lane runs through `TrlCpu().run` (its real SFTConfig/SFTTrainer); the loop is
forward with labels, backward, clip, step, schedule, zero_grad. Each measurement is its own process, the
two sides alternate, and tokens/s is taken between the ends of step WARMUP and the last step, so that
loading and the first steps' one-off costs count for neither.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_plan import ROOT, build_27m

sys.path.insert(0, str(ROOT / "src"))
BATCH, SEQ, STEPS, WARMUP, ROUNDS = 4, 512, 12, 2, 2
CONFIGS = [("full", "fp32"), ("lora", "bf16")]  # FIELD-NOTES: 624 and 1265 tokens/s on this machine


def build_inputs(folder: Path) -> Path:
    """The model (with the demo tokenizer, for the collator's pad id) and the prepared rows."""
    import numpy as np
    from datasets import Dataset

    from xtrain.tiny_model import build_tiny_model

    model = build_27m(folder / "27m")
    build_tiny_model(ROOT / "data/tiny-llama/corpus.txt", folder / "tiny")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (folder / "tiny" / name).is_file():
            shutil.copy(folder / "tiny" / name, model / name)
    rng = np.random.default_rng(0)
    rows = BATCH * STEPS
    ids = rng.integers(10, 1000, size=(rows, SEQ)).tolist()
    masks = [[0] * (SEQ // 4) + [1] * (SEQ - SEQ // 4)] * rows
    prepared = folder / "prepared"
    Dataset.from_dict({"input_ids": ids, "assistant_masks": masks}).to_parquet(str(prepared / "train.parquet"))
    return model


def lane_tokens_per_second(model: Path, prepared: Path, method: str, precision: str, work: Path) -> float:
    from transformers import TrainerCallback

    import xtrain.backends.trl as lane
    from xtrain.backends import TrainJob
    from xtrain.backends.trl_cpu import TrlCpu
    from xtrain.recipe import Hardware, Train

    ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

    shared = lane.callbacks
    lane.callbacks = lambda train: [*shared(train), StepClock()]  # timing only; the lane's own list is kept
    plan = {"precision": precision, "weights_dtype": "fp32", "gradient_checkpointing": False,
            "layout": {"strategy": "single", "micro_batch_size": BATCH, "gradient_accumulation_steps": 1},
            "data": {"seq_len": SEQ}, "time": {"steps": STEPS}}
    train = Train(method=method, global_batch_size=BATCH, max_steps=STEPS, learning_rate=1e-4, logging_steps=STEPS,
                  **({"lora": {"dropout": 0.0}} if method == "lora" else {}))
    job = TrainJob(model, prepared, plan, train, Hardware(), work / "out", work / "runs", None)
    job.out.mkdir(parents=True)
    TrlCpu().run(job)
    return BATCH * SEQ * (STEPS - WARMUP) / (ends[-1] - ends[WARMUP - 1])


def loop_tokens_per_second(model_dir: Path, prepared: Path, method: str, precision: str) -> float:
    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, get_cosine_schedule_with_warmup

    from xtrain.recipe import Train

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.config.use_cache = False
    if method == "lora":
        lora = Train(method="lora", lora={"dropout": 0.0}).lora
        model = get_peft_model(model, LoraConfig(**lora.peft_kwargs(), task_type="CAUSAL_LM"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    schedule = get_cosine_schedule_with_warmup(optimizer, 0, STEPS)
    rows = Dataset.from_parquet(str(prepared / "train.parquet"))
    ids = torch.tensor(rows["input_ids"])
    labels = ids.masked_fill(torch.tensor(rows["assistant_masks"]) == 0, -100)
    ends = []
    for step in range(STEPS):
        batch = slice(step * BATCH, (step + 1) * BATCH)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(input_ids=ids[batch], labels=labels[batch]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        ends.append(time.perf_counter())
    return BATCH * SEQ * (STEPS - WARMUP) / (ends[-1] - ends[WARMUP - 1])


def measure(side: str, folder: Path, method: str, precision: str) -> float:
    """One measurement in a fresh process (same allocator and thread-pool state for both sides)."""
    result = subprocess.run(
        [sys.executable, __file__, "--measure", side, str(folder), method, precision],
        capture_output=True, text=True, check=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    return json.loads(result.stdout.strip().splitlines()[-1])["tokens_per_second"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", nargs=4, metavar=("SIDE", "FOLDER", "METHOD", "PRECISION"),
                        help="internal: one measurement in this process")
    args = parser.parse_args()
    if args.measure:
        side, folder, method, precision = args.measure
        folder = Path(folder)
        if side == "lane":
            with tempfile.TemporaryDirectory() as work:
                rate = lane_tokens_per_second(folder / "27m", folder / "prepared", method, precision, Path(work))
        else:
            rate = loop_tokens_per_second(folder / "27m", folder / "prepared", method, precision)
        print(json.dumps({"tokens_per_second": rate}))
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "prepared").mkdir()
        build_inputs(folder)
        print(f"| method | precision | hand-written loop tokens/s | trl_cpu tokens/s | trl_cpu / loop |")
        print("| --- | --- | --- | --- | --- |")
        for method, precision in CONFIGS:
            rates = {"loop": [], "lane": []}
            for _ in range(ROUNDS):
                for side in ("loop", "lane"):
                    rates[side].append(measure(side, folder, method, precision))
            loop, lane = statistics.median(rates["loop"]), statistics.median(rates["lane"])
            print(f"| {method} | {precision} | {loop:.0f} ({', '.join(f'{r:.0f}' for r in rates['loop'])}) | "
                  f"{lane:.0f} ({', '.join(f'{r:.0f}' for r in rates['lane'])}) | {lane / loop:.1%} |", flush=True)
    print(f"\n{ROUNDS} alternating rounds per row (median, each round's figure in brackets); "
          f"{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
