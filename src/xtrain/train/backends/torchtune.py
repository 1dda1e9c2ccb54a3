"""`torchtune`: torchtune 0.6.1's LoRA / full fine-tune and DPO recipes, in their own environment: the
single-device recipes on one device, the distributed ones (FSDP2, under torchrun's options of `tune run`) on
several GPUs of a node, and under `srun` across the nodes of a Slurm allocation.

The backend translates recipe + plan into a torchtune config (the model built from the Hugging Face config's
shape with torchtune's Llama 3.2 component builders, HF checkpoints in and out, xtrain's prepared tokens as
the dataset), checks it with `tune validate`, launches `tune run` with the device overrides, and turns
torchtune's output into the checkpoint contract: the PEFT adapter (or the full model) and the tokenizer,
and the loss curve from torchtune's metric log. torchtune 0.6.1's distributed recipes do not run on the CPU
(docs/backends.md has their errors), so CPU training is one process. `xtrain_backend_side.torchtune_components`
holds the components the config names; it runs inside torchtune's environment.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from xtrain_backend_side import BACKEND_SIDE_PATH
from xtrain_backend_side.prepared import row_tokens, split_file, train_split_is_packed

from ...errors import XtrainError
from ...plan.schema import Layout
from ...project.envs import backend_python
from ...recipe import ADAPTER_METHODS, Hardware, Train
from ...stage import run_command
from .. import tracking
from .capabilities import CAPABILITIES
from .contract import GRPO_REFUSED, PLANNED_HARDWARE, TrainJob, TrainResult, grouped_lora_targets
from .distributed import found_device, slurm_placeholders, torchrun_command

log = logging.getLogger(__name__)

COMPONENTS = "xtrain_backend_side.torchtune_components"
# Recipe LoRA targets -> torchtune's names. torchtune adapts the MLP as a whole (w1, w2, w3 together).
ATTENTION = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "output_proj"}
MLP = ("gate_proj", "up_proj", "down_proj")
LORA_GROUPS = {**{name: (name,) for name in ATTENTION}, "mlp": MLP}
DTYPE = {"fp32": "fp32", "bf16": "bf16"}
# train.preference.loss_type -> torchtune 0.6.1's DPO losses (it has no IPO loss), and the name each gives beta.
DPO_LOSSES = {"sigmoid": ("torchtune.rlhf.loss.DPOLoss", "beta"), "hinge": ("torchtune.rlhf.loss.RSOLoss", "gamma")}
# (objective, method) -> torchtune's recipe, `<name>_single_device` on one device, `<name>_distributed` on more;
# full DPO has a distributed recipe only.
RECIPES = {("sft", "lora"): "lora_finetune", ("sft", "full"): "full_finetune", ("dpo", "lora"): "lora_dpo",
           ("dpo", "full"): "full_dpo"}
SINGLE_DEVICE = ("lora_finetune", "full_finetune", "lora_dpo")
# plan.layout.strategy -> the distributed recipes' `fsdp_reshard_after_forward` (they always shard with FSDP2):
# fsdp frees each layer's gathered weights after its forward (FULL_SHARD); ddp keeps them gathered until the
# backward (SHARD_GRAD_OP), a replica's weights with its gradients and optimizer states sharded; single (full DPO
# on one GPU) has nothing to shard.
RESHARD_AFTER_FORWARD = {"fsdp": True, "ddp": False, "single": False}
TUNE_RUN = ("-m", "torchtune._cli.tune", "run")  # `tune run`, which takes torchrun's options before the recipe
# torchtune's metric log: "Step 3 | loss:6.93 lr:0.005 tokens_per_second_per_gpu:1234.5 ..."
STEP_LINE = re.compile(r"^Step (\d+) \| (.*)$")


def lora_layout(target_modules: list[str]) -> tuple[list[str], bool]:
    """(lora_attn_modules, apply_lora_to_mlp) for the recipe's targets; what torchtune cannot adapt is an error."""
    groups = grouped_lora_targets("torchtune", target_modules, LORA_GROUPS)
    return [ATTENTION[name] for name in groups if name in ATTENTION], "mlp" in groups


def weight_files(model_dir: Path) -> list[str]:
    """The model's safetensors files, for torchtune's HF checkpointer: those its index names, else those present
    (none yet for a model smoke-tested before its weights arrive: `run` refuses that)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))
    return sorted(path.name for path in model_dir.glob("*.safetensors"))


# torchtune's Llama3ScaledRoPE takes the scale factor only; the rest of Llama 3.1's `rope_scaling` is fixed there.
LLAMA3_ROPE_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def rope_scale_factor(model_dir: Path, config: dict[str, Any]) -> float:
    """The `scale_factor` of torchtune's Llama 3 RoPE for the Hugging Face config: 1 (plain RoPE) without rope
    scaling; Llama 3.1 / 3.2's `llama3` scaling (transformers' `rope_scaling`, or `rope_parameters` since
    transformers 5) maps to its factor when its other values are the ones torchtune fixes."""
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return 1
    if kind == "llama3" and all(float(scaling.get(key, -1)) == value for key, value in LLAMA3_ROPE_FIXED.items()):
        return scaling["factor"]
    settings = {key: value for key, value in scaling.items() if key != "rope_theta"}
    raise XtrainError(
        f"{model_dir}/config.json: rope scaling {settings} is not mapped by the torchtune backend (its Llama 3 RoPE "
        f"takes `llama3` scaling with {LLAMA3_ROPE_FIXED} only); set train.backend: trl_local, trl_cpu or axolotl"
    )


def model_component(model_dir: Path, train: Train) -> dict[str, Any]:
    """torchtune's Llama 3.2 builder with the Hugging Face config's shape: its scaled RoPE with the config's
    `llama3` scaling factor, or with scale_factor 1 (plain RoPE, as in LlamaConfig without rope scaling); tied
    embeddings are kept tied."""
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise XtrainError(
            f"{model_dir}/config.json: model_type {config.get('model_type')!r}; the torchtune backend builds Llama "
            "models only (its Qwen2 adapter export permutes q/k wrongly)"
        )
    rope = config.get("rope_parameters") or {}
    heads = config["num_attention_heads"]
    shape = {
        "vocab_size": config["vocab_size"],
        "num_layers": config["num_hidden_layers"],
        "num_heads": heads,
        "num_kv_heads": config.get("num_key_value_heads", heads),
        "embed_dim": config["hidden_size"],
        "max_seq_len": config["max_position_embeddings"],
        "intermediate_dim": config["intermediate_size"],
        "attn_dropout": config.get("attention_dropout", 0.0),
        "norm_eps": config["rms_norm_eps"],
        "rope_base": rope.get("rope_theta", config.get("rope_theta", 10000.0)),
        "scale_factor": rope_scale_factor(model_dir, config),
        "tie_word_embeddings": config.get("tie_word_embeddings", False),
    }
    if config.get("head_dim", config["hidden_size"] // heads) * heads != config["hidden_size"]:
        raise XtrainError(f"{model_dir}/config.json: head_dim x heads != hidden_size is not mapped by torchtune's builder")
    if train.method == "full":
        return {"_component_": "torchtune.models.llama3_2._component_builders.llama3_2", **shape}
    attention, mlp = lora_layout(train.lora.target_modules)
    return {
        "_component_": "torchtune.models.llama3_2._component_builders.lora_llama3_2",
        "lora_attn_modules": attention,
        "apply_lora_to_mlp": mlp,
        "apply_lora_to_output": False,
        **shape,
        "lora_rank": train.lora.r,
        "lora_alpha": train.lora.alpha,
        "lora_dropout": train.lora.dropout,
        "use_dora": train.lora.use_dora,
        # QLoRA: torchao's NF4 base (nf4, its block scales quantized again), dequantized per layer in the forward.
        "quantize_base": train.method == "qlora",
    }


def dpo_loss(train: Train) -> dict[str, Any]:
    """torchtune's loss component for the recipe's DPO settings; a loss torchtune does not have is an error."""
    settings = train.preference
    if settings.loss_type not in DPO_LOSSES:
        raise XtrainError(
            f"train.preference.loss_type {settings.loss_type!r}: torchtune 0.6.1 has DPO losses "
            f"{' and '.join(DPO_LOSSES)} only; set train.preference.loss_type: sigmoid, or train.backend: trl_cpu"
        )
    component, beta = DPO_LOSSES[settings.loss_type]
    return {"_component_": component, beta: settings.beta}


def recipe_name(train: Train, hardware: Hardware) -> str:
    """The torchtune recipe that trains the objective with the method on this hardware: single-device on one
    device, distributed on more (and for full DPO, which has no single-device recipe, on one GPU too). The
    distributed recipes do not run on the CPU: asking for one there is an error naming the fix."""
    # QLoRA trains with the LoRA recipes: the 4-bit base is the model builder's (quantize_base).
    name = RECIPES[train.objective, "lora" if train.adapters else train.method]
    if hardware.devices == 1 and name in SINGLE_DEVICE:
        return f"{name}_single_device"
    if hardware.accelerator == "cpu":
        fix = ("set hardware.processes: 1" if name in SINGLE_DEVICE else
               "set train.method: lora (lora_dpo_single_device), or train on a GPU (hardware.accelerator: cuda)")
        raise XtrainError(
            f"train.backend torchtune would run {name}_distributed here, and torchtune 0.6.1's distributed recipes "
            f"do not run on the CPU (docs/backends.md): {fix}, or set train.backend: trl_cpu"
        )
    return f"{name}_distributed"


def per_device_rows(train_rows: int, devices: int) -> int:
    """Rows each device draws per epoch: torchtune's distributed sampler pads the rows to a multiple of the
    device count by repeating the first ones of its permutation."""
    return -(-train_rows // devices)


def epochs_and_cap(total_steps: int, steps_per_epoch: int) -> tuple[int, int | None]:
    """torchtune runs whole epochs, each capped at max_steps_per_epoch: the plan's step count as
    (epochs, cap). A count that is neither at most one epoch nor whole epochs cannot be expressed."""
    if total_steps <= steps_per_epoch:
        return 1, total_steps
    if total_steps % steps_per_epoch == 0:
        return total_steps // steps_per_epoch, None
    raise XtrainError(
        f"the plan's {total_steps} steps are {total_steps / steps_per_epoch:.2f} epochs of {steps_per_epoch} "
        "steps; torchtune runs whole epochs: set train.epochs to a whole number, or train.max_steps to at most "
        f"{steps_per_epoch} or a multiple of it"
    )


def torchtune_config(job: TrainJob, train_rows: int, packed: bool) -> dict[str, Any]:
    """The torchtune config for this job (device settings go on the command line: see `launch_command`)."""
    train, plan = job.train, job.plan
    layout = plan.layout
    sft = train.objective == "sft"
    recipe = recipe_name(train, job.hardware)
    micro, accumulation = layout.micro_batch_size, layout.gradient_accumulation_steps
    # torchtune's loader drops the last partial batch, and an epoch ends after whole optimizer steps.
    steps_per_epoch = (per_device_rows(train_rows, layout.devices) // micro) // accumulation
    if steps_per_epoch < 1:
        raise XtrainError(
            f"{train_rows} train rows make no full optimizer step of {micro} x {accumulation} rows on each of "
            f"{layout.devices} device(s); lower train.global_batch_size"
        )
    epochs, cap = epochs_and_cap(plan.time.steps, steps_per_epoch)
    out = job.work_dir / "torchtune"
    config = {
        "output_dir": str(out),
        "model": model_component(job.model_dir, train),
        "tokenizer": {"_component_": f"{COMPONENTS}.special_tokens", "path": str(job.model_dir)},
        "checkpointer": {
            "_component_": "torchtune.training.FullModelHFCheckpointer",
            "checkpoint_dir": str(job.model_dir),
            "checkpoint_files": weight_files(job.model_dir),
            "output_dir": str(out),
            "model_type": "LLAMA3_2",
            "recipe_checkpoint": None,
        },
        "resume_from_checkpoint": False,
        "save_adapter_weights_only": False,
        "dataset": {
            "_component_": f"{COMPONENTS}.prepared_dataset",
            "path": str(split_file(job.prepared_dir)),
            "packed": packed,
            "seed": train.seed,
            "seq_len": plan.data.seq_len,
        } if sft else {"_component_": f"{COMPONENTS}.prepared_pairs", "path": str(split_file(job.prepared_dir)),
                       "seed": train.seed},
        "seed": train.seed,
        "shuffle": True,
        "batch_size": micro,
        "optimizer": {
            "_component_": "torch.optim.AdamW",
            "fused": True,  # as every backend's (contract.ADAMW)
            "lr": train.learning_rate,
            "weight_decay": train.weight_decay,
        },
        "lr_scheduler": {
            "_component_": f"{COMPONENTS}.lr_scheduler",
            "schedule": train.lr_scheduler,
            "warmup_ratio": train.warmup_ratio,
        },
        "loss": {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"} if sft else dpo_loss(train),
        "epochs": epochs,
        "max_steps_per_epoch": cap,
        "gradient_accumulation_steps": accumulation,
        "clip_grad_norm": train.max_grad_norm,
        "enable_activation_checkpointing": plan.gradient_checkpointing,
        "enable_activation_offloading": False,
        "metric_logger": tracking.torchtune_logger(job, out / "logs"),
        # Every step is logged; `log_history` averages them over train.logging_steps as the trl backends do.
        "log_every_n_steps": 1,
        "profiler": {"_component_": "torchtune.training.setup_torch_profiler", "enabled": False},
    }
    if recipe.startswith("lora_dpo"):
        del config["clip_grad_norm"]  # the LoRA DPO recipes do not clip gradients (said in the log when it runs)
    if recipe.endswith("_distributed"):
        # FSDP2 as the plan laid it out: sharding from its strategy (see RESHARD_AFTER_FORWARD), nothing offloaded
        # to the host (the plan fits the step in the device's memory or refuses it).
        config["fsdp_cpu_offload"] = False
        config["fsdp_reshard_after_forward"] = RESHARD_AFTER_FORWARD[layout.strategy]
    if recipe == "full_dpo_distributed":
        config["ref_checkpointer"] = dict(config["checkpointer"])  # the frozen reference: the base model
    return config


def launch_command(python: str, recipe: str, config: Path, device: str, dtype: str, hardware: Hardware,
                   env: dict[str, str]) -> list[str]:
    """`tune run <recipe> --config X` with the device settings as command-line overrides; a distributed recipe
    with torchrun's options before it (one process per GPU of a node; on several nodes, one `tune run` per node
    under srun with a c10d rendezvous: `distributed.torchrun_command`)."""
    worker = [recipe, "--config", str(config), f"device={device}", f"dtype={dtype}", "compile=False",
              f"log_peak_memory_stats={device == 'cuda'}"]
    if recipe.endswith("_single_device"):
        return [python, *TUNE_RUN, *worker]
    return torchrun_command(python, hardware, worker, env, launcher=TUNE_RUN)


def log_history(log_file: Path, logging_steps: int) -> list[dict[str, Any]]:
    """torchtune's per-step metric log as trainer-style entries: step 1, then every `logging_steps` steps,
    each the mean loss of the steps since the previous entry (as transformers' Trainer reports it)."""
    steps = []
    for line in log_file.read_text().splitlines():
        match = STEP_LINE.match(line.strip())
        if match:
            values = dict(item.split(":", 1) for item in match.group(2).split())
            steps.append((int(match.group(1)), float(values["loss"]), float(values["lr"])))
    if not steps:
        raise XtrainError(f"{log_file}: torchtune logged no training step")
    history, pending = [], []
    last = steps[-1][0]
    for step, loss, lr in steps:
        pending.append(loss)
        if step == 1 or step % logging_steps == 0 or step == last:
            history.append({"step": step, "loss": sum(pending) / len(pending), "learning_rate": lr})
            pending = []
    return history


def export_checkpoint(epoch_dir: Path, model_dir: Path, out: Path, method: str, trust_remote_code: bool) -> None:
    """Copy torchtune's HF-format output into the checkpoint contract. For LoRA only the PEFT adapter:
    torchtune's epoch folder also holds the merged weights, and a folder with both is loaded by
    transformers 5 as merged weights plus the adapter a second time."""
    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    if method in ADAPTER_METHODS:
        shutil.copyfile(epoch_dir / "adapter_model.safetensors", out / "adapter_model.safetensors")
        adapter = json.loads((epoch_dir / "adapter_config.json").read_text())
        adapter["base_model_name_or_path"] = str(model_dir)
        (out / "adapter_config.json").write_text(json.dumps(adapter, indent=2))
    else:
        for path in epoch_dir.iterdir():
            if path.suffix == ".safetensors" or path.name in ("config.json", "model.safetensors.index.json",
                                                               "generation_config.json"):
                shutil.copyfile(path, out / path.name)
    AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code).save_pretrained(out)


def tensors(folder: Path) -> dict[str, Path]:
    """Which safetensors file of `folder` holds each tensor (model weights only, not the adapter)."""
    from safetensors import safe_open

    index = {}
    for path in sorted(folder.glob("*.safetensors")):
        if path.name != "adapter_model.safetensors":
            with safe_open(str(path), "pt") as file:
                index.update(dict.fromkeys(file.keys(), path))
    return index


def adapter_error(epoch_dir: Path, model_dir: Path, checkpoint: Path) -> float:
    """How far the exported PEFT adapter is from what torchtune merged itself, as the largest over all
    tensors of: for an adapted weight, |(merged - base) - (alpha/r)·B·A| relative to the largest |(alpha/r)·B·A|;
    for any other weight, |merged - base| relative to its largest |base| (it must be unchanged). Base weights
    are first rounded to the dtype torchtune saved, as it trained on them. A q/k export permuted or scaled
    differently from the trained model gives an error of order 1."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    config = json.loads((checkpoint / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    adapter = load_file(str(checkpoint / "adapter_model.safetensors"))
    merged, base = tensors(epoch_dir), tensors(model_dir)
    if set(merged) != set(base):
        raise XtrainError(f"{epoch_dir}: torchtune's merged weights name other tensors than {model_dir}'s")
    worst, applied = 0.0, 0
    for name, path in merged.items():
        with safe_open(str(path), "pt") as file:
            trained = file.get_tensor(name)
        with safe_open(str(base[name]), "pt") as file:
            before = file.get_tensor(name).to(trained.dtype).float()
        change = trained.float() - before
        prefix = "base_model.model." + name.removesuffix(".weight")
        if f"{prefix}.lora_A.weight" in adapter:
            delta = scale * adapter[f"{prefix}.lora_B.weight"].float() @ adapter[f"{prefix}.lora_A.weight"].float()
            error = (change - delta).abs().max() / delta.abs().max().clamp_min(1e-12)
            applied += 2
        else:
            error = change.abs().max() / before.abs().max().clamp_min(1e-12)
        worst = max(worst, error.item())
    if applied != len(adapter):
        raise XtrainError(f"{checkpoint}/adapter_model.safetensors: {len(adapter) - applied} adapter tensors name no "
                          f"weight of {model_dir}")
    return worst


def adapter_tolerance(precision: str) -> float:
    """fp32 merges agree to float rounding; bf16 weights (8-bit mantissa) round the merged weight at the
    size of the base weight, which on a short run is a few percent of the adapter's change."""
    return 1e-3 if precision == "fp32" else 0.1


def log_sharding(layout: Layout, config: dict[str, Any]) -> None:
    """Say what the distributed recipes' FSDP2 makes of the plan's layout: a `ddp` plan is sharded too."""
    if "fsdp_reshard_after_forward" not in config:
        return
    if layout.strategy == "ddp":
        log.info("plan layout ddp -> torchtune FSDP2 with fsdp_reshard_after_forward: False (its distributed recipes "
                 "always shard): each device keeps the whole model's weights gathered from forward to backward as a "
                 "DDP replica does, and holds 1/%d of the gradients and optimizer states, so it needs at most the "
                 "plan's DDP memory", layout.devices)
    else:
        log.info("plan layout %s -> torchtune FSDP2 over %d device(s), fsdp_reshard_after_forward: %s, "
                 "fsdp_cpu_offload: False", layout.strategy, layout.devices, config["fsdp_reshard_after_forward"])


class Torchtune:
    name = "torchtune"
    capabilities = CAPABILITIES[name]
    fields = {
        "train.backend": "registry",
        "train.method": "argv",
        "train.lora.r": "config.model.lora_rank",
        "train.lora.alpha": "config.model.lora_alpha",
        "train.lora.dropout": "config.model.lora_dropout",
        "train.lora.target_modules": "config.model.lora_attn_modules",
        "train.lora.use_dora": "config.model.use_dora",
        "train.quantization.bits": "config.model.quantize_base",
        **{field: "capabilities" for field in ("train.lora.use_rslora", "train.lora.modules_to_save",
                                               "train.quantization.quant_type", "train.quantization.double_quant",
                                               "train.neftune_noise_alpha")},
        "train.global_batch_size": "plan",
        "train.micro_batch_size": "plan",
        "train.epochs": "plan",
        "train.max_steps": "plan",
        "train.learning_rate": "config.optimizer.lr",
        "train.lr_scheduler": "config.lr_scheduler.schedule",
        "train.warmup_ratio": "config.lr_scheduler.warmup_ratio",
        "train.weight_decay": "config.optimizer.weight_decay",
        "train.max_grad_norm": "config.clip_grad_norm",
        "train.logging_steps": "logging_steps",
        "train.checkpoint_minutes": "log: torchtune 0.6.1 saves its resumable state at the end of each epoch only",
        "train.seed": "config.seed",
        "train.objective": "argv",
        "train.preference.beta": "config.loss.beta",
        "train.preference.loss_type": "config.loss._component_",
        "train.preference.desirable_weight": "capabilities",
        "train.preference.undesirable_weight": "capabilities",
        **GRPO_REFUSED,  # torchtune 0.6.1 has no GRPO recipe
        "train.report_to": "config.metric_logger.loggers",
        "train.mlflow_tracking_uri": "config.metric_logger.loggers.mlflow.tracking_uri",
        "hardware.accelerator": "argv",
        "hardware.gpus": "argv",
        "hardware.nodes": "argv",
        "hardware.processes": "capabilities",
        **PLANNED_HARDWARE,
    }

    def check(self, train: Train, hardware: Hardware) -> None:
        recipe_name(train, hardware)
        if train.adapters:
            lora_layout(train.lora.target_modules)
        if train.objective == "dpo":
            dpo_loss(train)

    def native(self, job: TrainJob) -> dict:
        """torchtune's config, `tune run` and its environment; `train_rows`: the prepared train rows' lengths. A
        multi-node launch names the Slurm variables it reads (`run` launches with their values)."""
        return self.launch(job, slurm_placeholders(job.hardware))

    def launch(self, job: TrainJob, env: dict[str, str]) -> dict:
        """`native`, with `env` the environment the launch reads (the Slurm allocation's, on several nodes)."""
        import pyarrow.parquet as pq

        if job.plan.precision not in DTYPE:
            raise XtrainError(f"plan precision {job.plan.precision!r} is not supported by torchtune; re-run the plan")
        lengths = [row_tokens(row) for row in pq.read_table(split_file(job.prepared_dir)).to_pylist()]
        config = torchtune_config(job, len(lengths), train_split_is_packed(job.prepared_dir))
        python = backend_python("torchtune", "torchtune", must_exist=False, accelerator=job.hardware.accelerator)
        recipe = recipe_name(job.train, job.hardware)
        # torch's ROCm build drives AMD GPUs through the cuda device (HIP) and nccl (RCCL).
        device = "cpu" if job.hardware.accelerator == "cpu" else "cuda"
        config_file = job.work_dir / "torchtune.yaml"
        return {
            "config": config, "config_file": config_file, "train_rows": lengths, "recipe": recipe,
            "validate": [python, "-m", "torchtune._cli.tune", "validate", str(config_file)],
            "argv": launch_command(python, recipe, config_file, device, DTYPE[job.plan.precision], job.hardware,
                                   env),
            "env": {"PYTHONPATH": BACKEND_SIDE_PATH},
            # torchtune logs every step; `log_history` averages them over train.logging_steps as the trl backends do.
            "logging_steps": job.train.logging_steps,
        }

    def validate(self, job: TrainJob, native: dict, scratch: Path) -> dict:
        """`tune validate` on the rendered config, in the lane's CPU environment (it checks each component's
        arguments against the torchtune code it names; no device is probed)."""
        config_file = scratch / "torchtune.yaml"
        config_file.parent.mkdir(parents=True, exist_ok=True)
        config_file.write_text(yaml.safe_dump(native["config"], sort_keys=False))
        run_command([backend_python("torchtune", "torchtune"), *native["validate"][1:-1], str(config_file)],
                    env=native["env"])
        return {"validator": "tune validate", "read_back": {"recipe": native["recipe"]}}

    def run(self, job: TrainJob) -> TrainResult:
        from xtrain_backend_side.torchtune_components import rows_trained

        found_device(job.hardware)
        python = backend_python("torchtune", "torchtune", accelerator=job.hardware.accelerator)
        tracking.require_packages(job.train, python, "envs/torchtune.yaml")
        if job.plan.precision == "bf16":
            log.info("plan precision bf16 -> torchtune dtype=bf16: torchtune holds weights and activations in "
                     "bf16 (it has no fp32-weights autocast mode)")
        if job.train.method == "full" and job.train.weight_decay:
            log.info("train.weight_decay -> torch AdamW over every parameter: torchtune also decays norms and "
                     "embeddings, which transformers' Trainer exempts")
        log.info("train.seed -> torchtune's seed (LoRA init, dropout) and the order of xtrain's dataset; "
                 "torchtune's sampler itself always shuffles with seed 0")
        log.info("train.checkpoint_minutes is not applied: torchtune 0.6.1 saves its resumable state at the end "
                 "of each epoch only; an interrupted run restarts")
        if not weight_files(job.model_dir):
            raise XtrainError(f"{job.model_dir}: no *.safetensors weights; torchtune's HF checkpointer reads "
                              "safetensors")
        shutil.rmtree(job.work_dir, ignore_errors=True)  # a torchtune run starts over (see above)
        launch = self.launch(job, dict(os.environ))
        if launch["recipe"].startswith("lora_dpo"):
            log.warning("train.max_grad_norm %s is not applied: torchtune 0.6.1's %s recipe does not clip gradients",
                        job.train.max_grad_norm, launch["recipe"])
        log_sharding(job.plan.layout, launch["config"])
        config, lengths = launch["config"], launch["train_rows"]
        job.work_dir.mkdir(parents=True)
        launch["config_file"].write_text(yaml.safe_dump(config, sort_keys=False))
        run_command(launch["validate"], env=launch["env"])
        started = time.perf_counter()
        run_command(launch["argv"], env=launch["env"])
        seconds = time.perf_counter() - started

        out = Path(config["output_dir"])
        logs = sorted((out / "logs").glob("log_*.txt"))
        history = log_history(logs[-1], launch["logging_steps"])
        # torchtune steps on whatever the gradients are: a non-finite loss means the saved weights carry it.
        broken = next((entry["step"] for entry in history if not math.isfinite(entry["loss"])), None)
        if broken is not None:
            raise XtrainError(
                f"torchtune's loss is NaN or infinite by step {broken} (its log: {logs[-1]}); no checkpoint is "
                "written. Lower train.learning_rate or raise train.warmup_ratio, or check the data, then rerun."
            )
        epoch_dir = max(out.glob("epoch_*"), key=lambda path: int(path.name.split("_")[1]))
        export_checkpoint(epoch_dir, job.model_dir, job.out, job.train.method, job.trust_remote_code)
        if job.train.method == "qlora":
            log.info("exported adapter not compared with torchtune's merged weights: those hold its NF4 base "
                     "dequantized, the adapter is saved for the unquantized base (as QLoRA adapters are)")
        elif job.train.method == "lora":
            error = adapter_error(epoch_dir, job.model_dir, job.out)
            log.info("exported adapter vs torchtune's merged weights: largest relative difference %.2e", error)
            if error > adapter_tolerance(job.plan.precision):
                raise XtrainError(
                    f"the PEFT adapter exported from {epoch_dir} does not reproduce the weights torchtune trained "
                    f"(relative difference {error:.2e}); its adapter export does not fit this model"
                )
        steps_per_epoch = config["max_steps_per_epoch"] or history[-1]["step"] // config["epochs"]
        devices = job.plan.layout.devices
        rows_per_epoch = steps_per_epoch * config["gradient_accumulation_steps"] * config["batch_size"] * devices
        trained = rows_trained(len(lengths), job.train.seed, config["epochs"], rows_per_epoch, devices)
        return TrainResult(log_history=history, tokens_seen=sum(lengths[row] for row in trained),
                           train_seconds=seconds)
