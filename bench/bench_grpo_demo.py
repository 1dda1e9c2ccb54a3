"""Benchmark of the GRPO demo (not a test): does its mean reward rise within a few CPU minutes?

    .venv/bin/python bench/bench_grpo_demo.py [--recipe recipes/demo_grpo.yaml] [--set train.max_steps=20 ...] [--unset train.lora]

The recipe (with each `--set dotted.field=YAML value` applied) is prepared, planned and trained through the library
as its Snakemake jobs would, on the embedded demo model (built once into --work). Printed: each step's mean reward
and each reward's mean, the mean reward over the first and the last fifth of the steps, and the wall time of
training. The issue's bar: the last fifth above the first.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def recipe_with(path: Path, changes: list[str], removals: list[str]):
    from xtrain.recipe import Recipe

    data = yaml.safe_load(path.read_text())
    for dotted in removals:
        *parents, leaf = dotted.split(".")
        section = data
        for name in parents:
            section = section[name]
        del section[leaf]
    for change in changes:
        dotted, value = change.split("=", 1)
        *parents, leaf = dotted.split(".")
        section = data
        for name in parents:
            section = section.setdefault(name, {})
        section[leaf] = yaml.safe_load(value)
    return Recipe.model_validate(data)


def fifths(values: list[float]) -> tuple[float, float]:
    fifth = max(1, len(values) // 5)
    return sum(values[:fifth]) / fifth, sum(values[-fifth:]) / fifth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes/demo_grpo.yaml")
    parser.add_argument("--set", action="append", default=[], dest="changes", metavar="FIELD=VALUE")
    parser.add_argument("--unset", action="append", default=[], dest="removals", metavar="FIELD")
    parser.add_argument("--work", type=Path, default=Path("/tmp/xtrain-bench-grpo"))
    args = parser.parse_args()

    from xtrain.data import prepare
    from xtrain.models.tiny import build_tiny_model
    from xtrain.plan import make_plan, write_plan
    from xtrain.recipe import DATA_KINDS, stage_params
    from xtrain.train.run import run_training

    recipe = recipe_with(args.recipe, args.changes, args.removals)
    model = args.work / "tiny-llama"
    if not (model / "config.json").is_file():
        settings = yaml.safe_load((ROOT / "config/config.yaml").read_text())["tiny_model"]
        build_tiny_model(ROOT / settings["corpus"], model, **settings["settings"])
    run = args.work / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    manifest = prepare([ROOT / source.path for source in recipe.data.sources], model, recipe.data, run / "prepared",
                       kind=DATA_KINDS[recipe.train.objective],
                       prompt_settings=stage_params(recipe, "prepare").get("prompts"))
    write_plan(run / "plan.json", make_plan(model, manifest, recipe.train, recipe.hardware))
    started = time.perf_counter()
    run_training(model_dir=model, prepared_dir=run / "prepared", plan_path=run / "plan.json", train=recipe.train,
                 hardware=recipe.hardware, out=run / "checkpoint", work_dir=run / "runs")
    wall = time.perf_counter() - started
    steps = json.loads((run / "checkpoint/train_metrics.json").read_text())["rl"]
    terms = sorted(key for key in steps[0] if key.startswith("rewards/"))
    for step in steps:
        print(f"step {step['step']:3d}  reward {step['reward']:+.3f}  " + "  ".join(
            f"{key[len('rewards/'):-len('/mean')]} {step[key]:.3f}" for key in terms)
            + f"  length {step['completions/mean_length']:.1f}")
    first, last = fifths([step["reward"] for step in steps])
    print(json.dumps({"changes": args.changes, "removed": args.removals, "steps": len(steps), "first_fifth_reward": round(first, 4),
                      "last_fifth_reward": round(last, 4), "rises": last > first, "train_wall_s": round(wall, 1)}))


if __name__ == "__main__":
    main()
