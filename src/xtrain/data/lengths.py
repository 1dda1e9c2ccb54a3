"""Token sequences fitted to data.seq_len: plain documents longer than it split into blocks, other rows
truncated or marked to be dropped (data.over_length), and rows with nothing left to train on marked too."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xtrain_backend_side.prepared import INPUT_IDS, LOSS_MASK

from ..recipe import Data
from .formats import TEXT_ROLE, Chat

log = logging.getLogger(__name__)


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
    """Truncate or mark over-length rows; rows with nothing left to train on are marked too."""
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
    return table, lengths > seq_len, reasons
