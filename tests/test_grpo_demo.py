"""The GRPO demo (recipes/demo_grpo.yaml) as it is, through real `snakemake`: its mean reward over the last fifth
of its steps is above the first fifth's (issue 38's proof that the demo learns), and the arithmetic problems of the
GRPO showcase and of its SFT stage are the ones their seeded script writes, none in both."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, copy_workflow, scheduled_jobs, snakemake

DEMO = REPO / "recipes/demo_grpo.yaml"


def fifths(values: list[float]) -> tuple[float, float]:
    fifth = max(1, len(values) // 5)
    return sum(values[:fifth]) / fifth, sum(values[-fifth:]) / fifth


@pytest.mark.slow
def test_the_grpo_demo_raises_its_mean_reward(tmp_path, tiny_model):
    root = copy_workflow(tmp_path, {"demo_grpo": DEMO.read_text()})
    shutil.copytree(tiny_model, root / "models/tiny-llama")  # as rule build_tiny_model builds it
    result = snakemake(root, "checkpoints/demo_grpo", "--cores", "2")
    assert scheduled_jobs(result.stdout + result.stderr) == {(rule, "demo_grpo") for rule in ("prepare", "plan", "train")}
    steps = json.loads((root / "checkpoints/demo_grpo/train_metrics.json").read_text())["rl"]
    rewards = [step["reward"] for step in steps]
    assert len(rewards) == 15
    first, last = fifths(rewards)
    # Measured 0.16 -> 0.89 (seed 0); the random-init model starts with a capital about one time in six.
    assert first < 0.35 and last > first + 0.3, rewards


def test_the_arithmetic_problems_are_what_their_script_writes(tmp_path):
    out = tmp_path / "problems.jsonl"
    subprocess.run([sys.executable, str(REPO / "data/arithmetic/make_problems.py"), "--out", str(out)], check=True,
                   capture_output=True)
    assert out.read_bytes() == (REPO / "data/arithmetic/problems.jsonl").read_bytes()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len({row["question"] for row in rows}) == 600
    for row in rows:
        steps, answer = row["answer"].rsplit("\n#### ", 1)
        assert int(answer) >= 0 and steps.split("= ")[-1].startswith(answer), row


def test_the_sft_stage_s_worked_problems_are_its_script_s_and_none_is_a_grpo_problem(tmp_path):
    out = tmp_path / "worked.jsonl"
    subprocess.run([sys.executable, str(REPO / "data/arithmetic/make_problems.py"), "--rows", "1200", "--seed", "1",
                    "--exclude", str(REPO / "data/arithmetic/problems.jsonl"), "--out", str(out)], check=True,
                   capture_output=True)
    assert out.read_bytes() == (REPO / "data/arithmetic/worked.jsonl").read_bytes()
    worked = {json.loads(line)["question"] for line in out.read_text().splitlines()}
    grpo = {json.loads(line)["question"] for line in (REPO / "data/arithmetic/problems.jsonl").read_text().splitlines()}
    assert len(worked) == 1200 and not worked & grpo
