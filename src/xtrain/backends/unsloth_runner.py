"""The `unsloth` lane's trainer, run by the lane's own interpreter (.venvs/unsloth or its conda env).

`python -I unsloth_runner.py job.json`: the job (written by `xtrain.backends.unsloth`) holds the model folder,
the prepared train split, the LoRA settings and the `SFTConfig` arguments every TRL-based lane shares; this
script loads the model with Unsloth's `FastLanguageModel`, trains with TRL's `SFTTrainer` on the prepared
tokens, saves the weights and tokenizer into the job's `out` and writes the log history to its `result`.
It imports nothing from xtrain: the lane's environment has Unsloth's stack, not the main one.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path


def save_callbacks(seconds: float, complete_marker: str):
    """Save a trainer checkpoint whenever `seconds` have passed since the last one (train.checkpoint_minutes),
    and mark each checkpoint complete once the trainer has written all of it, so that a rerun resumes only
    from a whole one. The same callbacks as trl_cpu's (`save_every` in backends/trl.py, `MarkComplete` in
    backends/guards.py), restated here because this process cannot import xtrain."""
    from transformers import TrainerCallback

    class SaveEvery(TrainerCallback):
        def __init__(self):
            self.last = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            if time.monotonic() - self.last >= seconds:
                control.should_save = True

        def on_save(self, args, state, control, **kwargs):
            self.last = time.monotonic()

    class MarkComplete(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if args.should_save and folder.is_dir():
                (folder / complete_marker).write_text(f"{state.global_step}\n")

    return [SaveEvery(), MarkComplete()]


def step_grouped(trainer_class):
    """Length grouping per optimizer step (micro-batch x accumulation), as xtrain's TRL lanes group
    (`trainer_class` in backends/trl.py, restated here for the same reason as `save_callbacks`): the same seed then
    picks the same rows for each step as trl_cpu."""
    from transformers.trainer_pt_utils import LengthGroupedSampler

    class StepGrouped(trainer_class):
        def _get_train_sampler(self, train_dataset=None):
            sampler = super()._get_train_sampler(train_dataset)
            if isinstance(sampler, LengthGroupedSampler):
                args = self.args
                sampler.batch_size = args.train_batch_size * args.gradient_accumulation_steps * args.world_size
            return sampler

    return StepGrouped


def sft_config(arguments: dict):
    """`SFTConfig` from the shared arguments, which use transformers 5.24 names; this environment has an
    older transformers, so the two renamed settings are translated, and anything else unknown is an error."""
    from trl import SFTConfig

    fields = {field.name for field in dataclasses.fields(SFTConfig)}
    arguments = dict(arguments)
    if "activation_checkpointing" not in fields:
        arguments["gradient_checkpointing"] = arguments.pop("activation_checkpointing")
    if "train_sampling_strategy" not in fields:
        arguments["group_by_length"] = arguments.pop("train_sampling_strategy") == "group_by_length"
    unknown = sorted(set(arguments) - fields)
    if unknown:
        raise SystemExit(
            f"unsloth lane: this environment's SFTConfig has no {unknown}; rebuild it from envs/unsloth.yaml"
        )
    return SFTConfig(**arguments)


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    # Unsloth patches transformers and TRL when imported, so it comes first.
    import torch
    from unsloth import FastLanguageModel
    from datasets import Dataset
    from trl import SFTTrainer

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=job["model_dir"],
        max_seq_length=job["seq_len"],
        dtype=torch.float32,  # trainable weights stay fp32; the plan's bf16 is autocast (SFTConfig bf16)
        load_in_4bit=False,
        load_in_8bit=False,
        full_finetuning=job["method"] == "full",
        local_files_only=True,
        trust_remote_code=job["trust_remote_code"],
    )
    # Packed sequences are kept apart by their restarting position ids only when no KV cache is built.
    model.config.use_cache = False
    if job["method"] == "lora":
        lora = job["lora"]
        model = FastLanguageModel.get_peft_model(
            model,
            r=lora["r"],
            lora_alpha=lora["lora_alpha"],
            lora_dropout=lora["lora_dropout"],
            target_modules=lora["target_modules"],
            bias="none",
            use_gradient_checkpointing=job["gradient_checkpointing"],
            random_state=job["seed"],
        )
    dataset = Dataset.from_parquet(job["train_parquet"]).select_columns(job["columns"])
    trainer = step_grouped(SFTTrainer)(
        model=model, args=sft_config(job["sft"]), train_dataset=dataset, processing_class=tokenizer,
        callbacks=save_callbacks(job["checkpoint_seconds"], job["complete_marker"]),
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
