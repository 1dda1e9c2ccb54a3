"""The recipe schema: the demo recipes load, and every bad recipe fails with a message a user can act on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from xtrain.recipe import Hardware, Recipe, RecipeError, Train, load_recipe, parse_recipe, stage_params

ROOT = Path(__file__).parents[1]

GOOD = {
    "model": {"path": "models/tiny-llama"},
    "data": {"sources": [{"path": "data/demo/chat.jsonl"}], "seq_len": 128},
    "train": {"method": "lora", "global_batch_size": 8},
    "hardware": {"accelerator": "cpu", "gpus": 0},
}


def with_changes(**sections) -> dict:
    """GOOD with whole sections replaced (None removes a section)."""
    recipe = {**GOOD, **sections}
    return {k: v for k, v in recipe.items() if v is not None}


def write(tmp_path: Path, content, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False))
    return path


def test_demo_recipe_loads():
    recipe = load_recipe(ROOT / "recipes/demo.yaml")
    assert recipe.model.path == "models/tiny-llama"
    assert recipe.data.sources[0].path == "data/demo/chat.jsonl"
    assert recipe.train.method == "lora"
    assert recipe.train.lora is not None and recipe.train.lora.r == 16
    assert recipe.hardware.devices == 1


def test_demo_full_recipe_loads():
    recipe = load_recipe(ROOT / "recipes/demo_full.yaml")
    assert recipe.train.method == "full"
    assert recipe.train.lora is None


def test_good_recipe_loads_and_lora_defaults_apply(tmp_path):
    recipe = load_recipe(write(tmp_path, GOOD, "good.yaml"))
    assert recipe.train.lora is not None
    assert recipe.train.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]


# (id, recipe content, text naming the field or place, text telling the user what to do)
BAD_CASES = [
    (
        "unknown-field-typo",
        with_changes(train={"method": "lora", "learnig_rate": 1e-3}),
        "train.learnig_rate",
        "did you mean `learning_rate`?",
    ),
    (
        "unknown-top-level-section",
        with_changes(trian={"epochs": 1}),
        "trian",
        "did you mean `train`?",
    ),
    (
        "unknown-field-not-close-to-any",
        with_changes(export={"zzz": 1}),
        "export.zzz",
        "name one of the fields of export: dtype, gguf, merged, ollama, shard_gb",
    ),
    (
        "wrong-type",
        with_changes(train={"global_batch_size": "eight"}),
        "train.global_batch_size",
        "should be a valid integer",
    ),
    (
        "wrong-type-list-item",  # one value is taken as a one-item list, and this one is no source
        with_changes(data={"sources": "data/demo/chat.jsonl"}),
        "data.sources[0]",
        "should be a valid dictionary",
    ),
    (
        "zero-lora-rank",
        with_changes(train={"lora": {"r": 0}}),
        "train.lora.r",
        "greater than 0",
    ),
    (
        "negative-seq-len",
        with_changes(data={"sources": [{"path": "x.jsonl"}], "seq_len": -5}),
        "data.seq_len",
        "greater than 0",
    ),
    (
        "zero-global-batch",
        with_changes(train={"global_batch_size": 0}),
        "train.global_batch_size",
        "greater than 0",
    ),
    (
        "negative-learning-rate",
        with_changes(train={"learning_rate": -1e-4}),
        "train.learning_rate",
        "greater than 0",
    ),
    (
        "missing-model",
        with_changes(model=None),
        "model",
        "required field is missing; add it",
    ),
    (
        "missing-source-path",
        with_changes(data={"sources": [{"format": "messages"}]}),
        "data.sources[0].path",
        "add it",
    ),
    (
        "full-with-lora",
        with_changes(train={"method": "full", "lora": {"r": 8}}),
        "train: `lora` settings are given but method is `full`",
        "remove `lora` or set method: lora",
    ),
    (
        "gpus-on-cpu",
        with_changes(hardware={"accelerator": "cpu", "gpus": 2}),
        "hardware",
        "set accelerator: cuda or rocm, or gpus: 0",
    ),
    (
        "cuda-without-gpus",
        with_changes(hardware={"accelerator": "cuda", "gpus": 0}),
        "hardware",
        "set gpus to at least 1",
    ),
    (
        "batch-not-divisible-by-gpus",
        with_changes(train={"global_batch_size": 6}, hardware={"accelerator": "cuda", "gpus": 4}),
        "train.global_batch_size",
        "use a multiple of 4",
    ),
    (
        "batch-not-divisible-by-gpus-times-nodes",
        with_changes(train={"global_batch_size": 12}, hardware={"accelerator": "cuda", "gpus": 4, "nodes": 2}),
        "train.global_batch_size",
        "use a multiple of 8",
    ),
    (
        "unknown-backend",
        with_changes(train={"backend": "deepspeed"}),
        "train.backend",
        "'trl_cpu'",
    ),
    (
        "invalid-yaml",
        "model:\n  path: models/tiny-llama\ndata: [unclosed\n  seq_len: 1\n",
        "line 4, column",
        "not valid YAML",
    ),
    (
        "not-a-mapping",
        "- model\n- data\n",
        "",
        "a recipe is a YAML mapping",
    ),
    (
        "empty-document",
        "",
        "",
        "a recipe is a YAML mapping",
    ),
]


@pytest.mark.parametrize(("content", "field", "hint"), [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_bad_recipe_is_a_recipe_error_naming_file_field_and_fix(tmp_path, content, field, hint):
    path = write(tmp_path, content)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    message = str(info.value)
    assert str(path) in message
    assert field in message
    assert hint in message


def test_unknown_field_message_names_the_full_path(tmp_path):
    path = write(tmp_path, with_changes(train={"lora": {"r": 8, "alpah": 16}}))
    with pytest.raises(RecipeError, match=r"train\.lora\.alpah: unknown field"):
        load_recipe(path)


def test_a_misspelt_field_inside_a_list_item_or_a_mapping_value_gets_its_closest_name(tmp_path):
    path = write(tmp_path, with_changes(data={"sources": [{"path": "x.jsonl", "fromat": "alpaca"}]},
                                        eval={"gate": {"tuned_loss": {"mx": 2}}}))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert "data.sources[0].fromat: unknown field; did you mean `format`?" in str(info.value)
    assert "eval.gate.tuned_loss.mx: unknown field; did you mean `max`?" in str(info.value)


def test_a_list_field_given_one_value_holds_that_one_value(tmp_path):
    recipe = load_recipe(write(tmp_path, with_changes(train={"lora": {"target_modules": "all-linear"}},
                                                      export={"gguf": "f16"})))
    assert recipe.train.lora.target_modules == ["all-linear"] and recipe.export.gguf == ["f16"]


def test_invalid_yaml_message_has_the_line_number(tmp_path):
    # The tab on line 3 is not allowed in YAML indentation.
    path = write(tmp_path, "model:\n  path: m\ndata:\n\tsources: []\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert f"{path}: line 4," in str(info.value)


def test_several_errors_are_all_reported(tmp_path):
    path = write(tmp_path, with_changes(train={"lora": {"r": 0}, "epochs": -1, "lerning_rate": 1}))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    message = str(info.value)
    for field in ("train.lora.r", "train.epochs", "train.lerning_rate"):
        assert field in message


@pytest.mark.parametrize("name", ["demo.v2.yaml", "my recipe.yaml", "-dash.yaml"])
def test_recipe_name_must_be_a_safe_folder_name(tmp_path, name):
    path = write(tmp_path, GOOD, name)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    message = str(info.value)
    assert str(path) in message
    assert repr(Path(name).stem) in message
    assert "rename the file" in message


def test_missing_recipe_file(tmp_path):
    path = tmp_path / "absent.yaml"
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_recipe(path)


def test_non_utf8_recipe(tmp_path):
    path = tmp_path / "latin.yaml"
    path.write_bytes(b"model:\n  path: caf\xe9\n")
    with pytest.raises(RecipeError, match=r"not UTF-8 text \(byte 18\)"):
        load_recipe(path)


def test_parse_recipe_names_the_source():
    with pytest.raises(RecipeError, match=r"^inline-source: invalid recipe"):
        parse_recipe({"data": GOOD["data"]}, "inline-source")


def all_keys(value) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in all_keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in all_keys(v)}
    return set()


def test_plan_params_hold_only_the_run_shape():
    recipe = load_recipe(ROOT / "recipes/demo.yaml")
    params = stage_params(recipe, "plan")
    keys = all_keys(params)
    for optimisation_only in ("learning_rate", "lr_scheduler", "seed", "warmup_ratio", "logging_steps"):
        assert optimisation_only not in keys
    assert params["train"]["method"] == "lora"
    assert params["train"]["global_batch_size"] == 8
    assert params["train"]["lora"]["r"] == 16
    assert params["hardware"] == recipe.hardware.model_dump(mode="json")
    assert "data" not in params and "eval" not in params
    json.dumps(params)  # plain JSON data, usable as Snakemake params


def test_plan_params_do_not_change_with_the_learning_rate(tmp_path):
    a = load_recipe(write(tmp_path, with_changes(train={"learning_rate": 1e-3}), "a.yaml"))
    b = load_recipe(write(tmp_path, with_changes(train={"learning_rate": 5e-3, "seed": 7}), "b.yaml"))
    assert stage_params(a, "plan") == stage_params(b, "plan")
    assert stage_params(a, "train") != stage_params(b, "train")


def test_evaluate_params_hold_only_the_eval_section_less_its_gates():
    recipe = load_recipe(ROOT / "recipes/demo.yaml")
    assert stage_params(recipe, "evaluate") == {
        "eval": {"batch_size": 16, "generations": 8, "max_new_tokens": 48, "lm_eval": None}
    }
    assert stage_params(recipe, "gate") == {"gate": {"loss_improvement": {"min": 0.0, "max": None}}}


def test_prepare_params_hold_only_the_data_section():
    recipe = load_recipe(ROOT / "recipes/demo.yaml")
    assert stage_params(recipe, "prepare") == {"data": recipe.data.model_dump(mode="json")}


@pytest.mark.parametrize("recipe_file", ["demo.yaml", "demo_full.yaml"])
def test_train_params_round_trip(recipe_file):
    # Regression: a `method: full` recipe dumped `lora: null`, which Train then refused.
    recipe = load_recipe(ROOT / "recipes" / recipe_file)
    params = stage_params(recipe, "train")
    assert Train.model_validate(params["train"]) == recipe.train
    assert Hardware.model_validate(params["hardware"]) == recipe.hardware


def test_full_method_round_trips_through_train_params(tmp_path):
    recipe = load_recipe(write(tmp_path, with_changes(train={"method": "full", "global_batch_size": 4}), "full.yaml"))
    params = stage_params(recipe, "train")
    assert params["train"]["lora"] is None
    train = Train.model_validate(json.loads(json.dumps(params["train"])))
    assert train == recipe.train
    assert train.method == "full" and train.lora is None


def test_recipe_hash_is_stable_and_content_based(tmp_path):
    a = load_recipe(write(tmp_path, GOOD, "a.yaml"))
    b = load_recipe(write(tmp_path, GOOD, "b.yaml"))
    c = load_recipe(write(tmp_path, with_changes(train={"epochs": 2}), "c.yaml"))
    assert a.hash() == b.hash() != c.hash()
    assert isinstance(a, Recipe)
