"""torchtune backend against trl_cpu on the tiny recipe: loss curves, tokens, held-out loss and wall time.

    .venv/bin/python bench/bench_torchtune_backend.py    # ~3 min on 2 cores; needs .venvs/torchtune (see docs/backends.md)

The demo model and data (seq_len 128), LoRA r 8 / alpha 16 / dropout 0, global batch 4, 4 steps at lr 5e-3,
once with unpacked rows and once with `data.packing: true`, each backend through `run_training` with the plan
this machine picks (bf16 on a CPU with native bf16). Prints one line per run for BENCHMARKS.md.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from xtrain.artifacts import read_json  # noqa: E402
from xtrain.data import prepare  # noqa: E402
from xtrain.evaluate import evaluate  # noqa: E402
from xtrain.models.tiny import build_tiny_model  # noqa: E402
from xtrain.plan import make_plan, read_plan, write_plan  # noqa: E402
from xtrain.recipe import Data, DataSource, Eval, Hardware, Lora, Train  # noqa: E402
from xtrain.train.run import run_training  # noqa: E402


def main() -> None:
    import os

    os.chdir(ROOT)  # the backend finds its environment as .venvs/torchtune under the working directory
    settings = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["tiny_model"]
    root = Path(tempfile.mkdtemp(prefix="bench-torchtune-"))
    model = root / "tiny-llama"
    model.mkdir()
    build_tiny_model(ROOT / settings["corpus"], model, **settings["settings"])
    chat = ROOT / "data" / "demo" / "chat.jsonl"
    for packing in (False, True):
        data = Data(sources=[DataSource(path=str(chat))], seq_len=128, packing=packing)
        prepared = root / f"prepared-{packing}"
        manifest = prepare([chat], model, data, prepared)
        for backend in ("trl_cpu", "torchtune"):
            train = Train(backend=backend, lora=Lora(r=8, alpha=16, dropout=0.0), global_batch_size=4, max_steps=4,
                          learning_rate=5e-3, logging_steps=1)
            plan = root / f"plan-{backend}-{packing}.json"
            write_plan(plan, make_plan(model, manifest, train, Hardware()))
            checkpoint = root / f"checkpoint-{backend}-{packing}"
            started = time.perf_counter()
            metrics = run_training(model_dir=model, prepared_dir=prepared, plan_path=plan, train=train,
                                   hardware=Hardware(), out=checkpoint, work_dir=root / f"runs-{backend}-{packing}")
            seconds = time.perf_counter() - started
            evaluate(model, checkpoint, prepared, Eval(batch_size=8), root / f"eval-{backend}-{packing}.json")
            report = read_json(root / f"eval-{backend}-{packing}.json")
            print(json.dumps({
                "backend": backend, "packing": packing, "precision": read_plan(plan).precision,
                "losses": [round(entry["loss"], 4) for entry in metrics["loss"]],
                "tokens_seen": metrics["tokens_seen"], "tuned_eval_loss": round(report["tuned_loss"], 4),
                "wall_seconds_with_launch": round(seconds, 1),
            }), flush=True)


if __name__ == "__main__":
    main()
