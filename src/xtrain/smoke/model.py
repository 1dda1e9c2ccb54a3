"""The recipe's model, shrunk: the same class, vocabulary, attention layout and module names, a few small layers.

Built from the model folder's `config.json` and tokenizer files alone (no weights are read, so a model whose
weights are not here yet can be smoke-tested): random-init weights in the config's dtype, so the LoRA targets,
the dtype settings, the chat template, the tokenizer's special tokens and checkpoint loading all behave as
they will in the full run, on a model small enough for a few CPU steps.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LAYERS = 2
HEAD_DIM = 16
MAX_HEADS = 4  # query heads when the model has no grouping; a grouped model keeps its queries per key/value head
FFN = 128
# Mixture-of-experts settings, where a config has them: fewer and smaller experts.
EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")
EXPERT_SIZES = ("moe_intermediate_size", "shared_expert_intermediate_size")
# Files a model folder holds besides its configuration and tokenizer: not copied (nor read).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")


def shrink(config) -> list[str]:
    """Shrink a transformers config in place (its `text_config` for a multimodal one); the settings changed."""
    target = getattr(config, "text_config", None) or config
    heads = target.num_attention_heads
    kv_heads = getattr(target, "num_key_value_heads", None) or heads
    group = max(1, heads // kv_heads)  # query heads per key/value head (grouped-query attention)
    new_kv = max(1, MAX_HEADS // group)
    changes: dict[str, Any] = {
        "num_hidden_layers": LAYERS,
        "num_attention_heads": new_kv * group,
        "hidden_size": new_kv * group * HEAD_DIM,
        "intermediate_size": FFN,
    }
    if hasattr(target, "num_key_value_heads"):
        changes["num_key_value_heads"] = new_kv
    if getattr(target, "head_dim", None):
        changes["head_dim"] = HEAD_DIM
    layer_types = getattr(target, "layer_types", None)
    if layer_types:  # one layer of each kind (sliding window, full attention ...), in the model's order
        kinds = list(dict.fromkeys(layer_types))
        changes["layer_types"] = kinds + kinds[-1:] * (LAYERS - len(kinds))
        changes["num_hidden_layers"] = len(changes["layer_types"])
    for name in EXPERT_COUNTS:
        if getattr(target, name, None):
            changes[name] = min(getattr(target, name), 4)
    if getattr(target, "num_experts_per_tok", None):
        changes["num_experts_per_tok"] = min(target.num_experts_per_tok, 2)
    for name in EXPERT_SIZES:
        if getattr(target, name, None):
            changes[name] = FFN // 2
    for name, value in changes.items():
        setattr(target, name, value)
    if getattr(config, "quantization_config", None) is not None:  # random weights are not quantized
        del config.quantization_config
        changes["quantization_config"] = None
    return [f"{name} {value}" for name, value in changes.items()]


def build_shrunk_model(model_dir: Path, out: Path, seed: int = 0, trust_remote_code: bool = False) -> dict[str, Any]:
    """Write the shrunk model into the new folder `out`: config and random weights, and every tokenizer and
    template file of `model_dir` as it is. Returns what was changed and the parameter count."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    changed = shrink(config)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    out.mkdir(parents=True)
    for path in sorted(model_dir.iterdir()):
        if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES) and not path.name.endswith(".index.json"):
            shutil.copyfile(path, out / path.name)
    model.save_pretrained(out)  # config.json and the weights over the copied config
    parameters = sum(p.numel() for p in model.parameters())
    log.info("smoke model %s: %s (%s parameters)", type(model).__name__, ", ".join(changed), f"{parameters:,}")
    return {"class": type(model).__name__, "changed": changed, "parameters": parameters}
