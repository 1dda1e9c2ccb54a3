"""The prepare stage: recipe data -> tokenized, masked train/eval splits, manifest.json and preview.txt.

Order of work: read and normalise every source (errors name file, row, field), drop what cannot be
trained on and duplicates (exact, then near), tokenize in batches (Rust, every core), handle over-length
rows, split by content hash (a row never moves between splits when others are added), weight the train
rows of each source, and pack them when asked. The output folder appears only when complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xtrain_backend_side.prepared import INPUT_IDS, LOSS_MASK
from xtrain_backend_side.progress import Progress

from ..artifacts import atomic_dir, write_json
from ..errors import XtrainError
from ..recipe import Data, DataSource, content_hash
from . import preference
from .dedupe import NearDuplicates, exact_key
from .formats import TEXT_ROLE, Chat, Normaliser, detect_format, drop_reason, other_kind, read_rows
from .report import preview, split_stats
from .sources import SourceRows, read_source
from .templates import ChatTemplate, resolve
from .tokenize import check_template, encode_batch, encode_chats

log = logging.getLogger(__name__)

SPLITS = ("train", "eval")
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # the name transformers reads beside tokenizer.json
BATCH_ROWS = 1000


def is_eval_row(row_hash: str, eval_fraction: float) -> bool:
    """Split by content: the first 8 bytes of the row's hash, read as a fraction of 2**64."""
    return int(row_hash[:16], 16) / 2**64 < eval_fraction


def repeats(row_hash: str, weight: float) -> int:
    """Copies of a train row under its source's weight; the fraction picks rows by hash (bytes 8-16)."""
    whole = int(weight)
    return whole + (int(row_hash[16:32], 16) / 2**64 < weight - whole)


def local_paths(data: Data, sources: list[Path]) -> list[Path | None]:
    """Pair each recipe source with its local file (as Snakemake resolved them, in order); None for hub ids."""
    if len(sources) != sum(source.path is not None for source in data.sources):
        raise ValueError(f"{len(sources)} local files given for the {len(data.sources)} sources of {data.sources}")
    files = iter(sources)
    return [next(files) if source.path is not None else None for source in data.sources]


PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
FILLED_KEYS = ("content", "reasoning_content", "tool_calls")  # where a message's placeholders are filled
# How templates read an assistant turn's reasoning: Qwen3, GLM-4.5 and others `reasoning_content`, GPT-OSS `thinking`.
REASONING_KEYS = {"reasoning_content": re.compile(r"reasoning_content"),
                  "thinking": re.compile(r"message(\.|\[['\"])thinking\b")}


def fill_placeholders(chat: Chat, values: dict[str, str], unfilled: Counter) -> Chat:
    """`{{name}}` placeholders filled from the source's `replace` map, in each message's text, reasoning and tool-call
    arguments; any left are counted in `unfilled` (an error when the source has a map: the user meant to fill them
    all)."""
    def fill(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: fill(item) for key, item in value.items()}
        if isinstance(value, list):
            return [fill(item) for item in value]
        if not isinstance(value, str):
            return value
        filled = PLACEHOLDER.sub(lambda m: values.get(m[1], m[0]), value) if values else value
        for name in PLACEHOLDER.findall(filled):
            if values:
                raise XtrainError(f"placeholder {{{{{name}}}}} has no value in data.sources[].replace "
                                  f"({', '.join(sorted(values))}); add `{name}` to it")
            unfilled[name] += 1
        return filled

    messages = [{**m, **{key: fill(m[key]) for key in FILLED_KEYS if key in m}} for m in chat["messages"]]
    return {**chat, "messages": messages}


def apply_reasoning(chat: Chat, policy: str, template: ChatTemplate) -> Chat:
    """Assistant reasoning per data.reasoning: rendered by the template (`keep`, under the key it reads), removed,
    or written inline."""
    if not any("reasoning_content" in m for m in chat["messages"]):
        return chat
    key = next((key for key, pattern in REASONING_KEYS.items() if pattern.search(template.stock)), None)
    if policy == "keep" and key is None:
        raise XtrainError(
            f"{template.label} does not render assistant reasoning (reasoning/thinking parts, `reasoning_content`), "
            "so it would be dropped: set data.reasoning: drop (train without it) or inline (write it before the "
            "answer as <think>...</think>), or use a template that renders it (data.chat_template: qwen3, glm4moe "
            "or gptoss)"
        )
    messages = []
    for message in chat["messages"]:
        message = dict(message)
        reasoning = message.pop("reasoning_content", None)
        if reasoning and policy == "keep":
            message[key] = reasoning
        elif reasoning and policy == "inline":
            message["content"] = f"<think>\n{reasoning}\n</think>\n\n{message['content']}"
        messages.append(message)
    return {**chat, "messages": messages}


def apply_tool_calls(chat: Chat, policy: str, template: ChatTemplate) -> Chat:
    """Tool calls and the tool list per data.tool_calls: rendered by the template's own tool support (`template`,
    refused when it has none), or written as text (`inline`): each call as <tool_call>JSON</tool_call> after the
    assistant's text, the tool list in the system turn."""
    calls = any(m.get("tool_calls") for m in chat["messages"])
    if not calls and chat["tools"] is None:
        return chat
    if policy == "template":
        missing = [what for what, present, key in (("tool calls", calls, "tool_calls"),
                                                    ("a tool list", chat["tools"] is not None, "tools"))
                   if present and key not in template.stock]
        if missing:
            raise XtrainError(
                f"{template.label} does not render {' or '.join(missing)} (assistant `tool_calls`, sharegpt "
                "`function_call` turns, a `tools` column), so they would be lost from the text trained on: use a "
                "template with tool support (data.chat_template: qwen2_5, qwen3 or llama3_1), or set data.tool_calls: "
                "inline (each call written as <tool_call>JSON</tool_call> in the assistant's turn, the tool list in "
                "the system turn)"
            )
        return chat
    messages = [dict(m) for m in chat["messages"]]
    for message in messages:
        written = [json.dumps(call["function"], ensure_ascii=False) for call in message.pop("tool_calls", [])]
        if written:
            text = "\n".join(f"<tool_call>\n{call}\n</tool_call>" for call in written)
            message["content"] = f"{message['content']}\n{text}" if message["content"] else text
    if chat["tools"] is not None:
        note = f"You can call these tools:\n{chat['tools']}"
        if messages[0]["role"] == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{note}"
        else:
            messages.insert(0, {"role": "system", "content": note})
    return {"messages": messages, "tools": None}


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


def source_format(source: DataSource, found: SourceRows) -> str:
    """The row format of a source (detected from its first row unless set), once its rows are known to be
    supervised chat data rather than preference or multimodal data."""
    if kind := other_kind(found.rows[0]):
        raise XtrainError(
            f"{found.where(0)}: this source holds {kind[0]}, not supervised chat data: an SFT recipe would train on "
            f"part of each row and drop what makes it {kind[0].split(' (')[0]}. Set {kind[1]}, or remove the source "
            "from data.sources"
        )
    fmt = source.format if source.format != "auto" else detect_format(found.rows[0])
    if fmt is None:
        raise XtrainError(
            f"{found.where(0)}: cannot tell the format from the columns {sorted(found.rows[0])}; set "
            "data.sources[].format (messages, sharegpt, alpaca, prompt_completion, text) and map names in `columns`"
        )
    return fmt


def check_first_rows(source: DataSource, path: Path, kind: str = "chats", rows: int = 20) -> str:
    """Before any job: a local source's first rows are read, its format detected (chats for sft, preference data
    for dpo/kto), and those rows parsed; the format."""
    found = read_source(source, path, limit=rows)
    if kind != "chats":
        return preference.read_examples(source, found, kind, set())[0]
    fmt = source_format(source, found)
    normaliser = Normaliser(source, fmt)
    for _ in read_rows(found, normaliser.read, Counter()):
        pass
    return fmt


def read_chats(source: DataSource, path: Path | None, seen: set[str], near: NearDuplicates | None,
               limit: int | None = None):
    """Normalised, trainable, not-yet-seen chats of one source, and its stats."""
    found = read_source(source, path, limit)
    fmt = source_format(source, found)
    normaliser = Normaliser(source, fmt)
    chats, dropped, placeholders = [], Counter(), Counter()
    for index, chat in read_rows(found, normaliser.read, dropped):
        try:
            chat = fill_placeholders(chat, source.replace, placeholders)
        except XtrainError as exc:
            raise XtrainError(f"{found.where(index)}: {exc}") from None
        reason = drop_reason(chat)
        key = exact_key(chat) if reason is None else None
        if reason is None and key in seen:
            reason = "duplicate"
        elif reason is None and near is not None and near.seen(chat):
            reason = "near duplicate"
        if reason is not None:
            dropped[reason] += 1
            continue
        seen.add(key)
        chats.append(chat)
    ignored = sorted(column for column in found.rows[0] if column not in set(normaliser.col.values()))
    stats = {"format": fmt, "rows": len(found.rows), "weight": source.weight,
             **({"ignored_columns": ignored} if ignored else {}),  # columns no format field reads (id, source, ...)
             **({"unfilled_placeholders": dict(sorted(placeholders.items()))} if placeholders else {})}
    return found.name, chats, dropped, stats


def tokenize(chats: list[Chat], tokenizer, template: ChatTemplate | None, data: Data) -> pa.Table:
    """input_ids and assistant_masks of every chat, in order.

    One process: each batch is tokenized by the Rust tokenizer on every core already, and measured on
    2 cores, `datasets` workers (num_proc=2) made this stage slower (bench/bench_prepare.py).
    """
    from datasets import Dataset, disable_progress_bars

    disable_progress_bars()  # its bar redraws with carriage returns; Progress writes log lines instead
    progress = Progress(log.info, "tokenize: chats", len(chats))

    def encode_counted(batch, **settings):
        encoded = encode_batch(batch, **settings)
        progress.advance(len(batch["messages"]))
        return encoded

    # As JSON text: messages differ in their keys (tool calls, reasoning), which one Arrow schema would merge.
    dataset = Dataset.from_dict({"messages": [json.dumps(c["messages"], ensure_ascii=False) for c in chats],
                                 "tools": [c["tools"] for c in chats]})
    encoded = dataset.map(
        encode_counted,
        batched=True,
        batch_size=BATCH_ROWS,
        remove_columns=["messages", "tools"],
        fn_kwargs={"tokenizer": tokenizer, "template": template, "train_on_inputs": data.train_on_inputs},
        new_fingerprint=content_hash([len(chats), data.model_dump(mode="json")])[:32],  # skip hashing the tokenizer
    )
    return encoded.with_format("arrow")[:]


def encode_in_batches(tokenizer, template: ChatTemplate, chats: list[Chat]):
    """Each chat's (input_ids, mask), in order, encoded BATCH_ROWS at a time with a progress line."""
    progress = Progress(log.info, "tokenize: chats", len(chats))
    for start in range(0, len(chats), BATCH_ROWS):
        batch = chats[start : start + BATCH_ROWS]
        encoded = list(encode_chats(tokenizer, template, [c["messages"] for c in batch], [c["tools"] for c in batch]))
        progress.advance(len(batch))
        yield from encoded


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


def pack(table: pa.Table, seq_len: int):
    """Best-fit-decreasing into seq_len bins with TRL's packer (the `seq_lengths` its collator turns into position ids)."""
    from datasets import Dataset
    from trl.data_utils import pack_dataset

    dataset = Dataset(table.select([INPUT_IDS, LOSS_MASK]))
    return pack_dataset(dataset, seq_len, strategy="bfd", map_kwargs={"batch_size": len(dataset)}).with_format(
        "arrow"
    )[:]


def prepare(
    sources: list[Path], model_dir: Path, data: Data, out: Path, trust_remote_code: bool = False,
    kind: str = "chats", limit: int | None = None,
) -> dict[str, Any]:
    """Build `out` (train/eval Parquet, manifest.json, preview.txt) atomically; return the manifest.

    `sources` are the local files of `data.sources` in order (hub sources have none); `kind` (recipe.DATA_KINDS of
    train.objective) says whether they hold chats (sft), pairs (dpo, orpo) or labelled answers (kto). `limit`
    reads only each source's first rows (the smoke stage).
    """
    from datasets import Dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    if kind != "chats":
        return prepare_preference(sources, tokenizer, model_dir, data, out, kind, limit)
    seen: set[str] = set()
    near = NearDuplicates(data.near_dedupe_threshold) if data.near_dedupe_threshold else None
    chats, origin, per_source = [], [], {}
    for index, (source, path) in enumerate(zip(data.sources, local_paths(data, sources))):
        name, found, dropped, stats = read_chats(source, path, seen, near, limit)
        per_source[name] = {**stats, "dropped": dropped}
        chats += found
        origin += [index] * len(found)

    template, end_of_turn = None, None
    if any(chat["messages"][0]["role"] != TEXT_ROLE for chat in chats):
        template = resolve(tokenizer, data.chat_template, model_dir, masked=not data.train_on_inputs)
        chats = [apply_tool_calls(apply_reasoning(chat, data.reasoning, template), data.tool_calls, template)
                 for chat in chats]
        if not data.train_on_inputs:
            end_of_turn = check_template(tokenizer, template)
        log.info("%s: assistant tokens found by %s", template.label, template.method)
    table, chats, origin, blocks = split_documents(tokenize(chats, tokenizer, template, data), chats, origin, data)
    table, over, reasons = fit_lengths(table, data.seq_len, data.over_length)

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
    for stats in per_source.values():
        stats["kept"] = stats["rows"] - sum(stats["dropped"].values())
        stats["dropped"] = dict(sorted(stats["dropped"].items()))
        stats.setdefault("truncated", 0)

    warnings = drop_warnings(per_source, data, table, origin, names)
    for warning in warnings:
        log.warning("%s", warning)
    check_splits(splits, per_source, warnings)
    tables = {
        name: table.take(pa.array(rows, pa.int64())).append_column(
            "row_hash", pa.array([row_hashes[r] for r in rows], pa.string())
        )
        for name, rows in splits.items()
    }
    examples = tables["train"]
    if data.packing:
        tables["train"] = pack(examples, data.seq_len)

    manifest: dict[str, Any] = {
        "sources": per_source,
        "seq_len": data.seq_len,
        "chat_template": data.chat_template,
        # How assistant tokens were found, and the end-of-turn token the checkpoint's generation config stops at.
        **({"masking": template.method} if template else {}),
        **({"end_of_turn": end_of_turn} if end_of_turn else {}),
        "train_on_inputs": data.train_on_inputs,
        "packing": data.packing,
        "splits": {name: split_stats(split, data.seq_len) for name, split in tables.items()},
        **({"warnings": warnings} if warnings else {}),
    }

    with atomic_dir(out) as staging:
        fingerprint = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode())
        if template:
            fingerprint.update(template.stock.encode())
            if template.masking != template.stock:
                fingerprint.update((template.masking or template.method).encode())
        for name, split in tables.items():
            Dataset(split).to_parquet(str(staging / f"{name}.parquet"))
            fingerprint.update((staging / f"{name}.parquet").read_bytes())
        manifest["fingerprint"] = fingerprint.hexdigest()
        write_json(staging / "manifest.json", manifest)
        (staging / "preview.txt").write_text(preview(examples, tokenizer), encoding="utf-8")
        if template:  # the checkpoint ships the stock template the data was rendered with, for inference
            (staging / CHAT_TEMPLATE_FILE).write_text(template.stock, encoding="utf-8")
    for name, stats in per_source.items():
        log.info("%s (%s): kept %d of %d rows, dropped %s", name, stats["format"], stats["kept"], stats["rows"],
                 stats["dropped"] or "none")
    return manifest


def prepare_preference(sources: list[Path], tokenizer, model_dir: Path, data: Data, out: Path, kind: str,
                       limit: int | None = None):
    """prepare for pairs (dpo, orpo) or labelled answers (kto): each example's prompt tokens once and
    each answer's tokens, split by prompt so that examples sharing a prompt stay in one split."""
    from datasets import Dataset

    seen: set[str] = set()
    examples, origin, per_source = [], [], {}
    for index, (source, path) in enumerate(zip(data.sources, local_paths(data, sources))):
        found = read_source(source, path, limit)
        fmt, read, dropped, ignored = preference.read_examples(source, found, kind, seen)
        unfilled = Counter()
        for example in read:
            chat = fill_placeholders({"messages": [*example["prompt"], *preference.answers(example)]}, source.replace,
                                     unfilled)
            example["prompt"] = chat["messages"][: len(example["prompt"])]
            for key, message in zip(preference.ANSWER_KEYS[kind], chat["messages"][len(example["prompt"]):]):
                example[key] = message
        per_source[found.name] = {"format": fmt, "rows": len(found.rows), "weight": source.weight, "dropped": dropped,
                                  **({"ignored_columns": ignored} if ignored else {}),
                                  **({"unfilled_placeholders": dict(sorted(unfilled.items()))} if unfilled else {})}
        examples += read
        origin += [index] * len(read)
    template = resolve(tokenizer, data.chat_template, model_dir)
    end_of_turn = check_template(tokenizer, template)
    rendered = [[apply_tool_calls(apply_reasoning(chat, data.reasoning, template), data.tool_calls, template)
                 for chat in preference.chats(example)] for example in examples]
    flat = [chat for chats in rendered for chat in chats]
    encoded = encode_in_batches(tokenizer, template, flat)
    columns = preference.COLUMNS[kind]
    splits: dict[str, list[dict]] = {name: [] for name in SPLITS}
    for example, chats, source_index in zip(examples, rendered, origin):
        prompt_ids, answer_ids = preference.answer_tokens([next(encoded) for _ in chats])
        stats = per_source[data.sources[source_index].name]
        if len(prompt_ids) + max(map(len, answer_ids)) > data.seq_len:
            stats["dropped"]["over seq_len"] += 1
            continue
        row = {columns[0]: prompt_ids, **dict(zip(columns[1:], answer_ids)), "row_hash": content_hash(example),
               **({"label": example["label"]} if kind == "labelled" else {})}
        if is_eval_row(preference.prompt_hash(example), data.eval_fraction):
            splits["eval"].append(row)
        else:
            splits["train"].extend([row] * repeats(row["row_hash"], data.sources[source_index].weight))
    for stats in per_source.values():
        stats["kept"] = stats["rows"] - sum(stats["dropped"].values())
        stats["dropped"] = dict(sorted(stats["dropped"].items()))
    warnings = preference_warnings(per_source, data)
    for warning in warnings:
        log.warning("%s", warning)
    check_splits(splits, per_source, warnings)
    manifest: dict[str, Any] = {
        "data_kind": kind,
        "sources": per_source,
        "seq_len": data.seq_len,
        "chat_template": data.chat_template,
        "masking": template.method,
        "end_of_turn": end_of_turn,
        "train_on_inputs": False,
        "packing": False,
        "splits": {name: preference.split_stats(rows, columns, data.seq_len) for name, rows in splits.items()},
        **({"warnings": warnings} if warnings else {}),
    }
    with atomic_dir(out) as staging:
        fingerprint = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode() + template.stock.encode())
        for name, rows in splits.items():
            Dataset.from_list(rows).to_parquet(str(staging / f"{name}.parquet"))
            fingerprint.update((staging / f"{name}.parquet").read_bytes())
        manifest["fingerprint"] = fingerprint.hexdigest()
        write_json(staging / "manifest.json", manifest)
        (staging / "preview.txt").write_text(preference.preview(splits["train"], columns, tokenizer), encoding="utf-8")
        (staging / CHAT_TEMPLATE_FILE).write_text(template.stock, encoding="utf-8")
    for name, stats in per_source.items():
        log.info("%s (%s): kept %d of %d rows, dropped %s", name, stats["format"], stats["kept"], stats["rows"],
                 stats["dropped"] or "none")
    return manifest


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
