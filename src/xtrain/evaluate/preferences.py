"""Evaluating a preference-tuned model on held-out pairs (dpo, orpo) or labelled answers (kto), base vs tuned.

Each answer is scored by its summed log-probability given the prompt under each model. A model prefers the chosen
answer of a pair when it gives it the higher log-probability; the implicit reward of an answer is the tuned model's
log-probability minus the base's (DPO's reward divided by beta), so `reward_accuracy` is the share of pairs whose
chosen answer gained more than the rejected one (for kto: whose reward has the sign of its label), and
`reward_margin` the mean difference in nats.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from xtrain_backend_side.prepared import LABEL, PREFERENCE_COLUMNS, split_file

Scores = list[tuple[float, int]]  # per sequence: summed NLL of the answer, and its token count


@dataclass(frozen=True)
class PreferenceSplit:
    kind: str  # pairs or labelled
    prompts: list[list[int]]
    answers: list[list[list[int]]]  # per row: [chosen, rejected] (dpo) or [completion] (kto)
    labels: list[bool] | None
    row_hashes: list[str]

    @cached_property
    def sequences(self) -> tuple[list[list[int]], list[list[int]]]:
        """Every answer after its prompt, as (input_ids, loss masks): row by row, answers in column order."""
        ids, masks = [], []
        for prompt, answers in zip(self.prompts, self.answers):
            for answer in answers:
                ids.append(prompt + answer)
                masks.append([0] * len(prompt) + [1] * len(answer))
        return ids, masks

    @cached_property
    def scored_rows(self) -> list[int]:
        """The rows the loss metrics and generations use: those with a chosen (pairs) or desirable (kto) answer."""
        return [i for i in range(len(self.prompts)) if self.labels is None or self.labels[i]] or list(
            range(len(self.prompts)))  # a kto split without a desirable answer: all of them

    @property
    def scored_sequences(self) -> list[int]:
        """Where the scored rows' first answers are in `sequences`."""
        return [i * len(self.answers[0]) for i in self.scored_rows]

    @property
    def scored(self) -> tuple[list[list[int]], list[list[int]], list[str]]:
        """The scored rows' first answers after their prompts (input_ids, masks) and their row hashes."""
        ids, masks = self.sequences
        return ([ids[i] for i in self.scored_sequences], [masks[i] for i in self.scored_sequences],
                [self.row_hashes[i] for i in self.scored_rows])

    def metrics(self, scores: dict[str, Scores]) -> dict[str, float | None]:
        width = len(self.answers[0])
        logp = {name: [-nll for nll, _ in rows] for name, rows in scores.items()}
        per_token = {name: [-nll / max(count, 1) for nll, count in rows] for name, rows in scores.items()}
        out: dict[str, float | None] = {"eval_pairs": len(self.prompts)}
        if self.kind == "pairs":
            for name in scores:
                out[f"{name}_chosen_logp_per_token"] = mean(per_token[name][0::2])
                out[f"{name}_rejected_logp_per_token"] = mean(per_token[name][1::2])
                out[f"{name}_preference_accuracy"] = mean(
                    [float(c > r) for c, r in zip(logp[name][0::2], logp[name][1::2])])
            reward = [t - b for t, b in zip(logp["tuned"], logp["base"])]
            margins = [c - r for c, r in zip(reward[0::2], reward[1::2])]
            out["reward_accuracy"] = mean([float(m > 0) for m in margins])
            out["reward_margin"] = mean(margins)
            return out
        good = [i for i, label in enumerate(self.labels) if label]
        bad = [i for i, label in enumerate(self.labels) if not label]
        for name in scores:
            out[f"{name}_chosen_logp_per_token"] = mean([per_token[name][i * width] for i in good])
            out[f"{name}_rejected_logp_per_token"] = mean([per_token[name][i * width] for i in bad])
        reward = [t - b for t, b in zip(logp["tuned"], logp["base"])]
        out["reward_accuracy"] = mean([float((reward[i] > 0) == label) for i, label in enumerate(self.labels)])
        return out


    def records(self, scores: dict[str, Scores], tokenizer, shown: int = 6) -> list[dict]:
        """Each held-out row's answers with both models' log-probabilities (total and per token), in row-hash order;
        the first `shown` also carry their text, for the report."""
        width = len(self.answers[0])
        names = ("chosen", "rejected") if self.kind == "pairs" else ("completion",)
        rows = []
        for i in sorted(range(len(self.prompts)), key=lambda i: self.row_hashes[i]):
            answers = []
            for j, name in enumerate(names):
                answer = {"answer": name}
                for model, sequences in scores.items():
                    nll, count = sequences[i * width + j]
                    answer |= {f"{model}_logp": -nll, f"{model}_logp_per_token": -nll / max(count, 1)}
                if len(rows) < shown:
                    answer["text"] = tokenizer.decode(self.answers[i][j])
                answers.append(answer)
            row = {"row_hash": self.row_hashes[i], "answers": answers}
            if self.labels is not None:
                row["label"] = self.labels[i]
            else:
                gains = [a["tuned_logp"] - a["base_logp"] for a in answers]
                row["reward_margin"] = gains[0] - gains[1]
            if len(rows) < shown:
                row["prompt"] = tokenizer.decode(self.prompts[i])[-400:]
            rows.append(row)
        return rows


def mean(values: list[float]) -> float | None:
    """The mean, or None (null in eval.json) when there is nothing to average."""
    return sum(values) / len(values) if values else None


def load_preference_split(prepared_dir: Path, kind: str) -> PreferenceSplit:
    from datasets import Dataset

    split = Dataset.from_parquet(str(split_file(prepared_dir, "eval")))
    prompt, *answer_columns = [column for column in PREFERENCE_COLUMNS[kind] if column != LABEL]
    answers = [list(row) for row in zip(*(split[column] for column in answer_columns))]
    labels = split[LABEL] if kind == "labelled" else None
    return PreferenceSplit(kind, split[prompt], answers, labels, split["row_hash"])
