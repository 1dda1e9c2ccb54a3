"""The `unsloth` backend's trainer, run by the backend's own interpreter (.venvs/unsloth or its conda env).

`python -m xtrain_backend_side.unsloth_runner job.json`: the job (written by `xtrain.train.backends.unsloth`) holds the model folder,
the prepared train split, the LoRA settings, the objective and the TRL config arguments every TRL-based backend
shares; this script loads the model with Unsloth's `FastLanguageModel`, trains with TRL's `SFTTrainer` (or, for a
preference objective, the trainer every TRL backend uses, `trainer_parts.preference_trainer`; for GRPO,
`grpo.grpo_trainer` on the prepared prompts with the rewards of `rewards.terms`) on the prepared rows, saves the
weights and tokenizer into the job's `out` and writes the log history to its `result`.
The backend's environment has Unsloth's stack, not xtrain's, so the runner imports no xtrain module; the Trainer
pieces every backend shares come from `xtrain_backend_side.trainer_parts`.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from xtrain_backend_side import rewards, tracking, trainer_parts
from xtrain_backend_side.grpo import grpo_trainer


def trainer_config(objective: str, arguments: dict):
    """The objective's TRL config from the shared arguments, which use transformers 5.24 names; this environment has
    an older transformers, so the two renamed settings are translated, and anything else unknown is an error."""
    config_class = trainer_parts.config_class(objective)
    fields = {field.name for field in dataclasses.fields(config_class)}
    arguments = dict(arguments)
    if "activation_checkpointing" not in fields:
        arguments["gradient_checkpointing"] = arguments.pop("activation_checkpointing")
    if "train_sampling_strategy" not in fields:
        arguments["group_by_length"] = arguments.pop("train_sampling_strategy") == "group_by_length"
    unknown = sorted(set(arguments) - fields)
    if unknown:
        raise SystemExit(
            f"unsloth backend: this environment's {config_class.__name__} has no {unknown}; rebuild it from "
            "envs/unsloth.yaml"
        )
    return config_class(**arguments)


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    # Unsloth patches transformers and TRL when imported, so it comes first.
    import torch
    from datasets import Dataset
    from trl import SFTTrainer
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=job["model_dir"],
        max_seq_length=job["seq_len"],
        # fp32 on the CPU and for full fine-tunes (the plan's bf16 is autocast, SFTConfig bf16); a LoRA base on a GPU
        # in the plan's 16-bit weights dtype (the adapter's own weights stay fp32).
        dtype={"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[job["weights_dtype"]],
        # QLoRA: Unsloth's own 4-bit loading (bitsandbytes nf4, double-quantized, computing in `dtype`).
        load_in_4bit=job["load_in_4bit"],
        load_in_8bit=False,
        full_finetuning=job["method"] == "full",
        local_files_only=True,
        trust_remote_code=job["trust_remote_code"],
    )
    # Packed sequences are kept apart by their restarting position ids only when no KV cache is built; GRPO generates
    # its completions, with the cache.
    objective = job["objective"]
    model.config.use_cache = objective == "grpo"
    if job["method"] in ("lora", "qlora"):
        lora = job["lora"]
        model = FastLanguageModel.get_peft_model(
            model,
            r=lora["r"],
            lora_alpha=lora["lora_alpha"],
            lora_dropout=lora["lora_dropout"],
            target_modules=lora["target_modules"],
            use_rslora=lora["use_rslora"],
            modules_to_save=lora["modules_to_save"],
            bias="none",
            use_gradient_checkpointing=job["gradient_checkpointing"],
            random_state=job["seed"],
        )
    dataset = Dataset.from_parquet(job["train_parquet"]).select_columns(job["columns"])
    # The same saves, checkpoint markers and row order per step as trl_cpu: the same seed trains on the same rows.
    # A preference trainer's reference is the model with Unsloth's adapter disabled, as in trl_cpu. GRPO's trainer
    # is TRL's GRPOTrainer (which Unsloth patched on import on a GPU; on the CPU it is TRL's own), scoring with the
    # guarded rewards trl_cpu uses.
    trainer_class, extra = trainer_parts.step_grouped(SFTTrainer), {}
    if objective == "grpo":
        trainer_class = grpo_trainer()
        extra = {"reward_funcs": rewards.terms(job["rewards"], Path(job["project"]))}
    elif objective != "sft":
        trainer_class = trainer_parts.preference_trainer(objective)
    trainer = tracking.measured(trainer_class)(
        model=model, args=trainer_config(objective, job["trainer"]), train_dataset=dataset, processing_class=tokenizer,
        callbacks=[trainer_parts.save_every(job["checkpoint_seconds"]), trainer_parts.mark_complete()], **extra,
    )
    started = time.perf_counter()
    trainer.train(resume_from_checkpoint=job["resume_from"])
    seconds = time.perf_counter() - started
    trainer.save_model(job["out"])
    tokenizer.save_pretrained(job["out"])
    Path(job["result"]).write_text(json.dumps({
        "log_history": trainer.state.log_history,
        "tokens_seen": int(trainer.state.num_input_tokens_seen),
        "train_seconds": seconds,
    }))


if __name__ == "__main__":
    main(sys.argv[1])
