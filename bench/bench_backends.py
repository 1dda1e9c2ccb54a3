"""The same tiny recipe through trl_cpu, axolotl and unsloth: loss per step, tokens, throughput, eval.

    .venv/bin/python bench/bench_backends.py [backend ...]   # default: all three; ~5 min on 2 cores once the backend
                                                        # environments exist (.venvs/axolotl, .venvs/unsloth)

Each backend trains 4 LoRA steps (global batch 4, lr 5e-3) of the demo model on the demo data, prepared and
planned once, so every backend sees the same prepared tokens and the same plan (printed: its precision).
"""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from xtrain.artifacts import read_json  # noqa: E402
from xtrain.data import prepare  # noqa: E402
from xtrain.evaluate import evaluate  # noqa: E402
from xtrain.models.tiny import build_tiny_model  # noqa: E402
from xtrain.plan import make_plan, read_plan, write_plan  # noqa: E402
from xtrain.recipe import Data, DataSource, Eval, Hardware, Train  # noqa: E402
from xtrain.train.run import run_training  # noqa: E402


def main(backends: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    root = Path(tempfile.mkdtemp(prefix="bench-backends-"))
    settings = yaml.safe_load((ROOT / "config/config.yaml").read_text())["tiny_model"]
    model = root / "model"
    build_tiny_model(ROOT / settings["corpus"], model, **settings["settings"])
    data = Data(sources=[DataSource(path=str(ROOT / "data/demo/chat.jsonl"))], seq_len=128, eval_fraction=0.1)
    manifest = prepare([ROOT / "data/demo/chat.jsonl"], model, data, root / "prepared")
    shape = {"method": "lora", "global_batch_size": 4, "max_steps": 4, "learning_rate": 5e-3, "logging_steps": 1}
    plan = root / "plan.json"
    write_plan(plan, make_plan(model, manifest, Train(**shape), Hardware()))
    print(f"plan precision: {read_plan(plan).precision}")
    print("| backend | loss at steps 1-4 | tokens seen | train s | tokens/s | eval loss base -> tuned |")
    print("| --- | --- | --- | --- | --- | --- |")
    for backend in backends:
        checkpoint = root / backend
        metrics = run_training(model_dir=model, prepared_dir=root / "prepared", plan_path=plan,
                               train=Train(**shape, backend=backend), hardware=Hardware(), out=checkpoint,
                               work_dir=root / f"runs-{backend}")
        evaluate(model, checkpoint, root / "prepared", Eval(batch_size=8), root / f"{backend}.json")
        report = read_json(root / f"{backend}.json")
        losses = ", ".join(f"{entry['loss']:.5f}" for entry in metrics["loss"])
        print(f"| {backend} | {losses} | {metrics['tokens_seen']} | {metrics['wall_seconds']} | "
              f"{metrics['tokens_per_second']} | {report['base_loss']:.4f} -> {report['tuned_loss']:.4f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["trl_cpu", "axolotl", "unsloth"])
