"""Loading a model for inference: a base model folder, or a checkpoint (its PEFT adapter on its base model, or the
full model it holds), in a given dtype on a given device.

Evaluation, export and chat load models the same way, through here. `device` is where the weights go: "cpu",
"cuda" (the first GPU) or "auto" (accelerate spreads a model larger than one GPU over the node's GPUs).
"""

from __future__ import annotations

from pathlib import Path

# plan.json's precision names -> torch dtype names.
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def load_model(folder: Path, dtype: str = "float32", device: str = "cpu", trust_remote_code: bool = False):
    """A transformers causal LM from `folder` in `dtype` (a torch dtype name) on `device`."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype),
                                                device_map=None if device == "cpu" else device,
                                                trust_remote_code=trust_remote_code)


def config_dtype(model_dir: Path, trust_remote_code: bool = False) -> str:
    """The dtype a model folder's config declares (a torch dtype name); float32 when it names none."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    dtype = getattr(config, "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else "float32"


def is_adapter(checkpoint_dir: Path) -> bool:
    return (checkpoint_dir / "adapter_config.json").is_file()


def load_tuned(model_dir: Path, checkpoint_dir: Path, trust_remote_code: bool = False, dtype: str = "float32",
               device: str = "cpu"):
    """The tuned model: base + PEFT adapter, or the full model the checkpoint holds."""
    if is_adapter(checkpoint_dir):
        from peft import PeftModel

        base = load_model(model_dir, dtype, device, trust_remote_code)
        return PeftModel.from_pretrained(base, checkpoint_dir)
    return load_model(checkpoint_dir, dtype, device, trust_remote_code)
