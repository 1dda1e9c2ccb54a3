"""A recipe cannot run code unless it says so: model.trust_remote_code is off by default, and when a recipe
turns it on, every stage passes it to transformers, a warning is logged and the checkpoint manifest
records it. (Recipe parsing refuses Python YAML tags: tests/test_bad_input.py; shell syntax in recipe
fields and planted tokens through the whole workflow: tests/test_robustness.py.)"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from xtrain.data import prepare
from xtrain.evaluate import evaluate
from xtrain.plan import make_plan, write_plan
from xtrain.recipe import Data, DataSource, Eval, Hardware, Train, load_recipe, stage_params, trusts_remote_code
from xtrain.train.run import run_training

# A model folder that ships its own code: importing it leaves a mark, so the test sees whether it ran.
CUSTOM_CODE = '''
import os
from pathlib import Path

from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

with Path(os.environ["XTRAIN_TEST_REMOTE_CODE_MARK"]).open("a") as mark:
    mark.write("imported\\n")


class CustomConfig(LlamaConfig):
    model_type = "xtrain_custom_llama"


class CustomForCausalLM(LlamaForCausalLM):
    config_class = CustomConfig


class CustomTokenizerFast(PreTrainedTokenizerFast):
    pass
'''


@pytest.fixture
def custom_model(tiny_model, tmp_path, monkeypatch) -> tuple[Path, Path]:
    model = tmp_path / "custom-model"
    shutil.copytree(tiny_model, model)
    (model / "custom_llama.py").write_text(CUSTOM_CODE)
    config = json.loads((model / "config.json").read_text())
    config["model_type"] = "xtrain_custom_llama"
    config["auto_map"] = {"AutoConfig": "custom_llama.CustomConfig",
                          "AutoModelForCausalLM": "custom_llama.CustomForCausalLM"}
    (model / "config.json").write_text(json.dumps(config))
    tokenizer = json.loads((model / "tokenizer_config.json").read_text())
    tokenizer["auto_map"] = {"AutoTokenizer": [None, "custom_llama.CustomTokenizerFast"]}
    tokenizer["tokenizer_class"] = "CustomTokenizerFast"
    (model / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    mark = tmp_path / "remote-code-ran"
    monkeypatch.setenv("XTRAIN_TEST_REMOTE_CODE_MARK", str(mark))
    return model, mark


def test_trust_remote_code_is_off_unless_the_recipe_sets_it(tmp_path):
    recipe = load_recipe(REPO / "recipes/demo.yaml")
    assert recipe.model.trust_remote_code is False
    stages = ("prepare", "plan", "train", "evaluate")
    assert not any(trusts_remote_code(stage_params(recipe, stage)) for stage in stages)
    on = tmp_path / "on.yaml"
    on.write_text((REPO / "recipes/demo.yaml").read_text().replace(
        "  path: models/tiny-llama\n", "  path: models/tiny-llama\n  trust_remote_code: true\n"))
    recipe = load_recipe(on)
    assert all(trusts_remote_code(stage_params(recipe, stage)) for stage in stages)


def test_custom_code_is_refused_without_trust(custom_model, tmp_path):
    model, mark = custom_model
    data = Data(sources=[DataSource(path=str(REPO / "data/demo/chat.jsonl"))], seq_len=128)
    with pytest.raises(ValueError, match="trust_remote_code"):
        make_plan(model, {}, Train(method="lora"), Hardware())
    with pytest.raises(ValueError, match="trust_remote_code"):
        prepare([Path(data.sources[0].path)], model, data, tmp_path / "prepared")
    assert not mark.exists(), "the model's code did not run"
    assert not (tmp_path / "prepared").exists()


@pytest.mark.slow
def test_trusted_custom_code_runs_in_every_stage_warns_and_is_in_the_manifest(custom_model, tmp_path, caplog):
    model, mark = custom_model
    data = Data(sources=[DataSource(path=str(REPO / "data/demo/chat.jsonl"))], seq_len=128, eval_fraction=0.1)
    train, hardware = Train(method="lora", global_batch_size=4, max_steps=2), Hardware()
    manifest = prepare([Path(data.sources[0].path)], model, data, tmp_path / "prepared", trust_remote_code=True)
    plan = tmp_path / "plan.json"
    write_plan(plan, make_plan(model, manifest, train, hardware, trust_remote_code=True))
    checkpoint = tmp_path / "checkpoint"
    with caplog.at_level(logging.WARNING, logger="xtrain"):
        run_training(model_dir=model, prepared_dir=tmp_path / "prepared", plan_path=plan, train=train,
                     hardware=hardware, out=checkpoint, work_dir=tmp_path / "runs", trust_remote_code=True)
    assert "model.trust_remote_code is set" in caplog.text
    assert json.loads((checkpoint / "manifest.json").read_text())["trust_remote_code"] is True
    report = evaluate(model, checkpoint, tmp_path / "prepared", Eval(batch_size=8), tmp_path / "eval.json",
                      trust_remote_code=True)
    assert report["tuned_loss"] > 0
    assert mark.read_text().count("imported") >= 1
