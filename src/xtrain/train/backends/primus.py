"""`primus`: AMD Primus post-training (Megatron Bridge SFT / LoRA) on ROCm GPUs.

Primus is ROCm-only and not on PyPI, so this backend cannot run on a CPU machine: it translates the recipe
and plan into a Primus experiment YAML and the `primus-cli` launch command, and runs that command only
where `primus-cli` is installed. What each key means, and where it comes from in Primus' own docs and
code, is in docs/backends.md.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import yaml

from xtrain_backend_side.prepared import INPUT_IDS, LOSS_MASK, labels, split_file, train_split_is_packed

from ...errors import XtrainError
from ...recipe import Hardware, Train
from ...stage import run_command
from .. import tracking
from .capabilities import CAPABILITIES
from .contract import GRPO_REFUSED, PLANNED_HARDWARE, SFT_ONLY, TrainJob, TrainResult, grouped_lora_targets, save_steps

IMAGE = "rocm/primus:v26.8"  # the container launcher's default image (Primus CLI reference)
# Megatron Bridge recipe module and flavor per Hugging Face model_type, with the model preset Primus ships for
# that flavor (primus/configs/models/megatron_bridge/). The flavor supplies optimizer and parallelism defaults;
# the architecture itself comes from the model folder (`hf_path`, set in the overrides).
RECIPES = {
    "llama": ("llama.llama3", "llama3_8b_finetune_config", "llama3_8b.yaml"),
    "qwen3": ("qwen.qwen3", "qwen3_8b_finetune_config", "qwen3_8b.yaml"),
}
PRECISION = {"bf16": "bf16_mixed", "fp16": "fp16_mixed", "fp32": "fp32"}
# Megatron's LoRA targets its fused projections; a recipe's per-projection list maps onto them only
# when it names whole groups (Megatron cannot adapt q without k and v).
LORA_GROUPS = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
}


def lora_targets(target_modules: list[str]) -> list[str]:
    """The recipe's LoRA targets as Megatron module names; an incomplete group is an error."""
    return grouped_lora_targets("primus", target_modules, LORA_GROUPS)


# Megatron's lr_decay_style for each recipe schedule; HF's `constant` has no warmup.
DECAY_STYLE = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}


def experiment(job: TrainJob, name: str, packed: bool, dataset_dir: Path) -> dict[str, Any]:
    """The Primus experiment YAML (as data) for this job."""
    recipe, flavor, preset = model_recipe(job.model_dir)
    train, plan = job.train, job.plan
    layout = plan.layout
    steps = plan.time.steps
    overrides: dict[str, Any] = {
        # Pure data parallelism, as the plan lays it out (it never plans tensor or pipeline parallelism).
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "context_parallel_size": 1,
        "sequence_parallel": False,
        "use_megatron_fsdp": layout.strategy == "fsdp",
        # Iteration-based: epochs become train_iters; Megatron derives accumulation as
        # global_batch_size / (micro_batch_size x data-parallel size).
        "train_iters": steps,
        "global_batch_size": layout.global_batch_size,
        "micro_batch_size": layout.micro_batch_size,
        "seq_length": plan.data.seq_len,
        "packed_sequence": packed,
        "eval_interval": steps,
        "save_interval": save_steps(job),
        "finetune_lr": train.learning_rate,
        "min_lr": 0.0,
        "lr_warmup_iters": 0 if train.lr_scheduler == "constant" else math.ceil(steps * train.warmup_ratio),
        "lr_decay_iters": steps,
        # The finetune flavors take no decay style, weight decay, clipping or seed: Primus passes every
        # override to the flavor and drops what it does not accept (config_utils.py:165-268, auto_filter_and_call),
        # then merges a key named like a ConfigContainer section into that dataclass (config_utils.py:271-324).
        "scheduler": {"lr_decay_style": DECAY_STYLE[train.lr_scheduler]},
        "optimizer": {"weight_decay": train.weight_decay, "clip_grad": train.max_grad_norm},
        "rng": {"seed": train.seed},
        "precision_config": PRECISION[plan.precision],
        "recompute_granularity": "full" if plan.gradient_checkpointing else None,
        "log_interval": train.logging_steps,
        "peft": "lora" if train.method == "lora" else "none",
        # The model and data: the local folders in place of the shipped preset's hub ids.
        "recipe": recipe,
        "flavor": flavor,
        "hf_path": str(job.model_dir.resolve()),
        "dataset": dataset_settings(dataset_dir, plan.data.seq_len, train.seed),
        **tracking.megatron_settings(job),
    }
    if train.method == "lora":
        overrides.update(
            peft_dim=train.lora.r,
            peft_alpha=train.lora.alpha,
            peft_dropout=train.lora.dropout,
            peft_target_modules=lora_targets(train.lora.target_modules),
        )
    return {
        "work_group": "xtrain",
        "user_name": "xtrain",
        "exp_name": name,
        "workspace": str(job.work_dir / "workspace"),
        "modules": {
            "post_trainer": {
                "framework": "megatron_bridge",
                "config": "sft_trainer.yaml",
                # A preset Primus ships: it loads presets only from its own configs folder and refuses any
                # other path (primus/core/config/preset_loader.py:46-51); the overrides replace its model and data.
                "model": preset,
                "overrides": overrides,
            }
        },
    }


def model_recipe(model_dir: Path) -> tuple[str, str, str]:
    """The Megatron Bridge recipe, flavor and Primus model preset for the recipe's local model folder."""
    model_type = json.loads((model_dir / "config.json").read_text()).get("model_type")
    if model_type not in RECIPES:
        raise XtrainError(
            f"{model_dir}/config.json: model_type {model_type!r} has no Megatron Bridge recipe in the primus "
            f"backend; supported: {', '.join(sorted(RECIPES))}"
        )
    return RECIPES[model_type]


def dataset_settings(dataset_dir: Path, seq_len: int, seed: int) -> dict[str, Any]:
    """A local dataset folder by path (Primus' post-training README, "Use Local Dataset")."""
    return {
        "_target_": "megatron.bridge.data.builders.hf_dataset.HFDatasetConfig",
        "dataset_name": str(dataset_dir.resolve()),
        "seq_length": seq_len,
        "seed": seed,
    }


def launch_command(config: Path, hardware: Hardware, entry: list[str]) -> list[str]:
    """`primus-cli ... -- train posttrain --config X.yaml` as an argument list: `entry` (direct or container) on
    one node; on several, Primus' Slurm launcher runs that entry once per node."""
    # Primus starts GPUS_PER_NODE processes per node and defaults it to 8 (runner/primus-cli-direct.sh:471,
    # primus-cli-slurm-entry.sh:45); a later --env wins over the one the Slurm entry passes first.
    node = [*entry, "--env", f"GPUS_PER_NODE={hardware.gpus}", "--", "train", "posttrain", "--config", str(config)]
    if hardware.nodes == 1:
        return ["primus-cli", *node]
    # srun starts one entry per node; Primus' entry sets NNODES and NODE_RANK from Slurm and the rendezvous
    # MASTER_ADDR to the allocation's first host (primus-cli-slurm-entry.sh:43-44, 178-191). The train job
    # itself runs in an `srun -n1` step holding the first node's cores, hence --overlap.
    srun = ["srun", "-N", str(hardware.nodes), "--ntasks-per-node=1", "--overlap", "--kill-on-bad-exit=1"]
    return ["primus-cli", "slurm", *srun, "--", *node]


def launch_entry(direct: bool) -> list[str]:
    """Primus' direct entry inside a ROCm environment that has its Python package, else its container."""
    if direct:
        return ["direct"]
    # The experiment, the model and the exported data live under the project: mount it at the same path.
    project = str(Path.cwd().resolve())
    return ["container", "--image", IMAGE, "--volume", f"{project}:{project}"]


def primus_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("primus") is not None


def export_dataset(prepared_dir: Path, out: Path) -> None:
    """Write the prepared splits as a local `datasets` folder: token ids and labels (xtrain_backend_side.prepared)."""
    from datasets import Dataset, DatasetDict

    def with_labels(split: str) -> Dataset:
        rows = Dataset.from_parquet(str(split_file(prepared_dir, split)))
        return rows.map(lambda row: {"labels": labels(row[INPUT_IDS], row[LOSS_MASK])})

    splits = DatasetDict({"train": with_labels("train"), "validation": with_labels("eval")})
    splits.save_to_disk(str(out))


class Primus:
    name = "primus"
    capabilities = CAPABILITIES[name]
    fields = {
        "train.backend": "registry",
        "train.method": "config.modules.post_trainer.overrides.peft",
        "train.lora.r": "config.modules.post_trainer.overrides.peft_dim",
        "train.lora.alpha": "config.modules.post_trainer.overrides.peft_alpha",
        "train.lora.dropout": "config.modules.post_trainer.overrides.peft_dropout",
        "train.lora.target_modules": "config.modules.post_trainer.overrides.peft_target_modules",
        "train.global_batch_size": "plan",
        "train.micro_batch_size": "plan",
        "train.epochs": "plan",
        "train.max_steps": "plan",
        "train.learning_rate": "config.modules.post_trainer.overrides.finetune_lr",
        "train.lr_scheduler": "config.modules.post_trainer.overrides.scheduler.lr_decay_style",
        "train.warmup_ratio": "config.modules.post_trainer.overrides.lr_warmup_iters",
        "train.weight_decay": "config.modules.post_trainer.overrides.optimizer.weight_decay",
        "train.max_grad_norm": "config.modules.post_trainer.overrides.optimizer.clip_grad",
        "train.logging_steps": "config.modules.post_trainer.overrides.log_interval",
        "train.checkpoint_minutes": "config.modules.post_trainer.overrides.save_interval",
        "train.seed": "config.modules.post_trainer.overrides.rng.seed",
        "train.report_to": "config.modules.post_trainer.overrides.tensorboard_dir",
        "train.mlflow_tracking_uri": "capabilities",
        "hardware.accelerator": "capabilities",
        "hardware.gpus": "plan",
        "hardware.nodes": "argv",
        "hardware.processes": "capabilities",
        **PLANNED_HARDWARE,
        **SFT_ONLY,
        **GRPO_REFUSED,
        # Refused through the declared capabilities: qlora (and so its quantization), the LoRA variants, NEFTune.
        **{f"train.{field}": "capabilities" for field in (
            "quantization.bits", "quantization.quant_type", "quantization.double_quant", "lora.use_dora",
            "lora.use_rslora", "lora.modules_to_save", "neftune_noise_alpha")},
    }

    def check(self, train: Train, hardware: Hardware) -> None:
        if train.method == "lora":
            lora_targets(train.lora.target_modules)

    def native(self, job: TrainJob) -> dict:
        """The Primus experiment (its data is exported to `dataset_dir`) and its `primus-cli` launch."""
        dataset_dir, config = job.work_dir / "dataset", job.work_dir / "primus_posttrain.yaml"
        return {
            "config": experiment(job, job.out.name, train_split_is_packed(job.prepared_dir), dataset_dir),
            "config_file": config,
            "dataset_dir": dataset_dir,
            "argv": launch_command(config, job.hardware, launch_entry(primus_installed())),
        }

    def run(self, job: TrainJob) -> TrainResult:
        if shutil.which("primus-cli") is None:
            raise XtrainError(
                "train.backend primus needs a ROCm machine with Primus installed (`primus-cli` on PATH, e.g. in "
                f"the {IMAGE} container); it is not on PATH here. The backend's translation is tested on CPU, "
                "but training needs AMD GPUs"
            )
        # Launching works; reading Megatron Bridge's output back into the checkpoint contract needs a
        # ROCm machine to check against, so the backend stops here rather than write an unchecked checkpoint.
        launch = self.write_config(job)
        run_command(launch["argv"])
        raise XtrainError(
            f"primus trained into {job.work_dir / 'workspace'}, but converting Megatron Bridge's output to the "
            "checkpoint contract is not implemented yet (it has never been run on a ROCm machine)"
        )

    def write_config(self, job: TrainJob) -> dict:
        """Export the data and write the experiment YAML under `job.work_dir`; the launch."""
        job.work_dir.mkdir(parents=True, exist_ok=True)
        launch = self.native(job)
        export_dataset(job.prepared_dir, launch["dataset_dir"])
        launch["config_file"].write_text(yaml.safe_dump(launch["config"], sort_keys=False))
        return launch

