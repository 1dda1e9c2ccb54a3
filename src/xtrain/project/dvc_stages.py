"""Generate `dvc.yaml` from the recipes: DVC versions what Snakemake builds, without a second DAG.

One DVC stage per recipe runs `snakemake reports/<recipe>/gate.json` (the recipe's last target), and
`exports/<recipe>` for a recipe with an `export:` section, and `bases/<recipe>` for a LoRA recipe that another
recipe is built on by merging (rule merge_base): so a clone that pulls has the merged base its downstream
recipe was trained on, and does not rebuild it and retrain that recipe. Snakemake alone decides which of its steps
are stale. DVC records the recipe's inputs and every output (all `persist: true`, so `dvc repro` never deletes what Snakemake would reuse), eval.json as metrics and
the loss curve as a plot.
`python -m xtrain.project.dvc_stages` rewrites dvc.yaml; a test fails when it is out of date with recipes/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from xtrain_backend_side.rewards import reward_files

from ..chain import BASES, base_folder
from ..recipe import Recipe, load_recipe

HEADER = "# Generated from recipes/ by `make dvc.yaml` (python -m xtrain.project.dvc_stages); do not edit by hand.\n"
# Code and configuration every recipe's stages run; a change makes DVC ask Snakemake again.
WORKFLOW_DEPS = ["Snakefile", "rules", "scripts", "src/xtrain", "config/config.yaml", "envs"]
# What rules evaluate, report and gate write under reports/<recipe>/ besides the eval.json metrics.
REPORT_OUTPUTS = ["generations.json", "pairs.json", "report.html", "plots", "gate.json"]


def persisted(*paths: str) -> list[dict[str, Any]]:
    """Outputs that `dvc repro` must not delete before running the stage: Snakemake reuses them."""
    return [{path: {"persist": True}} for path in paths]


def merged_upstreams(recipes: dict[str, Recipe]) -> set[str]:
    """The recipes whose LoRA adapter rule merge_base folds into bases/<recipe> for a recipe built on them (a root
    model's folder is never under bases/, so its name stands in for it)."""
    return {recipe.model.recipe for name, recipe in recipes.items() if recipe.model.recipe is not None
            and base_folder(name, recipes, lambda model: model.name) == f"{BASES}/{recipe.model.recipe}"}


def recipe_stage(name: str, recipe: Recipe, merged: bool = False) -> dict[str, Any]:
    """The DVC stage of recipe `name`; `merged`: another recipe is built on its adapter merged into bases/<name>."""
    exports = [f"exports/{name}"] if recipe.export is not None else []
    bases = [f"{BASES}/{name}"] if merged else []
    # Every job's plan (plan.json, and the jobs' after training): a clone that pulls them sizes its jobs as they were.
    plans = [f"plans/{name}/{job}.json" for job in ("plan", "evaluate", *(["export"] if exports else []))]
    return {
        "cmd": " ".join(["snakemake --cores all", f"reports/{name}/gate.json", *exports, *bases]),
        # A hub model is pinned by its revision in the recipe file (and its commit in the checkpoint manifest); a
        # recipe built on another (model.recipe) depends on that one's checkpoint, so DVC orders the stages as
        # Snakemake does. The reward files a GRPO recipe runs (rewards/) are its code too.
        "deps": [*(s.path for s in recipe.data.sources), *([recipe.model.path] if recipe.model.path else []),
                 *([f"checkpoints/{recipe.model.recipe}"] if recipe.model.recipe else []),
                 *reward_files(reward.model_dump() for reward in recipe.train.rewards), *WORKFLOW_DEPS],
        # The recipe file as DVC params (every key): `dvc params diff` shows a hyperparameter change, and
        # `dvc exp run -S recipes/<name>.yaml:train.learning_rate=1e-3` sweeps one.
        "params": [{f"recipes/{name}.yaml": None}],
        "outs": persisted(f"prepared/{name}", *plans, f"checkpoints/{name}",
                          *(f"reports/{name}/{report}" for report in REPORT_OUTPUTS), *exports, *bases),
        "metrics": persisted(f"reports/{name}/eval.json"),
    }


def pipeline(config: dict[str, Any], recipes: dict[str, Recipe]) -> dict[str, Any]:
    tiny = config["tiny_model"]
    stages = {
        "tiny_model": {
            "cmd": f"snakemake --cores all {tiny['path']}",
            "deps": [tiny["corpus"], "src/xtrain/models/tiny.py", "scripts/build_tiny_model.py", "rules/models.smk",
                     "config/config.yaml"],
            "outs": persisted(tiny["path"]),
        }
    }
    merged = merged_upstreams(recipes)
    stages.update({name: recipe_stage(name, recipe, name in merged) for name, recipe in sorted(recipes.items())})
    plots = [
        {f"loss_{name}": {"x": "step", "y": {f"checkpoints/{name}/train_metrics.json": "loss"}}}
        for name in sorted(recipes)
    ]
    return {"stages": stages, "plots": plots}


def render(root: Path = Path(".")) -> str:
    config = yaml.safe_load((root / "config/config.yaml").read_text())
    recipes = {path.stem: load_recipe(path) for path in sorted((root / config["recipes"]).glob("*.yaml"))}
    return HEADER + yaml.safe_dump(pipeline(config, recipes), sort_keys=False)


def main() -> None:
    Path("dvc.yaml").write_text(render())
    print("wrote dvc.yaml")


if __name__ == "__main__":
    main()
