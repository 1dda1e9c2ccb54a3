"""The model as the recipe trains it, built on the meta device: shapes and parameter counts, no weights."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import XtrainError
from ..recipe import Train


def meta_model(model_dir: Path, train: Train, dtype=None, trust_remote_code: bool = False, layers: int | None = None,
               attention: str | None = None):
    """The model (with its LoRA adapters) on the meta device: every shape, no memory, no weights read.

    `dtype` is that of the base weights; peft keeps the adapters in fp32 whatever it is. `layers`: only the first
    that many decoder layers (the plan traces shallow copies and extrapolates, memory.traced). `attention`: the
    attn_implementation to build it with (None: transformers' default for the model).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    if layers is not None:
        truncate(config.get_text_config(), layers)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code,
                                                 **({"attn_implementation": attention} if attention else {}))
    if train.adapters:
        from peft import LoraConfig, get_peft_model

        check_lora_targets(model, list(train.lora.target_modules))
        model = get_peft_model(model, LoraConfig(**train.lora.peft_kwargs()))
    return model


def per_layer_settings(config) -> dict[str, list]:
    """The config's per-layer lists (`layer_types`, and any other list with one entry per decoder layer)."""
    depth = config.num_hidden_layers
    return {name: value for name, value in vars(config).items()
            if isinstance(value, (list, tuple)) and len(value) == depth and not name.startswith("_")}


def truncate(config, layers: int) -> None:
    """The text config of the model's first `layers` decoder layers, their per-layer lists cut to match."""
    for name, value in per_layer_settings(config).items():
        setattr(config, name, type(value)(value[:layers]))
    config.num_hidden_layers = layers


def decoder_layers(model) -> list:
    """The decoder layers (transformers' no-split modules: FSDP's units), in order."""
    block_types = set(transformers_model(model)._no_split_modules or ())
    return [m for m in model.modules() if type(m).__name__ in block_types]


def layer_signature(layer) -> tuple:
    """What makes two decoder layers of one model cost the same: their module types and their parameters' names,
    shapes and trainability (a MoE layer beside a dense one, or LoRA on some layers only, differ here). Not the
    dtypes, which the build sets for the whole model."""
    return (tuple((name, type(module).__name__) for name, module in layer.named_modules()),
            tuple((name, tuple(p.shape), p.requires_grad) for name, p in layer.named_parameters()))


class LayerStack(NamedTuple):
    depth: int  # decoder layers (num_hidden_layers)
    signature: tuple | None  # every layer's layer_signature, when they are all the same
    differs: str | None  # why the layers are not identical copies (then the plan traces the whole model)


@functools.lru_cache(maxsize=32)
def layer_stack(model_dir: str, method: str, lora: str | None, trust_remote_code: bool) -> LayerStack:
    """Whether the model's decoder layers are identical copies, so that a step's cost grows by the same amount with
    each: per-layer config lists (`layer_types`: sliding-window or linear-attention layers between full ones) must
    hold one value, and every layer the same modules and parameters (no dense layers between MoE ones)."""
    from transformers import AutoConfig

    train = Train(method=method, lora=json.loads(lora) if lora else None)
    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code).get_text_config()
    depth = config.num_hidden_layers
    varying = [name for name, value in per_layer_settings(config).items() if len({repr(v) for v in value}) > 1]
    if varying:
        return LayerStack(depth, None, f"config.{varying[0]} differs between layers")
    layers = decoder_layers(meta_model(Path(model_dir), train, trust_remote_code=trust_remote_code))
    if len(layers) != depth:
        return LayerStack(depth, None, f"{len(layers)} decoder blocks found for num_hidden_layers {depth}")
    signatures = {layer_signature(layer) for layer in layers}
    if len(signatures) > 1:
        return LayerStack(depth, None, f"its {depth} decoder layers differ in modules or parameters")
    return LayerStack(depth, signatures.pop(), None)


def count_parameters(model_dir: Path, train: Train, trust_remote_code: bool = False) -> dict[str, Any]:
    """Total and trainable parameters of the model as the recipe trains it, and the shapes the plan uses."""
    model = meta_model(model_dir, train, trust_remote_code=trust_remote_code)
    config = model.config
    quantized = quantized_linears(model) if train.method == "qlora" else []
    return {
        "total": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        **({"quantized": sum(quantized), "largest_quantized": max(quantized, default=0),
            "quantized_stored_bytes": sum(quantized) * stored_bytes_per_weight(model_dir, trust_remote_code)}
           if quantized else {}),
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


def stored_bytes_per_weight(model_dir: Path, trust_remote_code: bool = False) -> int:
    """Bytes of one weight in the checkpoint's files: the dtype its config.json names (float32, the most, where it
    names none)."""
    import torch
    from transformers import AutoConfig

    dtype = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code).get_text_config().dtype
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return dtype.itemsize if isinstance(dtype, torch.dtype) else torch.float32.itemsize


def largest_block(model) -> int:
    """Parameters of the largest unit FSDP would wrap: a decoder layer (transformers' no-split modules)."""
    return max((sum(p.numel() for p in m.parameters()) for m in decoder_layers(model)), default=0)


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
