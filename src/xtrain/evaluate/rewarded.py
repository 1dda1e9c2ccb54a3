"""Held-out prompts (train.objective grpo) answered greedily and scored by the recipe's own rewards.

Every prompt of the prepared eval split (prepared/<recipe>/eval.parquet, ordered by content hash) is answered
greedily by each model, up to eval.max_new_tokens, stopping at the template's end-of-turn token or the end of
sequence. Each answer is scored by train.rewards as training scored its samples: the same functions
(xtrain_backend_side.rewards, the same guard), called as TRL's GRPOTrainer calls them (`prompts`: the rendered prompt
texts; `completions`: the answers decoded without special tokens; `completion_ids`: their tokens, with the stop
token; every other column of the rows), and summed by the same weights. Training's own arguments have no meaning
here: `trainer_state` is None, `log_metric` and `log_extra` record nothing.

eval.json gets, per model, the mean weighted reward (`<model>_reward_mean`) and per reward its mean and accuracy
(`<model>_reward_<name>_mean`, `<model>_reward_<name>_accuracy`: the share of prompts on which it passed,
xtrain_backend_side.rewards.passed); generations.json the first eval.generations prompts with both answers and
every score.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xtrain_backend_side.prepared import PROMPT_IDS, split_file
from xtrain_backend_side.rewards import passed, reward_keys, terms, weights

from ..data.prompts import PROMPT_TEXT
from ..errors import XtrainError
from .generations import Prompt, answer_text

# The arguments TRL adds for training, with what they mean when nothing trains.
NOT_TRAINING = {"trainer_state": None, "log_metric": lambda *args, **kwargs: None,
                "log_extra": lambda *args, **kwargs: None}


def load_prompts(prepared_dir: Path) -> list[dict[str, Any]]:
    """The held-out prompt rows, by content hash (the same order however the split was written)."""
    import pyarrow.parquet as pq

    rows = sorted(pq.read_table(split_file(prepared_dir, "eval")).to_pylist(), key=lambda row: row["row_hash"])
    if not rows:
        raise XtrainError(f"{split_file(prepared_dir, 'eval')} holds no prompts: raise data.eval_fraction so some "
                          "prompts are held out")
    return rows


class RewardScorer:
    """train.rewards over the held-out prompt rows: each answer's scores, each model's figures, the records."""

    def __init__(self, rewards: list[dict[str, Any]], project: Path, rows: list[dict[str, Any]]):
        self.rewards, self.rows = rewards, rows
        self.terms = terms(rewards, project)
        self.weights = weights(rewards)
        self.keys = reward_keys([term.name for term in self.terms])

    def prompts(self) -> list[Prompt]:
        return [Prompt(row["row_hash"], row[PROMPT_IDS], []) for row in self.rows]

    def score(self, tokenizer, answers: list[dict[str, Any]]) -> list[dict[str, float]]:
        """Each answer's score by each reward (by key), as training scores a completion of the same prompt."""
        columns = {key: [row[key] for row in self.rows] for key in self.rows[0] if key not in (PROMPT_TEXT, PROMPT_IDS)}
        arguments = {"prompts": [row[PROMPT_TEXT] for row in self.rows],
                     "completions": [tokenizer.decode(answer["ids"], skip_special_tokens=True) for answer in answers],
                     "completion_ids": [answer["ids"] for answer in answers]}
        per_reward = [term(**arguments, **columns, **NOT_TRAINING) for term in self.terms]
        return [dict(zip(self.keys, values, strict=True)) for values in zip(*per_reward, strict=True)]

    def total(self, scores: dict[str, float]) -> float:
        """An answer's reward: its scores summed by the rewards' weights."""
        return sum(weight * scores[key] for weight, key in zip(self.weights, self.keys, strict=True))

    def metrics(self, model: str, scores: list[dict[str, float]]) -> dict[str, float]:
        """A model's figures: its mean reward, and each reward's mean and accuracy."""
        count = len(scores)
        figures = {f"{model}_reward_mean": sum(self.total(s) for s in scores) / count}
        for key, reward in zip(self.keys, self.rewards, strict=True):
            figures[f"{model}_reward_{key}_mean"] = sum(s[key] for s in scores) / count
            figures[f"{model}_reward_{key}_accuracy"] = sum(passed(reward["type"], s[key]) for s in scores) / count
        return figures

    def records(self, tokenizer, answers: dict[str, list[dict]], scores: dict[str, list[dict]], count: int
                ) -> list[dict[str, Any]]:
        """generations.json: the first `count` prompts, their columns, and base's and tuned's answers with every
        score and the weighted reward."""
        records = []
        for i, row in enumerate(self.rows[:count]):
            record = {"row_hash": row["row_hash"], "prompt": row[PROMPT_TEXT],
                      "columns": {k: v for k, v in row.items() if k not in (PROMPT_TEXT, PROMPT_IDS, "row_hash")}}
            for model in ("base", "tuned"):
                result = answers[model][i]
                record[model] = {"text": answer_text(tokenizer, result["ids"]), "raw": tokenizer.decode(result["ids"]),
                                 "stopped": result["stopped"], "new_tokens": len(result["ids"]),
                                 "scores": scores[model][i], "reward": self.total(scores[model][i])}
            records.append(record)
        return records
