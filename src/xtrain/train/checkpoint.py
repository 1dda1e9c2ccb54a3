"""The checkpoint contract every backend writes (`checkpoints/<recipe>/`), checked from the files on disk.

Weights a plain transformers + peft install loads (a PEFT adapter, or a full model), the tokenizer with its chat
template, `generation_config.json`, the model card, `train_metrics.json` (finite losses, steps and tokens) and
`manifest.json` (what was trained from what). The smoke stage checks its checkpoint with it; the tests also load
one in a fresh interpreter and generate (tests/checkpoint_contract.py).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..artifacts import read_json
from ..errors import XtrainError

ADAPTER = ("adapter_config.json", "adapter_model.safetensors")
FULL_MODEL = ("config.json", "model.safetensors")
EVERY_CHECKPOINT = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "train_metrics.json",
                    "manifest.json", "generation_config.json", "README.md")
MANIFEST_KEYS = ("recipe_hash", "data_fingerprint", "plan_hash", "packages", "seed")


def check_checkpoint(checkpoint: Path, backend: str) -> dict[str, Any]:
    """Raise an XtrainError naming each way `checkpoint` breaks the contract; return its train_metrics.json."""
    weights = ADAPTER if (checkpoint / ADAPTER[0]).is_file() else FULL_MODEL
    missing = [name for name in (*weights, *EVERY_CHECKPOINT) if not (checkpoint / name).is_file()]
    if missing:
        raise XtrainError(f"{checkpoint} breaks the checkpoint contract: it lacks {', '.join(missing)}")
    problems = []
    if weights == ADAPTER:  # in one order, so two identical runs write identical files
        targets = read_json(checkpoint / ADAPTER[0])["target_modules"]
        if targets != sorted(targets):
            problems.append(f"adapter target_modules {targets} are not sorted")
    if not (checkpoint / "README.md").read_text(encoding="utf-8").startswith("---\nbase_model: "):
        problems.append("README.md is not a Hugging Face model card (a YAML header with base_model)")
    metrics = read_json(checkpoint / "train_metrics.json")
    if not metrics.get("loss") or not all(math.isfinite(entry["loss"]) for entry in metrics["loss"]):
        problems.append(f"train_metrics.json has no finite loss: {metrics.get('loss')}")
    if not metrics.get("steps") or not metrics.get("tokens_seen"):
        problems.append("train_metrics.json counts no steps or tokens")
    manifest = read_json(checkpoint / "manifest.json")
    if manifest.get("backend") != backend:
        problems.append(f"manifest.json names backend {manifest.get('backend')!r}, not {backend!r}")
    problems += [f"manifest.json lacks {key}" for key in MANIFEST_KEYS if manifest.get(key) is None]
    if problems:
        raise XtrainError(f"{checkpoint} breaks the checkpoint contract: {'; '.join(problems)}")
    return metrics
