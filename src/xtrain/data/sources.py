"""Reading one data source into plain rows, each with where it came from (file and line, or row number).

Owns every way a user can hand us data: a local JSON array, JSON lines, CSV, Parquet, a plain-text corpus
(.txt, .md), a folder written by `datasets.save_to_disk`, or a hub dataset id. Problems with the file itself (missing, not UTF-8, malformed
JSON, empty) are `XtrainError`s that name the file and the line or row.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import XtrainError
from ..recipe import DataSource

FILE_TYPES = (".json", ".jsonl", ".csv", ".parquet", ".txt", ".md")


@dataclass(frozen=True)
class SourceRows:
    name: str
    rows: list[dict[str, Any]]
    lines: list[int] | None = None  # file line of each row (JSON lines, CSV); None: rows are counted from 1

    def where(self, index: int) -> str:
        return f"{self.name}:{self.lines[index]}" if self.lines else f"{self.name} row {index + 1}"


def read_source(source: DataSource, path: Path | None, limit: int | None = None) -> SourceRows:
    """All rows of `source`, or its first `limit` (read alone where the file type allows); `path` is where its
    local file is (None for a hub source)."""
    if source.hub is not None:
        found = SourceRows(source.name, read_hub(source.hub, source.split)[:limit])
    elif not path.exists():
        raise XtrainError(f"{path}: data source not found; fix data.sources[].path in the recipe")
    elif path.is_dir():
        found = SourceRows(str(path), read_saved_dataset(path, source.split)[:limit])
    elif path.suffix in (".txt", ".md"):
        found = read_documents(path, whole_file=source.split == "file", limit=limit)
    elif path.suffix in READERS:
        found = READERS[path.suffix](path, limit)
    else:
        raise XtrainError(f"{path}: unknown file type {path.suffix!r}; use one of {', '.join(FILE_TYPES)}")
    if not found.rows:
        raise XtrainError(f"{found.name}: no rows; the file is empty")
    for index, row in enumerate(found.rows):
        if not isinstance(row, dict):
            raise XtrainError(f"{found.where(index)}: a row must be an object of columns, got {type(row).__name__}")
    return found


def read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise XtrainError(f"{path}:{line}: not UTF-8 (byte {exc.start}); re-encode the file as UTF-8") from None


def read_jsonl(path: Path, limit: int | None = None) -> SourceRows:
    rows, lines = [], []
    for line_no, line in enumerate(read_text(path).splitlines(), start=1):
        if len(rows) == limit:
            break
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise XtrainError(f"{path}:{line_no}: malformed JSON ({exc.msg} at column {exc.colno})") from None
        lines.append(line_no)
    return SourceRows(str(path), rows, lines)


def read_json_array(path: Path, limit: int | None = None) -> SourceRows:
    if limit is not None and (first := first_array_items(path, limit)) is not None:
        return SourceRows(str(path), first)
    text = read_text(path)
    if not text.strip():
        return SourceRows(str(path), [])
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise XtrainError(
            f"{path}:{exc.lineno}: malformed JSON ({exc.msg} at column {exc.colno}); "
            "a .json source is one array of row objects (use .jsonl for one object per line)"
        ) from None
    if not isinstance(rows, list):
        raise XtrainError(f"{path}: a .json source is one array of row objects, got a {type(rows).__name__}")
    return SourceRows(str(path), rows)


def first_array_items(path: Path, limit: int, chunk: int = 1 << 20) -> list | None:
    """The first `limit` items of the JSON array in `path`, reading only as much of the file as they take; None
    when the file is not such an array or is shorter (reading it whole then says what is wrong, or reads it all)."""
    decoder, text = json.JSONDecoder(), ""
    try:
        with path.open(encoding="utf-8") as file:
            while more := file.read(chunk):
                text += more
                body = text.lstrip()
                if body and not body.startswith("["):
                    return None
                items, position = [], 1
                while body and len(items) < limit:
                    while position < len(body) and body[position] in " \t\r\n,":
                        position += 1
                    try:
                        item, position = decoder.raw_decode(body, position)
                    except json.JSONDecodeError:
                        break  # an item runs past what is read so far (or is malformed)
                    items.append(item)
                if len(items) == limit:
                    return items
    except UnicodeDecodeError:
        pass
    return None


def read_documents(path: Path, whole_file: bool, limit: int | None = None) -> SourceRows:
    """A plain-text corpus as `text` rows: one document per non-blank line, or the whole file as one
    (data.sources[].split: file)."""
    text = read_text(path)
    if whole_file:
        return SourceRows(str(path), [{"text": text}] if text.strip() else [])
    numbered = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()][:limit]
    return SourceRows(str(path), [{"text": line} for _, line in numbered], [number for number, _ in numbered])


def read_csv(path: Path, limit: int | None = None) -> SourceRows:
    reader = csv.DictReader(io.StringIO(read_text(path) if limit is None else head_lines(path, limit), newline=""))
    rows, lines = [], []
    for row in itertools.islice(reader, limit):
        if None in row:
            raise XtrainError(f"{path}:{reader.line_num}: more fields than the header has columns")
        rows.append(row)
        lines.append(reader.line_num)
    return SourceRows(str(path), rows, lines)


def head_lines(path: Path, limit: int) -> str:
    """A text file's first lines, enough for `limit` rows unless they hold quoted line breaks (then fewer rows)."""
    try:
        with path.open(encoding="utf-8", newline="") as file:
            return "".join(itertools.islice(file, 4 * limit + 1))
    except UnicodeDecodeError:
        return read_text(path)


def read_parquet(path: Path, limit: int | None = None) -> SourceRows:
    import pyarrow.parquet as pq

    try:
        if limit is None:
            rows = pq.read_table(path).to_pylist()
        else:  # the first rows only (preflight): one batch, not the whole file
            rows = next(pq.ParquetFile(path).iter_batches(batch_size=limit), None)
            rows = rows.to_pylist() if rows is not None else []
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise XtrainError(f"{path}: not a readable Parquet file ({exc})") from None
    return SourceRows(str(path), rows)


def read_saved_dataset(path: Path, split: str) -> list[dict[str, Any]]:
    from datasets import DatasetDict, load_from_disk

    try:
        dataset = load_from_disk(str(path))
    except FileNotFoundError:
        raise XtrainError(f"{path}: a folder source must be written by `datasets` save_to_disk") from None
    if isinstance(dataset, DatasetDict):
        if split not in dataset:
            raise XtrainError(f"{path}: no split {split!r}; it has {sorted(dataset)}: set data.sources[].split")
        dataset = dataset[split]
    return dataset.to_list()


def read_hub(dataset_id: str, split: str) -> list[dict[str, Any]]:
    from datasets import load_dataset

    try:
        return load_dataset(dataset_id, split=split).to_list()
    except Exception as exc:  # offline, unknown id, gated, missing split: all end the same way for the user
        raise XtrainError(
            f"hub:{dataset_id}: cannot load split {split!r} from the Hugging Face hub ({type(exc).__name__}: {exc}). "
            f"Without network access, save a copy where there is one with "
            f"`datasets.load_dataset({dataset_id!r}, split={split!r}).save_to_disk(FOLDER)` "
            "and point data.sources[].path at FOLDER instead of `hub`"
        ) from None


READERS = {".json": read_json_array, ".jsonl": read_jsonl, ".csv": read_csv, ".parquet": read_parquet}
