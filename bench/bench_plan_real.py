"""Does the plan hold on real train-stage runs? Predicted against measured train time and peak host memory.

    .venv/bin/python bench/bench_plan_real.py time [--configs lora-256 ...] [--steps N]  # ~4 min per configuration
    .venv/bin/python bench/bench_plan_real.py memory [--configs lora-256 ...]  # ~1 min per configuration
    (either with --keep DIR: each run's plan, metrics and peak RSS kept there as JSON, for fitting)

Every run is the real train stage (`xtrain.train.run_training`, trl_cpu, length-grouped batches) in a fresh
process under the allocator the train job gets (`xtrain.train.allocator`: the machine's TCMalloc, else the lock's mimalloc
with its options, else the machine's jemalloc) and with no MALLOC_* variable, trained on a plan made for this machine as the plan stage makes it
(`make_plan`, the recorded CPU probe). Measured: the trainer's runtime (train_metrics.json `trainer_runtime_seconds`:
every step and the trainer checkpoints saved during the run, not loading the model) and the process's peak RSS
(the child's ru_maxrss); predicted: the plan's `time.seconds`, its host-memory request `resources.mem_mb` and the
peak RSS that request adds its margin to (`mem_mb` / HOST_REQUEST_MARGIN).

`time`: SmolLM2-135M-Instruct (needs models/SmolLM2-135M-Instruct: `make showcase`, or `snakemake
models/SmolLM2-135M-Instruct`) in the showcase recipe (SmolLM2's stock template, the alpaca demo file, LoRA on all
seven linear layers) with method, seq_len, packing and global batch changed, cut to about TARGET_SECONDS of training
by the plan's own prediction (at least MIN_STEPS steps), or to `--steps`.
`memory`: the 27M Llama of bench_plan (random-init, demo tokenizer) on ROWS random rows whose lengths are spread
evenly between a quarter of seq_len and seq_len, so that batches take many shapes, for STEPS_27M steps.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_trl_throughput import model_with_tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
RECIPE = ROOT / "recipes/showcase/smollm2_alpaca.yaml"
TARGET_SECONDS, MIN_STEPS = 150, 6
SMOLLM2 = {  # name: (method, seq_len, packing, global batch)
    "lora-256": ("lora", 256, False, 8),
    "lora-1024-packed": ("lora", 1024, True, 4),
    "full-256-packed": ("full", 256, True, 4),
    "full-1024": ("full", 1024, False, 4),
    "qlora-256": ("qlora", 256, False, 8),
    "full-512": ("full", 512, False, 4),  # not one of the rows: a run the full fine-tune's share is fitted on
}
CHECKED = ("lora-256", "lora-1024-packed", "full-256-packed", "full-1024", "qlora-256")  # `time` without --configs
ROWS, STEPS_27M, LOG_STEPS_27M = 512, 24, 4
MODEL_27M = {  # name: (method, seq_len, global batch)
    "lora-256": ("lora", 256, 8), "lora-512": ("lora", 512, 8), "full-256": ("full", 256, 8), "full-512": ("full", 512, 8),
    "qlora-256": ("qlora", 256, 8), "qlora-512": ("qlora", 512, 8),
}
TRAIN = """
import sys
from pathlib import Path
from xtrain.recipe import Train, Hardware
from xtrain.train.run import run_training
model, prepared, plan, train, out = sys.argv[1:6]
run_training(model_dir=Path(model), prepared_dir=Path(prepared), plan_path=Path(plan),
             train=Train.model_validate_json(train), hardware=Hardware(), out=Path(out) / "checkpoint",
             work_dir=Path(out) / "runs")
"""
MIB = 2**20
KEEP = "XTRAIN_BENCH_KEEP"  # set by --keep for the configuration processes


def train_and_measure(model: Path, prepared: Path, manifest: dict, train, work: Path) -> dict:
    """Plan `train` on `manifest`, run the train stage in a fresh process; the plan and what was measured."""
    from xtrain.artifacts import read_json, write_json
    from xtrain.plan import make_plan, write_plan
    from xtrain.recipe import Hardware
    from xtrain.train import allocator

    plan = make_plan(model, manifest, train, Hardware())
    write_plan(work / "plan.json", plan)
    env = {name: value for name, value in os.environ.items() if not name.startswith("MALLOC_")}
    env |= allocator.train_job_variables()  # as scripts/dispatch.py runs the train job
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    trained = subprocess.run([sys.executable, "-c", TRAIN, str(model), str(prepared), str(work / "plan.json"),
                              train.model_dump_json(), str(work)], cwd=ROOT, env=env, capture_output=True, text=True)
    if trained.returncode:
        raise SystemExit(f"the train stage failed:\n{trained.stderr[-3000:]}")
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if peak_kib <= before:
        raise SystemExit("an earlier run's peak hides this one's: run one configuration per invocation")
    metrics = read_json(work / "checkpoint" / "train_metrics.json")
    if keep := os.environ.get(KEEP):  # the run's plan and metrics, with its peak, for fitting the plan's constants
        write_json(Path(keep) / f"{work.name.removeprefix('xtrain-').rsplit('-', 1)[0]}.json",
                   {"plan": read_json(work / "plan.json"), "metrics": metrics, "peak_rss_mib": peak_kib / 1024})
    losses = [entry["loss"] for entry in metrics["loss"]]
    return {"plan": plan, "measured": metrics["trainer_runtime_seconds"], "peak_mib": peak_kib / 1024,
            "tokens_per_second": metrics["tokens_per_second"], "steps": train.max_steps, "mfu": metrics["mfu"],
            "loss": f"{losses[0]:.2f} → {losses[-1]:.2f}"}


def settings(plan) -> str:
    return (f"{plan.precision}, micro {plan.layout.micro_batch_size} × {plan.layout.gradient_accumulation_steps}"
            f"{', checkpointing' if plan.gradient_checkpointing else ''}{', compiled' if plan.compile.mode else ''}"
            f"{', eager attention' if plan.attention.implementation == 'eager' else ''}")


def predicted_rss_mib(plan) -> float:
    """The peak RSS the plan predicts: its host-memory request without the request's margin."""
    from xtrain.plan.planner import HOST_REQUEST_MARGIN

    return plan.resources.mem_mb / HOST_REQUEST_MARGIN


def smollm2_run(name: str, work: Path, steps: int | None = None) -> str:
    from xtrain.data.pipeline import prepare
    from xtrain.plan import make_plan
    from xtrain.recipe import Train, load_recipe

    method, seq_len, packing, batch = SMOLLM2[name]
    recipe = load_recipe(RECIPE)
    model = ROOT / recipe.model.path
    data = recipe.data.model_copy(update={"seq_len": seq_len, "packing": packing})
    manifest = prepare([ROOT / source.path for source in data.sources], model, data, work / "prepared")
    train = Train.model_validate({**recipe.train.model_dump(exclude={"lora"} if method == "full" else set()),
                                  "method": method, "global_batch_size": batch, "report_to": [], "max_steps": MIN_STEPS})
    per_step = make_plan(model, manifest, train, recipe.hardware).time.seconds_per_step
    train = train.model_copy(update={"max_steps": steps or max(MIN_STEPS, math.ceil(TARGET_SECONDS / per_step))})
    result = train_and_measure(model, work / "prepared", manifest, train, work)
    plan = result["plan"]
    return (f"| {method} | {seq_len} | {'packed' if packing else 'not packed'} | {batch} | {result['steps']} | "
            f"{plan.data.mean_sequence_tokens:.0f} | {settings(plan)} | {plan.time.seconds:,.0f} | "
            f"{result['measured']:,.0f} | **{plan.time.seconds / result['measured']:.2f}** | "
            f"{result['tokens_per_second']:,.0f} | {result['loss']} | {predicted_rss_mib(plan):,.0f} | "
            f"{result['peak_mib']:,.0f} | **{predicted_rss_mib(plan) / result['peak_mib']:.2f}** | "
            f"{plan.resources.mem_mb / result['peak_mib']:.2f} | {mfu(result)} |")


def mfu(result: dict) -> str:
    return "unknown" if result["mfu"] is None else f"{result['mfu']:.1%}"


def varied_rows(folder: Path, seq_len: int) -> dict:
    """ROWS random rows, lengths spread evenly over [seq_len / 4, seq_len], the answer the last 3/4: the prepared
    split and its manifest, with the split's statistics as prepare writes them (the plan reads its length histogram:
    24 steps of 8 rows stop inside the second of four length-grouped megabatches)."""
    import numpy as np
    from datasets import Dataset

    import pyarrow.parquet as pq

    from xtrain.artifacts import write_json
    from xtrain.data.report import split_stats

    rng = np.random.default_rng(0)
    lengths = np.linspace(seq_len // 4, seq_len, ROWS).astype(int)
    rng.shuffle(lengths)
    ids = [rng.integers(10, 1000, size=n).tolist() for n in lengths]
    masks = [[0] * (n // 4) + [1] * (n - n // 4) for n in lengths]
    folder.mkdir(parents=True)
    Dataset.from_dict({"input_ids": ids, "assistant_masks": masks}).to_parquet(str(folder / "train.parquet"))
    split = split_stats(pq.read_table(folder / "train.parquet"), seq_len)  # as prepare counts it, histogram included
    manifest = {"seq_len": seq_len, "splits": {"train": split, "eval": split}, "fingerprint": f"varied-{seq_len}",
                "sources": {"random rows": {"rows": ROWS, "kept": ROWS, "dropped": {}}},
                "chat_template": "none (random token rows)", "end_of_turn": None}
    write_json(folder / "manifest.json", manifest)
    return manifest


def model_27m_run(name: str, work: Path) -> str:
    from xtrain.recipe import Train

    method, seq_len, batch = MODEL_27M[name]
    model = model_with_tokenizer(work)
    manifest = varied_rows(work / "prepared", seq_len)
    train = Train(method=method, global_batch_size=batch, max_steps=STEPS_27M, report_to=[],
                  logging_steps=LOG_STEPS_27M)
    result = train_and_measure(model, work / "prepared", manifest, train, work)
    plan = result["plan"]
    return (f"| {method} | {seq_len} | {batch} | {STEPS_27M} | {settings(plan)} | "
            f"{plan.memory.peak_bytes_per_device / MIB:,.0f} | {result['peak_mib']:,.0f} | {plan.resources.mem_mb:,} | "
            f"**{plan.resources.mem_mb / result['peak_mib']:.2f}** | {plan.time.seconds:,.0f} | {result['measured']:,.0f} | "
            f"{plan.time.seconds / result['measured']:.2f} | {result['loss']} | {predicted_rss_mib(plan):,.0f} | "
            f"**{predicted_rss_mib(plan) / result['peak_mib']:.2f}** | {mfu(result)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=["time", "memory"])
    parser.add_argument("--configs", nargs="+", help=f"time: {', '.join(SMOLLM2)}; memory: {', '.join(MODEL_27M)}")
    parser.add_argument("--steps", type=int, help="time: train this many steps instead of about TARGET_SECONDS")
    parser.add_argument("--keep", type=Path, help="write each run's plan.json, train_metrics.json and peak RSS here, "
                        "as <table>-<configuration>.json")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        os.environ[KEEP] = str(args.keep.resolve())
    started = time.time()
    if args.table == "time":
        configs, run = args.configs or list(CHECKED), smollm2_run
        print("| method | seq_len | packing | global batch | steps | mean row tokens | plan's settings | predicted s | "
              "measured s | predicted / measured | tokens/s | loss first → last | predicted peak RSS MiB | "
              "peak RSS MiB | predicted / peak | request / peak | MFU |")
        print("| --- " * 17 + "|")
    else:
        configs, run = args.configs or list(MODEL_27M), model_27m_run
        print("| method | seq_len | global batch | steps | plan's settings | traced step peak MiB | peak RSS MiB | "
              "plan mem_mb | request / peak | predicted s | measured s | predicted / measured | loss first → last | "
              "predicted peak RSS MiB | predicted / peak | MFU |")
        print("| --- " * 16 + "|")
    for name in configs:
        with tempfile.TemporaryDirectory(prefix=f"xtrain-{args.table}-{name}-") as folder:
            # One fresh process per configuration: ru_maxrss of this process's children is their highest peak.
            steps = [str(args.steps)] if args.table == "time" and args.steps else []
            one = subprocess.run([sys.executable, __file__, "--one", args.table, name, folder, *steps],
                                 capture_output=True, text=True)
            if one.returncode:
                raise SystemExit(f"{name} failed:\n{one.stderr[-3000:]}")
            print(one.stdout.strip().splitlines()[-1], flush=True)
    from xtrain.train import allocator

    print(f"\n(bench took {time.time() - started:.0f} s; train jobs under {allocator.for_train_job()})")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        table, name, folder, *steps = sys.argv[2:]
        print(smollm2_run(name, Path(folder), int(steps[0]) if steps else None) if table == "time"
              else model_27m_run(name, Path(folder)))
    else:
        main()
