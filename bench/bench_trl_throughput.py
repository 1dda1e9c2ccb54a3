"""Is the trl_cpu backend, with the plan's settings, as fast as plain PyTorch? Its tokens/s against an eager loop.

    .venv/bin/python bench/bench_trl_throughput.py [--rounds N]   # ~4 min per round on 2 quiet cores

The 27.4M Llama of FIELD-NOTES' CPU throughput reference (bench_plan.build_27m), random-init, with the demo
tokenizer; rows of exactly 512 random tokens (no padding: both sides process the same tokens), the last
three quarters of each row supervised. The loop is the hand-written eager reference: micro-batch 4, no
accumulation, the row's precision, fp32 weights, torch AdamW (lr 1e-4, no weight decay), gradient clipping at
1.0, a cosine schedule; forward with labels, backward, clip, step, schedule, zero_grad. The backend runs
through `TrlCpu().run` (its real SFTConfig/SFTTrainer) with the settings `make_plan` chooses for a run of
PLANNED_STEPS steps of these rows (precision, micro-batch, checkpointing, torch.compile, attention), trained for STEPS of
them. Each measurement is its own process, the two sides alternate, and rates are taken between the ends of
step WARMUP and the last step, so that loading, compiling and the first steps' one-off costs count for neither;
the first step's seconds (compile included) are given apart. Rates are tokens per wall second.
The backend runs under the allocator the train job gets (`xtrain.train.allocator`: the machine's TCMalloc, else the
lock's mimalloc with its options, else the machine's jemalloc); the loop is measured under glibc and under that allocator too.
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
PLANNED_STEPS = 1000  # the run the plan's settings are chosen for (its compile decision weighs warm-up against it)
CONFIGS = [("full", "fp32"), ("lora", "bf16")]  # the loop's rows; FIELD-NOTES: 624 and 1265 tokens/s on this machine


def model_with_tokenizer(folder: Path) -> Path:
    """The 27M model in `folder`/27m, with the demo tokenizer (for the collator's pad id)."""
    from xtrain.models.tiny import build_tiny_model

    model = build_27m(folder / "27m")
    build_tiny_model(ROOT / "data/tiny-llama/corpus.txt", folder / "tiny")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (folder / "tiny" / name).is_file():
            shutil.copy(folder / "tiny" / name, model / name)
    return model


def build_inputs(folder: Path) -> Path:
    """The model and the prepared rows."""
    import numpy as np
    from datasets import Dataset

    model = model_with_tokenizer(folder)
    rng = np.random.default_rng(0)
    rows = BATCH * STEPS
    ids = rng.integers(10, 1000, size=(rows, SEQ)).tolist()
    masks = [[0] * (SEQ // 4) + [1] * (SEQ - SEQ // 4)] * rows
    prepared = folder / "prepared"
    Dataset.from_dict({"input_ids": ids, "assistant_masks": masks}).to_parquet(str(prepared / "train.parquet"))
    return model


def rates(start: float, ends: list[float], saves: list[tuple[int, float]] = ()) -> dict[str, float]:
    """Tokens per wall second between the end of step WARMUP and the last step; the same without the trainer
    checkpoints saved in that window (`saves`: step, seconds); and the first step's seconds from `start` (compile
    included)."""
    tokens = BATCH * SEQ * (STEPS - WARMUP)
    inside = [save for save in saves if WARMUP <= save[0] < STEPS]
    window = ends[-1] - ends[WARMUP - 1]
    return {"wall": tokens / window, "saves": len(inside), "wall_steps": tokens / (window - sum(s[1] for s in inside)),
            "first_step": ends[0] - start}


def planned(model: Path, method: str) -> tuple[object, object]:
    """The plan for PLANNED_STEPS steps of the bench's rows, as the plan stage makes it, with its time cut to STEPS
    (the backend's save cadence follows it); and the recipe's train section for STEPS steps."""
    from xtrain.plan import make_plan
    from xtrain.recipe import Hardware, Train

    rows = BATCH * PLANNED_STEPS
    split = {"rows": rows, "tokens": rows * SEQ, "supervised_tokens": rows * (SEQ - SEQ // 4), "max_len": SEQ}
    manifest = {"seq_len": SEQ, "splits": {"train": split, "eval": split}, "fingerprint": "bench"}
    settings = {"method": method, "global_batch_size": BATCH, "learning_rate": 1e-4, "logging_steps": STEPS,
                **({"lora": {"dropout": 0.0}} if method == "lora" else {})}
    plan = make_plan(model, manifest, Train(**settings, max_steps=PLANNED_STEPS), Hardware())
    return (plan.model_copy(update={"time": plan.time.model_copy(update={"steps": STEPS})}),
            Train(**settings, max_steps=STEPS))


def backend_rates(model: Path, prepared: Path, method: str, work: Path) -> dict[str, float]:
    from transformers import TrainerCallback

    import xtrain.train.backends.trl as backend
    from xtrain.recipe import Hardware
    from xtrain.train.backends.contract import TrainJob
    from xtrain.train.backends.trl_cpu import TrlCpu

    ends: list[float] = []
    saves: list[tuple[int, float]] = []
    start = [time.perf_counter()]

    class StepClock(TrainerCallback):
        """The start of training, the end of each step, and how long each trainer checkpoint save took."""

        def on_train_begin(self, args, state, control, **kwargs):
            start[0] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

        def on_save(self, args, state, control, **kwargs):
            saves.append((len(ends), time.perf_counter() - ends[-1]))

    shared = backend.callbacks
    backend.callbacks = lambda seconds: [*shared(seconds), StepClock()]  # timing only; the backend's own list is kept
    plan, train = planned(model, method)
    job = TrainJob(model, prepared, plan, train, Hardware(), work / "out", work / "runs", None)
    job.out.mkdir(parents=True)
    TrlCpu().run(job)
    return {**rates(start[0], ends, saves), "settings": settings(plan)}


def settings(plan) -> str:
    return (f"{plan.precision}, micro {plan.layout.micro_batch_size}, checkpointing "
            f"{'on' if plan.gradient_checkpointing else 'off'}, {'compiled' if plan.compile.mode else 'not compiled'}, "
            f"attention {plan.attention.implementation or 'sdpa'}")


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
    ends, start = [], time.perf_counter()
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
    return rates(start, ends)


SIDES = ("loop", "loop+preload", "backend")  # the eager loop under glibc, and under the train job's allocator


def measure(side: str, folder: Path, method: str, precision: str) -> dict[str, float]:
    """One measurement in a fresh process: the loop under glibc ("loop") or under the allocator a train job gets
    ("loop+preload"), or the backend under it, as scripts/dispatch.py runs the train job ("backend")."""
    from xtrain.train import allocator

    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if side != "loop":
        env |= allocator.train_job_variables()
    result = subprocess.run(
        [sys.executable, __file__, "--measure", side, str(folder), method, precision],
        capture_output=True, text=True, check=True, env=env,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", nargs=4, metavar=("SIDE", "FOLDER", "METHOD", "PRECISION"),
                        help="internal: one measurement in this process")
    parser.add_argument("--rounds", type=int, default=1, help="alternating measurements of each side per row")
    parser.add_argument("--methods", default=",".join(method for method, _ in CONFIGS),
                        help="the rows to measure, by method (comma-separated; default: all)")
    args = parser.parse_args()
    if args.measure:
        side, folder, method, precision = args.measure
        folder = Path(folder)
        if side == "backend":
            with tempfile.TemporaryDirectory() as work:
                measured = backend_rates(folder / "27m", folder / "prepared", method, Path(work))
        else:
            measured = loop_rates(folder / "27m", folder / "prepared", method, precision)
        print(json.dumps(measured))
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "prepared").mkdir()
        build_inputs(folder)
        from xtrain.train import allocator

        preload = allocator.for_train_job()
        print(f"| method | loop precision | loop tokens/s (glibc) | loop tokens/s ({preload}) | trl_cpu with the plan's "
              f"settings ({preload}) | trl_cpu tokens/s | saves in window | trl_cpu tokens/s without saves | "
              "trl_cpu / loop (glibc), without saves | trl_cpu / loop (same allocator), without saves | "
              "first step s, loop / trl_cpu |")
        print("| --- " * 11 + "|")
        kinds = ("wall", "saves", "wall_steps", "first_step")
        for method, precision in (row for row in CONFIGS if row[0] in args.methods.split(",")):
            runs = {side: [] for side in SIDES}
            for _ in range(args.rounds):
                for side in SIDES:
                    runs[side].append(measure(side, folder, method, precision))
            loop, preloaded, backend = ({kind: statistics.median(r[kind] for r in runs[side]) for kind in kinds}
                                        for side in SIDES)
            print(f"| {method} | {precision} | {loop['wall']:.0f} | {preloaded['wall']:.0f} | "
                  f"{runs['backend'][0]['settings']} | {backend['wall']:.0f} | {backend['saves']:.0f} | "
                  f"{backend['wall_steps']:.0f} | **{backend['wall_steps'] / loop['wall']:.2f}×** | "
                  f"{backend['wall_steps'] / preloaded['wall']:.2f}× | {loop['first_step']:.1f} / "
                  f"{backend['first_step']:.1f} |", flush=True)
    print(f"\n{args.rounds} alternating round(s) per row (median); {time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
