"""The unsloth lane: its refusals, and a real run in its own environment compared with trl_cpu."""

from __future__ import annotations

import pytest

from checkpoint_contract import assert_checkpoint_contract
from conftest import REPO, build_run
from lanes import ensure_lane_env, trl_cpu_reference  # noqa: F401 (a fixture)
from lanes import tiny_train as lane_train
from xtrain.artifacts import read_json
from xtrain.backends import get_backend
from xtrain.errors import XtrainError
from xtrain.recipe import Hardware, Lora, Train


def tiny_train(**changes) -> Train:
    return lane_train("unsloth", **changes)


def test_a_gpu_recipe_is_refused_before_launch():
    with pytest.raises(XtrainError, match="hardware.accelerator 'cuda' is not supported yet"):
        get_backend("unsloth").check(tiny_train(), Hardware(accelerator="cuda", gpus=1))


def test_all_linear_targets_are_refused_with_the_names_to_list():
    with pytest.raises(XtrainError, match=r"target_modules \['all-linear'\].*list the module names"):
        get_backend("unsloth").check(tiny_train(lora=Lora(target_modules=["all-linear"])), Hardware())


@pytest.mark.slow
def test_unsloth_trains_the_tiny_recipe_like_trl_cpu(trl_cpu_reference, tiny_model, tmp_path, monkeypatch):
    ensure_lane_env("unsloth")
    monkeypatch.chdir(REPO)  # the lane finds its interpreter under .venvs/
    run = build_run(tmp_path, tiny_model, tiny_train())
    metrics = assert_checkpoint_contract(run["checkpoint"], tiny_model, "unsloth")
    assert (run["checkpoint"] / "adapter_model.safetensors").is_file()
    assert metrics["steps"] == 4 and [entry["step"] for entry in metrics["loss"]] == [1, 2, 3, 4]
    # Both lanes build SFTTrainer from the same `sft_arguments` on the same prepared rows with the same seed,
    # so the first batch is the same rows; LoRA's B starts at zero, so step 1's loss is the base model's loss
    # on that batch in both (seen equal to 5 digits on 2026-12-02: on the CPU Unsloth falls back to
    # transformers' forward, with its chunked cross-entropy).
    first, expected = metrics["loss"][0]["loss"], trl_cpu_reference["loss"][0]["loss"]
    assert first == pytest.approx(expected, rel=0.02), f"first-step loss {first} vs trl_cpu {expected}"
    assert metrics["tokens_seen"] == trl_cpu_reference["tokens_seen"], "the same rows, the same non-padding tokens"
    report = read_json(run["report"])
    assert report["tuned_loss"] < report["base_loss"]
