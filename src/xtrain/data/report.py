"""What prepare tells a person about its output: split statistics for the manifest, and preview.txt."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xtrain_backend_side.prepared import INPUT_IDS, LOSS_MASK, SEQ_LENGTHS, is_packed

HISTOGRAM_BINS = 16
PREVIEW_ROWS = 3
TRAINED = ("⟪", "⟫")  # marks around tokens the loss is computed on


def split_stats(split: pa.Table, seq_len: int) -> dict[str, Any]:
    """Counts of one split; `rows` are the sequences a trainer sees (packed bins when packed)."""
    lengths = pc.list_value_length(split[INPUT_IDS]).to_numpy()
    packed = is_packed(split.column_names)
    example_lengths = pc.list_flatten(split[SEQ_LENGTHS]).to_numpy() if packed else lengths
    tokens = int(lengths.sum())
    supervised = int(pc.sum(pc.list_flatten(split[LOSS_MASK])).as_py() or 0)
    counts, edges = np.histogram(example_lengths, bins=HISTOGRAM_BINS, range=(0, seq_len))
    stats = {
        "rows": len(lengths),
        "examples": len(example_lengths),
        "tokens": tokens,
        "supervised_tokens": supervised,
        "supervised_fraction": round(supervised / tokens, 4),
        "max_len": int(lengths.max()),
        "length_histogram": {"bin_edges": edges.astype(int).tolist(), "counts": counts.tolist()},
        # Share of a batch that would be padding if every example were padded to seq_len.
        "padding_fraction_unpacked": round(1 - tokens / (len(example_lengths) * seq_len), 4),
    }
    if packed:
        stats["packing_efficiency"] = round(tokens / (len(lengths) * seq_len), 4)
    return stats


def render_row(ids: list[int], mask: list[int], tokenizer) -> str:
    """The row's text with every run of trained tokens between TRAINED marks."""
    pieces, start = [], 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or mask[end] != mask[start]:
            text = tokenizer.decode(ids[start:end])
            pieces.append(f"{TRAINED[0]}{text}{TRAINED[1]}" if mask[start] else text)
            start = end
    return "".join(pieces)


def preview(examples: pa.Table, tokenizer) -> str:
    head = examples.slice(0, PREVIEW_ROWS).to_pylist()
    header = (
        f"First {len(head)} train examples as the model sees them. Tokens between {TRAINED[0]} and {TRAINED[1]} "
        "are trained on (they count in the loss); the rest is context only.\n"
    )
    blocks = [
        f"=== example {i + 1}: {len(row['input_ids'])} tokens, {sum(row['assistant_masks'])} trained ===\n"
        + render_row(row[INPUT_IDS], row[LOSS_MASK], tokenizer)
        for i, row in enumerate(head)
    ]
    return header + "\n\n".join(blocks) + "\n"
