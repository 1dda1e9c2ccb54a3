"""Is the trl_cpu backend as fast as plain PyTorch? Its tokens/s against a minimal hand-written loop.

    .venv/bin/python bench/bench_trl_throughput.py [--rounds N]   # ~5 min per round on 2 quiet cores

The 27.4M Llama of FIELD-NOTES' CPU throughput reference (bench_plan.build_27m), random-init, with the demo
tokenizer; rows of exactly 512 random tokens (no padding: both sides process the same tokens), the last
three quarters of each row supervised. Both sides do the same steps: micro-batch 4, no accumulation, the
same precision, fp32 weights, torch AdamW (lr 1e-4, no weight decay), gradient clipping at 1.0 and a
cosine schedule. The backend runs through `TrlCpu().run` (its real SFTConfig/SFTTrainer); the loop is
forward with labels, backward, clip, step, schedule, zero_grad. Each measurement is its own process, the
two sides alternate, and rates are taken between the ends of step WARMUP and the last step, so that
loading and the first steps' one-off costs count for neither. Two rates: tokens per wall second, and
tokens per CPU second of the process (all its threads), which other jobs on a shared machine disturb less.
The backend saves a resumable trainer checkpoint every quarter of its run (model, optimizer and scheduler
state), which the loop does not: in these 8 steps that is after steps 2, 4 and 6, inside the window. Each
save is timed (from the step's end to the trainer's on_save), and the rates are also given without them,
as a run of hundreds of steps amortises its four saves.
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
BATCH, SEQ, STEPS, WARMUP = 4, 512, 8, 2
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


def rates(ends: list[tuple[float, float]], saves: list[tuple[int, float, float]] = ()) -> dict[str, float]:
    """Tokens per wall second and per CPU second between the end of step WARMUP and the last step; and the
    same without the trainer checkpoints saved in that window (`saves`: step, wall and CPU seconds)."""
    tokens = BATCH * SEQ * (STEPS - WARMUP)
    (wall0, cpu0), (wall1, cpu1) = ends[WARMUP - 1], ends[-1]
    inside = [save for save in saves if WARMUP <= save[0] < STEPS]
    save_wall, save_cpu = sum(save[1] for save in inside), sum(save[2] for save in inside)
    return {"wall": tokens / (wall1 - wall0), "cpu": tokens / (cpu1 - cpu0), "saves": len(inside),
            "wall_steps": tokens / (wall1 - wall0 - save_wall), "cpu_steps": tokens / (cpu1 - cpu0 - save_cpu)}


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def backend_rates(model: Path, prepared: Path, method: str, precision: str, work: Path) -> dict[str, float]:
    from transformers import TrainerCallback

    import xtrain.backends.trl as backend
    from xtrain.backends import TrainJob
    from xtrain.backends.trl_cpu import TrlCpu
    from xtrain.recipe import Hardware, Train

    ends: list[tuple[float, float]] = []
    saves: list[tuple[int, float, float]] = []

    class StepClock(TrainerCallback):
        """The end of each step, and how long each trainer checkpoint save after it took."""

        def on_step_end(self, args, state, control, **kwargs):
            ends.append(clock())

        def on_save(self, args, state, control, **kwargs):
            (wall0, cpu0), (wall1, cpu1) = ends[-1], clock()
            saves.append((len(ends), wall1 - wall0, cpu1 - cpu0))

    shared = backend.callbacks
    backend.callbacks = lambda seconds: [*shared(seconds), StepClock()]  # timing only; the backend's own list is kept
    plan = {"precision": precision, "weights_dtype": "fp32", "gradient_checkpointing": False,
            "layout": {"strategy": "single", "micro_batch_size": BATCH, "gradient_accumulation_steps": 1},
            "data": {"seq_len": SEQ}, "time": {"steps": STEPS}}
    train = Train(method=method, global_batch_size=BATCH, max_steps=STEPS, learning_rate=1e-4, logging_steps=STEPS,
                  **({"lora": {"dropout": 0.0}} if method == "lora" else {}))
    job = TrainJob(model, prepared, plan, train, Hardware(), work / "out", work / "runs", None)
    job.out.mkdir(parents=True)
    TrlCpu().run(job)
    return rates(ends, saves)


def loop_rates(model_dir: Path, prepared: Path, method: str, precision: str) -> dict[str, float]:
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
        ends.append(clock())
    return rates(ends)


def measure(side: str, folder: Path, method: str, precision: str) -> dict[str, float]:
    """One measurement in a fresh process (same allocator and thread-pool state for both sides)."""
    result = subprocess.run(
        [sys.executable, __file__, "--measure", side, str(folder), method, precision],
        capture_output=True, text=True, check=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", nargs=4, metavar=("SIDE", "FOLDER", "METHOD", "PRECISION"),
                        help="internal: one measurement in this process")
    parser.add_argument("--rounds", type=int, default=1, help="alternating measurements of each side per row")
    args = parser.parse_args()
    if args.measure:
        side, folder, method, precision = args.measure
        folder = Path(folder)
        if side == "backend":
            with tempfile.TemporaryDirectory() as work:
                measured = backend_rates(folder / "27m", folder / "prepared", method, precision, Path(work))
        else:
            measured = loop_rates(folder / "27m", folder / "prepared", method, precision)
        print(json.dumps(measured))
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "prepared").mkdir()
        build_inputs(folder)
        print("| method | precision | loop tokens/s | trl_cpu tokens/s | wall ratio | saves in window | trl_cpu "
              "tokens/s without saves | wall ratio without saves | loop tokens/CPU-s | trl_cpu tokens/CPU-s without "
              "saves | CPU ratio without saves |")
        print("| --- " * 11 + "|")
        kinds = ("wall", "cpu", "saves", "wall_steps", "cpu_steps")
        for method, precision in CONFIGS:
            runs = {"loop": [], "backend": []}
            for _ in range(args.rounds):
                for side in ("loop", "backend"):
                    runs[side].append(measure(side, folder, method, precision))
            loop, backend = ({kind: statistics.median(r[kind] for r in runs[side]) for kind in kinds}
                          for side in ("loop", "backend"))
            print(f"| {method} | {precision} | {loop['wall']:.0f} | {backend['wall']:.0f} | "
                  f"{backend['wall'] / loop['wall']:.1%} | {backend['saves']:.0f} | {backend['wall_steps']:.0f} | "
                  f"{backend['wall_steps'] / loop['wall']:.1%} | {loop['cpu']:.0f} | {backend['cpu_steps']:.0f} | "
                  f"{backend['cpu_steps'] / loop['cpu']:.1%} |", flush=True)
    print(f"\n{args.rounds} alternating round(s) per row (median); {time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
