"""A lane's own validator on the native config xtrain rendered for it, run by the lane's interpreter, as the lane's
GPU node would run it at start: its device probe answers what the target GPU reports, not this machine's.

`python -m xtrain_backend_side.validate requests.json`: a list of requests (one interpreter for all: importing a
framework takes seconds), each naming the `framework` and its inputs (`capabilities`: the GPU's probe answers, or
null for a CPU run; `world_size`: processes of the launch). For each it prints `VALIDATED <json>` (what the framework
read back); the first refusal exits non-zero with the framework's own error.
- `trl`: TRL's config class of the objective (transformers' TrainingArguments checks precision, FSDP and schedule
  settings against the device) and peft's `LoraConfig`;
- `unsloth`: the same through the unsloth runner's translation to its environment's older transformers;
- `axolotl`: Axolotl's `load_cfg` on `config_file` (whose top-level `keys` the request lists; its pydantic schema, `validate_config` against the GPU's capabilities, and
  `normalize_config`), the loader `axolotl train` uses; a key its schema does not know is an error, and so is a
  warning in which Axolotl says training will fail (its verdict on bf16 without GPU support); the others are
  returned.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path


def trl_config(request: dict, translate=None) -> dict:
    import transformers.training_args as training_args
    from peft import LoraConfig

    from xtrain_backend_side.trainer_parts import config_class

    if request["capabilities"] is not None:
        training_args.is_torch_bf16_gpu_available = lambda: request["capabilities"]["bf16"]
        training_args.is_torch_tf32_available = lambda: request["capabilities"]["tf32"]
    arguments = request["arguments"]
    config = translate(request["objective"], arguments) if translate else config_class(request["objective"])(
        **arguments)
    if request["peft"]:
        LoraConfig(**request["peft"])
    if request.get("quantization"):
        from transformers import BitsAndBytesConfig

        BitsAndBytesConfig(**request["quantization"])
    return {"config_class": type(config).__name__, "bf16": config.bf16, "fp16": config.fp16,
            "fsdp": config.fsdp, "fsdp_config": config.fsdp_config}


def unsloth_config(request: dict) -> dict:
    from xtrain_backend_side.unsloth_runner import trainer_config

    return trl_config(request, translate=trainer_config)


def axolotl_config(request: dict) -> dict:
    import axolotl.cli.config as loader
    import torch
    from axolotl.utils.schemas.config import AxolotlInputConfig

    os.environ["WORLD_SIZE"] = str(request["world_size"])
    if request["capabilities"] is not None:
        capabilities = {**request["capabilities"], "n_gpu": request["world_size"]}
        torch_version = torch.__version__.split("+", maxsplit=1)[0]
        loader.gpu_capabilities = lambda: (capabilities, {"torch_version": torch_version})
    path, keys = Path(request["config_file"]), request["keys"]
    if unknown := sorted(set(keys) - set(AxolotlInputConfig.model_fields)):
        raise SystemExit(f"{path}: Axolotl's config schema has no key(s) {unknown}")
    warnings = Warnings()
    logging.getLogger("axolotl").addHandler(warnings)
    cfg = loader.load_cfg(str(path))
    if failing := [message for message in warnings.messages if "Training will fail" in message]:
        raise SystemExit(f"{path}: Axolotl's loader: {failing[0]}")
    return {**{key: cfg.get(key) for key in [*keys, "batch_size", "world_size"]}, "warnings": warnings.messages}


class Warnings(logging.Handler):
    """The warnings a framework logs while it loads a config (Axolotl says some problems only as a warning)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


VALIDATORS = {"trl": trl_config, "unsloth": unsloth_config, "axolotl": axolotl_config}


def main(requests_path: str) -> None:
    for request in json.loads(Path(requests_path).read_text()):
        read_back = VALIDATORS[request["framework"]](request)
        print("VALIDATED " + json.dumps(read_back, default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
