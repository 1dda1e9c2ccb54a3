"""The prepare stage: recipe data sources -> tokenized, masked train/eval splits and their manifest.

Rows are read from local files, checked, deduplicated by content, split by content hash (a row never
moves between splits when others are added), rendered with the tokenizer's chat template and masked
so that only assistant tokens are trained on. Output is Parquet (fast to load with `datasets`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Any

from .artifacts import atomic_dir, write_json
from .errors import XtrainError
from .recipe import Data, content_hash

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
SPLITS = ("train", "eval")
# The Jinja block that marks assistant text for `return_assistant_tokens_mask`.
GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")


def read_messages_jsonl(path: Path) -> list[list[dict[str, str]]]:
    """Read OpenAI-style chat rows; a malformed line is an error naming file and line."""
    if not path.is_file():
        raise XtrainError(f"{path}: data source not found; fix data.sources[].path in the recipe")
    rows = []
    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as exc:
                raise XtrainError(f"{path}:{line_no}: not UTF-8 (byte {exc.start}); re-encode the file as UTF-8")
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise XtrainError(f"{path}:{line_no}: malformed JSON ({exc.msg} at column {exc.colno})") from None
            messages = row.get("messages") if isinstance(row, dict) else None
            if not isinstance(messages, list):
                raise XtrainError(f"{path}:{line_no}: expected an object with a `messages` list")
            for turn in messages:
                if not isinstance(turn, dict) or not isinstance(turn.get("content"), str):
                    raise XtrainError(f"{path}:{line_no}: each message needs a `role` and a string `content`")
                if turn.get("role") not in ROLES:
                    raise XtrainError(
                        f"{path}:{line_no}: unknown role {turn.get('role')!r}; allowed roles are {', '.join(ROLES)}"
                    )
            rows.append([{"role": t["role"], "content": t["content"]} for t in messages])
    if not rows:
        raise XtrainError(f"{path}: no rows; the file is empty")
    return rows


def drop_reason(messages: list[dict[str, str]]) -> str | None:
    """Why a chat row cannot be trained on, or None when it can."""
    turns = messages[1:] if messages and messages[0]["role"] == "system" else messages
    if not any(t["role"] == "assistant" for t in turns):
        return "no assistant turn"
    if any(not t["content"].strip() for t in turns):
        return "empty turn"
    expected = ["user", "assistant"] * len(turns)
    if [t["role"] for t in turns] != expected[: len(turns)]:
        return "wrong role order"
    return None


def is_eval_row(row_hash: str, eval_fraction: float) -> bool:
    """Split by content: the first 8 bytes of the row's hash, read as a fraction of 2**64."""
    return int(row_hash[:16], 16) / 2**64 < eval_fraction


def tokenize(tokenizer, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    encoded = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    return list(encoded["input_ids"]), list(encoded["assistant_masks"])


def prepare(sources: list[Path], model_dir: Path, data: Data, out: Path) -> dict[str, Any]:
    """Build `out` (train/eval Parquet splits, manifest.json) atomically; return the manifest."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if not GENERATION_BLOCK.search(tokenizer.chat_template or ""):
        raise XtrainError(
            f"{model_dir}: the tokenizer's chat template has no {{% generation %}} block, so assistant tokens "
            "cannot be found for loss masking; use a template that marks assistant turns"
        )

    splits: dict[str, dict[str, list]] = {s: {"input_ids": [], "assistant_masks": [], "row_hash": []} for s in SPLITS}
    per_source = {}
    seen: set[str] = set()
    for path in sources:
        dropped: Counter[str] = Counter()
        kept = 0
        for messages in read_messages_jsonl(path):
            reason = drop_reason(messages)
            row_hash = content_hash(messages)
            if reason is None and row_hash in seen:
                reason = "duplicate"
            if reason is None:
                input_ids, mask = tokenize(tokenizer, messages)
                if len(input_ids) > data.seq_len:
                    reason = "over seq_len"
            if reason is not None:
                dropped[reason] += 1
                continue
            seen.add(row_hash)
            kept += 1
            split = splits["eval" if is_eval_row(row_hash, data.eval_fraction) else "train"]
            split["input_ids"].append(input_ids)
            split["assistant_masks"].append(mask)
            split["row_hash"].append(row_hash)
        per_source[str(path)] = {"kept": kept, "dropped": dict(sorted(dropped.items()))}
        log.info("%s: kept %d rows, dropped %s", path, kept, dict(dropped) or "none")

    manifest: dict[str, Any] = {"sources": per_source, "seq_len": data.seq_len, "splits": {}}
    for name, columns in splits.items():
        if not columns["input_ids"]:
            raise XtrainError(
                f"the {name} split is empty ({sum(s['kept'] for s in per_source.values())} usable rows); "
                "add data or change data.eval_fraction"
            )
        lengths = [len(ids) for ids in columns["input_ids"]]
        supervised = sum(sum(mask) for mask in columns["assistant_masks"])
        if supervised == 0:
            raise XtrainError(f"the {name} split has no supervised (assistant) tokens; check the chat template")
        manifest["splits"][name] = {
            "rows": len(lengths),
            "tokens": sum(lengths),
            "supervised_tokens": supervised,
            "max_len": max(lengths),
        }

    fingerprint = hashlib.sha256()
    fingerprint.update(tokenizer.backend_tokenizer.to_str().encode())
    fingerprint.update((tokenizer.chat_template or "").encode())
    for name in SPLITS:
        fingerprint.update(json.dumps([name, splits[name]["input_ids"], splits[name]["assistant_masks"]]).encode())
    manifest["fingerprint"] = fingerprint.hexdigest()

    with atomic_dir(out) as staging:
        for name in SPLITS:
            Dataset.from_dict(splits[name]).to_parquet(str(staging / f"{name}.parquet"))
        write_json(staging / "manifest.json", manifest)
    return manifest
