"""The model as the recipe trains it, built on the meta device: shapes and parameter counts, no weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import XtrainError
from ..recipe import Train


def meta_model(model_dir: Path, train: Train, dtype=None, trust_remote_code: bool = False):
    """The model (with its LoRA adapters) on the meta device: every shape, no memory, no weights read.

    `dtype` is that of the base weights; peft keeps the adapters in fp32 whatever it is.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    if train.adapters:
        from peft import LoraConfig, get_peft_model

        check_lora_targets(model, list(train.lora.target_modules))
        model = get_peft_model(model, LoraConfig(**train.lora.peft_kwargs()))
    return model


def count_parameters(model_dir: Path, train: Train, trust_remote_code: bool = False) -> dict[str, Any]:
    """Total and trainable parameters of the model as the recipe trains it, and the shapes the plan uses."""
    model = meta_model(model_dir, train, trust_remote_code=trust_remote_code)
    config = model.config
    quantized = quantized_linears(model) if train.method == "qlora" else []
    return {
        "total": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        **({"quantized": sum(quantized), "largest_quantized": max(quantized, default=0)} if quantized else {}),
        "largest_layer": largest_block(model),
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "intermediate_size": getattr(config, "intermediate_size", 4 * config.hidden_size),
        "vocab_size": config.vocab_size,
    }


def quantized_linears(model) -> list[int]:
    """Weights (element counts) of the linear layers a 4-bit load quantizes: every `nn.Linear` of the base except
    the output head, which transformers' bitsandbytes loader keeps in full precision (as it does a tied one)."""
    import torch

    base = transformers_model(model)
    head = base.get_output_embeddings()
    return [module.base_layer.weight.numel() if hasattr(module, "base_layer") else module.weight.numel()
            for name, module in base.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not head and "lora_" not in name
            and not (hasattr(module, "base_layer") and module.base_layer is head)]


def largest_block(model) -> int:
    """Parameters of the largest unit FSDP would wrap: a decoder layer (transformers' no-split modules)."""
    block_types = set(transformers_model(model)._no_split_modules or ())
    sizes = [sum(p.numel() for p in m.parameters()) for m in model.modules() if type(m).__name__ in block_types]
    return max(sizes, default=0)


def transformers_model(model):
    """The transformers model inside a peft wrapper, or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def check_lora_targets(model, targets: list[str]) -> None:
    """Every LoRA target must name at least one module: peft itself only fails when none does."""
    if targets == ["all-linear"]:
        return
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in targets if not any(name == t or name.endswith(f".{t}") for name in names)]
    if missing:
        leaves = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                         if not list(module.children()) and name})
        raise XtrainError(
            f"train.lora.target_modules: {missing} match no module of the model; "
            f"module names it has: {', '.join(leaves)}"
        )
