"""The `xtrain` command, as a user runs it in a project folder: new, status, plan, run --dry-run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_SECONDS, REPO, copy_workflow

from xtrain.recipe import load_recipe

XTRAIN = str(Path(sys.executable).with_name("xtrain"))


def xtrain(project: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([XTRAIN, *args], cwd=project, capture_output=True, text=True, timeout=HANG_SECONDS,
                            stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise AssertionError(f"xtrain {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("cli"), {"demo": (REPO / "recipes/demo.yaml").read_text()})


def test_new_writes_a_recipe_that_loads_with_the_format_detected(project):
    out = xtrain(project, "new", "mine", "--model", "models/tiny-llama", "--data", "data/demo/chat.jsonl")
    assert "data/demo/chat.jsonl: messages" in out.stdout
    recipe = load_recipe(project / "recipes/mine.yaml")
    assert recipe.data.sources[0].format == "messages" and recipe.train.learning_rate == 2e-4, "defaults shown"
    again = xtrain(project, "new", "mine", "--model", "models/tiny-llama", "--data", "data/demo/chat.jsonl", check=False)
    assert again.returncode == 1 and "recipes/mine.yaml exists" in again.stderr
    wrong = xtrain(project, "new", "pairs", "--model", "m", "--data", "data/demo/chat.jsonl", "--objective", "dpo",
                   check=False)
    assert wrong.returncode == 1 and "set train.objective: sft" in wrong.stderr
    assert not (project / "recipes/pairs.yaml").exists()
    (project / "recipes/mine.yaml").unlink()


def test_plan_builds_and_shows_the_plan_and_status_says_what_is_stale_and_why(project):
    before = xtrain(project, "status", "demo").stdout
    assert before.splitlines()[1].split()[1:] == ["missing"] * 6
    shown = xtrain(project, "plan", "demo").stdout
    assert "micro-batch" in shown and "peak per device" in shown and "asks for" in shown
    assert xtrain(project, "status", "demo").stdout.splitlines()[1].split()[1:3] == ["done", "done"]
    recipe = project / "recipes/demo.yaml"
    recipe.write_text(recipe.read_text().replace("seq_len: 128", "seq_len: 120"))
    after = xtrain(project, "status", "demo").stdout
    assert after.splitlines()[1].split()[1:3] == ["stale", "stale"]
    assert "demo prepare: params changed" in after


def test_run_dry_run_lists_the_jobs_and_an_unknown_recipe_is_named(project):
    dry = xtrain(project, "run", "demo", "--dry-run")
    assert "rule train:" in dry.stdout and "rule gate:" in dry.stdout
    unknown = xtrain(project, "run", "nope", check=False)
    assert unknown.returncode == 1 and "no recipe nope in recipes/; known recipes: demo" in unknown.stderr


def test_smoke_names_an_unknown_recipe_before_running_anything(project):
    unknown = xtrain(project, "smoke", "nope", check=False)
    assert unknown.returncode == 1 and "no recipe nope in recipes/; known recipes: demo" in unknown.stderr
    assert not (project / "smoke").exists()
