"""The prepare stage: recipe data -> tokenized, masked train/eval splits, manifest.json and preview.txt.

Order of work: read and normalise every source (errors name file, row, field), drop what cannot be
trained on and duplicates (exact, then near), tokenize in batches (Rust, every core), handle over-length
rows, split by content hash (a row never moves between splits when others are added), weight the train
rows of each source, and pack them when asked. The output folder appears only when complete.
Each step is a function of the module that owns it (`sources`, `formats`, `dedupe`, `chats`, `tokenize`, `lengths`,
`split`, `packing`, `report`, `output`); this module runs them in order.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

from ..errors import XtrainError
from ..recipe import Data, DataSource
from . import preference, prompts
from .chats import apply_policies, fill_placeholders
from .dedupe import NearDuplicates, exact_key
from .formats import TEXT_ROLE, Chat, Normaliser, drop_reason, read_rows, source_format
from .lengths import check_seq_len, fit_lengths, read_positions, split_documents
from .output import write_output
from .packing import pack
from .report import count_kept, drop_warnings, preference_warnings, preview, split_stats
from .sources import read_source
from .split import check_splits, split_chats, split_examples, take_splits
from .templates import ChatTemplate, resolve
from .tokenize import check_template, encode_in_batches, tokenize_chats

log = logging.getLogger(__name__)


def prepare(
    sources: list[Path], model_dir: Path, data: Data, out: Path, trust_remote_code: bool = False,
    kind: str = "chats", limit: int | None = None, prompt_settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build `out` (train/eval Parquet, manifest.json, preview.txt) atomically; return the manifest.

    `sources` are the local files of `data.sources` in order (hub sources have none); `kind` (recipe.DATA_KINDS of
    train.objective) says whether they hold chats (sft), pairs (dpo, orpo), labelled answers (kto) or prompts (grpo,
    with `prompt_settings`: the prepare slice's `prompts`). `limit` reads only each source's first rows (the smoke
    stage).
    """
    from datasets import Dataset
    from transformers import AutoTokenizer

    check_seq_len(model_dir, data.seq_len)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    if kind == "prompts":
        return prompts.prepare_prompts(list(zip(data.sources, local_paths(data, sources))), tokenizer, model_dir, data,
                                       out, prompt_settings, limit)
    if kind != "chats":
        return prepare_preference(sources, tokenizer, model_dir, data, out, kind, limit)
    chats, origin, per_source = read_all_chats(sources, data, limit)
    chats, template, end_of_turn = normalise_chats(chats, tokenizer, model_dir, data)
    table = tokenize_chats(chats, tokenizer, template, data)
    table, chats, origin, blocks = split_documents(table, chats, origin, data)
    table, lengths, reasons = fit_lengths(table, data.seq_len, data.over_length)
    splits, row_hashes = split_chats(chats, origin, reasons, blocks, lengths > data.seq_len, per_source, data)
    count_kept(per_source, "truncated")
    warnings = drop_warnings(per_source, data, lengths, origin, read_positions(model_dir))
    for warning in warnings:
        log.warning("%s", warning)
    check_splits(splits, per_source, warnings)
    tables = take_splits(table, splits, row_hashes)
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
    write_output(out, {name: Dataset(split) for name, split in tables.items()}, manifest,
                 preview(examples, tokenizer), tokenizer, template)
    log_kept(per_source)
    return manifest


def prepare_preference(sources: list[Path], tokenizer, model_dir: Path, data: Data, out: Path, kind: str,
                       limit: int | None = None):
    """prepare for pairs (dpo, orpo) or labelled answers (kto): each example's prompt tokens once and
    each answer's tokens, split by prompt so that examples sharing a prompt stay in one split."""
    from datasets import Dataset

    examples, origin, per_source = read_all_examples(sources, data, kind, limit)
    template = resolve(tokenizer, data.chat_template, model_dir)
    end_of_turn = check_template(tokenizer, template)
    rendered = [[apply_policies(chat, data, template) for chat in preference.chats(example)] for example in examples]
    encoded = encode_in_batches(tokenizer, template, [chat for chats in rendered for chat in chats])
    splits, lengths = split_examples(examples, rendered, origin, encoded, per_source, data, kind)
    count_kept(per_source)
    warnings = preference_warnings(per_source, data, lengths, origin, read_positions(model_dir))
    for warning in warnings:
        log.warning("%s", warning)
    check_splits(splits, per_source, warnings)

    columns = preference.COLUMNS[kind]
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
    # The fingerprint of preference data has always left out how assistant tokens are found.
    write_output(out, {name: Dataset.from_list(rows) for name, rows in splits.items()}, manifest,
                 preference.preview(splits["train"], columns, tokenizer), tokenizer, template,
                 fingerprint_masking=False)
    log_kept(per_source)
    return manifest


def local_paths(data: Data, sources: list[Path]) -> list[Path | None]:
    """Pair each recipe source with its local file (as Snakemake resolved them, in order); None for hub ids."""
    if len(sources) != sum(source.path is not None for source in data.sources):
        raise ValueError(f"{len(sources)} local files given for the {len(data.sources)} sources of {data.sources}")
    files = iter(sources)
    return [next(files) if source.path is not None else None for source in data.sources]


def check_first_rows(source: DataSource, path: Path, kind: str = "chats", rows: int = 20,
                     reward_columns: dict[str, str] | None = None) -> str:
    """Before any job: a local source's first rows are read, its format detected (chats for sft, preference data
    for dpo/kto, prompts for grpo, whose rows hold every column a reward reads: `reward_columns`, column -> reward),
    and those rows parsed; the format."""
    found = read_source(source, path, limit=rows)
    if kind == "prompts":
        fmt = prompts.read_prompts(source, found, set())[0]  # an SFT or preference file is named as such first
        prompts.check_columns(found, reward_columns or {})
        return fmt
    if kind != "chats":
        return preference.read_examples(source, found, kind, set())[0]
    fmt = source_format(source, found)
    normaliser = Normaliser(source, fmt)
    for _ in read_rows(found, normaliser.read, Counter()):
        pass
    return fmt


def read_all_chats(sources: list[Path], data: Data, limit: int | None) -> tuple[list[Chat], list[int], dict]:
    """The chats of every source in order, each one's source index, and each source's stats; duplicates (exact,
    then near when data.near_dedupe_threshold is set) dropped across all sources, the first copy kept."""
    seen: set[str] = set()
    near = NearDuplicates(data.near_dedupe_threshold) if data.near_dedupe_threshold else None
    chats, origin, per_source = [], [], {}
    for index, (source, path) in enumerate(zip(data.sources, local_paths(data, sources))):
        name, found, dropped, stats = read_chats(source, path, seen, near, limit)
        per_source[name] = {**stats, "dropped": dropped}
        chats += found
        origin += [index] * len(found)
    return chats, origin, per_source


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


def normalise_chats(chats: list[Chat], tokenizer, model_dir: Path,
                    data: Data) -> tuple[list[Chat], ChatTemplate | None, dict | None]:
    """Chats made ready for the chat template (data.reasoning, data.tool_calls), the template, and the end-of-turn
    token its masking supervises (None when data.train_on_inputs); no template when every row is a plain document."""
    template, end_of_turn = None, None
    if any(chat["messages"][0]["role"] != TEXT_ROLE for chat in chats):
        template = resolve(tokenizer, data.chat_template, model_dir, masked=not data.train_on_inputs)
        chats = [apply_policies(chat, data, template) for chat in chats]
        if not data.train_on_inputs:
            end_of_turn = check_template(tokenizer, template)
        log.info("%s: assistant tokens found by %s", template.label, template.method)
    return chats, template, end_of_turn


def read_all_examples(sources: list[Path], data: Data, kind: str, limit: int | None) -> tuple[list, list[int], dict]:
    """The preference examples of every source in order (placeholders filled in prompt and answers), each one's
    source index, and each source's stats; duplicates dropped across all sources."""
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
    return examples, origin, per_source


def log_kept(per_source: dict) -> None:
    for name, stats in per_source.items():
        log.info("%s (%s): kept %d of %d rows, dropped %s", name, stats["format"], stats["kept"], stats["rows"],
                 stats["dropped"] or "none")
