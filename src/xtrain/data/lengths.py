"""Token sequences fitted to data.seq_len: a seq_len the model's positions cannot hold refused, plain documents longer
than it split into blocks, other rows truncated or marked to be dropped (data.over_length), and rows with nothing
left to train on marked too."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xtrain_backend_side.prepared import INPUT_IDS, LOSS_MASK

from ..errors import XtrainError
from ..recipe import Data
from .formats import TEXT_ROLE, Chat

log = logging.getLogger(__name__)

# RoPE scalings that stretch the positions a model was trained on by their `factor` (Llama 3's `llama3` and Phi-3's
# `longrope` already count theirs in max_position_embeddings).
STRETCHING_ROPE = ("linear", "dynamic", "yarn")


def model_positions(config: dict) -> int | None:
    """The longest sequence a model's config.json says it can place: max_position_embeddings (GPT-2's family:
    n_positions), or its RoPE scaling's factor times the positions it stretches, whichever is more; None when the
    config names neither."""
    positions = config.get("max_position_embeddings") or config.get("n_positions")
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind, factor = scaling.get("rope_type", scaling.get("type")), scaling.get("factor")
    if positions and kind in STRETCHING_ROPE and isinstance(factor, int | float) and factor > 1:
        positions = max(positions, int(factor * (scaling.get("original_max_position_embeddings") or positions)))
    return positions


def read_positions(model_dir: Path) -> int | None:
    """`model_positions` of the model folder's config.json (None without one)."""
    config = model_dir / "config.json"
    return model_positions(json.loads(config.read_text(encoding="utf-8"))) if config.is_file() else None


def check_seq_len(model_dir: Path, seq_len: int) -> None:
    """data.seq_len no longer than the positions the model can place: beyond them it would train on positions it has
    never seen (learned embeddings fail outright, RoPE quietly degrades)."""
    positions = read_positions(model_dir)
    if positions is not None and seq_len > positions:
        raise XtrainError(
            f"data.seq_len {seq_len} is longer than the model's {positions} positions (max_position_embeddings and "
            f"rope_scaling in {model_dir / 'config.json'}): set data.seq_len to {positions} or less (data.over_length "
            "says what happens to longer rows), or use a model with a longer context"
        )


def seq_len_advice(lengths: np.ndarray, seq_len: int, positions: int | None) -> str:
    """Which data.seq_len keeps rows of these `lengths` (a source's, some over `seq_len`): 95% of them, or all of
    them, as long as the model's positions allow."""
    p95, longest = int(np.percentile(lengths, 95)), int(lengths.max())
    target, kept = (p95, "95% of them") if p95 > seq_len else (longest, "them all")
    if positions is None or target <= positions:
        return (f"its rows' 95th-percentile length is {p95} tokens: " if target == p95 else "") + \
            f"data.seq_len: {target} keeps {kept}"
    if seq_len < positions:
        return f"data.seq_len: {positions}, the model's positions, keeps the most (keeping {kept} needs {target})"
    return f"no data.seq_len keeps more: keeping {kept} needs {target} tokens, the model has {positions} positions"


def split_documents(table: pa.Table, chats: list[Chat], origin: list[int], data: Data):
    """Plain documents longer than data.seq_len as consecutive blocks of seq_len tokens (starting every
    data.block_stride tokens), every token kept, rather than cut to their head or dropped. Returns the table, chats
    and origins with one entry per row, and each row's block number (0: the first or only one)."""
    stride = data.block_stride or data.seq_len
    lengths = pc.list_value_length(table[INPUT_IDS]).to_numpy()
    long = [i for i, chat in enumerate(chats) if chat["messages"][0]["role"] == TEXT_ROLE and lengths[i] > data.seq_len]
    if not long:
        return table, chats, origin, [0] * len(chats)
    rows = table.to_pylist()
    out_rows, out_chats, out_origin, blocks = [], [], [], []
    for row, chat, source in zip(rows, chats, origin):
        length = len(row[INPUT_IDS])
        starts = ([0] if chat["messages"][0]["role"] != TEXT_ROLE or length <= data.seq_len else
                  list(range(0, max(length - data.seq_len, 0) + stride, stride)))
        for block, start in enumerate(starts):
            end = min(start + data.seq_len, length)
            out_rows.append({key: value[start:end] for key, value in row.items()})
            out_chats.append(chat)
            out_origin.append(source)
            blocks.append(block)
            if end == length:
                break
    log.info("%d long documents split into blocks of %d tokens (every %d)", len(long), data.seq_len, stride)
    return pa.Table.from_pylist(out_rows, schema=table.schema), out_chats, out_origin, blocks


def fit_lengths(table: pa.Table, seq_len: int, over_length: str) -> tuple[pa.Table, np.ndarray, list[str | None]]:
    """Truncate or mark over-length rows; rows with nothing left to train on are marked too. Returns the table, each
    row's length before it was fitted, and the reasons."""
    lengths = pc.list_value_length(table[INPUT_IDS]).to_numpy()
    masks = table[LOSS_MASK].combine_chunks()
    ends = masks.offsets.to_numpy()
    cumulative = np.concatenate([[0], np.cumsum(masks.values.to_numpy(), dtype=np.int64)])
    kept_len = np.minimum(lengths, seq_len) if over_length == "truncate" else lengths
    supervised = cumulative[ends[:-1] + kept_len] - cumulative[ends[:-1]]
    reasons = [
        "over seq_len" if over_length == "drop" and n > seq_len else "no supervised tokens" if s == 0 else None
        for n, s in zip(lengths, supervised)
    ]
    if over_length == "truncate":
        table = pa.table({name: pc.list_slice(table[name], 0, seq_len) for name in table.column_names})
    return table, lengths, reasons
