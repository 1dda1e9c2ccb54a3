"""Preference data (train.objective dpo, orpo or kto): rows of the formats users bring -> prompt and answer tokens.

A pair is `{"prompt": [messages], "chosen": message, "rejected": message, "tools"}` and a labelled answer (KTO)
`{"prompt": [messages], "completion": message, "label": bool, "tools"}`, read from:

- `message_pairs`: LLaMA-Factory's `chosen_messages` / `rejected_messages` (whole conversations, typed content
  parts and per-turn `loss_weight` as in SFT data), or TRL's implicit-prompt `chosen` / `rejected` message lists;
  the prompt is what both share before their last (assistant) turn;
- `sharegpt_pairs`: LLaMA-Factory's `conversations` (the prompt) + `chosen` / `rejected` turns ({from, value});
- `alpaca_pairs`: `instruction` / `input` (and `system`, `history`) + `chosen` / `rejected` answers;
- `prompt_pairs`: TRL's `prompt` / `chosen` / `rejected`, as text or as message lists;
- `hh_pairs`: Anthropic's HH-RLHF `chosen` / `rejected` transcripts (`\n\nHuman: ...\n\nAssistant: ...`), split as
  TRL's hh-rlhf script splits them: the text both share up to their last common `\n\nAssistant: ` is the prompt (its
  earlier turns the chat), and what follows it in each is the answer;
- `labelled`: `messages` or `conversations` (the last turn is the answer) or TRL's `prompt` / `completion`, with a
  boolean `label` (or its text) or LLaMA-Factory's `kto_tag`.

Every chat is rendered with the recipe's chat template as SFT chats are (`tokenize.encode_chats`); the prompt's
tokens are kept once, and each answer's tokens are exactly its supervised span (its text and end-of-turn token).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Any

import numpy as np

from xtrain_backend_side.prepared import LABEL
from xtrain_backend_side.prepared import PREFERENCE_COLUMNS as COLUMNS

from ..errors import XtrainError
from ..recipe import DataSource, content_hash
from .formats import Chat, Normaliser, RowError, drop_reason, is_kto_label, read_rows
from .report import HISTOGRAM_BINS, PREVIEW_ROWS, TRAINED
from .sources import SourceRows

Example = dict[str, Any]
# The columns that tell each format, tried in this order (the first row decides).
PAIR_FORMATS = (
    (("chosen_messages", "rejected_messages"), "message_pairs"),
    (("conversations", "chosen", "rejected"), "sharegpt_pairs"),
    (("instruction", "chosen", "rejected"), "alpaca_pairs"),
    (("prompt", "chosen", "rejected"), "prompt_pairs"),
    (("chosen", "rejected"), "message_pairs"),
)
LABEL_COLUMNS = ("label", "kto_tag")
# The columns each format reads (the rest are listed in the manifest as ignored).
READ_COLUMNS = {
    "message_pairs": {"chosen_messages", "rejected_messages", "chosen", "rejected", "tools"},
    "sharegpt_pairs": {"conversations", "chosen", "rejected", "system", "tools"},
    "alpaca_pairs": {"instruction", "input", "chosen", "rejected", "system", "history"},
    "prompt_pairs": {"prompt", "chosen", "rejected", "tools"},
    "hh_pairs": {"chosen", "rejected"},
    "labelled": {"messages", "conversations", "prompt", "completion", "label", "kto_tag", "system", "tools"},
}
ANSWER_KEYS = {"pairs": ("chosen", "rejected"), "labelled": ("completion",)}
SFT_HINT = "supervised chat data (no chosen/rejected answers, no label): set train.objective: sft"
# HH-RLHF's transcript turns, as TRL's hh-rlhf script splits them.
HH_HUMAN, HH_ASSISTANT = "\n\nHuman: ", "\n\nAssistant: "
HH_TURNS = re.compile(f"({re.escape(HH_ASSISTANT)}|{re.escape(HH_HUMAN)})")
UNSPLIT_TEXT = (
    "`chosen` and `rejected` are text with no prompt to split off: give the prompt in a `prompt` column (TRL's "
    "prompt/chosen/rejected), write each as a message list ending in the assistant's answer, or as an HH-RLHF "
    "transcript (`\\n\\nHuman: ...\\n\\nAssistant: ...`)"
)


def detect(row: dict[str, Any], kind: str) -> str:
    """The format of a source of `kind` (pairs or labelled) from its first row, or an error naming what the data is
    instead and the objective it needs."""
    if kind == "labelled":
        if any(column in row for column in LABEL_COLUMNS) and (
                "messages" in row or "conversations" in row or ("prompt" in row and "completion" in row)):
            return "labelled"
        if any(all(column in row for column in columns) for columns, _ in PAIR_FORMATS):
            raise XtrainError("this source holds preference pairs (chosen/rejected), not labelled answers: set "
                              "train.objective: dpo")
        raise XtrainError(f"this source holds {SFT_HINT}, or KTO rows lack a `label`/`kto_tag` column (columns: "
                          f"{sorted(row)})")
    found = next((fmt for columns, fmt in PAIR_FORMATS if all(column in row for column in columns)), None)
    if found == "message_pairs" and "chosen_messages" not in row and isinstance(row["chosen"], str):
        if is_hh_transcript(row["chosen"]):
            return "hh_pairs"
        raise XtrainError(f"format message_pairs (TRL's implicit prompt): {UNSPLIT_TEXT}")
    if found:
        return found
    if any(column in row for column in LABEL_COLUMNS):
        raise XtrainError("this source holds unpaired answers with a label (KTO), not pairs: set train.objective: kto")
    raise XtrainError(f"this source holds {SFT_HINT} (columns: {sorted(row)}); a DPO source has `chosen` and "
                      "`rejected` answers")


class PreferenceReader:
    """Reads the rows of one preference source into pairs or labelled answers."""

    def __init__(self, source: DataSource, fmt: str):
        self.fmt = fmt
        self.chats = Normaliser(source, "messages")
        self.sharegpt = Normaliser(source, "sharegpt")
        self.alpaca = Normaliser(source, "alpaca")

    def read(self, row: dict[str, Any]) -> Example:
        return getattr(self, f"read_{self.fmt}")(row)

    def messages(self, value: Any, field: str) -> list[dict]:
        if isinstance(value, str):
            return [{"role": "assistant", "content": value}]
        if not isinstance(value, list):
            raise RowError(field, f"must be text or a list of messages, got {type(value).__name__}")
        return self.chats.turns(value, field, "role", "content")

    def read_message_pairs(self, row: dict[str, Any]) -> Example:
        key = "chosen_messages" if "chosen_messages" in row else "chosen"
        other = key.replace("chosen", "rejected")
        chosen, rejected = self.messages(row[key], key), self.messages(row[other], other)
        if chosen[:-1] != rejected[:-1]:
            raise RowError(other, f"differs from `{key}` before the last turn; a pair shares its prompt")
        return pair(chosen[:-1], chosen[-1], rejected[-1], self.chats.tools(row))

    def read_sharegpt_pairs(self, row: dict[str, Any]) -> Example:
        prompt = self.sharegpt.read_sharegpt(row)
        answers = [self.sharegpt.turns([row[key]], key, "from", "value")[0] if isinstance(row[key], dict)
                   else {"role": "assistant", "content": row[key]} for key in ("chosen", "rejected")]
        return pair(prompt["messages"], *answers, prompt["tools"])

    def read_alpaca_pairs(self, row: dict[str, Any]) -> Example:
        chosen, rejected = (self.alpaca.read_alpaca({**row, "output": row[key]})["messages"]
                            for key in ("chosen", "rejected"))
        return pair(chosen[:-1], chosen[-1], rejected[-1], None)

    def read_prompt_pairs(self, row: dict[str, Any]) -> Example:
        prompt = row["prompt"]
        prompt = ([{"role": "user", "content": prompt}] if isinstance(prompt, str)
                  else self.chats.turns(prompt, "prompt", "role", "content") if isinstance(prompt, list)
                  else None)
        if prompt is None:
            raise RowError("prompt", "must be text or a list of messages")
        chosen, rejected = (self.messages(row[key], key) for key in ("chosen", "rejected"))
        if len(chosen) != 1 or len(rejected) != 1:
            raise RowError("chosen", "with a `prompt` column, `chosen` and `rejected` are one answer each")
        return pair(prompt, chosen[0], rejected[0], self.chats.tools(row))

    def read_hh_pairs(self, row: dict[str, Any]) -> Example:
        texts = []
        for key in ("chosen", "rejected"):
            if not isinstance(row[key], str) or not is_hh_transcript(row[key]):
                raise RowError(key, f"format hh_pairs reads a transcript `{HH_HUMAN!r}...{HH_ASSISTANT!r}...`, got "
                               f"{str(row[key])[:60]!r}; {UNSPLIT_TEXT}")
            texts.append(row[key])
        chosen, rejected = texts
        prompt = os.path.commonprefix(texts)
        if not prompt.endswith(HH_ASSISTANT):  # the answers start alike: the prompt ends at their shared turn
            if HH_ASSISTANT not in prompt:
                raise RowError("rejected", f"differs from `chosen` before the first {HH_ASSISTANT!r}; a pair shares "
                               "its prompt")
            prompt = prompt[: prompt.rfind(HH_ASSISTANT)] + HH_ASSISTANT
        turns = HH_TURNS.split(prompt[: -len(HH_ASSISTANT)])
        if turns[0]:
            raise RowError("chosen", f"text before the first {HH_HUMAN!r} turn: {turns[0][:60]!r}")
        messages = [{"role": "user" if mark == HH_HUMAN else "assistant", "content": content}
                    for mark, content in zip(turns[1::2], turns[2::2])]
        return pair(messages, *({"role": "assistant", "content": text[len(prompt):]} for text in texts), None)

    def read_labelled(self, row: dict[str, Any]) -> Example:
        label = row.get("label", row.get("kto_tag"))
        if not is_kto_label(label):
            raise RowError("label" if "label" in row else "kto_tag", f"true or false, got {label!r}")
        label = label if isinstance(label, bool) else label.strip().lower() == "true"
        if "messages" in row or "conversations" in row:
            chat = self.chats.read_messages(row) if "messages" in row else self.sharegpt.read_sharegpt(row)
            prompt, completion, tools = chat["messages"][:-1], chat["messages"][-1], chat["tools"]
        else:
            prompt = self.messages(row["prompt"], "prompt") if isinstance(row["prompt"], list) else [
                {"role": "user", "content": row["prompt"]}]
            completion, tools = self.messages(row["completion"], "completion")[-1], self.chats.tools(row)
        return {"prompt": context(prompt), "completion": answer(completion), "label": label, "tools": tools}


def is_hh_transcript(text: str) -> bool:
    return text.startswith(HH_HUMAN) and HH_ASSISTANT in text


def pair(prompt: list[dict], chosen: dict, rejected: dict, tools: str | None) -> Example:
    return {"prompt": context(prompt), "chosen": answer(chosen), "rejected": answer(rejected), "tools": tools}


def context(messages: list[dict]) -> list[dict]:
    """The prompt's turns: its assistant turns are context, never trained."""
    return [{**m, "train": False} if m["role"] == "assistant" else m for m in messages]


def answer(message: dict) -> dict:
    return {key: value for key, value in message.items() if key != "train"}


def answers(example: Example) -> list[dict]:
    return [example[key] for key in ANSWER_KEYS["labelled" if "completion" in example else "pairs"]]


def chats(example: Example) -> list[Chat]:
    """The chats an example is rendered as: prompt + each answer."""
    return [{"messages": [*example["prompt"], reply], "tools": example["tools"]} for reply in answers(example)]


def example_drop_reason(example: Example) -> str | None:
    for reply in answers(example):
        if reply["role"] != "assistant":
            return "last turn is not the assistant's"
        if not reply["content"].strip() and not reply.get("tool_calls"):
            return "empty answer"
    if "chosen" in example and example["chosen"] == example["rejected"]:
        return "chosen identical to rejected"
    return next((reason for chat in chats(example) if (reason := drop_reason(chat))), None)


def read_examples(source: DataSource, found: SourceRows, kind: str, seen: set[str]):
    """A source's readable, trainable, not-yet-seen examples, its format, its drop counts and the columns of its
    first row that no field reads."""
    if source.format != "auto" or source.columns:
        raise XtrainError(f"{source.name}: data.sources[].format and .columns name SFT formats and their columns; "
                          f"preference data is read by its own column names (docs/data.md, 'Preference training'): "
                          "remove them and name the file's columns as the format does")
    try:
        fmt = detect(found.rows[0], kind)
    except XtrainError as exc:
        raise XtrainError(f"{found.where(0)}: {exc}") from None
    reader = PreferenceReader(source, fmt)
    examples, dropped = [], Counter()
    for _, example in read_rows(found, reader.read, dropped):
        reason = example_drop_reason(example)
        key = content_hash(example)
        if reason is None and key in seen:
            reason = "duplicate"
        if reason is not None:
            dropped[reason] += 1
            continue
        seen.add(key)
        examples.append(example)
    return fmt, examples, dropped, sorted(set(found.rows[0]) - READ_COLUMNS[fmt])


def prompt_hash(example: Example) -> str:
    """Examples split by their prompt: pairs that share one stay in one split."""
    return content_hash([example["prompt"], example["tools"]])


def answer_tokens(encoded: list[tuple[list[int], list[int]]]) -> tuple[list[int], list[list[int]]]:
    """From an example's encoded chats (prompt + each answer): the prompt's tokens once, and each answer's tokens
    (its supervised span). The prompt ends where the chats' tokens first differ or the first answer starts."""
    starts = [mask.index(1) for _, mask in encoded]
    ends = [len(mask) - mask[::-1].index(1) for _, mask in encoded]
    length = min(starts)
    first = encoded[0][0]
    for ids, _ in encoded[1:]:
        length = min(length, next((i for i, (a, b) in enumerate(zip(first, ids)) if a != b), min(len(first), len(ids))))
    return first[:length], [ids[length:end] for (ids, _), end in zip(encoded, ends)]


def split_stats(rows: list[dict], columns: tuple[str, ...], seq_len: int) -> dict[str, Any]:
    """Counts of one split; each example is one sequence per answer (prompt + answer), as the trainer sees them."""
    answers = [column for column in columns[1:] if column != LABEL]
    lengths = np.array([len(row[columns[0]]) + len(row[key]) for row in rows for key in answers])
    supervised = sum(len(row[key]) for row in rows for key in answers)
    counts, edges = np.histogram(lengths, bins=HISTOGRAM_BINS, range=(0, seq_len))
    stats = {
        "rows": len(rows),
        "examples": len(rows),
        "sequences_per_row": len(answers),
        "tokens": int(lengths.sum()),
        "supervised_tokens": int(supervised),
        "supervised_fraction": round(supervised / int(lengths.sum()), 4),
        "max_len": int(lengths.max()),
        "length_histogram": {"bin_edges": edges.astype(int).tolist(), "counts": counts.tolist()},
        "padding_fraction_unpacked": round(1 - int(lengths.sum()) / (len(lengths) * seq_len), 4),
    }
    if "label" in rows[0]:
        stats["desirable"] = sum(bool(row["label"]) for row in rows)
    return stats


def preview(rows: list[dict], columns: tuple[str, ...], tokenizer) -> str:
    """The first train examples as the trainer sees them: the prompt, then each answer between TRAINED marks."""
    blocks = []
    for i, row in enumerate(rows[:PREVIEW_ROWS]):
        label = f", label {row['label']}" if "label" in row else ""
        parts = [f"--- {key.removesuffix('_ids')} ({len(row[key])} tokens) ---\n"
                 f"{TRAINED[0]}{tokenizer.decode(row[key])}{TRAINED[1]}" for key in columns[1:] if key != LABEL]
        blocks.append(f"=== example {i + 1}: prompt {len(row[columns[0]])} tokens{label} ===\n"
                      f"{tokenizer.decode(row[columns[0]])}\n" + "\n".join(parts))
    return (f"First {len(blocks)} train examples: the prompt once (context), then each answer; tokens between "
            f"{TRAINED[0]} and {TRAINED[1]} are the answer's, scored by the objective.\n" + "\n\n".join(blocks) + "\n")
