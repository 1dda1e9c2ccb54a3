"""GRPO through real `snakemake` on the embedded demo: prompt rows -> TRL's GRPOTrainer with a built-in and a user
reward -> a checkpoint meeting the contract, with the rewards, KL and completion lengths of each step in
train_metrics.json; an edit to the user's reward file reruns training and nothing before it; the held-out prompts
answered greedily by base and tuned and scored by the same rewards (eval.json, generations.json), the report's RL
section, the gate and the end-of-run summary."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from backend_runs import assert_each_step_rewarded
from checkpoint_contract import assert_checkpoint_contract
from conftest import copy_workflow, scheduled_jobs, snakemake

pytestmark = pytest.mark.slow

# 3 steps of 2 prompts x 4 completions of at most 8 tokens: ~15 s of training on 2 loaded cores.
GRPO = """
model: {path: models/tiny-llama}
data:
  sources: [{path: data/demo/prompts.jsonl}]
  seq_len: 64
  eval_fraction: 0.1
train:
  objective: grpo
  rl: {generations: 4, max_completion_length: 8, kl_weight: 0.05}
  rewards:
    - {type: format, pattern: '^\\\\s*[A-Z]'}
    - {type: python, file: rewards/words.py, function: short, weight: 0.5}
  global_batch_size: 8
  max_steps: 3
  learning_rate: 5.0e-3
  logging_steps: 1
eval:
  generations: 2
  max_new_tokens: 8
  gate: {tuned_reward_format_accuracy: {min: 0}, reward_improvement: {min: -10}}
"""
# The user's reward reads the row's `answer` column: a row without it would fail here, naming the function.
WORDS = """def short(completions, answer, **kwargs):
    assert all(isinstance(text, str) and text for text in answer), answer
    return [-len(completion.split()) / 10 for completion in completions]
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model) -> Path:
    root = copy_workflow(tmp_path_factory.mktemp("grpo"), {"grpo": GRPO})
    shutil.copytree(tiny_model, root / "models/tiny-llama")  # as rule build_tiny_model builds it
    (root / "rewards").mkdir()
    (root / "rewards/words.py").write_text(WORDS)
    result = snakemake(root, "checkpoints/grpo", "--cores", "2")
    assert scheduled_jobs(result.stdout + result.stderr) == {(rule, "grpo") for rule in ("prepare", "plan", "train")}
    return root


def test_grpo_checkpoint_meets_the_contract_and_records_each_steps_rewards(project, tiny_model):
    metrics = assert_checkpoint_contract(project / "checkpoints/grpo", tiny_model, "trl_cpu")
    steps = metrics["rl"]
    assert [step["step"] for step in steps] == [1, 2, 3]
    assert_each_step_rewarded(steps)
    # Tokens are the prompts' and the completions' TRL counted: 24 completions of at most 8 tokens, after prompts.
    prompts = json.loads((project / "prepared/grpo/manifest.json").read_text())["splits"]["train"]
    completions = sum(step["completions/mean_length"] * 8 for step in steps)
    assert completions < metrics["tokens_seen"] <= completions + 24 * prompts["max_len"]


def test_a_reward_file_edit_reruns_training_only(project):
    reward = project / "rewards/words.py"
    stat = reward.stat()
    reward.write_text(WORDS.replace("/ 10", "/ 20"))
    try:
        assert dry_run(project) == {("train", "grpo")}  # its sha256 is in the train rule's params
    finally:
        reward.write_text(WORDS)
        os.utime(reward, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert dry_run(project) == set()


def test_held_out_prompts_are_scored_by_the_rewards_and_reported(project):
    result = snakemake(project, "reports/grpo/gate.json", "--cores", "2")
    assert scheduled_jobs(result.stdout + result.stderr) == {
        (rule, "grpo") for rule in ("plan_evaluate", "evaluate", "report", "gate")}
    metrics = json.loads((project / "reports/grpo/eval.json").read_text())
    records = json.loads((project / "reports/grpo/generations.json").read_text())
    held_out = json.loads((project / "prepared/grpo/manifest.json").read_text())["splits"]["eval"]["rows"]
    assert metrics["eval_rows"] == metrics["generations"] == held_out > 0
    assert "tuned_loss" not in metrics  # prompts have no reference answer
    words = "rewards/words.py:short"
    for model in ("base", "tuned"):
        # The weighted sum of the rewards' means, as training sums them; the user's penalty never passes (never > 0).
        assert metrics[f"{model}_reward_mean"] == pytest.approx(
            metrics[f"{model}_reward_format_mean"] + 0.5 * metrics[f"{model}_reward_{words}_mean"])
        assert 0 <= metrics[f"{model}_reward_format_accuracy"] <= 1
        assert metrics[f"{model}_reward_{words}_accuracy"] == 0
        assert -0.8 <= metrics[f"{model}_reward_{words}_mean"] <= 0
    assert metrics["reward_improvement"] == pytest.approx(metrics["tuned_reward_mean"] - metrics["base_reward_mean"])
    # The first eval.generations prompts, each answer scored again here from its text, independently of xtrain.
    assert len(records) == 2 and records[0]["row_hash"] < records[1]["row_hash"]
    for record in records:
        assert record["columns"]["answer"] and record["prompt"]
        for model in ("base", "tuned"):
            answer = record[model]
            assert 0 < answer["new_tokens"] <= 8
            assert answer["scores"] == {"format": float(bool(re.search(r"^\s*[A-Z]", answer["text"]))),
                                        words: pytest.approx(-len(answer["text"].split()) / 10)}
            assert answer["reward"] == pytest.approx(answer["scores"]["format"] + 0.5 * answer["scores"][words])
    page = (project / "reports/grpo/report.html").read_text()
    assert "Reinforcement learning (GRPO)" in page and "Held-out mean reward" in page
    assert f"{held_out} held-out prompts" in page and page.count("<b>reward ") == 4  # 2 prompts, base and tuned
    gate = json.loads((project / "reports/grpo/gate.json").read_text())
    assert {verdict["metric"] for verdict in gate} == {"tuned_reward_format_accuracy", "reward_improvement"}
    output = result.stdout + result.stderr
    assert re.search(r"reward\s+-?[\d.]+ -> -?[\d.]+ mean over \d+ held-out prompts, base -> tuned", output), output
    assert re.search(r"format passes\s+[\d.]+% -> [\d.]+% of held-out prompts", output), output


def dry_run(root: Path) -> set:
    result = snakemake(root, "-n", "checkpoints/grpo")
    return scheduled_jobs(result.stdout + result.stderr)
