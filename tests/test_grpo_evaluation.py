"""Evaluating a GRPO recipe (xtrain.evaluate.rewarded): held-out answers scored by the training rewards, called as
TRL calls them; each reward's accuracy by its pass rule; gates on reward figures checked against train.rewards; the
end-of-run summary's reward lines."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from xtrain.evaluate.rewarded import RewardScorer
from xtrain.recipe import Recipe
from xtrain.summary import scores
from xtrain_backend_side.rewards import passed, reward_keys

STOP = 0  # the stand-in tokenizer's one special token: the end of turn


class CharTokenizer:
    """One character per token id (its code point); id 0 is a special token."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == STOP))


def ids(text: str, stopped: bool = True) -> dict:
    return {"ids": [ord(c) for c in text] + ([STOP] if stopped else []), "stopped": stopped}


@pytest.mark.parametrize("kind, value, expected", [
    ("answer", 1.0, True), ("answer", 0.0, False), ("format", 1.0, True), ("tool_call", 0.0, False),
    ("length", 0.0, True), ("length", -0.25, False),  # no penalty passes, any penalty fails
    ("python", 0.5, True), ("python", 0.0, False), ("python", -1.0, False),  # a user reward passes above 0
])
def test_a_reward_passes_at_its_best_score_or_a_user_reward_above_zero(kind, value, expected):
    assert passed(kind, value) is expected


def test_a_reward_listed_twice_is_numbered_from_its_second_use():
    assert reward_keys(["format", "answer", "format", "format"]) == ["format", "answer", "format#2", "format#3"]


USER_REWARD = """CALLS = []

def score(prompts, completions, completion_ids, answer, trainer_state, **kwargs):
    CALLS.append({"prompts": prompts, "completion_ids": completion_ids, "trainer_state": trainer_state,
                  "columns": sorted(kwargs), "log_metric": kwargs["log_metric"]("x", 1.0)})
    return [0.5 if str(a) in c else 0.0 for c, a in zip(completions, answer)]
"""


def test_answers_are_scored_by_the_training_rewards_as_trl_calls_them(tmp_path):
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards/mine.py").write_text(USER_REWARD)
    rows = [{"prompt": "<q>Half of 144?</q>", "prompt_ids": [1, 2], "row_hash": "a1", "answer": "72"},
            {"prompt": "<q>Twice 8?</q>", "prompt_ids": [3], "row_hash": "b2", "answer": "16"}]
    rewards = [{"type": "answer", "weight": 1.0}, {"type": "format", "pattern": "^####", "weight": 0.5},
               {"type": "length", "max_tokens": 4, "weight": 1.0},
               {"type": "python", "file": "rewards/mine.py", "function": "score", "weight": 2.0}]
    scorer = RewardScorer(rewards, tmp_path, rows)
    answers = [ids("#### 72"), ids("it is 15", stopped=False)]
    scored = scorer.score(CharTokenizer(), answers)
    # "#### 72" + the stop token: 8 tokens, 4 over max_tokens 4 -> -1; "it is 15": 8 tokens -> -1 as well.
    assert scored == [{"answer": 1.0, "format": 1.0, "length": -1.0, "rewards/mine.py:score": 0.5},
                      {"answer": 0.0, "format": 0.0, "length": -1.0, "rewards/mine.py:score": 0.0}]
    # This file's module: other tests of the same process load reward files of their own.
    mine = str((tmp_path / "rewards/mine.py").resolve())
    call = next(module for name, module in sys.modules.items()
                if name.startswith("xtrain_reward_") and str(Path(module.__file__).resolve()) == mine).CALLS[-1]
    assert call["prompts"] == [row["prompt"] for row in rows]  # the rendered prompt text
    assert call["completion_ids"] == [a["ids"] for a in answers]  # the stop token included, as TRL passes them
    assert call["trainer_state"] is None and call["log_metric"] is None  # nothing trains here
    assert call["columns"] == ["log_extra", "log_metric", "row_hash"]  # the row's columns, not its prompt_ids
    figures = scorer.metrics("tuned", scored)
    assert figures == pytest.approx({
        "tuned_reward_mean": ((1 + 0.5 - 1 + 2 * 0.5) + (0 + 0 - 1 + 0)) / 2,
        "tuned_reward_answer_mean": 0.5, "tuned_reward_answer_accuracy": 0.5,
        "tuned_reward_format_mean": 0.5, "tuned_reward_format_accuracy": 0.5,
        "tuned_reward_length_mean": -1.0, "tuned_reward_length_accuracy": 0.0,
        "tuned_reward_rewards/mine.py:score_mean": 0.25, "tuned_reward_rewards/mine.py:score_accuracy": 0.5,
    })
    records = scorer.records(CharTokenizer(), {"base": answers[::-1], "tuned": answers},
                             {"base": scored[::-1], "tuned": scored}, 1)
    assert records == [{"row_hash": "a1", "prompt": "<q>Half of 144?</q>", "columns": {"answer": "72"},
                        "base": {"text": "it is 15", "raw": "it is 15", "stopped": False, "new_tokens": 8,
                                 "scores": scored[1], "reward": -1.0},
                        "tuned": {"text": "#### 72", "raw": "#### 72\x00", "stopped": True, "new_tokens": 8,
                                  "scores": scored[0], "reward": 1.5}}]


GRPO = {"model": {"path": "models/tiny"}, "data": {"sources": [{"path": "data/prompts.jsonl"}], "seq_len": 64},
        "train": {"objective": "grpo", "rl": {"max_completion_length": 8}, "global_batch_size": 8,
                  "rewards": [{"type": "answer"}, {"type": "format", "pattern": "^A"}, {"type": "format", "pattern": "B"}]}}


def recipe(gate: dict, **changes) -> Recipe:
    return Recipe.model_validate({**GRPO, **changes, "eval": {"gate": gate}})


def test_gates_on_reward_figures_name_a_reward_of_the_recipe():
    gates = {"tuned_reward_answer_accuracy": {"min": 0.3}, "tuned_reward_format#2_mean": {"min": 0},
             "reward_improvement": {"min": 0}, "tuned_stop_rate": {"min": 0.5}}
    assert set(recipe(gates).eval.gate) == set(gates)
    with pytest.raises(ValidationError, match=r"tuned_reward_tool_call_accuracy names no reward of train.rewards: "
                                              r"gate on .*tuned_reward_answer_accuracy"):
        recipe({"tuned_reward_tool_call_accuracy": {"min": 0.5}})
    with pytest.raises(ValidationError, match=r"loss_improvement is not measured for objective grpo"):
        recipe({"loss_improvement": {"min": 0}})
    with pytest.raises(ValidationError, match=r"tuned_reward_mean is measured for objective grpo only, not sft"):
        recipe({"tuned_reward_mean": {"min": 0}}, train={})


def test_the_summary_prints_the_mean_reward_and_each_rewards_accuracy_base_to_tuned():
    metrics = {"eval_rows": 16, "generations": 16, "base_reward_mean": 0.125, "base_reward_answer_mean": 0.125,
               "base_reward_answer_accuracy": 0.125, "tuned_reward_mean": 0.5, "tuned_reward_answer_mean": 0.5,
               "tuned_reward_answer_accuracy": 0.5, "reward_improvement": 0.375}
    assert scores(metrics) == [("reward", "0.1250 -> 0.5000 mean over 16 held-out prompts, base -> tuned"),
                               ("answer passes", "12.5% -> 50.0% of held-out prompts")]
