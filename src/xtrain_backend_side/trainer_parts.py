"""Pieces of transformers' Trainer that every backend built on it shares: timed saves, complete-checkpoint
markers, length grouping per optimizer step, and TRL's trainers and configs of each objective (the preference
trainers reading the prepared tokens).

The TRL backends import this module, and so does the unsloth runner in its backend's own interpreter
(without xtrain): it imports only the standard library at load time, transformers and TRL when called.
"""

from __future__ import annotations

import time
from pathlib import Path

from .prepared import CHOSEN_IDS, COMPLETION_IDS, PROMPT_IDS, REJECTED_IDS, answer_row
from .progress import progress_line

# Written into checkpoint-<step>/ after the trainer has saved everything in it (weights, optimizer,
# scheduler, RNG states, trainer state): a folder without it was cut short by a kill or a full disk.
COMPLETE_MARKER = "xtrain-complete"


def save_every(seconds: float):
    """A trainer callback that saves a checkpoint whenever `seconds` have passed since the last one:
    a scheduler's time limit or a preemption then costs at most that much work."""
    from transformers import TrainerCallback

    class SaveEvery(TrainerCallback):
        def __init__(self):
            self.last = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            if time.monotonic() - self.last >= seconds:
                control.should_save = True

        def on_save(self, args, state, control, **kwargs):
            self.last = time.monotonic()

    return SaveEvery()


# The logged values a progress line shows (the trainer logs more; all of it stays in trainer_state.json).
PROGRESS_KEYS = ("loss", "train_loss", "nll_loss", "rewards/accuracies", "rewards/margins", "grad_norm", "learning_rate")


def progress(write):
    """A trainer callback that writes each logged step as one line through `write` (a logger's info): step of total,
    percent, the main values, and the time left at the mean step time so far. It replaces the trainer's printing
    of dicts to stdout, so the line lands in the stage's log and on the console alike, with no carriage returns."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.started, self.first = time.monotonic(), state.global_step

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs or not state.max_steps:
                return
            values = ", ".join(f"{key} {logs[key]:.4g}" for key in PROGRESS_KEYS if isinstance(logs.get(key), float | int))
            write(progress_line("step", state.global_step, state.max_steps, time.monotonic() - self.started,
                                self.first, values))

    return Progress()


def mark_complete():
    """A trainer callback that writes COMPLETE_MARKER into each checkpoint once it is whole: on_save runs
    after the trainer wrote the folder, so a rerun resumes only from a complete one."""
    from transformers import TrainerCallback

    class MarkComplete(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if args.should_save and folder.is_dir():  # the process that saves (rank 0) marks
                (folder / COMPLETE_MARKER).write_text(f"{state.global_step}\n")

    return MarkComplete()


def step_grouped(trainer_class):
    """`trainer_class` with length grouping per optimizer step rather than per process.

    transformers groups rows of similar length in windows of one process's share of a step, so the rows a
    step trains on would change with the process count (and between backends); grouping over the global batch
    (micro-batch x accumulation x processes) makes every layout train on the same rows in the same order.
    """
    from transformers.trainer_pt_utils import LengthGroupedSampler

    class StepGrouped(trainer_class):
        def _get_train_sampler(self, train_dataset=None):
            sampler = super()._get_train_sampler(train_dataset)
            if isinstance(sampler, LengthGroupedSampler):
                args = self.args
                sampler.batch_size = args.train_batch_size * args.gradient_accumulation_steps * args.world_size
            return sampler

    return StepGrouped


def config_class(objective: str):
    """TRL's config class of the objective (ORPO's lives in trl.experimental)."""
    if objective == "orpo":
        from trl.experimental.orpo import ORPOConfig

        return ORPOConfig
    import trl

    return {"sft": trl.SFTConfig, "dpo": trl.DPOConfig, "kto": trl.KTOConfig, "grpo": trl.GRPOConfig}[objective]


def preference_trainer(objective: str):
    """DPOTrainer, KTOTrainer or (TRL's experimental) ORPOTrainer on the rows prepare tokenized with the recipe's
    chat template (`prompt_ids` and each answer's ids): TRL's own tokenization of text is skipped. With LoRA, the
    reference model (DPO, KTO) is the base with the adapter disabled (no second copy); with a full fine-tune, TRL's
    frozen copy. ORPO has none."""
    if objective == "dpo":
        from trl import DPOTrainer

        class XtrainDPOTrainer(DPOTrainer):
            def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
                return dataset

        return XtrainDPOTrainer
    if objective == "kto":
        from trl import KTOTrainer

        class XtrainKTOTrainer(KTOTrainer):
            def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
                if not self.calculate_KL:
                    return dataset
                # KTO's KL term, as TRL estimates it: each completion paired with the previous row's prompt, per batch.
                def shifted(rows):
                    return {"KL_completion_ids": rows[COMPLETION_IDS][-1:] + rows[COMPLETION_IDS][:-1]}

                return dataset.map(shifted, batched=True, batch_size=args.per_device_train_batch_size)

        return XtrainKTOTrainer
    from trl.experimental.orpo import ORPOTrainer

    class XtrainORPOTrainer(ORPOTrainer):
        def tokenize_row(self, feature, model=None):
            """ORPO's row layout from the prepared tokens: each answer after the prompt, labelled on the answer."""
            prompt = feature[PROMPT_IDS]
            row = {"prompt_input_ids": prompt, "prompt_attention_mask": [1] * len(prompt)}
            for name, answer in (("chosen", feature[CHOSEN_IDS]), ("rejected", feature[REJECTED_IDS])):
                ids, labels = answer_row(prompt, answer)
                row |= {f"{name}_input_ids": ids, f"{name}_attention_mask": [1] * len(ids), f"{name}_labels": labels}
            return row

        def _track_num_input_tokens(self, inputs):
            """Tokens seen (for tokens/s): ORPO's batches hold no `input_ids`, which is what transformers counts, but
            each answer after its prompt; both sequences go through the model, so both count (padding left out)."""
            import torch

            if self.args.include_num_input_tokens_seen == "no":
                return
            tokens = sum(inputs[f"{name}_attention_mask"].sum() for name in ("chosen", "rejected"))
            tokens = torch.as_tensor(tokens, device=self.args.device, dtype=torch.int64)
            self.state.num_input_tokens_seen += self.accelerator.gather(tokens).sum().item()

    return XtrainORPOTrainer
