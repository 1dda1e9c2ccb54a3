"""The smoke stage of a GRPO recipe: its real plan shows the generation phase, and its train step runs real GRPO
steps on the shrunk model, sampling each prompt's group of completions and scoring them with the recipe's rewards."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from xtrain.artifacts import read_json
from xtrain.recipe import parse_recipe
from xtrain.smoke import smoke
from xtrain.smoke.run import SMOKE_BATCH, SMOKE_COMPLETION, SMOKE_STEPS, smoke_settings

pytestmark = pytest.mark.slow

RECIPE = {
    "data": {"sources": [{"path": "data/demo/prompts.jsonl"}], "seq_len": 128},
    "train": {"backend": "trl_cpu", "objective": "grpo", "method": "lora", "global_batch_size": 32, "max_steps": 40,
              "rl": {"generations": 4, "max_completion_length": 48, "kl_weight": 0.05},
              "rewards": [{"type": "format", "pattern": "^\\s*[A-Z]"}, {"type": "answer", "weight": 0.5}]},
    "hardware": {"accelerator": "cpu", "gpus": 0},
    "eval": {"max_new_tokens": 8},
}


def test_smoke_steps_are_few_prompts_with_their_groups_and_short_completions():
    train = parse_recipe({**RECIPE, "model": {"path": "models/tiny-llama"}}, "recipes/r.yaml").train
    settings = smoke_settings(train)
    assert settings.global_batch_size == SMOKE_BATCH * 4 and settings.max_steps == SMOKE_STEPS
    assert settings.rl.max_completion_length == min(48, SMOKE_COMPLETION) and settings.rl.kl_weight == 0.05
    assert settings.rewards == train.rewards


def test_a_grpo_recipe_is_rehearsed_with_real_grpo_steps_and_its_generation_plan(tmp_path, tiny_model):
    recipe = parse_recipe({**RECIPE, "model": {"path": str(tiny_model)}}, "recipes/r.yaml")
    summary = smoke(recipe=recipe, name="r", model_dir=tiny_model, sources=[REPO / "data/demo/prompts.jsonl"],
                    out=tmp_path / "smoke", prices={})
    steps = {record["step"]: record for record in summary["steps"]}
    assert summary["verdict"] == "passed", summary
    # the real run's plan: 32 completions per step, each sampled up to 48 tokens after its prompt
    assert "32 completions per device (8 prompts) of up to 48 tokens" in steps["plan"]["generation"]
    train = steps["train"]
    assert train["steps"] == SMOKE_STEPS and train["completions"] == SMOKE_BATCH * 4
    assert len(train["rewards"]) == SMOKE_STEPS and all(0 <= reward <= 1.5 for reward in train["rewards"])
    metrics = read_json(tmp_path / "smoke/checkpoint/train_metrics.json")
    assert [step["step"] for step in metrics["rl"]] == [1, 2, 3]
    assert all(0 < step["completions/mean_length"] <= SMOKE_COMPLETION and step["kl"] >= 0 for step in metrics["rl"])
    report = (tmp_path / "smoke/report.md").read_text()
    assert "- Generation (GRPO): 32 completions per device" in report
    assert f"{SMOKE_BATCH * 4} completions per step, mean reward per step" in report
    assert Path(tmp_path / "smoke/plan.json").is_file()
