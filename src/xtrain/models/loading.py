"""Loading a tuned model for inference: a checkpoint's PEFT adapter on its base model, or the full model it holds.

Evaluation, export and chat load checkpoints the same way, through here."""

from __future__ import annotations

from pathlib import Path


def load_tuned(model_dir: Path, checkpoint_dir: Path, trust_remote_code: bool = False):
    """The tuned model: base + PEFT adapter, or the full model the checkpoint holds."""
    import torch
    from transformers import AutoModelForCausalLM

    if (checkpoint_dir / "adapter_config.json").is_file():
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, trust_remote_code=trust_remote_code)
        return PeftModel.from_pretrained(base, checkpoint_dir)
    return AutoModelForCausalLM.from_pretrained(
        checkpoint_dir, dtype=torch.float32, trust_remote_code=trust_remote_code
    )
