"""The plan stage: how a run is laid out, and what it will cost, decided before any device is allocated.

From the model's config (built on the meta device: no weights are read), the prepared data's
manifest and the recipe's hardware, choose micro-batch and accumulation, precision and gradient
checkpointing, and predict peak memory per device and wall time with an analytical model. The
plan's `resources` are what the train rule asks the scheduler for.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from .errors import XtrainError
from .recipe import Hardware, Train

GIB = 2**30
# Dense peak throughput per device in FLOP/s for the precision the plan picks. CPU: ~80 GFLOP/s fp32
# per core for 2048² matmuls on this project's machines (FIELD-NOTES); GPUs: vendor bf16 dense peaks.
PEAK_FLOPS = {"cpu_per_core": 80e9, "cuda": 989e12, "rocm": 1307e12}
# Share of peak a training step reaches (model FLOPs utilisation); full fp32 on CPU measured ~0.6.
MFU = {"cpu": 0.5, "cuda": 0.4, "rocm": 0.35}
DEFAULT_GPU_MEMORY_GB = {"cuda": 80.0, "rocm": 192.0}
# Fraction of device memory a plan may fill; the rest is left to the allocator and runtime.
MEMORY_HEADROOM = 0.9
# Host memory the training process needs besides the model: interpreter, torch, transformers, trl.
PROCESS_OVERHEAD_BYTES = 1.5 * GIB


def count_parameters(model_dir: Path, train: Train) -> dict[str, Any]:
    """Total and trainable parameters of the model as the recipe trains it, without loading weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    trainable = total
    if train.method == "lora":
        from peft import LoraConfig, get_peft_model

        check_lora_targets(model, list(train.lora.target_modules))
        peft_model = get_peft_model(model, LoraConfig(**train.lora.peft_kwargs()))
        trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in peft_model.parameters())
    return {
        "total": total,
        "trainable": trainable,
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
    }


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


def memory_budget(hardware: Hardware) -> float:
    """Bytes one device may use: GPU memory, or this host's RAM when training on the CPU."""
    if hardware.accelerator == "cpu":
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    else:
        total = (hardware.gpu_memory_gb or DEFAULT_GPU_MEMORY_GB[hardware.accelerator]) * GIB
    return total * MEMORY_HEADROOM


def predict_memory(params: dict, seq_len: int, micro: int, precision: str, checkpointing: bool) -> dict[str, float]:
    """Analytical peak bytes per device: weights, grads, AdamW states, activations and logits."""
    weight_bytes = 4 if precision == "fp32" else 2
    h, layers, vocab = params["hidden_size"], params["layers"], params["vocab_size"]
    tokens = micro * seq_len
    # Per layer and token, a transformer block keeps ~34·h bytes of activations in 16-bit
    # (Korthikanti et al. 2022), twice that in fp32; checkpointing keeps only each layer's input.
    per_layer = tokens * h * (weight_bytes if checkpointing else 17 * weight_bytes)
    recompute = tokens * h * 17 * weight_bytes if checkpointing else 0
    return {
        "weights": params["total"] * weight_bytes,
        "gradients": params["trainable"] * 4,
        "optimizer": params["trainable"] * 8,
        "activations": layers * per_layer + recompute,
        "logits": tokens * vocab * 4 * 2,
    }


def choose_layout(params, train: Train, hardware: Hardware, seq_len: int, precision: str) -> dict[str, Any]:
    """The largest micro-batch that fits, without checkpointing if possible, else with it."""
    per_device = train.global_batch_size // hardware.devices
    candidates = [train.micro_batch_size] if train.micro_batch_size else [
        m for m in range(per_device, 0, -1) if per_device % m == 0
    ]
    if train.micro_batch_size and per_device % train.micro_batch_size:
        raise XtrainError(
            f"train.micro_batch_size {train.micro_batch_size} does not divide the per-device batch {per_device} "
            f"(global_batch_size {train.global_batch_size} over {hardware.devices} devices); choose a divisor"
        )
    budget = memory_budget(hardware)
    for checkpointing in (False, True):
        for micro in candidates:
            breakdown = predict_memory(params, seq_len, micro, precision, checkpointing)
            if sum(breakdown.values()) <= budget:
                return {
                    "micro_batch_size": micro,
                    "gradient_accumulation_steps": per_device // micro,
                    "gradient_checkpointing": checkpointing,
                    "breakdown": breakdown,
                    "budget": budget,
                }
    smallest = sum(predict_memory(params, seq_len, candidates[-1], precision, True).values())
    raise XtrainError(
        f"the run does not fit: {smallest / GIB:.1f} GiB per device even with micro-batch {candidates[-1]} and "
        f"gradient checkpointing, over a budget of {budget / GIB:.1f} GiB. Lower data.seq_len, use "
        "train.method: lora, or add GPUs (hardware.gpus)"
    )


def precision_for(hardware: Hardware) -> str:
    """bf16 on GPUs (CUDA and ROCm parts this targets support it); fp32 on the CPU."""
    return "fp32" if hardware.accelerator == "cpu" else "bf16"


def make_plan(model_dir: Path, manifest: dict, train: Train, hardware: Hardware) -> dict[str, Any]:
    params = count_parameters(model_dir, train)
    data = manifest["splits"]["train"]
    seq_len = manifest["seq_len"]
    precision = precision_for(hardware)
    layout = choose_layout(params, train, hardware, seq_len, precision)

    steps_per_epoch = math.ceil(data["rows"] / train.global_batch_size)
    steps = train.max_steps or math.ceil(steps_per_epoch * train.epochs)
    mean_len = data["tokens"] / data["rows"]
    tokens_per_step = train.global_batch_size * mean_len
    # Forward 2N, backward 2N for activations plus 2 per trainable weight for weight gradients.
    flops_per_token = 4 * params["total"] + 2 * params["trainable"]
    device = hardware.accelerator
    peak = PEAK_FLOPS["cpu_per_core"] * (os.cpu_count() or 1) if device == "cpu" else PEAK_FLOPS[device]
    throughput = peak * MFU[device] * hardware.devices
    seconds = steps * tokens_per_step * flops_per_token / throughput

    peak_bytes = sum(layout["breakdown"].values())
    host_bytes = PROCESS_OVERHEAD_BYTES + (peak_bytes if device == "cpu" else params["total"] * 4)
    return {
        "model": params,
        "data": {
            "train_rows": data["rows"],
            "train_tokens": data["tokens"],
            "supervised_tokens": data["supervised_tokens"],
            "seq_len": seq_len,
            "mean_sequence_tokens": round(mean_len, 1),
            "fingerprint": manifest["fingerprint"],
        },
        "layout": {
            "strategy": "single" if hardware.devices == 1 else "ddp",
            "devices": hardware.devices,
            "nodes": hardware.nodes,
            "global_batch_size": train.global_batch_size,
            "micro_batch_size": layout["micro_batch_size"],
            "gradient_accumulation_steps": layout["gradient_accumulation_steps"],
        },
        "precision": precision,
        "gradient_checkpointing": layout["gradient_checkpointing"],
        "memory": {
            "estimator": "analytical",
            "peak_bytes_per_device": int(peak_bytes),
            "budget_bytes_per_device": int(layout["budget"]),
            "breakdown_bytes": {k: int(v) for k, v in layout["breakdown"].items()},
        },
        "time": {
            "steps": steps,
            "tokens_per_step": round(tokens_per_step),
            "flops_per_token": flops_per_token,
            "throughput_flops": throughput,
            "seconds": round(seconds, 1),
        },
        "resources": {
            "gpus": hardware.gpus,
            "nodes": hardware.nodes,
            "mem_mb": math.ceil(host_bytes * 1.25 / 2**20),
            "runtime": math.ceil(seconds * 2 / 60) + 10,
        },
    }
