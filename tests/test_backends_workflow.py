"""The axolotl and unsloth backends in the workflow: their environments are built by rule build_backend_env before
their train jobs, and a recipe a backend refuses stops the workflow before any job runs."""

from __future__ import annotations

import re

import pytest
from conftest import REPO, copy_workflow, scheduled_jobs, snakemake

pytestmark = pytest.mark.slow  # drives real snakemake (dry runs)

DEMO = (REPO / "recipes" / "demo.yaml").read_text()


def test_each_backend_trains_after_its_own_environment_is_built(tmp_path):
    project = copy_workflow(tmp_path, {backend: DEMO.replace("backend: trl_cpu", f"backend: {backend}")
                                       for backend in ("axolotl", "unsloth")})
    result = snakemake(project, "-n", "checkpoints/axolotl", "checkpoints/unsloth")
    output = result.stdout + result.stderr
    assert {("train", "axolotl"), ("train", "unsloth"), ("build_backend_env", None)} <= scheduled_jobs(output)
    assert "output: .venvs/axolotl/ready.json" in output and "output: .venvs/unsloth/ready.json" in output


def test_a_recipe_the_backend_refuses_stops_the_workflow_before_any_job(tmp_path):
    refused = DEMO.replace("backend: trl_cpu", "backend: unsloth").replace("accelerator: cpu\n  gpus: 0",
                                                                          "accelerator: rocm\n  gpus: 1")
    project = copy_workflow(tmp_path, {"gpu": refused})
    result = snakemake(project, "-n", check=False)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "recipes/gpu.yaml: train.backend unsloth runs on hardware.accelerator cpu or cuda, not 'rocm'" in output
    # Snakemake names the rule whose input needed the recipe ("Exception in rule evaluate"); no job is listed.
    assert not re.search(r"^(local)?rule \w+:$", output, re.MULTILINE), "no job was scheduled"
