"""The merged model: a checkpoint's LoRA adapter folded into the base weights (PEFT `merge_and_unload`), or a
full fine-tune's weights as they are, written as one plain transformers folder.

The merge runs in the dtype merged/ is written in (the base model's, or `export.dtype`), never through float32,
so it needs about the model's size in that dtype. The weights are saved as safetensors shards of at most
`export.shard_gb`, which the GGUF writer then reads one tensor at a time. `merged/` also holds the tokenizer with
the checkpoint's stock chat template, the checkpoint's `generation_config.json` (it already stops at the
end-of-turn token) and a model card.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ..artifacts import atomic_dir
from ..models.loading import config_dtype, load_tuned

log = logging.getLogger(__name__)


def merged_model(model_dir: Path, checkpoint_dir: Path, dtype: str, device: str = "cpu",
                 trust_remote_code: bool = False):
    """The tuned model as one transformers model in `dtype` (a torch dtype name) on `device` ("cpu", "cuda" or
    "auto"): base + adapter merged, or the full checkpoint."""
    model = load_tuned(model_dir, checkpoint_dir, trust_remote_code, dtype=dtype, device=device)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    return model.eval()


def save_weights(model, out: Path, shard_gb: float) -> None:
    """The config and the weights of `model` in `out` (which exists), safetensors shards of at most `shard_gb`."""
    model.save_pretrained(out, max_shard_size=f"{int(shard_gb * 1000)}MB")
    log.info("wrote %s (%s, %d parameters)", out, str(model.dtype).removeprefix("torch."), model.num_parameters())


def add_model_files(checkpoint_dir: Path, out: Path, card: str) -> None:
    """What makes the weights in `out` a model to run: tokenizer, generation config, model card."""
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(checkpoint_dir).save_pretrained(out)
    # The checkpoint's generation config already lists the end-of-turn token among its eos ids.
    shutil.copyfile(checkpoint_dir / "generation_config.json", out / "generation_config.json")
    (out / "README.md").write_text(card, encoding="utf-8")


def write_merged_base(model_dir: Path, checkpoint_dir: Path, out: Path, trust_remote_code: bool = False) -> None:
    """`out` (bases/<recipe>/): the checkpoint's adapter merged into its base, in the base's dtype on the CPU, with
    the checkpoint's tokenizer and chat template and generation config: the plain model folder the recipes built on
    this one (model.recipe) train on. Built once, read by their prepare, plan, train, evaluate and export jobs."""
    dtype = config_dtype(model_dir, trust_remote_code)
    model = merged_model(model_dir, checkpoint_dir, dtype, "cpu", trust_remote_code)
    with atomic_dir(out) as staging:
        save_weights(model, staging, shard_gb=5)
        add_model_files(checkpoint_dir, staging, f"# {out.name}, merged\n\n`{checkpoint_dir}` merged into "
                        f"`{model_dir}` ({dtype}): the base of the recipes built on recipe `{out.name}`. Not an "
                        "export: `exports/<recipe>/` is.\n")
        shutil.copyfile(checkpoint_dir / "manifest.json", staging / "manifest.json")
