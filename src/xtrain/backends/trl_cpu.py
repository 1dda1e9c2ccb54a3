"""`trl_cpu`: TRL's SFTTrainer with a PEFT LoRA (or a full fine-tune), in-process on the CPU."""

from __future__ import annotations

import time

from ..errors import XtrainError
from ..recipe import Hardware, Train
from . import TrainJob, TrainResult, guards


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


class TrlCpu:
    name = "trl_cpu"

    def check(self, train: Train, hardware: Hardware) -> None:
        if hardware.accelerator != "cpu":
            raise XtrainError(
                f"train.backend trl_cpu trains on the CPU, but hardware.accelerator is {hardware.accelerator!r}: "
                "set hardware.accelerator: cpu and gpus: 0, or use backend trl_local"
            )
        if hardware.nodes != 1:
            raise XtrainError("train.backend trl_cpu runs one process: set hardware.nodes: 1")

    def run(self, job: TrainJob) -> TrainResult:
        import torch
        from datasets import Dataset
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import SFTConfig, SFTTrainer

        train, plan = job.train, job.plan
        if plan["precision"] not in ("fp32", "bf16"):
            raise XtrainError(f"plan precision {plan['precision']!r} is not supported by trl_cpu; re-run the plan")
        tokenizer = AutoTokenizer.from_pretrained(job.model_dir, trust_remote_code=job.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            job.model_dir, dtype=torch.float32, trust_remote_code=job.trust_remote_code
        )
        # Packed sequences are kept apart by their restarting position ids only when no KV cache is built.
        model.config.use_cache = False
        dataset = Dataset.from_parquet(str(job.prepared_dir / "train.parquet"))
        # Prepare packs with TRL's packer: `seq_lengths` marks the sequences inside each row.
        packed = "seq_lengths" in dataset.column_names
        dataset = dataset.select_columns(["input_ids", "assistant_masks"] + (["seq_lengths"] if packed else []))
        peft_config = None
        if train.method == "lora":
            peft_config = LoraConfig(**train.lora.peft_kwargs(), task_type="CAUSAL_LM")
        layout = plan["layout"]
        args = SFTConfig(
            output_dir=str(job.work_dir),
            use_cpu=True,
            bf16=plan["precision"] == "bf16",  # autocast on the CPU; the weights stay fp32
            fp16=False,
            per_device_train_batch_size=layout["micro_batch_size"],
            gradient_accumulation_steps=layout["gradient_accumulation_steps"],
            activation_checkpointing=plan["gradient_checkpointing"],
            num_train_epochs=train.epochs,
            max_steps=train.max_steps or -1,
            learning_rate=train.learning_rate,
            lr_scheduler_type=train.lr_scheduler,
            warmup_steps=train.warmup_ratio,
            weight_decay=train.weight_decay,
            max_grad_norm=train.max_grad_norm,
            optim="adamw_torch",
            seed=train.seed,
            data_seed=train.seed,
            # Packed rows already fit seq_len, and TRL refuses max_length with padding-free batches.
            max_length=None if packed else plan["data"]["seq_len"],
            packing=False,
            padding_free=packed,
            train_sampling_strategy="random" if packed else "group_by_length",
            logging_steps=train.logging_steps,
            logging_first_step=True,
            save_strategy="steps",
            save_steps=max(1, plan["time"]["steps"] // 4),  # and every checkpoint_minutes, below
            save_total_limit=2,
            include_num_input_tokens_seen="non_padding",
            report_to=[],
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = SFTTrainer(
            model=model, args=args, train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config,
            callbacks=[save_every(train.checkpoint_minutes * 60), *guards.callbacks()],
        )
        started = time.perf_counter()
        trainer.train(resume_from_checkpoint=job.resume_from)
        seconds = time.perf_counter() - started
        trainer.save_model(str(job.out))
        tokenizer.save_pretrained(str(job.out))
        return TrainResult(
            log_history=trainer.state.log_history,
            tokens_seen=int(trainer.state.num_input_tokens_seen),
            train_seconds=seconds,
        )
