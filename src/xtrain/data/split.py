"""Train/eval splits by content hash (a row never moves between splits when others are added), with each source's
train rows repeated by its weight; an empty split is an error that says where the rows went."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from ..errors import XtrainError
from ..recipe import Data, content_hash
from . import preference
from .formats import Chat

SPLITS = ("train", "eval")


def is_eval_row(row_hash: str, eval_fraction: float) -> bool:
    """Split by content: the first 8 bytes of the row's hash, read as a fraction of 2**64."""
    return int(row_hash[:16], 16) / 2**64 < eval_fraction


def repeats(row_hash: str, weight: float) -> int:
    """Copies of a train row under its source's weight; the fraction picks rows by hash (bytes 8-16)."""
    whole = int(weight)
    return whole + (int(row_hash[16:32], 16) / 2**64 < weight - whole)


def split_chats(chats: list[Chat], origin: list[int], reasons: list[str | None], blocks: list[int], over: np.ndarray,
                per_source: dict, data: Data) -> tuple[dict[str, list[int]], dict[int, str]]:
    """The table rows of each split (a train row once per copy) and each kept row's hash; the rows marked with a
    reason are counted as dropped, and truncated rows and document blocks are counted, in `per_source`."""
    names = list(per_source)
    splits: dict[str, list[int]] = {name: [] for name in SPLITS}
    row_hashes: dict[int, str] = {}
    for row, (chat, source_index, reason, block) in enumerate(zip(chats, origin, reasons, blocks)):
        stats = per_source[names[source_index]]
        if block:  # a split document's blocks, its first (block 0) counted with the second
            stats["blocks"] = stats.get("blocks", 0) + (2 if block == 1 else 1)
        if reason is not None:
            stats["dropped"][reason] += 1
            continue
        stats["truncated"] = stats.get("truncated", 0) + int(over[row])
        # A document's blocks go to one split together (by the document's hash): none is held out half-seen.
        document = content_hash(chat)
        row_hashes[row] = content_hash([document, block]) if block else document
        if is_eval_row(document, data.eval_fraction):
            splits["eval"].append(row)
        else:
            splits["train"].extend([row] * repeats(document, data.sources[source_index].weight))
    return splits, row_hashes


def split_examples(examples: list[preference.Example], rendered: list[list[Chat]], origin: list[int],
                   encoded: Iterator[tuple[list[int], list[int]]], per_source: dict, data: Data,
                   kind: str) -> tuple[dict[str, list[dict]], np.ndarray]:
    """The rows of each split of preference examples, by prompt so that examples sharing a prompt stay in one split:
    each example's prompt tokens once and each answer's tokens (from `encoded`, its chats' tokens in order); examples
    longer than data.seq_len are counted as dropped in `per_source`. Also each example's length (prompt + the longer
    answer)."""
    columns = preference.COLUMNS[kind]
    splits: dict[str, list[dict]] = {name: [] for name in SPLITS}
    lengths = []
    for example, chats, source_index in zip(examples, rendered, origin):
        prompt_ids, answer_ids = preference.answer_tokens([next(encoded) for _ in chats])
        stats = per_source[data.sources[source_index].name]
        lengths.append(len(prompt_ids) + max(map(len, answer_ids)))
        if lengths[-1] > data.seq_len:
            stats["dropped"]["over seq_len"] += 1
            continue
        row = {columns[0]: prompt_ids, **dict(zip(columns[1:], answer_ids)), "row_hash": content_hash(example),
               **({"label": example["label"]} if kind == "labelled" else {})}
        if is_eval_row(preference.prompt_hash(example), data.eval_fraction):
            splits["eval"].append(row)
        else:
            splits["train"].extend([row] * repeats(row["row_hash"], data.sources[source_index].weight))
    return splits, np.array(lengths, dtype=np.int64)


def check_splits(splits: dict[str, list], per_source: dict, warnings: list[str]) -> None:
    """An empty split is an error listing, per source, rows read, kept and dropped by reason."""
    for name, rows in splits.items():
        if not rows:
            usable = sum(s["kept"] for s in per_source.values())
            counts = "; ".join(f"{source}: read {stats['rows']}, kept {stats['kept']}, dropped "
                               f"{', '.join(f'{n} {reason}' for reason, n in stats['dropped'].items()) or 'none'}"
                               for source, stats in per_source.items())
            drops = f", keep more rows ({'; '.join(warnings)})" if warnings else ""
            raise XtrainError(f"the {name} split is empty ({usable} usable rows; {counts}); add data{drops} or change "
                              "data.eval_fraction")


def take_splits(table: pa.Table, splits: dict[str, list[int]], row_hashes: dict[int, str]) -> dict[str, pa.Table]:
    """Each split's rows of `table`, in order, with their `row_hash` column."""
    return {
        name: table.take(pa.array(rows, pa.int64())).append_column(
            "row_hash", pa.array([row_hashes[r] for r in rows], pa.string())
        )
        for name, rows in splits.items()
    }
