# Recipe loading and every helper the stage rules use; stage files hold rules only.
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake_interface_executor_plugins.settings import DeploymentMethod
from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from xtrain.chain import base_folder, chain_models, chain_params, check_chains, root_model  # noqa: E402
from xtrain.models.hub import model_folder  # noqa: E402
from xtrain.plan import read_plan  # noqa: E402
from xtrain.plan.schema import JobPlan, Plan  # noqa: E402
from xtrain.preflight import preflight  # noqa: E402
from xtrain.project.envs import LOCKED, venv_name, venv_parts  # noqa: E402
from xtrain.recipe import RecipeError, stage_params  # noqa: E402
from xtrain.summary import DONE, FAILED, NOT_RUN, Job as RunJob, end_of_run as run_summary  # noqa: E402
from xtrain_backend_side.rewards import file_hashes  # noqa: E402

validate(config, "../config/config.schema.yaml")


wildcard_constraints:
    recipe=r"[A-Za-z0-9][A-Za-z0-9_-]*",
    backend="|".join(config["backends"]),


# On a cluster these run where snakemake runs: seconds of CPU each, and the plans must exist before
# the train, evaluate and export jobs can ask the scheduler for what they predict.
localrules:
    all,
    build_tiny_model,
    plan,
    plan_evaluate,
    plan_export,
    report,
    gate,
    compare,


def models_built_by_rules():
    """Model folders a rule of this workflow builds, so a recipe may name them before they exist."""
    return [config["tiny_model"]["path"], config["gguf_model"]["path"]]


def load_recipes(folder):
    """Check every recipe before any job runs (xtrain.preflight). A bad one is set aside, named in one warning line:
    a target that needs it stops on its whole message (`recipe`), a target naming only other recipes runs."""
    recipes, broken = {}, {}
    for path in sorted(Path(folder).glob("*.yaml")):
        try:
            recipes[path.stem] = preflight(path, Path.cwd(), config["allowed_paths"], built=models_built_by_rules())
        except RecipeError as exc:  # names the file, the field and the fix
            set_aside(broken, path.stem, str(exc))
    # A recipe built on a set-aside one (model.recipe) is set aside with it.
    while below := [name for name, loaded in recipes.items() if loaded.model.recipe in broken]:
        for name in below:
            parent = recipes.pop(name).model.recipe
            set_aside(broken, name, f"{folder}/{name}.yaml: model.recipe: {folder}/{parent}.yaml is invalid: fix it")
    return recipes, broken


def set_aside(broken, name, message):
    """Keep a bad recipe's message for the targets that need it, and name it in one warning line now."""
    broken[name] = message
    first, *problems = message.splitlines()
    problem = f"{first}: {'; '.join(line.strip() for line in problems)}" if problems else first
    logger.warning(f"{problem} (set aside: a target that needs `{name}` stops on this, others run)")


RECIPES, BROKEN = load_recipes(config["recipes"])
# Every recipe of the folder, the invalid ones too: `all` and `compare` need them all.
RECIPE_NAMES = sorted([*RECIPES, *BROKEN])
try:  # recipes built on other recipes (model.recipe): every chain complete, acyclic and consistent
    check_chains(RECIPES, config["recipes"])
except RecipeError as exc:
    raise WorkflowError(str(exc))


def recipe(wildcards):
    if wildcards.recipe in BROKEN:
        raise WorkflowError(BROKEN[wildcards.recipe])
    try:
        return RECIPES[wildcards.recipe]
    except KeyError:
        raise WorkflowError(
            f"no recipe {config['recipes']}/{wildcards.recipe}.yaml; known recipes: {', '.join(sorted(RECIPES))}"
        ) from None


def model_dir(wildcards):
    """The plain model folder the recipe trains on: its model, or its upstream recipe's checkpoint (or merged base,
    bases/<upstream>: rule merge_base), xtrain.chain.base_folder."""
    recipe(wildcards)
    return base_folder(wildcards.recipe, RECIPES, model_folder)


def root_model_dir(wildcards):
    """The model at the top of the recipe's chain (its own model when it is built on none): what the smoke test
    shrinks and plans, since an upstream checkpoint has its configuration and tokenizer and exists only once the
    upstream has trained on its GPUs."""
    recipe(wildcards)
    return model_folder(root_model(wildcards.recipe, RECIPES))


def upstream_checkpoint(wildcards):
    """The checkpoint of the recipe this one is built on (model.recipe); none for a recipe on a model."""
    parent = recipe(wildcards).model.recipe
    return [] if parent is None else [f"checkpoints/{parent}"]


def chain_checkpoints(wildcards):
    """Every model of the recipe's chain above it (their folders and checkpoints), which its evaluation scores."""
    if recipe(wildcards).model.recipe is None:
        return []
    models = chain_models(wildcards.recipe, RECIPES, model_folder)[:-1]
    return sorted({path for model in models for path in (model.folder, model.checkpoint) if path is not None})


def merge_memory_mb(wildcards, input):
    """The merge holds the base in its dtype and writes it: twice its weights' size, and 1 GiB for the rest."""
    size = sum(path.stat().st_size for path in Path(input.model).glob("*.safetensors"))
    return 2 * size // 2**20 + 1024


def data_sources(wildcards):
    return [source.path for source in recipe(wildcards).data.sources if source.path is not None]


def lm_eval_tasks(wildcards):
    """The files of the recipe's local lm-eval task folder (keep each task's data file there too)."""
    harness = recipe(wildcards).eval.lm_eval
    if harness is None or harness.include_path is None:
        return []
    return sorted(str(path) for path in Path(harness.include_path).rglob("*") if path.is_file())


def reward_file_hashes(wildcards):
    """sha256 of each reward file the recipe trains with (train.rewards python, in rewards/): the train rule's
    params, so an edit to one reruns training and nothing before it."""
    rewards = recipe(wildcards).train.rewards
    return file_hashes(Path.cwd(), (reward.model_dump() for reward in rewards))


def recipe_slice(stage):
    """Params of a stage: only the recipe sections it reads, so other edits do not rerun it; and for a recipe built
    on another, how (xtrain.chain.chain_params)."""
    return lambda wildcards: stage_params(recipe(wildcards), stage) | chain_params(
        wildcards.recipe, RECIPES, model_folder, stage
    )


def exported_recipes():
    """Recipes with an `export:` section: only these have an exports/<recipe> target."""
    return sorted(name for name, loaded in RECIPES.items() if loaded.export is not None)


def exported_slice(stage):
    """Params of the export job or its plan; only a recipe with an `export:` section has them."""

    def params(wildcards):
        if recipe(wildcards).export is None:
            raise WorkflowError(
                f"{config['recipes']}/{wildcards.recipe}.yaml has no `export:` section: add one (docs/recipe.md) "
                f"to build exports/{wildcards.recipe}"
            )
        return stage_params(recipe(wildcards), stage)

    return params


export_slice = exported_slice("export")
plan_export_slice = exported_slice("plan_export")


MAIN_ENV = "envs/xtrain.yaml"


def backend_entry(wildcards):
    """The config entry (conda, container, uninstall) of the recipe's training backend."""
    return config["backends"][recipe(wildcards).train.backend]


def train_env(wildcards):
    return str(Path(workflow.basedir) / backend_entry(wildcards)["conda"])


def train_container(wildcards):
    return backend_entry(wildcards)["container"]


def lane_env(wildcards, accelerator):
    """The backend's virtual environment for `accelerator`, when it has its own and conda is not providing it. An
    accelerator xtrain writes no lock for (ROCm) runs in an image or env of its own: the train job says so if its
    interpreter lacks the backend (xtrain.project.envs.backend_python)."""
    if (
        backend_entry(wildcards)["conda"] == MAIN_ENV
        or DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
        or accelerator not in LOCKED
    ):
        return []
    return [f".venvs/{venv_name(recipe(wildcards).train.backend, accelerator)}/ready.json"]


def backend_env(wildcards):
    """The environment the train job runs the backend in: the one for the recipe's accelerator."""
    return lane_env(wildcards, recipe(wildcards).hardware.accelerator)


def cpu_backend_env(wildcards):
    """The smoke stage trains the shrunk model on the CPU: the backend's CPU environment, whatever the hardware."""
    return lane_env(wildcards, "cpu")


def venv_spec(wildcards):
    return f"envs/{venv_parts(wildcards.venv)[0]}.yaml"


def venv_accelerator(wildcards):
    return venv_parts(wildcards.venv)[1]


def backend_uninstall(wildcards):
    return config["backends"][venv_parts(wildcards.venv)[0]].get("uninstall", [])


def end_of_run():
    """What each recipe's jobs in this run came to (xtrain.summary), as the run's last words."""
    failed = workflow.scheduler.failed
    jobs = [
        RunJob(
            job.wildcards_dict["recipe"],
            job.rule.name,
            DONE if workflow.dag.finished(job) else FAILED if job in failed else NOT_RUN,
            tuple(str(path) for path in job.log),
        )
        for job in workflow.dag.needrun_jobs(exclude_finished=False)
        if "recipe" in job.wildcards_dict
    ]
    summary = run_summary(jobs, RECIPES, Path.cwd())
    if summary:
        logger.info(summary)


def planned(key, default, plan="plan"):
    """A launch resource from the job's plan (input `plan`: plan.json; `job_plan`: plans/<recipe>/<job>.json);
    `default` until the plan exists."""

    def resource(wildcards, input):
        path = Path(getattr(input, plan))
        if not path.is_file():
            return default
        return getattr(read_plan(path, Plan if plan == "plan" else JobPlan).resources, key)

    return resource
