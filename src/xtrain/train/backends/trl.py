"""The TRL trainer the `trl_cpu` and `trl_local` backends share: recipe `train` + plan -> `SFTConfig` ->
`SFTTrainer` -> weights and tokenizer in `job.out`.

The backends differ only in where this runs (device, process count); everything that decides what is trained
and how is here, once. The trainer's callbacks are listed in one place, `callbacks`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from xtrain_backend_side.prepared import PREFERENCE_COLUMNS, split_file, train_split_is_packed, training_columns
from xtrain_backend_side.tracking import measured
from xtrain_backend_side.grpo import grpo_trainer
from xtrain_backend_side.trainer_parts import config_class, preference_trainer, progress, save_every, step_grouped

from ...errors import XtrainError
from ...recipe import DATA_KINDS, Train
from .. import tracking
from . import guards
from .contract import ADAMW, PLANNED_HARDWARE, TrainJob, TrainResult
from .distributed import decoder_blocks
from .trl_grpo import GRPO_FIELDS, grpo_arguments, prompt_columns, reward_functions, reward_specs
from .validation import device_probe, validated

log = logging.getLogger(__name__)

Device = Literal["cpu", "cuda", "rocm"]
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# Where each recipe field lands in `native` (see backends/contract.py); the backends add their hardware fields.
TRL_FIELDS = {
    "train.backend": "registry",
    "train.objective": "objective",
    "train.preference.beta": "config.beta",
    "train.preference.loss_type": "config.loss_type",
    "train.preference.desirable_weight": "config.desirable_weight",
    "train.preference.undesirable_weight": "config.undesirable_weight",
    **GRPO_FIELDS,
    "train.method": "peft",
    "train.lora.r": "peft.r",
    "train.lora.alpha": "peft.lora_alpha",
    "train.lora.dropout": "peft.lora_dropout",
    "train.lora.target_modules": "peft.target_modules",
    "train.lora.use_dora": "peft.use_dora",
    "train.lora.use_rslora": "peft.use_rslora",
    "train.lora.modules_to_save": "peft.modules_to_save",
    "train.quantization.bits": "quantization.load_in_4bit",
    "train.quantization.quant_type": "quantization.bnb_4bit_quant_type",
    "train.quantization.double_quant": "quantization.bnb_4bit_use_double_quant",
    "train.neftune_noise_alpha": "config.neftune_noise_alpha",
    "train.global_batch_size": "plan",
    "train.micro_batch_size": "plan",
    "train.epochs": "config.num_train_epochs",
    "train.max_steps": "config.max_steps",
    "train.learning_rate": "config.learning_rate",
    "train.lr_scheduler": "config.lr_scheduler_type",
    "train.warmup_ratio": "config.warmup_steps",
    "train.weight_decay": "config.weight_decay",
    "train.max_grad_norm": "config.max_grad_norm",
    "train.logging_steps": "config.logging_steps",
    "train.checkpoint_minutes": "save_every_seconds",
    "train.seed": "config.seed",
    "train.report_to": "config.report_to",
    "train.mlflow_tracking_uri": "env.MLFLOW_TRACKING_URI",
    **PLANNED_HARDWARE,
}


@dataclass(frozen=True)
class Placement:
    """Where one training process runs and the autocast dtype it uses there."""

    device: Device
    precision: str  # fp32 (no autocast), bf16 or fp16


def callbacks(save_every_seconds: float) -> list:
    """Every callback the trainer runs with, for every TRL backend."""
    return [save_every(save_every_seconds), progress(log.info), *guards.callbacks()]


def cpu_placement(plan: dict) -> Placement:
    """The CPU settings: fp32, or bf16 autocast (weights stay fp32) when the plan chose it; processes as DDP."""
    if plan.precision not in ("fp32", "bf16"):
        raise XtrainError(
            f"plan precision {plan.precision!r} cannot run on the CPU (fp32 or bf16 autocast only); re-run the plan "
            "for hardware.accelerator: cpu"
        )
    if plan.layout.strategy == "fsdp":
        raise XtrainError(
            "the plan's layout is fsdp, but CPU processes train as DDP only (accelerate ignores FSDP there): "
            "re-run the plan for hardware.accelerator: cpu"
        )
    return Placement("cpu", plan.precision)


def trainer_class(objective: str = "sft"):
    """The TRL trainer of the objective: SFTTrainer (below), or DPOTrainer / KTOTrainer / ORPOTrainer
    (`trainer_parts.preference_trainer`).

    SFTTrainer, with two changes:

    - Length grouping per optimizer step rather than per process (`trainer_parts.step_grouped`): N
      processes train on exactly the rows one process does, in the same order.
    - transformers' loss (the model's cross-entropy over full logits, summed over the step's supervised
      tokens / their count) instead of TRL's tiled LM head. That head exists for TRL's entropy and token
      accuracy metrics, which xtrain does not record; on the CPU it costs ~25% more time per forward and
      backward (27M Llama, seq 512, BENCHMARKS.md), and the plan's memory trace models the plain path.
    """
    from transformers import Trainer
    from trl import SFTTrainer

    if objective == "grpo":
        return grpo_trainer()
    if objective != "sft":
        return preference_trainer(objective)

    class XtrainSFTTrainer(step_grouped(SFTTrainer)):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

    return XtrainSFTTrainer


def fsdp_settings(job: TrainJob) -> dict:
    """FSDP (weights, gradients and optimizer states sharded, one decoder block per unit) when the plan's layout
    is `fsdp`; nothing for `single` and `ddp` (the trainer replicates under torchrun by itself)."""
    plan = job.plan
    if plan.layout.strategy != "fsdp":
        return {}
    return {
        "fsdp": "full_shard auto_wrap",
        "fsdp_config": {
            "version": 2,
            "transformer_layer_cls_to_wrap": decoder_blocks(job),
            # The checkpoint contract wants one HF-loadable file, not per-rank shards.
            "state_dict_type": "FULL_STATE_DICT",
            "activation_checkpointing": plan.gradient_checkpointing,
        },
    }


def quantization_config(train: Train, precision: str) -> dict | None:
    """`transformers.BitsAndBytesConfig`'s arguments for train.method qlora (None otherwise): the base's linear
    layers stored in 4 bits, each dequantized to the compute dtype, the plan's precision, when it runs."""
    if train.method != "qlora":
        return None
    settings = train.quantization
    return {"load_in_4bit": True, "bnb_4bit_quant_type": settings.quant_type,
            "bnb_4bit_use_double_quant": settings.double_quant, "bnb_4bit_compute_dtype": TORCH_DTYPES[precision]}


def native(job: TrainJob, placement: Placement) -> dict:
    """What the TRL backends train with: the placement, `SFTConfig`'s arguments (FSDP's included),
    `peft.LoraConfig`'s (None for a full fine-tune) and `BitsAndBytesConfig`'s (None unless qlora)."""
    packed = train_split_is_packed(job.prepared_dir)
    fsdp = fsdp_settings(job)
    return {
        "placement": {"device": placement.device, "precision": placement.precision},
        "objective": job.train.objective,
        "config": trainer_arguments(job, placement, packed, fsdp=bool(fsdp)) | fsdp,
        "peft": job.train.lora.peft_kwargs() | {"task_type": "CAUSAL_LM"} if job.train.adapters else None,
        "quantization": quantization_config(job.train, placement.precision),
        "columns": (prompt_columns(job.prepared_dir) if job.train.objective == "grpo"
                    else trained_columns(job.train.objective, packed)),
        **({"rewards": reward_specs(job.train)} if job.train.rewards else {}),
        "save_every_seconds": job.train.checkpoint_minutes * 60,
        "env": tracking.environment(job),
    }


def validate_with_trl(job: TrainJob, settings: dict, scratch: Path) -> dict:
    """`settings` (what `native` gives) through TRL's config class and peft's LoraConfig, in this environment."""
    request = {"framework": "trl", "objective": job.train.objective, "arguments": settings["config"],
               "peft": settings["peft"], "quantization": settings["quantization"], **device_probe(job.hardware)}
    quantized = ", transformers' BitsAndBytesConfig" if settings["quantization"] else ""
    return {"validator": f"TRL's {job.train.objective.upper()}Config and peft's LoraConfig{quantized}",
            "read_back": validated(sys.executable, [request], scratch)[0]}


def trainer_arguments(job: TrainJob, placement: Placement, packed: bool, fsdp: bool = False) -> dict:
    """The TRL config's keyword arguments for the recipe's objective: `sft_arguments`, with `preference_arguments`
    on top for a preference objective."""
    arguments = sft_arguments(job, placement, packed, fsdp=fsdp)
    if job.train.objective == "grpo":
        return grpo_arguments(job.train, arguments)
    return arguments if job.train.objective == "sft" else preference_arguments(job, arguments)


def trained_columns(objective: str, packed: bool) -> list[str]:
    """The prepared columns the objective's trainer reads."""
    return training_columns(packed) if objective == "sft" else list(PREFERENCE_COLUMNS[DATA_KINDS[objective]])


def sft_arguments(job: TrainJob, placement: Placement, packed: bool, fsdp: bool = False) -> dict:
    """`SFTConfig` keyword arguments (TRL 1.16 / transformers 5.24 names) for the recipe's train section and the
    plan: the one recipe -> trainer mapping of every TRL-based backend (trl_cpu, trl_local, and unsloth, whose
    runner translates the names its older transformers spells differently)."""
    train, plan = job.train, job.plan
    layout = plan.layout
    on_cpu = placement.device == "cpu"
    return dict(
        output_dir=str(job.work_dir),
        use_cpu=on_cpu,
        bf16=placement.precision == "bf16",  # autocast; trainable weights stay fp32
        fp16=placement.precision == "fp16",
        per_device_train_batch_size=layout.micro_batch_size,
        gradient_accumulation_steps=layout.gradient_accumulation_steps,
        # FSDP checkpoints its own wrapped blocks (fsdp_config); the trainer's would wrap them twice.
        activation_checkpointing=plan.gradient_checkpointing and not fsdp,
        num_train_epochs=train.epochs,
        max_steps=train.max_steps or -1,
        learning_rate=train.learning_rate,
        lr_scheduler_type=train.lr_scheduler,
        warmup_steps=train.warmup_ratio,
        weight_decay=train.weight_decay,
        max_grad_norm=train.max_grad_norm,
        optim=ADAMW,
        seed=train.seed,
        data_seed=train.seed,
        # Packed rows already fit seq_len, and TRL refuses max_length with padding-free batches.
        max_length=None if packed else plan.data.seq_len,
        packing=False,
        padding_free=packed,
        train_sampling_strategy="random" if packed else "group_by_length",
        logging_steps=train.logging_steps,
        logging_first_step=True,
        neftune_noise_alpha=train.neftune_noise_alpha,
        save_strategy="steps",
        save_steps=max(1, plan.time.steps // 4),  # and every checkpoint_minutes, in callbacks()
        save_total_limit=2,
        include_num_input_tokens_seen="non_padding",
        # transformers' own integrations; xtrain_backend_side.tracking adds tokens/s and memory to what they record.
        report_to=list(train.report_to),
        run_name=tracking.run_name(job),
        disable_tqdm=True,
        dataloader_num_workers=0,
        # Used only under torchrun (accelerate picks gloo on the CPU, nccl/rccl on GPUs). Every parameter that
        # trains takes part in each step: skipping DDP's search for unused ones saves a graph traversal per step.
        ddp_find_unused_parameters=False,
        # The plan's compile decision (plan.compile): inductor, with batch lengths rounded up to its bucket.
        **({"torch_compile": True, "torch_compile_mode": plan.compile.mode,
            "pad_to_multiple_of": plan.compile.pad_to_multiple_of} if plan.compile.mode else {}),
    )


def preference_arguments(job: TrainJob, sft: dict) -> dict:
    """`DPOConfig` / `KTOConfig` / `ORPOConfig` keyword arguments: the SFT ones without packing, the objective's
    settings, and the plan's `reference`. The
    recipe's LoRA dropout is kept (TRL would disable dropout); at step 0 the adapter adds nothing, so the policy still
    equals the reference and the first DPO loss is ln 2."""
    settings, objective = job.train.preference, job.train.objective
    sft_only = ("packing", "padding_free", "loss_type") if objective == "orpo" else ("packing", "padding_free")
    arguments = {key: value for key, value in sft.items() if key not in sft_only}
    arguments |= {"beta": settings.beta, "disable_dropout": False,
                  # Rows are not length-grouped (TRL's preference collators pad each batch); KTO's KL estimate pairs
                  # rows within a batch in their stored order, which TRL requires to be sequential.
                  "train_sampling_strategy": "sequential" if job.train.objective == "kto" else "random"}
    if objective == "dpo":
        arguments["loss_type"] = [settings.loss_type]
    elif objective == "kto":
        arguments |= {"desirable_weight": settings.desirable_weight, "undesirable_weight": settings.undesirable_weight}
    if objective in ("dpo", "kto"):
        # The plan's choice: the reference log-probs computed once before training, with no frozen copy held.
        arguments["precompute_ref_log_probs"] = job.plan.reference == "precomputed"
    return arguments


def quantized_device_map(placement: Placement) -> dict:
    """Where a 4-bit base is loaded: bitsandbytes quantizes while loading, on the device it trains on (this
    process's GPU under torchrun)."""
    return {"": "cpu" if placement.device == "cpu" else int(os.environ.get("LOCAL_RANK", "0"))}


def train_and_save(job: TrainJob, placement: Placement) -> TrainResult:
    """Train `job` in this process (one of several under torchrun, or alone) and save the weights and the
    tokenizer in `job.out` (the main process only)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, PrinterCallback

    train, plan = job.train, job.plan
    on_cpu = placement.device == "cpu"
    tracking.require_packages(train)
    settings = native(job, placement)
    tokenizer = AutoTokenizer.from_pretrained(job.model_dir, trust_remote_code=job.trust_remote_code)
    # LoRA on a GPU holds the frozen base in 16 bits (plan weights_dtype), in the dtype autocast really uses;
    # the CPU and full fine-tunes keep fp32 (master) weights. QLoRA stores the base's linear layers in 4 bits
    # (bitsandbytes, on the CPU too); the rest of the base (embeddings, norms, head) takes `dtype`.
    sixteen_bit_base = not on_cpu and train.adapters and plan.weights_dtype != "fp32"
    dtype = getattr(torch, TORCH_DTYPES[placement.precision if sixteen_bit_base else "fp32"])
    quantized = {"quantization_config": BitsAndBytesConfig(**settings["quantization"]),
                 "device_map": quantized_device_map(placement)} if settings["quantization"] else {}
    # The plan's attention (plan.attention): eager where the CPU measured it faster at the run's shape.
    eager = plan.attention is not None and plan.attention.implementation == "eager"
    attention = {"attn_implementation": "eager"} if eager else {}
    model = AutoModelForCausalLM.from_pretrained(job.model_dir, dtype=dtype, trust_remote_code=job.trust_remote_code,
                                                 **quantized, **attention)
    if quantized:
        import bitsandbytes

        layers = sum(isinstance(module, bitsandbytes.nn.Linear4bit) for module in model.modules())
        log.info("base loaded in 4 bits: %d Linear4bit layers (%s%s), computing in %s", layers,
                 train.quantization.quant_type, ", double-quantized" if train.quantization.double_quant else "",
                 settings["quantization"]["bnb_4bit_compute_dtype"])
    # Packed sequences are kept apart by their restarting position ids only when no KV cache is built; GRPO generates
    # its completions, with the cache.
    model.config.use_cache = job.train.objective == "grpo"
    dataset = Dataset.from_parquet(str(split_file(job.prepared_dir))).select_columns(settings["columns"])
    peft_config = LoraConfig(**settings["peft"]) if settings["peft"] else None
    if job.adapter_init is not None:
        # model.adapter: continue: the upstream recipe's adapter trains further (its settings equal train.lora, as
        # xtrain.chain checked). A preference trainer copies it into a frozen "ref" adapter: the reference model is
        # the upstream checkpoint, so the first DPO loss is still ln 2.
        from peft import PeftModel

        model, peft_config = PeftModel.from_pretrained(model, job.adapter_init, is_trainable=True), None
    args = config_class(job.train.objective)(**settings["config"])
    with tracking.environment_set(settings["env"]):  # the trackers read it when the trainer starts them
        trainer = measured(trainer_class(job.train.objective))(
            model=model, args=args, train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config,
            callbacks=callbacks(settings["save_every_seconds"]),
            **({"reward_funcs": reward_functions(job.train, Path.cwd())} if job.train.objective == "grpo" else {}),
        )
        trainer.remove_callback(PrinterCallback)  # the progress callback writes each logged step instead
        started = time.perf_counter()
        trainer.train(resume_from_checkpoint=job.resume_from)
        seconds = time.perf_counter() - started
    log.info("trained on %s, %s autocast, %d process(es), model wrapped as %s", placement.device,
             placement.precision, args.world_size, type(trainer.model_wrapped).__name__)
    trainer.save_model(str(job.out))  # the main process writes; under FSDP every rank helps gather
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(str(job.out))
    return TrainResult(
        log_history=trainer.state.log_history,
        tokens_seen=int(trainer.state.num_input_tokens_seen),
        train_seconds=seconds,
    )
