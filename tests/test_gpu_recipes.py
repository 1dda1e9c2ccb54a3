"""The GPU recipes users start from (recipes/gpu/): each passes `xtrain smoke` here, on its model's published
config.json (tests/data/model_configs/) with a tokenizer carrying the family's special tokens and stock template,
served from a Hugging Face cache the test writes (no weights, no hub access), and each file's header states the
plan's prediction that smoke gives. One smoke per recipe: its plan traces the full-size model (tens of seconds for
8B, more for 70B) and its train step runs the recipe's own backend for 3 steps in its environment."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from backend_runs import ensure_backend_env
from conftest import REPO
from test_model_families import config_only_model, published_config

from xtrain.chain import check_chains, root_model
from xtrain.models.hub import model_folder
from xtrain.preflight import preflight
from xtrain.recipe import load_recipe
from xtrain.train import allocator

GPU_RECIPES = REPO / "recipes" / "gpu"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
# hub id -> (its published config, the tokenizer's family, the instruct tokenizer's end-of-sequence token)
MODELS = {
    "meta-llama/Llama-3.1-8B-Instruct": ("Llama-3.1-8B-Instruct", "llama3_1", "<|eot_id|>"),
    "meta-llama/Llama-3.1-70B-Instruct": ("Llama-3.1-70B-Instruct", "llama3_1", "<|eot_id|>"),
    "Qwen/Qwen2.5-7B-Instruct": ("Qwen2.5-7B-Instruct", "qwen2_5", None),
    "Qwen/Qwen3-8B": ("Qwen3-8B", "qwen3", None),
}
PLAN_HEADER = re.compile(r"^# Plan, as `xtrain smoke` predicts it \(every row data.seq_len long\): (?P<memory>.+) per GPU "
                         r"\((?P<layout>.+)\);\n# (?P<time>.+) on the demo data .*\n", re.MULTILINE)
README = GPU_RECIPES / "README.md"
# xtrain.smoke.smoke on one recipe (its JSON), its name, model folder, sources (a JSON list) and output folder.
SMOKE = """
import json, sys
from pathlib import Path
from xtrain.recipe import parse_recipe
from xtrain.smoke import smoke
recipe, name, model, sources, out = sys.argv[1:]
smoke(recipe=parse_recipe(json.loads(Path(recipe).read_text()), recipe), name=name, model_dir=Path(model),
      sources=[Path(source) for source in json.loads(sources)], out=Path(out), prices={})
"""
ACCELERATORS = {"cuda": "CUDA", "rocm": "ROCm"}
# The lane's own validator, which the smoke's launch step names (the start of `validated_by`).
VALIDATORS = {"trl_local": "TRL's", "axolotl": "Axolotl's load_cfg", "torchtune": "tune validate",
              "unsloth": "the unsloth runner's"}


def recipe_names() -> list[str]:
    return sorted(path.stem for path in GPU_RECIPES.glob("*.yaml"))


@pytest.fixture(scope="module")
def hub_cache(tiny_model, tmp_path_factory):
    """A Hugging Face cache holding each recipe's model (config and tokenizer) as `main`, laid out as the hub client
    lays it; the process reads it for the module's tests."""
    home = tmp_path_factory.mktemp("hf")
    for hub_id, (config, family, eos) in MODELS.items():
        repo = home / "hub" / f"models--{hub_id.replace('/', '--')}"
        config_only_model(tiny_model, repo / "snapshots" / COMMIT, family, published_config(config), eos)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(COMMIT)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(home))
        patch.setenv("HF_HUB_CACHE", str(home / "hub"))
        patch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(home / "hub"))
        yield home


def plan_header(plan: dict) -> str:
    """The two header lines each recipe carries: the smoke step `plan`'s figures."""
    seconds = plan["run_seconds"]
    duration = f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{max(1, round(seconds / 60))} min"
    return (f"# Plan, as `xtrain smoke` predicts it (every row data.seq_len long): "
            f"{plan['peak_gib_per_device']:.2f} of {plan['budget_gib_per_device']:.2f} GiB per GPU "
            f"({plan['precision']}, {plan['strategy']});\n"
            f"# {plan['steps']:,} steps, {duration}, {plan['gpu_hours']:g} GPU-hours on the demo data (rows counted "
            "with a stand-in tokenizer: yours will differ).\n")


def test_the_gpu_recipes_are_not_built_by_default_and_cover_the_hardware_users_bring():
    """`make demo` builds recipes/*.yaml only (Snakefile: config `recipes`, not recursive); every GPU recipe names a
    GPU, its model by hub id, and its plan in its header."""
    import yaml

    assert yaml.safe_load((REPO / "config/config.yaml").read_text())["recipes"] == "recipes"
    shapes = set()
    for name in recipe_names():
        load_recipe(GPU_RECIPES / f"{name}.yaml")  # the schema's checks
        text = (GPU_RECIPES / f"{name}.yaml").read_text()
        data = yaml.safe_load(text)
        assert data["hardware"]["accelerator"] in ("cuda", "rocm") and data["hardware"].get("gpu_model"), name
        assert data["model"].get("hub") in MODELS or "recipe" in data["model"], name
        assert PLAN_HEADER.search(text) and "# Hardware: " in text, f"{name}: no hardware or plan header"
        shapes.add((data["train"]["backend"], data["train"].get("method", "lora"), data["hardware"]["gpu_model"],
                    data["hardware"]["gpus"]))
        if data["train"].get("objective") == "dpo":  # DPO after SFT: on an SFT recipe of the folder
            upstream = yaml.safe_load((GPU_RECIPES / f"{data['model']['recipe']}.yaml").read_text())
            shapes.add(("dpo after", upstream["train"].get("objective", "sft")))
    assert {("trl_local", "qlora", "rtx4090", 1), ("unsloth", "lora", "a100", 1), ("axolotl", "full", "h100", 8),
            ("axolotl", "qlora", "h100", 8), ("torchtune", "lora", "h100", 8), ("axolotl", "full", "mi300x", 8),
            ("dpo after", "sft")} <= shapes


def readme_row(name: str) -> str:
    """The README table's row of a recipe: its fields, and the plan's figures as its header states them."""
    path = GPU_RECIPES / f"{name}.yaml"
    recipe, header = load_recipe(path), PLAN_HEADER.search(path.read_text())
    train, hardware = recipe.train, recipe.hardware
    model = recipe.model.hub or f"the model `{recipe.model.recipe}` trained"
    method = {"lora": "LoRA", "full": "full"}.get(train.method) or f"QLoRA ({train.quantization.quant_type})"
    if train.objective != "sft":
        method = f"{train.objective.upper()}, {method}"
    return (f"| [{name}]({name}.yaml) | {model} | {method} | `{train.backend}` | {hardware.gpus} x {hardware.gpu} "
            f"({ACCELERATORS[hardware.accelerator]}) | {header['memory']} ({header['layout']}) | {header['time']} |")


def test_the_readme_table_has_each_recipe_with_the_plan_its_header_states():
    """recipes/gpu/README.md's table: a row per recipe, in name order, each as readme_row builds it from the file
    (the smoke test below checks each header against the plan)."""
    table = re.search(r"^\| recipe \|.*\n\|[- |]+\n((?:\|.*\n)*)", README.read_text(), re.MULTILINE)
    assert table, f"{README}: no table under a `| recipe |` header row"
    assert table[1].splitlines() == [readme_row(name) for name in recipe_names()]


@pytest.fixture(scope="module")
def gpu_recipes(hub_cache) -> dict:
    """Every recipe of the folder as the workflow loads them (`--config recipes=recipes/gpu`): each through
    preflight (paths confined, the hub model found in the cache), then their chains."""
    recipes = {name: preflight(GPU_RECIPES / f"{name}.yaml", REPO) for name in recipe_names()}
    check_chains(recipes, "recipes/gpu")
    return recipes


@pytest.mark.slow
@pytest.mark.parametrize("name", recipe_names())
def test_each_gpu_recipe_passes_xtrain_smoke_and_states_its_plan(name, gpu_recipes, tmp_path, monkeypatch):
    path, recipe = GPU_RECIPES / f"{name}.yaml", gpu_recipes[name]
    if recipe.train.backend not in ("trl_cpu", "trl_local"):
        ensure_backend_env(recipe.train.backend)
    monkeypatch.chdir(REPO)  # the backend finds its interpreter under .venvs/
    # A recipe built on another one is rehearsed on its chain's root model: the upstream's checkpoint, which has the
    # root's configuration and tokenizer, does not exist before the upstream has trained on its GPUs.
    model = Path(model_folder(root_model(name, gpu_recipes)))
    sources = [source.path for source in recipe.data.sources]  # as the rule gives them, from the project
    (tmp_path / "recipe.json").write_text(json.dumps(recipe.model_dump(mode="json")))
    # In a process of its own under the train job's allocator, as rule smoke runs it (scripts/smoke.py preloads it):
    # the 8B DPO recipe's smoke took 160 s in this process, under glibc, and 87 s under the lock's mimalloc.
    run = subprocess.run([sys.executable, "-c", SMOKE, str(tmp_path / "recipe.json"), name, str(model),
                          json.dumps(sources), str(tmp_path / "smoke")], capture_output=True, text=True,
                         env={**os.environ, **allocator.train_job_variables()})
    assert run.returncode == 0, run.stderr[-4000:]
    summary = json.loads((tmp_path / "smoke" / "smoke.json").read_text())
    steps = {step["step"]: step for step in summary["steps"]}
    assert summary["verdict"] == "passed", steps
    plan = steps["plan"]
    assert (plan["device"], plan["gpus"]) == (recipe.hardware.gpu, recipe.hardware.devices)
    assert plan["peak_gib_per_device"] < plan["budget_gib_per_device"]
    assert steps["train"]["backend"] == recipe.train.backend and steps["train"]["steps"] == 3
    # What the lane would launch on the recipe's hardware, as its own validator accepted it: every GPU of the node a
    # process, in the plan's precision (torchtune's on its command line, the others' in their config).
    launch, gpus = steps["launch"], recipe.hardware.gpus
    assert launch["validated_by"].startswith(VALIDATORS[recipe.train.backend]) and launch["resources"]["gpus"] == gpus
    assert gpus == 1 or f"--nproc-per-node={gpus}" in launch["argv"]
    if recipe.train.backend == "torchtune":
        assert f"dtype={plan['precision']}" in launch["argv"]
    elif recipe.train.backend in ("axolotl", "trl_local"):
        assert json.loads((tmp_path / "smoke" / "launch.json").read_text())["config"][plan["precision"]] is True
    header = plan_header(plan)
    assert header in path.read_text(), f"{path}: the plan's figures changed; its header should read\n{header}"
