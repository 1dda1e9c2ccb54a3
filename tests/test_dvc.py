"""DVC versions what Snakemake builds: generated dvc.yaml, and a push / clone / pull / repro round trip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_SECONDS, REPO, copy_workflow, scheduled_jobs

from xtrain.project.dvc_stages import render

RECIPE_A = """
model: {path: models/tiny-llama}
data:
  sources: [{path: data/demo/chat.jsonl}]
  seq_len: 128
train: {max_steps: 6, global_batch_size: 4, learning_rate: 5.0e-3, logging_steps: 2}
"""
RECIPE_B = RECIPE_A.replace("max_steps: 6", "max_steps: 4")


def test_dvc_yaml_is_up_to_date_with_recipes():
    assert (REPO / "dvc.yaml").read_text() == render(REPO), "run `make dvc.yaml` and commit the result"


def test_every_recipe_has_a_stage_with_persisted_outputs_metrics_and_plot():
    import yaml

    pipeline = yaml.safe_load(render(REPO))
    recipes = sorted(path.stem for path in (REPO / "recipes").glob("*.yaml"))
    assert sorted(set(pipeline["stages"]) - {"tiny_model"}) == recipes
    for name in recipes:
        stage = pipeline["stages"][name]
        assert stage["params"] == [{f"recipes/{name}.yaml": None}], "the recipe's keys are DVC params"
        assert all(options == {"persist": True} for out in stage["outs"] + stage["metrics"]
                   for options in out.values())
        assert {"loss_" + name: {"x": "step", "y": {f"checkpoints/{name}/train_metrics.json": "loss"}}} in pipeline["plots"]


class Shell:
    """Runs the project's tools (the venv first on PATH, as after activating it) in one folder."""

    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    def __call__(self, *cmd: str) -> str:
        result = subprocess.run(cmd, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=HANG_SECONDS)
        assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        return result.stdout + result.stderr


@pytest.mark.slow
def test_push_clone_pull_then_only_the_edited_recipe_retrains(tmp_path):
    project = copy_workflow(tmp_path / "project", {"a": RECIPE_A, "b": RECIPE_B})
    for name in (".gitignore", ".dvcignore"):
        (project / name).write_text((REPO / name).read_text())
    (project / "dvc.yaml").write_text(render(project))
    sh = Shell(project)
    sh("git", "init", "-q")
    sh("git", "config", "user.email", "ci@xtrain.invalid")
    sh("git", "config", "user.name", "xtrain CI")
    sh("dvc", "init", "-q")
    sh("dvc", "remote", "add", "-d", "store", str(tmp_path / "remote"))
    sh("dvc", "repro")
    sh("dvc", "push")
    sh("git", "add", "-A")
    sh("git", "commit", "-qm", "built a and b")
    assert not any(p.name == ".snakemake_timestamp" for p in (tmp_path / "remote").rglob("*"))

    clone = Shell(tmp_path / "clone")
    sh("git", "clone", "-q", str(project), str(clone.cwd))
    clone("dvc", "pull")
    before = json.loads((clone.cwd / "reports/a/eval.json").read_text())
    # The checkout rewrote timestamps, and Snakemake's own records (.snakemake/) are not versioned:
    # touching every job realigns the one and rebuilds the other, so later edits are seen again.
    clone("snakemake", "--touch", "--forceall", "--cores", "1")
    assert "Nothing to be done" in clone("snakemake", "-n")

    recipe = clone.cwd / "recipes/a.yaml"
    recipe.write_text(recipe.read_text().replace("learning_rate: 5.0e-3", "learning_rate: 2.0e-3"))
    log = clone("dvc", "repro")
    assert "Stage 'b' didn't change, skipping" in log and "Running stage 'a'" in log
    # DVC runs Snakemake quietly; Snakemake's own log of that run says which jobs it ran.
    snakemake_log = max((clone.cwd / ".snakemake/log").glob("*.snakemake.log"), key=lambda p: p.stat().st_mtime)
    assert scheduled_jobs(snakemake_log.read_text()) == {(step, "a") for step in ("train", "evaluate", "report", "gate")}
    assert "Nothing to be done" in clone("snakemake", "-n")
    after = json.loads((clone.cwd / "reports/a/eval.json").read_text())
    assert after["tuned_loss"] != before["tuned_loss"]
    diff = clone("dvc", "metrics", "diff")
    assert "reports/a/eval.json" in diff and "tuned_loss" in diff and "reports/b/eval.json" not in diff
    params = clone("dvc", "params", "diff")
    assert "train.learning_rate" in params and "0.005" in params and "0.002" in params

    # A two-point learning-rate sweep of recipe b as DVC experiments: each trains b only, and `dvc exp show` lists
    # both with their metrics.
    clone("git", "add", "-A")
    clone("git", "-c", "user.email=ci@xtrain.invalid", "-c", "user.name=xtrain CI", "commit", "-qm", "a at 2e-3")
    for rate in ("1.0e-3", "8.0e-3"):
        clone("dvc", "exp", "run", "-S", f"recipes/b.yaml:train.learning_rate={rate}")
    shown = json.loads(subprocess.run(["dvc", "exp", "show", "--json"], cwd=clone.cwd, env=clone.env,
                                      capture_output=True, text=True, check=True).stdout)
    rates = set()
    for commit in shown:
        for experiment in commit.get("experiments") or []:
            for revision in experiment.get("revs", []):
                data = revision.get("data", {})
                rates.add(data.get("params", {}).get("recipes/b.yaml", {}).get("data", {}).get("train", {})
                          .get("learning_rate"))
                assert "tuned_loss" in data.get("metrics", {}).get("reports/b/eval.json", {}).get("data", {})
    assert {1.0e-3, 8.0e-3} <= rates, shown
