"""Are the plan's settings the fastest? Every setting's tokens/s on this CPU, with the plan's pick marked.

    .venv/bin/python bench/bench_plan_grid.py [--methods lora full]   # ~15 min per method on 2 quiet cores
    .venv/bin/python bench/bench_plan_grid.py --model models/SmolLM2-135M-Instruct --methods lora   # ~50 min

For the 27M Llama of bench_plan (random-init), or the model `--model` names, global batch 4 rows of 512 tokens, a
run of PLANNED_STEPS steps: the plan (`make_plan`, this machine's recorded CPU probe) chooses precision, micro-batch
and accumulation, gradient checkpointing and torch.compile. Then the whole grid of those settings (every one fits
this machine's memory) is measured, each setting in its own process under the allocator a train job gets
(`xtrain.train.allocator`): the model loaded (and, compiled, wrapped in torch.compile as the trainer does), WARMUP
optimizer steps untimed (compiling happens there), then the median of TIMED optimizer steps (forward and backward of
each micro-batch, its loss scaled by the accumulation, then one AdamW step; the random tokens are their own labels).
Printed: a Markdown row per setting with its tokens/s and its share of the best, the plan's pick marked.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_plan import ROOT, build_27m, load

sys.path.insert(0, str(ROOT / "src"))
BATCH, SEQ, PLANNED_STEPS, WARMUP, TIMED = 4, 512, 1000, 2, 4
GRID = list(itertools.product(("fp32", "bf16"), (1, 2, 4), (False, True), (False, True)))  # precision, micro, ckpt, compile


def plan_pick(model_dir: Path, method: str) -> tuple:
    from xtrain.plan import make_plan
    from xtrain.recipe import Hardware, Train

    rows = BATCH * PLANNED_STEPS
    split = {"rows": rows, "tokens": rows * SEQ, "supervised_tokens": rows * SEQ // 2, "max_len": SEQ}
    manifest = {"seq_len": SEQ, "splits": {"train": split, "eval": split}, "fingerprint": "bench"}
    plan = make_plan(model_dir, manifest, Train(method=method, global_batch_size=BATCH, max_steps=PLANNED_STEPS),
                     Hardware())
    return (plan.precision, plan.layout.micro_batch_size, plan.gradient_checkpointing, plan.compile.mode is not None)


def tokens_per_second(model_dir: Path, method: str, precision: str, micro: int, checkpointing: bool,
                      compiled: bool) -> dict:
    """One setting, in this process: the median tokens/s of TIMED optimizer steps after WARMUP untimed ones."""
    import torch

    torch.manual_seed(0)
    model = load(model_dir, method, checkpointing)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], fused=True)
    runnable = torch.compile(model) if compiled else model
    ids = torch.randint(0, model.config.vocab_size, (micro, SEQ))
    seconds, started = [], time.perf_counter()
    for step in range(WARMUP + TIMED):
        begun = time.perf_counter()
        for _ in range(BATCH // micro):  # accumulate micro-batches, one optimizer step (training_step steps each)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = runnable(input_ids=ids, labels=ids, use_cache=False).loss / (BATCH // micro)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= WARMUP:
            seconds.append(time.perf_counter() - begun)
        elif step == 0:
            first = time.perf_counter() - started
    return {"tokens_per_second": BATCH * SEQ / statistics.median(seconds), "first_step": first}


def measure(model_dir: Path, method: str, setting: tuple) -> dict:
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import bench_plan_grid as g; "
            f"from pathlib import Path; print(json.dumps(g.tokens_per_second(Path({str(model_dir)!r}), "
            f"{method!r}, *{setting!r})))")
    from xtrain.train import allocator

    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env |= allocator.train_job_variables()  # the allocator a train job runs under (scripts/dispatch.py)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["lora", "full"], choices=["lora", "full"])
    parser.add_argument("--model", type=Path, help="a model folder (default: the 27M Llama, built here)")
    args = parser.parse_args()
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model.resolve() if args.model else build_27m(Path(tmp) / "27m")
        name = args.model.name if args.model else "27M"
        for method in args.methods:
            pick = plan_pick(model_dir, method)
            results = {}
            for setting in GRID:  # each as measured on stderr too: a run cut short keeps what it measured
                results[setting] = measure(model_dir, method, setting)
                print(f"{name} {method} {setting}: {results[setting]}", file=sys.stderr, flush=True)
            best = max(result["tokens_per_second"] for result in results.values())
            print(f"\n{name} {method}, global batch {BATCH} x {SEQ} tokens, planned for {PLANNED_STEPS} steps; plan's pick: "
                  f"{pick}; its tokens/s: {results[pick]['tokens_per_second'] / best:.1%} of the best\n")
            print("| precision | micro-batch × accumulation | checkpointing | compile | tokens/s | of the best | "
                  "first step s |")
            print("| --- | --- | --- | --- | --- | --- | --- |")
            for setting in sorted(GRID, key=lambda s: -results[s]["tokens_per_second"]):
                precision, micro, checkpointing, compiled = setting
                mark = "**" if setting == pick else ""
                result = results[setting]
                print(f"| {mark}{precision}{mark} | {mark}{micro} × {BATCH // micro}{mark} | {'on' if checkpointing else 'off'} | "
                      f"{'compiled' if compiled else 'eager'} | {mark}{result['tokens_per_second']:.0f}{mark} | "
                      f"{result['tokens_per_second'] / best:.1%} | {result['first_step']:.1f} |", flush=True)
    print(f"\n(bench took {time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
