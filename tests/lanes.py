"""Shared by the tests of the lanes with their own environment: the tiny recipe they all train, its trl_cpu
reference run (once per session), and the lane environments, built once into the work tree's .venvs/<lane>/
(as rule build_lane_env builds them) and reused while their ready.json records the current spec's hash."""

from __future__ import annotations

import fcntl

import pytest
import yaml

from conftest import REPO, build_run
from xtrain.artifacts import read_json
from xtrain.envs import build, is_built
from xtrain.recipe import Train

# A few steps of LoRA on the demo data, one logged loss per step.
TINY = {"method": "lora", "global_batch_size": 4, "max_steps": 4, "learning_rate": 5e-3, "logging_steps": 1}


def tiny_train(backend: str, **changes) -> Train:
    return Train(**{**TINY, "backend": backend, **changes})


@pytest.fixture(scope="session")
def trl_cpu_reference(tiny_model, tmp_path_factory) -> dict:
    """train_metrics.json of trl_cpu on the tiny recipe: what each lane's first-step loss is compared with."""
    run = build_run(tmp_path_factory.mktemp("trl_cpu_reference"), tiny_model, tiny_train("trl_cpu"))
    return read_json(run["checkpoint"] / "train_metrics.json")


def ensure_lane_env(backend: str) -> None:
    """Build .venvs/<backend> unless it is a build of the current spec; one builder at a time (xdist workers)."""
    spec, target = REPO / "envs" / f"{backend}.yaml", REPO / ".venvs" / backend
    target.parent.mkdir(exist_ok=True)
    with open(target.parent / f".{backend}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_built(spec, target):
            lanes = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["backends"]
            build(spec, target, lanes[backend].get("uninstall", []))
