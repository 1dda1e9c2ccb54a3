"""The merged model: a checkpoint's LoRA adapter folded into the base weights (PEFT `merge_and_unload`), or a
full fine-tune's weights as they are, written as one plain transformers folder.

`merged/` holds safetensors (sharded at `export.shard_gb`), the tokenizer with the checkpoint's stock chat
template, the checkpoint's `generation_config.json` (it already stops at the end-of-turn token) and a model card.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ..models.loading import load_tuned

log = logging.getLogger(__name__)


def merged_model(model_dir: Path, checkpoint_dir: Path, trust_remote_code: bool = False):
    """The tuned model as one fp32 transformers model: base + adapter merged, or the full checkpoint."""
    model = load_tuned(model_dir, checkpoint_dir, trust_remote_code)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    return model.eval()


def base_dtype(model_dir: Path, trust_remote_code: bool = False) -> str:
    """The dtype the base model's config declares; float32 when it names none."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    dtype = getattr(config, "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else "float32"


def save_merged(model, checkpoint_dir: Path, out: Path, dtype: str, shard_gb: float, card: str) -> None:
    """Write the merged folder `out` (which exists) from `model`, cast to `dtype` in place."""
    import torch
    from transformers import AutoTokenizer

    model.to(getattr(torch, dtype))
    model.save_pretrained(out, max_shard_size=f"{int(shard_gb * 1000)}MB")
    AutoTokenizer.from_pretrained(checkpoint_dir).save_pretrained(out)
    # The checkpoint's generation config already lists the end-of-turn token among its eos ids.
    shutil.copyfile(checkpoint_dir / "generation_config.json", out / "generation_config.json")
    (out / "README.md").write_text(card, encoding="utf-8")
    log.info("wrote %s (%s, %d parameters)", out, dtype, model.num_parameters())
