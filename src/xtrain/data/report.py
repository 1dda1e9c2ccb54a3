"""What prepare tells a person about its output: each source's counts (rows read, kept, dropped by reason) and
the warnings they raise, split statistics for the manifest, and preview.txt."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xtrain_backend_side.prepared import INPUT_IDS, LOSS_MASK, SEQ_LENGTHS, is_packed

from ..recipe import Data
from .lengths import seq_len_advice

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


def count_kept(per_source: dict, *zeroed: str) -> None:
    """Each source's kept rows (read, less dropped) and its drop reasons in order; the counts named in `zeroed`
    (e.g. truncated) set to 0 where nothing was counted."""
    for stats in per_source.values():
        stats["kept"] = stats["rows"] - sum(stats["dropped"].values())
        stats["dropped"] = dict(sorted(stats["dropped"].items()))
        for count in zeroed:
            stats.setdefault(count, 0)


def drop_warnings(per_source: dict, data: Data, lengths: np.ndarray, origin: list[int],
                  positions: int | None) -> list[str]:
    """A warning for each source that lost data.drop_warning or more of its rows, or had that many truncated: how
    many, why, and what keeps them (`lengths`: each row's tokens before it was fitted to data.seq_len; `positions`:
    the model's)."""
    origin = np.asarray(origin)
    warnings = []
    for index, (name, stats) in enumerate(per_source.items()):
        mine = lengths[origin == index]
        dropped = sum(stats["dropped"].values())
        if stats["rows"] and dropped / stats["rows"] >= data.drop_warning:
            reasons = ", ".join(f"{count} {reason}" for reason, count in stats["dropped"].items())
            advice = (f"; {seq_len_advice(mine, data.seq_len, positions)}, or data.over_length: truncate keeps them "
                      "cut" if stats["dropped"].get("over seq_len") else "")
            warnings.append(f"{name}: {dropped} of {stats['rows']} rows ({dropped / stats['rows']:.0%}) dropped "
                            f"({reasons}){advice} (this warning: data.drop_warning {data.drop_warning})")
        cut = stats.get("truncated", 0)
        if stats["rows"] and cut and cut / stats["rows"] >= data.drop_warning:
            warnings.append(
                f"{name}: {cut} of {stats['rows']} rows ({cut / stats['rows']:.0%}) truncated to data.seq_len "
                f"{data.seq_len} (data.over_length: truncate): their tokens past it, the answer's end and its "
                f"end-of-turn token among them, are not trained; {seq_len_advice(mine, data.seq_len, positions)}, or "
                f"data.over_length: drop leaves them out (this warning: data.drop_warning {data.drop_warning})")
    return warnings + placeholder_warnings(per_source)


def placeholder_warnings(per_source: dict) -> list[str]:
    """A warning for each source with `{{name}}` placeholders left in its text."""
    warnings = []
    for name, stats in per_source.items():
        if stats.get("unfilled_placeholders"):
            found = ", ".join(f"{{{{{k}}}}} x{v}" for k, v in stats["unfilled_placeholders"].items())
            warnings.append(f"{name}: placeholders left in the text ({found}) would be trained literally; fill them "
                            "with data.sources[].replace")
    return warnings


def preference_warnings(per_source: dict, data: Data, lengths: np.ndarray, origin: list[int],
                        positions: int | None) -> list[str]:
    """A warning for each source that lost data.drop_warning or more of its rows (with the data.seq_len that keeps
    them; `lengths`: each example's prompt + longer answer), and for unfilled placeholders."""
    origin, warnings = np.asarray(origin), []
    for index, (name, stats) in enumerate(per_source.items()):
        dropped = sum(stats["dropped"].values())
        if stats["rows"] and dropped / stats["rows"] >= data.drop_warning:
            reasons = ", ".join(f"{count} {reason}" for reason, count in stats["dropped"].items())
            advice = (f"; {seq_len_advice(lengths[origin == index], data.seq_len, positions)}"
                      if stats["dropped"].get("over seq_len") else "")
            warnings.append(f"{name}: {dropped} of {stats['rows']} rows ({dropped / stats['rows']:.0%}) dropped "
                            f"({reasons}){advice} (this warning: data.drop_warning {data.drop_warning})")
    return warnings + placeholder_warnings(per_source)
