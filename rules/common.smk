# Recipe loading and every helper the stage rules use; stage files hold rules only.
import json
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from xtrain.backends import get_backend  # noqa: E402
from xtrain.errors import XtrainError  # noqa: E402
from xtrain.recipe import RecipeError, load_recipe, stage_params  # noqa: E402


validate(config, "../config/config.schema.yaml")


wildcard_constraints:
    recipe=r"[A-Za-z0-9][A-Za-z0-9_-]*",


# On a cluster these run where snakemake runs: seconds of CPU each, and the plan must exist before
# the train job can ask the scheduler for what it predicts.
localrules:
    all,
    build_tiny_model,
    plan,
    report,
    gate,
    compare,


def load_recipes(folder):
    """Validate every recipe before any job runs; the first bad one stops the workflow."""
    recipes = {}
    for path in sorted(Path(folder).glob("*.yaml")):
        try:
            recipe = load_recipe(path)
            get_backend(recipe.train.backend).check(recipe.train, recipe.hardware)
        except RecipeError as exc:  # already names the file
            raise WorkflowError(str(exc))
        except XtrainError as exc:  # a backend refusing a field names the field, not the file
            raise WorkflowError(f"{path}: {exc}")
        model = recipe.model.path
        built = {config["tiny_model"]["path"], config.get("gguf_model", {}).get("path")}  # models a rule builds
        if model not in built and not Path(model, "config.json").is_file():
            raise WorkflowError(
                f"{path}: model.path {model!r} is not a model folder (no config.json there); "
                "point it at a local Hugging Face model folder"
            )
        recipes[path.stem] = recipe
    return recipes


RECIPES = load_recipes(config["recipes"])


def recipe(wildcards):
    try:
        return RECIPES[wildcards.recipe]
    except KeyError:
        raise WorkflowError(
            f"no recipe {config['recipes']}/{wildcards.recipe}.yaml; known recipes: {', '.join(sorted(RECIPES))}"
        ) from None


def model_dir(wildcards):
    return recipe(wildcards).model.path


def data_sources(wildcards):
    return [source.path for source in recipe(wildcards).data.sources if source.path is not None]


def lm_eval_tasks(wildcards):
    """The files of the recipe's local lm-eval task folder (keep each task's data file there too)."""
    harness = recipe(wildcards).eval.lm_eval
    if harness is None or harness.include_path is None:
        return []
    return sorted(str(path) for path in Path(harness.include_path).rglob("*") if path.is_file())


def recipe_slice(stage):
    """Params of a stage: only the recipe sections it reads, so other edits do not rerun it."""
    return lambda wildcards: stage_params(recipe(wildcards), stage)


def train_env(wildcards):
    return str(Path(workflow.basedir) / config["backends"][recipe(wildcards).train.backend]["conda"])


def planned(key, default):
    """A launch resource from plan.json; `default` until the plan exists."""

    def resource(wildcards, input):
        plan = Path(input.plan)
        return json.loads(plan.read_text())["resources"][key] if plan.is_file() else default

    return resource
