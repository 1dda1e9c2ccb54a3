"""What prepare tells a person about its output: each source's counts (rows read, kept, dropped by reason) and
the warnings they raise, split statistics for the manifest, and preview.txt."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xtrain_backend_side.prepared import INPUT_IDS, LOSS_MASK, SEQ_LENGTHS, is_packed

from ..recipe import Data

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


def drop_warnings(per_source: dict, data: Data, table: pa.Table, origin: list[int], names: list[str]) -> list[str]:
    """A warning for each source that lost data.drop_warning or more of its rows: how many, why, and what keeps them."""
    lengths = pc.list_value_length(table[INPUT_IDS]).to_numpy()
    origin = np.asarray(origin)
    warnings = []
    for index, name in enumerate(names):
        stats = per_source[name]
        dropped = sum(stats["dropped"].values())
        if not stats["rows"] or dropped / stats["rows"] < data.drop_warning:
            continue
        reasons = ", ".join(f"{count} {reason}" for reason, count in stats["dropped"].items())
        advice = ""
        if stats["dropped"].get("over seq_len"):
            mine = lengths[origin == index]
            p95, longest = int(np.percentile(mine, 95)), int(mine.max())
            keep = (f"its rows' 95th-percentile length is {p95} tokens: data.seq_len: {p95} keeps 95% of them"
                    if p95 > data.seq_len else f"data.seq_len: {longest} keeps them all")
            advice = f"; {keep}, or data.over_length: truncate keeps them cut"
        warnings.append(f"{name}: {dropped} of {stats['rows']} rows ({dropped / stats['rows']:.0%}) dropped "
                        f"({reasons}){advice} (this warning: data.drop_warning {data.drop_warning})")
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


def preference_warnings(per_source: dict, data: Data) -> list[str]:
    """A warning for each source that lost data.drop_warning or more of its rows, and for unfilled placeholders."""
    warnings = []
    for name, stats in per_source.items():
        dropped = sum(stats["dropped"].values())
        if stats["rows"] and dropped / stats["rows"] >= data.drop_warning:
            reasons = ", ".join(f"{count} {reason}" for reason, count in stats["dropped"].items())
            advice = "; a larger data.seq_len keeps the long ones" if stats["dropped"].get("over seq_len") else ""
            warnings.append(f"{name}: {dropped} of {stats['rows']} rows ({dropped / stats['rows']:.0%}) dropped "
                            f"({reasons}){advice} (this warning: data.drop_warning {data.drop_warning})")
    return warnings + placeholder_warnings(per_source)
