"""`axolotl`: Axolotl's own trainer (`python -m axolotl.cli.train <config>`, what `axolotl train` runs), in the
backend's own environment, on the CPU or on CUDA / ROCm GPUs.

The backend owns the translation recipe + plan -> Axolotl YAML (`axolotl_config`), the export of the prepared
tokens into the form Axolotl reads (SFT: pre-tokenized input_ids / attention_mask / labels, -100 on unsupervised
tokens; DPO and KTO, `rl: dpo | kto`: text that TRL's trainers tokenize again, checked to give back the prepared
ids by `preference_text`; GRPO, `rl: grpo`: the rendered prompt text and the columns the rewards read, with the
trainer and rewards named by dotted path in `xtrain_backend_side.axolotl_grpo`), the launch (one process, or torchrun
with one process per GPU or CPU process, under `srun` on several nodes: what `axolotl train --launcher torchrun`
runs), and the normalisation of Axolotl's output (trainer_state.json, the adapter or model it saves) into the
checkpoint contract.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from xtrain_backend_side import BACKEND_SIDE_PATH
from xtrain_backend_side.axolotl_grpo import REWARD_PREFIX, REWARDS_JOB
from xtrain_backend_side.prepared import INPUT_IDS, LOSS_MASK, PROMPT_IDS, labels, split_file

from ...artifacts import read_json, write_json
from ...errors import XtrainError
from ...project.envs import backend_python
from ...recipe import Hardware, Reward, Train
from ...stage import run_command
from .. import tracking
from .capabilities import CAPABILITIES
from .contract import ADAMW, PLANNED_HARDWARE, TrainJob, TrainResult, save_steps
from .distributed import decoder_blocks, found_device, slurm_placeholders, torchrun_command
from .preference_text import export_text
from .trl_grpo import reward_specs, sampling_and_loss
from .validation import device_probe, validated

log = logging.getLogger(__name__)

# Axolotl's Triton LoRA kernels stay off everywhere: on the CPU they fail ("Torch not compiled with CUDA enabled"),
# and on GPUs the LoRA maths stays PEFT's, as on every other lane.
LORA_KERNELS = ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel", "lora_embedding_kernel")
# Offline, and without Axolotl's telemetry (which otherwise waits on the network before loading the config).
OFFLINE = {"HF_HUB_OFFLINE": "1", "AXOLOTL_DO_NOT_TRACK": "1"}
# What Axolotl's final save leaves in output_dir that the checkpoint contract wants: an adapter, or a full model
# (config and, for a large one, sharded safetensors with their index).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
MODEL_FILES = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json")
# GRPO: the module whose `Trainer` and `reward_<i>` Axolotl's config names (xtrain_backend_side.axolotl_grpo).
GRPO_MODULE = "xtrain_backend_side.axolotl_grpo"


def export_tokens(prepared_dir: Path, target: Path) -> int:
    """The prepared train split as Axolotl's pre-tokenized dataset: the same token ids, and their labels
    (xtrain_backend_side.prepared). Returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(split_file(prepared_dir), columns=[INPUT_IDS, LOSS_MASK])
    ids, masks = table.column(INPUT_IDS).to_pylist(), table.column(LOSS_MASK).to_pylist()
    targets = [labels(row, mask) for row, mask in zip(ids, masks)]
    attention = [[1] * len(row) for row in ids]
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"input_ids": ids, "attention_mask": attention, "labels": targets}), target)
    return len(ids)


def export_prompts(prepared_dir: Path, target: Path) -> int:
    """The prepared train prompts as TRL's GRPOTrainer reads them: the rendered `prompt` text and every column the
    rewards may read (the prompt's ids are the trainer's to make from the text, as on trl_cpu). Returns the rows."""
    import pyarrow.parquet as pq

    table = pq.read_table(split_file(prepared_dir))
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.drop_columns([PROMPT_IDS]), target)
    return table.num_rows


def precision_keys(job: TrainJob) -> dict[str, bool]:
    """Axolotl's dtype switches for the plan's precision on the recipe's device (logged where they differ)."""
    plan, on_cpu = job.plan, job.hardware.accelerator == "cpu"
    if on_cpu and plan.precision not in ("fp32", "bf16"):
        raise XtrainError(f"plan precision {plan.precision!r} cannot run on the CPU; re-run the plan")
    if on_cpu and plan.precision == "bf16":
        # transformers accepts bf16 autocast on the CPU only with `use_cpu`, which Axolotl 0.19 does not expose
        # ("Your setup doesn't support bf16/gpu").
        log.warning("axolotl: the plan's bf16 autocast -> fp32 (Axolotl cannot autocast on the CPU); "
                    "the step is slower than the plan predicts and keeps fp32 activations")
    sixteen_bit = not on_cpu and plan.precision in ("bf16", "fp16")
    if sixteen_bit and job.train.method == "full":
        log.warning("axolotl: `%s: true` also loads the weights in %s, so this full fine-tune keeps weights, "
                    "gradients and optimizer states in %s (the plan sized fp32 ones: the run needs less memory "
                    "than planned)", plan.precision, plan.precision, plan.precision)
    return {"bf16": sixteen_bit and plan.precision == "bf16", "fp16": sixteen_bit and plan.precision == "fp16",
            "tf32": False}


def fsdp_keys(job: TrainJob) -> dict[str, Any]:
    """The plan's layout: `fsdp` shards weights, gradients and optimizer states with FSDP2, one decoder block
    per unit, checkpointing those blocks itself; `single` and `ddp` need nothing (torchrun makes the replicas)."""
    plan = job.plan
    if plan.layout.strategy != "fsdp":
        return {}
    return {
        "fsdp_version": 2,
        "fsdp_config": {
            "offload_params": False,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "transformer_layer_cls_to_wrap": ",".join(decoder_blocks(job)),
            "reshard_after_forward": True,
            # The checkpoint contract wants one HF-loadable file, not per-rank shards.
            "state_dict_type": "FULL_STATE_DICT",
            "activation_checkpointing": plan.gradient_checkpointing,
        },
        # FSDP checkpoints its own wrapped blocks; the trainer's would wrap them twice.
        "gradient_checkpointing": False,
    }


def preference_config(job: TrainJob) -> dict[str, Any]:
    """The keys of Axolotl's `rl:` trainers (TRL's DPOTrainer / KTOTrainer) for a preference objective."""
    settings, objective = job.train.preference, job.train.objective
    config = {
        "rl": objective,
        "rl_beta": settings.beta,
        # Prepare already dropped the pairs over seq_len: one Axolotl would drop is an error, not a silent loss.
        "excess_length_strategy": "raise",
        # The trainer reads the text columns itself (Axolotl requires it stated for KTO; its RL default otherwise).
        "remove_unused_columns": False,
        # The plan's choice: the reference log-probs computed once before training, with no frozen copy held.
        "precompute_ref_log_probs": job.plan.reference == "precomputed",
    }
    if objective == "dpo":
        config["dpo_loss_type"] = [settings.loss_type]
    else:
        config |= {"kto_desirable_weight": settings.desirable_weight,
                   "kto_undesirable_weight": settings.undesirable_weight}
    return config


def grpo_config(job: TrainJob) -> dict[str, Any]:
    """Axolotl's `rl: grpo` keys: train.rl in its `trl:` section, the rewards as dotted paths with their weights,
    and the trainer that tokenizes the prepared prompts as they are."""
    rl, layout = job.train.rl, job.plan.layout
    trl: dict[str, Any] = sampling_and_loss(job.train) | {
        # TRL's default, which trl_cpu keeps (Axolotl's own default is its older spelling, True).
        "scale_rewards": "group",
        "reward_funcs": [f"{GRPO_MODULE}.{REWARD_PREFIX}{index}" for index in range(len(job.train.rewards))],
    }
    if rl.steps_per_generation:
        # Axolotl exposes TRL's generation_batch_size, not steps_per_generation: TRL's own relation between them.
        trl["generation_batch_size"] = layout.micro_batch_size * layout.devices * rl.steps_per_generation
        log.info("axolotl: train.rl.steps_per_generation %s -> trl.generation_batch_size %s (micro-batch %s x %s "
                 "process(es) x %s)", rl.steps_per_generation, trl["generation_batch_size"], layout.micro_batch_size,
                 layout.devices, rl.steps_per_generation)
    # The trainer reads the reward columns (Axolotl's RL default, stated).
    return {"rl": "grpo", "trl": trl, "remove_unused_columns": False, "trainer_cls": f"{GRPO_MODULE}.Trainer"}


def check_grpo_groups(train: Train, hardware: Hardware) -> None:
    """Axolotl's own GRPO batch rule (its config validator, `check_grpo_batch_size_divisibility`), asked before any
    job: its generation batch, one device's micro-batch x accumulation (or `trl.generation_batch_size`, which
    train.rl.steps_per_generation sets), must hold whole groups of train.rl.generations completions, and on several
    devices at least one group per device. TRL's GRPOTrainer counts that batch over all devices, so a recipe that
    trl_cpu or trl_local run can fail here; on GPUs Axolotl would only say so on the cluster, once the job starts."""
    devices, generations = hardware.devices, train.rl.generations
    least = generations * devices  # whole groups, one per device at least
    if train.rl.steps_per_generation is None:
        batch = train.global_batch_size // devices
        source = f"train.global_batch_size {train.global_batch_size} over {devices} device(s)"
        fix = f"raise train.global_batch_size to a multiple of {least * devices}"
    elif train.micro_batch_size:
        batch = train.micro_batch_size * devices * train.rl.steps_per_generation
        source = (f"train.micro_batch_size {train.micro_batch_size} x {devices} device(s) x "
                  f"train.rl.steps_per_generation {train.rl.steps_per_generation}")
        fix = "change train.micro_batch_size or train.rl.steps_per_generation"
    else:  # the micro-batch is the plan's to choose; Axolotl's validator checks the rendered config at launch
        return
    if batch % generations or batch < least:
        raise XtrainError(
            f"train.backend axolotl: its GRPO generation batch is {batch} completions ({source}); Axolotl needs a "
            f"multiple of train.rl.generations {generations}" + (f", at least {least} (one group per device)"
                                                                if devices > 1 else "")
            + f": {fix}, or lower train.rl.generations, or use train.backend trl_local (TRL counts that batch over "
            "all devices)")


def axolotl_config(job: TrainJob, dataset: Path) -> dict[str, Any]:
    """Axolotl's YAML for the recipe's train section and the plan (every Train field is used here)."""
    train, plan, layout = job.train, job.plan, job.plan.layout
    sft = train.objective == "sft"
    config: dict[str, Any] = {
        "base_model": str(job.model_dir.resolve()),
        "trust_remote_code": job.trust_remote_code,
        # No `type:` -> Axolotl reads the rows as they are: already tokenized (input_ids, attention_mask, labels) for
        # SFT; for `rl:`, the text columns TRL's trainer reads (a preference dataset takes no ds_type: from the suffix).
        "datasets": [{"path": str(dataset.resolve()), "split": "train"} | ({"ds_type": "parquet"} if sft else {})],
        "dataset_prepared_path": str((job.work_dir / "axolotl_prepared").resolve()),
        "val_set_size": 0.0,
        "sequence_len": plan.data.seq_len,
        "sample_packing": False,
        "pad_to_sequence_len": False,
        # The sampler trl_cpu uses for unpacked rows: batches of similar length, shuffled by the seed (preference
        # rows: shuffled, as trl_cpu's). Axolotl would shuffle the rows once more while loading them; keeping
        # prepare's order lets the same seed pick the same batches as trl_cpu.
        "group_by_length": sft,
        "shuffle_merged_datasets": False,
        "micro_batch_size": layout.micro_batch_size,
        "gradient_accumulation_steps": layout.gradient_accumulation_steps,
        "num_epochs": train.epochs,
        "max_steps": train.max_steps,
        "learning_rate": train.learning_rate,
        "lr_scheduler": train.lr_scheduler,
        "warmup_ratio": train.warmup_ratio,
        "optimizer": ADAMW,
        "weight_decay": train.weight_decay,
        "max_grad_norm": train.max_grad_norm,
        "seed": train.seed,
        **precision_keys(job),
        "gradient_checkpointing": plan.gradient_checkpointing,
        "output_dir": str(job.work_dir.resolve()),
        "logging_steps": train.logging_steps,
        # -> transformers' include_num_input_tokens_seen=True: token slots seen, padding included.
        "include_tokens_per_second": True,
        "save_strategy": "steps",
        "save_steps": save_steps(job),
        "save_total_limit": 2,
        "save_safetensors": True,
        "resume_from_checkpoint": str(Path(job.resume_from).resolve()) if job.resume_from else None,
        **tracking.axolotl_settings(job),
        **fsdp_keys(job),
    }
    if train.adapters:
        lora = train.lora
        config |= {"adapter": train.method, "lora_r": lora.r, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
                   "peft_use_dora": lora.use_dora or None, "peft_use_rslora": lora.use_rslora or None,
                   "lora_modules_to_save": list(lora.modules_to_save) or None}
        if train.method == "qlora":
            # Axolotl builds the BitsAndBytesConfig (compute dtype: its torch_dtype) with these overrides.
            config |= {"load_in_4bit": True, "bnb_config_kwargs": {
                "bnb_4bit_quant_type": train.quantization.quant_type,
                "bnb_4bit_use_double_quant": train.quantization.double_quant}}
        if lora.target_modules == ["all-linear"]:
            config["lora_target_linear"] = True
        else:
            config["lora_target_modules"] = list(lora.target_modules)
        config |= {kernel: False for kernel in LORA_KERNELS}
    if train.objective == "grpo":
        config |= grpo_config(job)
    elif not sft:
        config |= preference_config(job)
    config["neftune_noise_alpha"] = train.neftune_noise_alpha
    return {key: value for key, value in config.items() if value is not None}


class Axolotl:
    name = "axolotl"
    capabilities = CAPABILITIES[name]
    fields = {
        "train.backend": "registry",
        "train.method": "config.adapter",
        "train.lora.r": "config.lora_r",
        "train.lora.alpha": "config.lora_alpha",
        "train.lora.dropout": "config.lora_dropout",
        "train.lora.target_modules": "config.lora_target_modules",
        "train.lora.use_dora": "config.peft_use_dora",
        "train.lora.use_rslora": "config.peft_use_rslora",
        "train.lora.modules_to_save": "config.lora_modules_to_save",
        "train.quantization.bits": "config.load_in_4bit",
        "train.quantization.quant_type": "config.bnb_config_kwargs.bnb_4bit_quant_type",
        "train.quantization.double_quant": "config.bnb_config_kwargs.bnb_4bit_use_double_quant",
        "train.neftune_noise_alpha": "config.neftune_noise_alpha",
        "train.global_batch_size": "plan",
        "train.micro_batch_size": "plan",
        "train.epochs": "config.num_epochs",
        "train.max_steps": "config.max_steps",
        "train.learning_rate": "config.learning_rate",
        "train.lr_scheduler": "config.lr_scheduler",
        "train.warmup_ratio": "config.warmup_ratio",
        "train.weight_decay": "config.weight_decay",
        "train.max_grad_norm": "config.max_grad_norm",
        "train.logging_steps": "config.logging_steps",
        "train.checkpoint_minutes": "config.save_steps",
        "train.seed": "config.seed",
        "train.objective": "config.rl",
        "train.preference.beta": "config.rl_beta",
        "train.preference.loss_type": "config.dpo_loss_type",
        "train.preference.desirable_weight": "config.kto_desirable_weight",
        "train.preference.undesirable_weight": "config.kto_undesirable_weight",
        "train.rl.generations": "config.trl.num_generations",
        "train.rl.max_completion_length": "config.trl.max_completion_length",
        "train.rl.temperature": "config.trl.temperature",
        "train.rl.top_p": "config.trl.top_p",
        "train.rl.kl_weight": "config.trl.beta",
        "train.rl.clip_epsilon": "config.trl.epsilon",
        "train.rl.loss_type": "config.trl.loss_type",
        "train.rl.steps_per_generation": "config.trl.generation_batch_size",
        **{f"train.rewards.{name}": "rewards_job.rewards" for name in Reward.model_fields if name != "weight"},
        "train.rewards.weight": "config.trl.reward_weights",
        "train.report_to": "config.use_tensorboard",
        "train.mlflow_tracking_uri": "config.mlflow_tracking_uri",
        "hardware.accelerator": "argv",
        "hardware.gpus": "argv",
        "hardware.nodes": "argv",
        "hardware.processes": "capabilities",
        **PLANNED_HARDWARE,
    }

    def check(self, train: Train, hardware: Hardware) -> None:
        """Several nodes are for GPUs (CPU processes share one node). TRL's preference trainers turn every dropout off
        (their `disable_dropout`, which Axolotl 0.19 does not expose), so a LoRA dropout would be silently ignored:
        refused (GRPO's trainer keeps dropout by default, as trl_cpu does)."""
        if hardware.accelerator == "cpu" and hardware.nodes != 1:
            raise XtrainError(
                "train.backend axolotl runs CPU training on one node: set hardware.nodes: 1 (more CPU processes "
                "with hardware.processes), or train on GPUs"
            )
        if train.objective == "grpo":
            check_grpo_groups(train, hardware)
        if train.objective not in ("sft", "grpo") and train.adapters and train.lora.dropout:
            raise XtrainError(
                f"train.backend axolotl: train.lora.dropout {train.lora.dropout} with train.objective "
                f"{train.objective}: Axolotl's {train.objective} trainer (TRL's) turns dropout off; set "
                "train.lora.dropout: 0, or train.backend: trl_cpu (which keeps it)"
            )

    def native(self, job: TrainJob, env: dict[str, str] | None = None) -> dict:
        """Axolotl's YAML, its launch and environment; the prepared tokens are exported to `dataset`. On the CPU
        Axolotl's CLI runs in one process; every GPU run goes through torchrun (one process per GPU, also for one
        GPU: never DataParallel). `env`: the launching process's environment (a multi-node launch reads its Slurm
        allocation); None renders the launch with the Slurm variables as the shell names them. GRPO adds the
        rewards' job (`rewards_job`, written to `rewards_file`), which `xtrain_backend_side.axolotl_grpo` reads in
        Axolotl's process: each reward's settings, and the project whose rewards/ folder holds the user's files (the
        train job's working folder, as trl_cpu reads them)."""
        hardware = job.hardware
        dataset = job.work_dir / "axolotl_data" / "train.parquet"
        config = job.work_dir / "axolotl.yaml"
        python = backend_python(self.name, "axolotl", must_exist=False, accelerator=hardware.accelerator)
        program = ["-m", "axolotl.cli.train", str(config)]
        argv = ([python, *program] if hardware.accelerator == "cpu" else
                torchrun_command(python, hardware, program, slurm_placeholders(hardware) if env is None else env))
        launch = {"config": axolotl_config(job, dataset), "dataset": dataset, "config_file": config, "argv": argv,
                  "env": OFFLINE | tracking.environment(job)}
        if job.train.objective == "grpo":
            rewards_file = job.work_dir / "axolotl_rewards.json"
            launch |= {"rewards_job": {"rewards": reward_specs(job.train), "project": str(Path.cwd().resolve())},
                       "rewards_file": rewards_file}
            launch["env"] |= {"PYTHONPATH": BACKEND_SIDE_PATH, REWARDS_JOB: str(rewards_file.resolve())}
        return launch

    def validate(self, job: TrainJob, native: dict, scratch: Path) -> dict:
        """Axolotl's own loader on the rendered YAML, with the recipe's GPU answering its device probe and torchrun's
        world size; Axolotl's batch arithmetic must give the plan's global batch."""
        config_file = scratch / "axolotl.yaml"
        config_file.parent.mkdir(parents=True, exist_ok=True)
        config_file.write_text(yaml.safe_dump(native["config"], sort_keys=False))
        request = {"framework": "axolotl", "config_file": str(config_file), "keys": list(native["config"]),
                   **device_probe(job.hardware)}
        read_back = validated(backend_python(self.name, "axolotl"), [request], scratch, env=OFFLINE)[0]
        if read_back["batch_size"] != job.plan.layout.global_batch_size:
            raise XtrainError(
                f"Axolotl reads a global batch of {read_back['batch_size']} from {config_file}, the plan has "
                f"{job.plan.layout.global_batch_size}; this is a bug in xtrain's axolotl translation"
            )
        return {"validator": "Axolotl's load_cfg (schema, validate_config, normalize_config)", "read_back": read_back}

    def run(self, job: TrainJob) -> TrainResult:
        found_device(job.hardware)
        tracking.require_packages(job.train, backend_python(self.name, "axolotl", accelerator=job.hardware.accelerator),
                                  "envs/axolotl.yaml")
        launch = self.native(job, dict(os.environ))
        if job.train.objective == "sft":
            export_tokens(job.prepared_dir, launch["dataset"])
        elif job.train.objective == "grpo":
            export_prompts(job.prepared_dir, launch["dataset"])
            write_json(launch["rewards_file"], launch["rewards_job"])
        else:
            export_text(job.prepared_dir, job.model_dir, launch["dataset"], self.name, job.trust_remote_code)
        launch["config_file"].write_text(yaml.safe_dump(launch["config"], sort_keys=False))
        run_command(launch["argv"], env=launch["env"])
        return self.normalise(job)

    def normalise(self, job: TrainJob) -> TrainResult:
        """Axolotl saves the final adapter or model in output_dir and its log in the last checkpoint-N (saved at
        the final step)."""
        checkpoints = sorted(job.work_dir.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
        if not checkpoints:
            raise XtrainError(f"axolotl finished without a checkpoint in {job.work_dir}; see its log above")
        state = read_json(checkpoints[-1] / "trainer_state.json")
        for pattern in ADAPTER_FILES if job.train.adapters else MODEL_FILES:
            for path in job.work_dir.glob(pattern):
                shutil.copyfile(path, job.out / path.name)
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(job.model_dir, trust_remote_code=job.trust_remote_code).save_pretrained(job.out)
        log_history = state["log_history"]
        runtime = next((entry["train_runtime"] for entry in reversed(log_history) if "train_runtime" in entry), 0.0)
        # The summary entry transformers' Trainer ends its own log with (the last step, whether logged or not).
        log_history = [*log_history, {"step": state["global_step"], "train_runtime": runtime}]
        return TrainResult(log_history, int(state.get("num_input_tokens_seen", 0)), float(runtime))
