"""GRPO through real `snakemake` on the embedded demo: prompt rows -> TRL's GRPOTrainer with a built-in and a user
reward -> a checkpoint meeting the contract, with the rewards, KL and completion lengths of each step in
train_metrics.json; an edit to the user's reward file reruns training and nothing before it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
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
    for step in steps:
        format_mean, words_mean = step["rewards/format/mean"], step["rewards/rewards/words.py:short/mean"]
        assert 0 <= format_mean <= 1 and -0.8 <= words_mean <= 0
        assert step["reward"] == pytest.approx(format_mean + 0.5 * words_mean, abs=1e-5)  # summed by weight
        assert 0 < step["completions/mean_length"] <= 8
        assert step["kl"] >= 0  # logged with train.rl.kl_weight above 0
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


def dry_run(root: Path) -> set:
    result = snakemake(root, "-n", "checkpoints/grpo")
    return scheduled_jobs(result.stdout + result.stderr)
