"""The unsloth backend: its refusals, and a real run in its own environment compared with trl_cpu."""

from __future__ import annotations

import pytest
from backend_runs import tiny_train as backend_train
from backend_runs import train_tiny_recipe_with_backend, trl_cpu_reference  # noqa: F401 (a fixture)

from xtrain import backends
from xtrain.backends import get_backend
from xtrain.errors import XtrainError
from xtrain.recipe import Hardware, Lora, Train


def tiny_train(**changes) -> Train:
    return backend_train("unsloth", **changes)


def test_a_gpu_recipe_is_refused_before_launch():
    with pytest.raises(XtrainError, match="runs on hardware.accelerator cpu, not 'cuda'"):
        backends.check("unsloth", tiny_train(), Hardware(accelerator="cuda", gpus=1))


def test_all_linear_targets_are_refused_with_the_names_to_list():
    with pytest.raises(XtrainError, match=r"target_modules \['all-linear'\].*list the module names"):
        get_backend("unsloth").check(tiny_train(lora=Lora(target_modules=["all-linear"])), Hardware())


@pytest.mark.slow
def test_unsloth_trains_the_tiny_recipe_like_trl_cpu(trl_cpu_reference, tiny_model, tmp_path, monkeypatch):
    # Both backends build SFTTrainer from the same `sft_arguments` on the same prepared rows with the same seed:
    # step 1's loss was seen equal to 5 digits on 2026-12-02 (on the CPU Unsloth falls back to transformers'
    # forward, with its chunked cross-entropy).
    metrics = train_tiny_recipe_with_backend("unsloth", trl_cpu_reference, tiny_model, tmp_path, monkeypatch)
    assert metrics["tokens_seen"] == trl_cpu_reference["tokens_seen"], "the same rows, the same non-padding tokens"
