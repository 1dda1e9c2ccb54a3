"""Benchmark of the GRPO showcase (not a test): held-out accuracy of SmolLM2-135M-Instruct on the arithmetic word
problems before and after GRPO, and the wall time of each part.

    .venv/bin/python bench/bench_grpo_showcase.py [--prompts 40] [--base-only] [--set train.max_steps=10 ...]

The recipe (recipes/showcase/smollm2_grpo_arithmetic.yaml, with each `--set` applied) is prepared, planned and
trained through the library as its Snakemake jobs would, on the model its `model.recipe` chain starts from: the SFT
stage's merged base, `bases/smollm2_arithmetic_sft` (`snakemake bases/smollm2_arithmetic_sft --config
recipes=recipes/showcase`), or the model `--model` names (models/SmolLM2-135M-Instruct, `make showcase-model`: GRPO
on the instruct model alone, as the recipe was first written). The held-out prompts (the first --prompts of the eval
split by content hash, all by default) are answered greedily by the base and the tuned model and scored by the
recipe's rewards exactly as the evaluate stage scores them (xtrain.evaluate.rewarded, xtrain.evaluate.generations);
the answer reward's accuracy is the share of prompts whose final number is right. The full figures come from
`snakemake --config recipes=recipes/showcase reports/smollm2_grpo_arithmetic/eval.json`; this script is for a
shorter, timed look.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from bench_grpo_demo import ROOT, fifths, recipe_with


def score(model, scorer, tokenizer, manifest: dict, max_new_tokens: int, name: str) -> dict:
    from xtrain.evaluate import generations

    stop = {manifest["end_of_turn"]["id"], tokenizer.eos_token_id}
    started = time.perf_counter()
    done = []

    def advance(count: int) -> None:
        done.append(count)
        print(f"{name}: {sum(done)} prompts answered, {time.perf_counter() - started:.0f} s", flush=True)

    answers = generations.generate(model, scorer.prompts(), stop, tokenizer.pad_token_id, 16, max_new_tokens, advance)
    figures = scorer.metrics(name, scorer.score(tokenizer, answers))
    figures[f"{name}_stop_rate"] = sum(answer["stopped"] for answer in answers) / len(answers)
    figures[f"{name}_answer_wall_s"] = round(time.perf_counter() - started, 1)
    print(f"{name}: first answer: {tokenizer.decode(answers[0]['ids'], skip_special_tokens=True)!r}", flush=True)
    print(json.dumps(figures), flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes/showcase/smollm2_grpo_arithmetic.yaml")
    parser.add_argument("--set", action="append", default=[], dest="changes", metavar="FIELD=VALUE")
    parser.add_argument("--prompts", type=int, default=None, help="held-out prompts scored (default: all)")
    parser.add_argument("--base-only", action="store_true", help="score the base model and stop")
    parser.add_argument("--work", type=Path, default=Path("/tmp/xtrain-bench-grpo-showcase"))
    parser.add_argument("--model", type=Path, help="the base to tune (default: the recipe's model.path, or for a "
                        "model.recipe its upstream's merged base in bases/)")
    args = parser.parse_args()

    from peft import PeftModel
    from transformers import AutoTokenizer

    from xtrain.data import prepare
    from xtrain.evaluate.rewarded import RewardScorer, load_prompts
    from xtrain.models.loading import load_model
    from xtrain.plan import make_plan, write_plan
    from xtrain.recipe import DATA_KINDS, stage_params
    from xtrain.train.run import run_training

    recipe = recipe_with(args.recipe, args.changes, [])
    model_dir = ROOT / (args.model or recipe.model.path or f"bases/{recipe.model.recipe}")
    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"{model_dir}: no model there; build it first (snakemake {model_dir} "
                         "--config recipes=recipes/showcase) or pass --model")
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    prepared = args.work / "prepared"
    manifest = prepare([ROOT / source.path for source in recipe.data.sources], model_dir, recipe.data, prepared,
                       kind=DATA_KINDS[recipe.train.objective],
                       prompt_settings=stage_params(recipe, "prepare").get("prompts"))
    rows = load_prompts(prepared)[: args.prompts]
    scorer = RewardScorer([reward.model_dump() for reward in recipe.train.rewards], ROOT, rows)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    base = load_model(model_dir)
    figures = {"changes": args.changes, "prompts": len(rows),
               **score(base, scorer, tokenizer, manifest, recipe.eval.max_new_tokens, "base")}
    if not args.base_only:
        write_plan(args.work / "plan.json", make_plan(model_dir, manifest, recipe.train, recipe.hardware))
        started = time.perf_counter()
        run_training(model_dir=model_dir, prepared_dir=prepared, plan_path=args.work / "plan.json",
                     train=recipe.train, hardware=recipe.hardware, out=args.work / "checkpoint",
                     work_dir=args.work / "runs")
        figures["train_wall_s"] = round(time.perf_counter() - started, 1)
        steps = json.loads((args.work / "checkpoint/train_metrics.json").read_text())["rl"]
        for step in steps:
            print(f"step {step['step']:3d}  reward {step['reward']:+.3f}  answer {step['rewards/answer/mean']:.3f}  "
                  f"format {step['rewards/format/mean']:.3f}  length {step['completions/mean_length']:.1f}")
        figures["first_fifth_reward"], figures["last_fifth_reward"] = fifths([step["reward"] for step in steps])
        tuned = PeftModel.from_pretrained(base, args.work / "checkpoint")
        figures.update(score(tuned, scorer, tokenizer, manifest, recipe.eval.max_new_tokens, "tuned"))
    print(json.dumps(figures))


if __name__ == "__main__":
    sys.exit(main())
