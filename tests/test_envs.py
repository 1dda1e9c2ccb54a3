"""Per-backend environments: the pins come from the conda spec, and a missing build says how to make it."""

from __future__ import annotations

import sys

import pytest
from conftest import REPO

from xtrain.envs import backend_python, build, pip_requirements
from xtrain.errors import XtrainError


def test_the_main_spec_pins_torch_for_both_materialisations():
    requirements = pip_requirements(REPO / "envs" / "xtrain.yaml")
    assert "torch==2.13.0" in requirements
    assert all("==" in requirement for requirement in requirements), "every package is pinned"


def test_a_spec_without_a_pip_list_is_refused(tmp_path):
    spec = tmp_path / "backend.yaml"
    spec.write_text("name: backend\ndependencies:\n  - python=3.11\n")
    with pytest.raises(XtrainError, match=r"backend\.yaml: no `pip:` list"):
        pip_requirements(spec)


def test_a_spec_without_a_torch_pin_is_refused_before_anything_is_built(tmp_path):
    spec = tmp_path / "backend.yaml"
    spec.write_text("dependencies:\n  - pip\n  - pip:\n      - torch\n      - trl==1.16.0\n")
    with pytest.raises(XtrainError, match="pin torch"):
        build(spec, tmp_path / "venv")
    assert not (tmp_path / "venv").exists()


def test_a_backend_runs_here_when_this_interpreter_has_its_package():
    assert backend_python("trl_local", "trl") == sys.executable


def test_an_unbuilt_backend_environment_names_the_target_that_builds_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(XtrainError, match=r"snakemake --cores 1 \.venvs/axolotl/ready\.json"):
        backend_python("axolotl", "a_module_that_is_not_installed")
    (tmp_path / ".venvs" / "axolotl").mkdir(parents=True)
    (tmp_path / ".venvs" / "axolotl" / "ready.json").write_text("{}")
    assert backend_python("axolotl", "a_module_that_is_not_installed") == ".venvs/axolotl/bin/python"
