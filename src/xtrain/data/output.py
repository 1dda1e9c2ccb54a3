"""The prepared folder, written atomically (it appears only when complete): train/eval Parquet, manifest.json
with the data's fingerprint, preview.txt, and the stock chat template the data was rendered with."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ..artifacts import atomic_dir, write_json
from .templates import ChatTemplate

CHAT_TEMPLATE_FILE = "chat_template.jinja"  # the name transformers reads beside tokenizer.json


def write_output(out: Path, splits: dict[str, Any], manifest: dict[str, Any], preview: str, tokenizer,
                 template: ChatTemplate | None, fingerprint_masking: bool = True) -> None:
    """`out` with each split (a `datasets.Dataset`) as Parquet, and `manifest` as manifest.json with its
    `fingerprint` added: a hash of the tokenizer, the chat template (and, with `fingerprint_masking`, how its
    assistant tokens are found where that is not the stock template) and the Parquet files."""
    with atomic_dir(out) as staging:
        fingerprint = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode())
        if template:
            fingerprint.update(template.stock.encode())
            if fingerprint_masking and template.masking != template.stock:
                fingerprint.update((template.masking or template.method).encode())
        for name, split in splits.items():
            split.to_parquet(str(staging / f"{name}.parquet"))
            fingerprint.update((staging / f"{name}.parquet").read_bytes())
        manifest["fingerprint"] = fingerprint.hexdigest()
        write_json(staging / "manifest.json", manifest)
        (staging / "preview.txt").write_text(preview, encoding="utf-8")
        if template:  # the checkpoint ships the stock template the data was rendered with, for inference
            (staging / CHAT_TEMPLATE_FILE).write_text(template.stock, encoding="utf-8")
