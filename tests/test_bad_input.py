"""Bad input is refused before any job runs: a table of bad recipes and data files, each with the message
that names the file and the field and says what to do.

Recipes go through `xtrain.preflight` (what the workflow runs on every recipe as it starts), in-process;
data files through `prepare`. tests/test_recipe.py holds the schema's own table (unknown fields, wrong
types, zero sizes, batch not divisible by the devices...); these are the rows it does not have.
tests/test_robustness.py drives a few of them through real `snakemake`.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from xtrain.errors import XtrainError
from xtrain.preflight import preflight
from xtrain.recipe import Data, DataSource, RecipeError

GOOD = {
    "model": {"path": "models/base"},
    "data": {"sources": [{"path": "data/chat.jsonl"}], "seq_len": 128},
    "train": {"method": "lora", "global_batch_size": 8},
    "hardware": {"accelerator": "cpu", "gpus": 0},
}
CHAT = '{"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]}\n'


def merged(base: dict, changes: dict) -> dict:
    """`base` with `changes` merged in section by section; a None value removes the key."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A project with a model folder, a data file, and, beside it, a model and data outside the project."""
    root = tmp_path_factory.mktemp("project")
    (root / "models/base").mkdir(parents=True)
    (root / "models/base/config.json").write_text("{}")
    (root / "data").mkdir()
    (root / "data/chat.jsonl").write_text(CHAT)
    (root / "data/unreadable.jsonl").write_text('{"messages": [{"role": "human", "content": "Hi"}]}\n')
    (root / "data/pairs.jsonl").write_text('{"prompt": "Hi", "chosen": "Hello", "rejected": "Go away"}\n')
    (root / "recipes").mkdir()
    outside = root.parent / f"{root.name}-outside"
    (outside / "model").mkdir(parents=True)
    (outside / "model/config.json").write_text("{}")
    (outside / "chat.jsonl").write_text(CHAT)
    (root / "data/linked.jsonl").symlink_to(outside / "chat.jsonl")
    return root


def tree(root: Path) -> dict[str, int]:
    """Every file under `root` with its modification time."""
    return {str(p.relative_to(root)): p.lstat().st_mtime_ns for p in root.rglob("*") if not p.is_dir()}


# (id, recipe file name, changes to GOOD or raw YAML text, text naming the field or place, the fix it gives)
BAD_RECIPES = [
    ("huge-seq-len", "r", {"data": {"seq_len": 10_000_000}}, "data.seq_len", "less than or equal to 131072"),
    ("zero-epochs", "r", {"train": {"epochs": 0}}, "train.epochs", "greater than 0"),
    ("negative-max-steps", "r", {"train": {"max_steps": -3}}, "train.max_steps", "greater than 0"),
    ("zero-eval-batch", "r", {"eval": {"batch_size": 0}}, "eval.batch_size", "greater than 0"),
    ("eval-fraction-one", "r", {"data": {"eval_fraction": 1.0}}, "data.eval_fraction", "less than 1"),
    ("lora-dropout-one", "r", {"train": {"lora": {"dropout": 1.0}}}, "train.lora.dropout", "less than 1"),
    ("empty-lora-targets", "r", {"train": {"lora": {"target_modules": []}}}, "train.lora.target_modules",
     "at least 1 item"),
    ("lora-alpha-text", "r", {"train": {"lora": {"alpha": "high"}}}, "train.lora.alpha", "valid number"),
    ("infinite-learning-rate", "r", "model: {path: models/base}\ndata: {sources: [{path: data/chat.jsonl}]}\n"
     "train: {learning_rate: .inf}\n", "train.learning_rate", "finite number"),
    ("nan-weight-decay", "r", "model: {path: models/base}\ndata: {sources: [{path: data/chat.jsonl}]}\n"
     "train: {weight_decay: .nan}\n", "train.weight_decay", "finite number"),
    ("negative-seed", "r", {"train": {"seed": -1}}, "train.seed", "greater than or equal to 0"),
    ("warmup-ratio-one", "r", {"train": {"warmup_ratio": 1}}, "train.warmup_ratio", "less than 1"),
    ("unknown-format", "r", {"data": {"sources": [{"path": "data/chat.jsonl", "format": "xml"}]}},
     "data.sources[0].format", "'messages'"),
    ("columns-without-format", "r", {"data": {"sources": [{"path": "data/chat.jsonl", "columns": {"messages": "d"}}]}},
     "data.sources[0]", "set `format` too"),
    ("role-mapped-to-nothing", "r", {"data": {"sources": [{"path": "data/chat.jsonl", "roles": {"bot": "robot"}}]}},
     "data.sources[0]", "map each to one of"),
    ("path-and-hub", "r", {"data": {"sources": [{"path": "data/chat.jsonl", "hub": "org/set"}]}},
     "data.sources[0]", "give exactly one of `path`"),
    ("source-listed-twice", "r", {"data": {"sources": [{"path": "data/chat.jsonl"}, {"path": "data/chat.jsonl"}]}},
     "data", "list each once and use `weight`"),
    ("gpu-model-of-other-vendor", "r", {"hardware": {"accelerator": "rocm", "gpus": 1, "gpu_model": "h100"}},
     "hardware", "fix one of them"),
    ("micro-batch-does-not-divide", "r", {"train": {"micro_batch_size": 3}}, "train.micro_batch_size",
     "choose a divisor"),
    ("backend-cannot-train-on-gpus", "r", {"hardware": {"accelerator": "cuda", "gpus": 1}}, "hardware.accelerator",
     "set hardware.accelerator: cpu"),
    ("backend-runs-one-node", "r", {"hardware": {"nodes": 2}}, "hardware.nodes", "set hardware.nodes: 1"),
    ("gate-on-unknown-metric", "r", {"eval": {"gate": {"tuned_accuracy": {"min": 0.5}}}}, "eval.gate",
     "known metrics: "),
    ("backend-cannot-honour-the-device", "r", {"train": {"backend": "primus"}}, "hardware.accelerator",
     "set hardware.accelerator: rocm"),
    ("backend-is-translate-only", "r", {"train": {"backend": "primus"}, "hardware": {"accelerator": "rocm", "gpus": 8}},
     "train.backend primus", "translate-only"),
    ("trust-remote-code-as-text", "r", {"model": {"trust_remote_code": "yes"}}, "model.trust_remote_code",
     "valid boolean"),
    ("model-path-missing", "r", {"model": {"path": "models/nosuch"}}, "model.path", "not a model folder"),
    ("model-path-not-a-model", "r", {"model": {"path": "data"}}, "model.path", "no config.json there"),
    ("model-path-escapes-with-dotdot", "r", {"model": {"path": "../{outside}/model"}}, "model.path",
     "add its folder to `allowed_paths`"),
    ("model-path-absolute-outside", "r", {"model": {"path": "{outside_abs}/model"}}, "model.path",
     "outside the project"),
    ("data-path-escapes-with-dotdot", "r", {"data": {"sources": [{"path": "data/../../{outside}/chat.jsonl"}]}},
     "data.sources[0].path", "add its folder to `allowed_paths`"),
    ("data-path-symlink-outside", "r", {"data": {"sources": [{"path": "data/linked.jsonl"}]}},
     "data.sources[0].path", "outside the project"),
    ("data-rows-do-not-parse", "r", {"data": {"sources": [{"path": "data/unreadable.jsonl"}]}},
     "data/unreadable.jsonl:1: field `messages[0].role`", "map others with data.sources[].roles"),
    ("preference-data-in-sft-recipe", "r", {"data": {"sources": [{"path": "data/pairs.jsonl"}]}},
     "data/pairs.jsonl:1: this source holds preference pairs", "train.objective: dpo"),
    ("data-path-missing", "r", {"data": {"sources": [{"path": "data/nosuch.jsonl"}]}}, "data.sources[0].path",
     "fix the path or create the file"),
    ("recipe-name-with-dotdot", "..up", {}, "'..up'", "rename the file"),
    ("recipe-name-with-dots", "a..b", {}, "'a..b'", "rename the file"),
    ("key-given-twice", "r", "model: {path: models/base}\ndata: {sources: [{path: data/chat.jsonl}]}\n"
     "train: {learning_rate: 1.0e-3}\ntrain: {learning_rate: 1.0e-2}\n", "line 4", "given twice in one mapping"),
    ("python-object-tag", "r", "model: !!python/object/apply:os.system ['touch pwned']\n", "line 1",
     "could not determine a constructor"),
]


@pytest.mark.parametrize(("name", "content", "field", "fix"), [c[1:] for c in BAD_RECIPES],
                         ids=[c[0] for c in BAD_RECIPES])
def test_bad_recipe_is_refused_before_any_job(project, name, content, field, fix):
    outside = f"{project.name}-outside"
    subst = {"{outside}": outside, "{outside_abs}": str(project.parent / outside)}
    text = content if isinstance(content, str) else yaml.safe_dump(merged(GOOD, content), sort_keys=False)
    for key, value in subst.items():
        text = text.replace(key, value)
    before = tree(project)
    path = project / "recipes" / f"{name}.yaml"
    path.write_text(text)
    try:
        with pytest.raises(RecipeError) as info:
            preflight(path, project)
    finally:
        path.unlink()
    message = str(info.value)
    assert str(path) in message, message
    assert field in message, message
    assert fix in message, message
    assert not (project / "pwned").exists() and not Path("pwned").exists()
    assert tree(project) == before, "nothing written"


def test_allowed_paths_admit_a_folder_outside_the_project(project):
    outside = project.parent / f"{project.name}-outside"
    path = project / "recipes" / "shared.yaml"
    path.write_text(yaml.safe_dump(merged(GOOD, {"model": {"path": str(outside / "model")},
                                                 "data": {"sources": [{"path": "data/linked.jsonl"}]}})))
    try:
        with pytest.raises(RecipeError, match="outside the project"):
            preflight(path, project)
        recipe = preflight(path, project, allowed=[str(outside)])
        assert recipe.model.path == str(outside / "model")
        # Relative allowlist entries are relative to the project.
        preflight(path, project, allowed=[f"../{outside.name}"])
    finally:
        path.unlink()


def test_a_folder_a_rule_builds_may_be_missing(project):
    path = project / "recipes" / "built.yaml"
    path.write_text(yaml.safe_dump(merged(GOOD, {"model": {"path": "models/to-build"}})))
    try:
        with pytest.raises(RecipeError, match="not a model folder"):
            preflight(path, project)
        assert preflight(path, project, built=["models/to-build"]).model.path == "models/to-build"
    finally:
        path.unlink()


# (id, data file name, its content, text naming the place in the file, what is wrong)
BAD_DATA = [
    ("invalid-json-line", "broken.jsonl", CHAT + '{"messages": [\n', "broken.jsonl:2", "malformed JSON"),
    ("no-messages-column", "nocol.jsonl", '{"dialog": []}\n', "nocol.jsonl", "set data.sources[].format"),
    ("unknown-role", "role.jsonl", '{"messages": [{"role": "robot", "content": "x"}]}\n', "role.jsonl", "robot"),
    ("empty-file", "empty.jsonl", "", "empty.jsonl", "no rows"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "content", "where", "what"), [c[1:] for c in BAD_DATA], ids=[c[0] for c in BAD_DATA])
def test_bad_data_file_is_refused_naming_file_and_line_with_no_output(tiny_model, tmp_path, name, content, where, what):
    from xtrain.data import prepare

    source = tmp_path / name
    source.write_text(content)
    out = tmp_path / "prepared" / "r"
    with pytest.raises(XtrainError) as info:
        prepare([source], tiny_model, Data(sources=[DataSource(path=str(source))], seq_len=128), out)
    message = str(info.value)
    assert str(source) in message and where in message and what in message, message
    assert not out.exists() and not list(out.parent.glob(".r.*")), "no partial output"


@pytest.mark.slow
def test_lora_target_matching_no_module_stops_at_the_plan_naming_the_field(tiny_model):
    """The one recipe check that needs the model's module names: the plan makes it, before training."""
    from xtrain.plan.model import count_parameters
    from xtrain.recipe import Lora, Train

    with pytest.raises(XtrainError) as info:
        count_parameters(tiny_model, Train(method="lora", lora=Lora(target_modules=["q_proj", "qkv"])))
    message = str(info.value)
    assert "train.lora.target_modules: ['qkv'] match no module of the model" in message
    assert "q_proj" in message, "it lists the module names the model has"
