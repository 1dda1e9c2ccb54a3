"""Prompt rows (train.objective grpo): rows of the formats users bring -> the prompt rendered for generation, its
tokens, and the row's other columns, which reach the rewards (`answer`, `tools`, ...).

A prompt is read from:

- `messages` (or sharegpt's `conversations`) ending with a user turn;
- `prompt`: text, or a message list ending with a user turn;
- `question` (GSM8K and the like): text;
- alpaca's `instruction` (with `input`, `system`) and no `output`.

Each prompt is rendered with the recipe's chat template and its generation prompt (the assistant's turn opened), as
the checkpoint will be prompted. Every other column of the row is kept beside it (lists and objects as JSON text).
Supervised chats (an answer to train on) and preference rows are refused, naming the objective they need.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from xtrain_backend_side.prepared import PROMPT_IDS

from ..errors import XtrainError
from ..recipe import Data, DataSource, content_hash
from .chats import apply_policies, fill_placeholders
from .formats import Chat, Normaliser, RowError, read_rows
from .output import write_output
from .report import HISTOGRAM_BINS, PREVIEW_ROWS
from .sources import SourceRows, read_source
from .split import check_splits, is_eval_row, repeats
from .templates import ChatTemplate, render, resolve
from .tokenize import check_template

log = logging.getLogger(__name__)

PROMPT_TEXT = "prompt"  # the rendered prompt, as the trainer generates from it and the rewards receive it
# The columns that tell each format (the first row decides), and the columns each reads into the prompt.
PROMPT_FORMATS = (("messages", "messages"), ("conversations", "sharegpt"), ("prompt", "prompt"),
                  ("question", "question"), ("instruction", "alpaca"))
READ_COLUMNS = {"messages": {"messages"}, "sharegpt": {"conversations", "system"}, "prompt": {"prompt"},
                "question": {"question"}, "alpaca": {"instruction", "input", "system"}}
# Columns that make a row training data of another objective.
ANSWER_COLUMNS = {
    "output": "an alpaca answer (`output`)", "completion": "a prompt's completion (`completion`)",
    "chosen": "preference pairs (`chosen` / `rejected`)", "chosen_messages": "preference pairs (`chosen_messages`)",
    "label": "labelled answers (KTO's `label`)", "kto_tag": "labelled answers (KTO's `kto_tag`)",
}
RESERVED = {PROMPT_TEXT, PROMPT_IDS, "row_hash"}


def detect(row: dict[str, Any]) -> str:
    """The prompt format of a source from its first row, or an error naming what the data is instead."""
    if answered := [what for column, what in ANSWER_COLUMNS.items() if column in row]:
        objective = "sft" if answered[0].startswith(("an alpaca", "a prompt's")) else (
            "kto" if "KTO" in answered[0] else "dpo or orpo")
        raise XtrainError(f"this source holds {answered[0]}, not prompts: train.objective grpo samples its own answers "
                          f"and scores them with train.rewards; give prompt rows (docs/data.md), or set "
                          f"train.objective: {objective}")
    found = next((fmt for column, fmt in PROMPT_FORMATS if column in row), None)
    if found is None:
        raise XtrainError(f"cannot find the prompt among the columns {sorted(row)}: a GRPO source has `messages` or "
                          "`conversations` ending with a user turn, `prompt`, `question`, or alpaca's `instruction`")
    return found


class PromptReader:
    """Reads the rows of one prompt source into a chat ending with the user's turn, and the row's other columns."""

    def __init__(self, source: DataSource, fmt: str):
        self.fmt = fmt
        self.chats = Normaliser(source, "messages")
        self.sharegpt = Normaliser(source, "sharegpt")
        self.alpaca = Normaliser(source, "alpaca")

    def read(self, row: dict[str, Any]) -> tuple[Chat, dict[str, Any]]:
        if self.fmt == "messages":
            chat = self.chats.read_messages(row)
        elif self.fmt == "sharegpt":
            chat = self.sharegpt.read_sharegpt(row)
        elif self.fmt == "alpaca":
            chat = self.alpaca.read_alpaca({**row, "output": ""})
            chat["messages"] = chat["messages"][:-1]
        elif self.fmt == "prompt" and isinstance(row.get("prompt"), list):
            chat = {"messages": self.chats.turns(row["prompt"], "prompt", "role", "content"),
                    "tools": self.chats.tools(row)}
        else:
            text = row.get(self.fmt)
            if not isinstance(text, str):
                raise RowError(self.fmt, f"must be text, got {type(text).__name__}")
            chat = {"messages": [{"role": "user", "content": text}], "tools": self.chats.tools(row)}
        last = chat["messages"][-1]["role"] if chat["messages"] else None
        if last != "user":
            raise RowError(self.fmt if self.fmt != "sharegpt" else "conversations",
                           f"a prompt ends with the user's turn, this one with {last or 'nothing'}: GRPO samples the "
                           "answer itself (for chats with answers, set train.objective: sft)")
        extras = {key: value if value is None or isinstance(value, str | int | float | bool)
                  else json.dumps(value, ensure_ascii=False)
                  for key, value in row.items() if key not in READ_COLUMNS[self.fmt]}
        if clash := sorted(RESERVED & set(extras)):
            raise RowError(clash[0], f"the prepared prompts use this column name themselves: rename it in the data")
        return chat, extras


def read_prompts(source: DataSource, found: SourceRows, seen: set[str]):
    """A source's prompts (chat, other columns), its format, its drop counts."""
    if source.format != "auto" or source.columns:
        raise XtrainError(f"{source.name}: data.sources[].format and .columns name SFT formats and their columns; "
                          "prompt rows are read by their own column names (docs/data.md): remove them")
    try:
        fmt = detect(found.rows[0])
    except XtrainError as exc:
        raise XtrainError(f"{found.where(0)}: {exc}") from None
    reader = PromptReader(source, fmt)
    prompts, dropped = [], Counter()
    for _, (chat, extras) in read_rows(found, reader.read, dropped):
        if any(not m["content"].strip() and not m.get("tool_calls") for m in chat["messages"]):
            dropped["empty turn"] += 1
            continue
        key = content_hash([chat, extras])
        if key in seen:
            dropped["duplicate"] += 1
            continue
        seen.add(key)
        prompts.append((chat, extras))
    return fmt, prompts, dropped


def check_columns(found: SourceRows, needed: dict[str, str]) -> None:
    """Refuse a source whose rows lack a column a reward reads (`needed`: column -> the reward)."""
    for index, row in enumerate(found.rows):
        if missing := sorted(column for column in needed if column not in row):
            readers = ", ".join(f"`{column}` (reward {needed[column]})" for column in missing)
            raise XtrainError(f"{found.where(index)}: the rewards read {readers}, which this row lacks (columns: "
                              f"{sorted(row)}): add the column, or name the right one in train.rewards[].column")


def prepare_rows(sources: list[tuple[DataSource, SourceRows]], tokenizer, template: ChatTemplate, data: Data,
                 max_completion_length: int, needed: dict[str, str]) -> tuple[dict[str, list[dict]], dict]:
    """The rows of each split: prompt text, its tokens, row_hash and the other columns; prompts longer than
    data.seq_len less the completion length are dropped. Also each source's stats."""
    seen: set[str] = set()
    budget = data.seq_len - max_completion_length
    splits: dict[str, list[dict]] = {"train": [], "eval": []}
    per_source = {}
    for source, found in sources:
        fmt, prompts, dropped = read_prompts(source, found, seen)
        check_columns(found, needed)
        unfilled: Counter = Counter()
        texts = [render(tokenizer, template.stock,
                        apply_policies(fill_placeholders(chat, source.replace, unfilled), data, template)["messages"],
                        json.loads(chat["tools"]) if chat["tools"] else None, add_generation_prompt=True)
                 for chat, _ in prompts]
        encoded = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False) if texts else []
        kept = 0
        for (chat, extras), text, encoding in zip(prompts, texts, encoded):
            if len(encoding.ids) > budget:
                dropped["over seq_len"] += 1
                continue
            kept += 1
            row = {PROMPT_TEXT: text, PROMPT_IDS: encoding.ids, "row_hash": content_hash([chat, extras]), **extras}
            if is_eval_row(row["row_hash"], data.eval_fraction):
                splits["eval"].append(row)
            else:
                splits["train"].extend([row] * repeats(row["row_hash"], source.weight))
        per_source[found.name] = {"format": fmt, "rows": len(found.rows), "weight": source.weight, "kept": kept,
                                  "dropped": dropped,
                                  **({"unfilled_placeholders": dict(sorted(unfilled.items()))} if unfilled else {})}
    return splits, per_source


def split_stats(rows: list[dict], seq_len: int, max_completion_length: int) -> dict[str, Any]:
    """Counts of one split of prompts; `tokens` are the prompts', completions are sampled while training."""
    lengths = np.array([len(row[PROMPT_IDS]) for row in rows])
    counts, edges = np.histogram(lengths, bins=HISTOGRAM_BINS, range=(0, seq_len))
    return {
        "rows": len(rows),
        "sequences_per_row": 1,
        "tokens": int(lengths.sum()),
        "supervised_tokens": 0,  # completions are sampled, up to max_completion_length each
        "max_len": int(lengths.max()),
        "max_completion_length": max_completion_length,
        "length_histogram": {"bin_edges": edges.astype(int).tolist(), "counts": counts.tolist()},
    }


def preview(rows: list[dict]) -> str:
    """The first train prompts as the trainer generates from them, with the columns the rewards receive."""
    blocks = []
    for i, row in enumerate(rows[:PREVIEW_ROWS]):
        columns = {k: v for k, v in row.items() if k not in (PROMPT_TEXT, PROMPT_IDS)}
        blocks.append(f"=== prompt {i + 1}: {len(row[PROMPT_IDS])} tokens ===\n{row[PROMPT_TEXT]}\n"
                      f"--- columns the rewards receive ---\n{json.dumps(columns, ensure_ascii=False)}")
    return (f"First {len(blocks)} train prompts, rendered with the chat template and its generation prompt; the "
            "model's completions are sampled from here while training.\n" + "\n\n".join(blocks) + "\n")


def prepare_prompts(sources: list[tuple[DataSource, Path | None]], tokenizer, model_dir: Path, data: Data, out: Path,
                    settings: dict[str, Any], limit: int | None = None) -> dict[str, Any]:
    """prepare for GRPO: `out` with the train/eval prompts, manifest.json and preview.txt; the manifest.
    `settings` (the prepare slice's `prompts`): the completion length the prompts must leave room for, and the
    columns the rewards read (column -> reward)."""
    from datasets import Dataset

    template = resolve(tokenizer, data.chat_template, model_dir)
    end_of_turn = check_template(tokenizer, template)
    found = [(source, read_source(source, path, limit)) for source, path in sources]
    splits, per_source = prepare_rows(found, tokenizer, template, data, settings["max_completion_length"],
                                      settings["reward_columns"])
    warnings = [f"{name}: {sum(stats['dropped'].values())} of {stats['rows']} rows dropped ({dict(stats['dropped'])}) "
                f"(this warning: data.drop_warning {data.drop_warning})" for name, stats in per_source.items()
                if stats["rows"] and sum(stats["dropped"].values()) / stats["rows"] >= data.drop_warning]
    for warning in warnings:
        log.warning("%s", warning)
    check_splits(splits, per_source, warnings)
    manifest: dict[str, Any] = {
        "data_kind": "prompts",
        "sources": per_source,
        "seq_len": data.seq_len,
        "chat_template": data.chat_template,
        "masking": template.method,
        "end_of_turn": end_of_turn,
        "train_on_inputs": False,
        "packing": False,
        "reward_columns": settings["reward_columns"],
        "splits": {name: split_stats(rows, data.seq_len, settings["max_completion_length"])
                   for name, rows in splits.items()},
        **({"warnings": warnings} if warnings else {}),
    }
    write_output(out, {name: Dataset.from_list(rows) for name, rows in splits.items()}, manifest,
                 preview(splits["train"]), tokenizer, template, fingerprint_masking=False)
    for name, stats in per_source.items():
        log.info("%s (%s): kept %d of %d prompts, dropped %s", name, stats["format"], stats["kept"], stats["rows"],
                 dict(stats["dropped"]) or "none")
    return manifest
