"""`axolotl`: Axolotl's own trainer (`axolotl train <config>`), in the lane's own environment.

The lane owns the translation recipe + plan -> Axolotl YAML (`axolotl_config`), the export of the prepared
tokens into the pre-tokenized form Axolotl reads (input_ids / attention_mask / labels, -100 on unsupervised
tokens), the launch, and the normalisation of Axolotl's output (trainer_state.json, the adapter or model it
saves) into the checkpoint contract.
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path
from typing import Any

import yaml

from ..artifacts import read_json
from ..envs import lane_python
from ..errors import XtrainError
from ..launch import run_command
from ..recipe import Hardware, Train
from . import TrainJob, TrainResult, require_one_cpu_process

log = logging.getLogger(__name__)

# Axolotl's Triton LoRA kernels need CUDA; on the CPU they fail with "Torch not compiled with CUDA enabled".
CPU_OFF_KERNELS = ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel", "lora_embedding_kernel")
# Offline, and without Axolotl's telemetry (which otherwise waits on the network before loading the config).
OFFLINE = {"HF_HUB_OFFLINE": "1", "AXOLOTL_DO_NOT_TRACK": "1"}
# What Axolotl's final save leaves in output_dir that the checkpoint contract wants: an adapter, or a full model
# (config and, for a large one, sharded safetensors with their index).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
MODEL_FILES = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json")


def export_tokens(prepared_dir: Path, target: Path) -> int:
    """The prepared train split as Axolotl's pre-tokenized dataset: the same token ids, labels = the ids on
    supervised tokens (assistant_masks == 1) and -100 elsewhere. Returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(prepared_dir / "train.parquet", columns=["input_ids", "assistant_masks"])
    ids, masks = table.column("input_ids").to_pylist(), table.column("assistant_masks").to_pylist()
    labels = [[token if keep else -100 for token, keep in zip(row, mask)] for row, mask in zip(ids, masks)]
    attention = [[1] * len(row) for row in ids]
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"input_ids": ids, "attention_mask": attention, "labels": labels}), target)
    return len(ids)


def save_steps(job: TrainJob) -> int:
    """Axolotl saves every N steps only (no time-based save): train.checkpoint_minutes becomes the step count the
    plan predicts for that many minutes, unless a quarter of the run (trl_cpu's cadence) comes sooner."""
    steps = job.plan["time"]["steps"]
    quarter = max(1, steps // 4)
    per_step = job.plan["time"]["seconds_per_step"]
    in_minutes = max(1, math.floor(job.train.checkpoint_minutes * 60 / per_step)) if per_step > 0 else quarter
    chosen = min(quarter, in_minutes)
    log.info("axolotl: train.checkpoint_minutes %s -> save_steps %s (plan: %.2f s/step, %s steps)",
             job.train.checkpoint_minutes, chosen, per_step, steps)
    return chosen


def cpu_precision(plan: dict[str, Any]) -> None:
    """Axolotl trains in fp32 on the CPU: transformers accepts bf16 autocast there only with `use_cpu`, a training
    argument Axolotl 0.19 does not expose ("Your setup doesn't support bf16/gpu"). A plan that chose bf16 (it
    is faster on CPUs with native bf16) runs in fp32 instead, said in the log."""
    if plan["precision"] not in ("fp32", "bf16"):
        raise XtrainError(f"plan precision {plan['precision']!r} cannot run on the CPU; re-run the plan")
    if plan["precision"] == "bf16":
        log.warning("axolotl: the plan's bf16 autocast -> fp32 (Axolotl cannot autocast on the CPU); "
                    "the step is slower than the plan predicts and keeps fp32 activations")


def axolotl_config(job: TrainJob, dataset: Path) -> dict[str, Any]:
    """Axolotl's YAML for the recipe's train section and the plan (every Train field is used here)."""
    train, plan, layout = job.train, job.plan, job.plan["layout"]
    config: dict[str, Any] = {
        "base_model": str(job.model_dir.resolve()),
        "trust_remote_code": job.trust_remote_code,
        # No `type:` -> Axolotl reads the rows as already tokenized (input_ids, attention_mask, labels).
        "datasets": [{"path": str(dataset.resolve()), "ds_type": "parquet", "split": "train"}],
        "dataset_prepared_path": str((job.work_dir / "axolotl_prepared").resolve()),
        "val_set_size": 0.0,
        "sequence_len": plan["data"]["seq_len"],
        "sample_packing": False,
        "pad_to_sequence_len": False,
        # The sampler trl_cpu uses for unpacked rows: batches of similar length, shuffled by the seed. Axolotl would
        # shuffle the rows once more while loading them; keeping prepare's order lets the same seed pick the same
        # batches as trl_cpu.
        "group_by_length": True,
        "shuffle_merged_datasets": False,
        "micro_batch_size": layout["micro_batch_size"],
        "gradient_accumulation_steps": layout["gradient_accumulation_steps"],
        "num_epochs": train.epochs,
        "max_steps": train.max_steps,
        "learning_rate": train.learning_rate,
        "lr_scheduler": train.lr_scheduler,
        "warmup_ratio": train.warmup_ratio,
        "optimizer": "adamw_torch",
        "weight_decay": train.weight_decay,
        "max_grad_norm": train.max_grad_norm,
        "seed": train.seed,
        "bf16": False,  # on the CPU: see cpu_precision
        "fp16": False,
        "tf32": False,
        "gradient_checkpointing": plan["gradient_checkpointing"],
        "output_dir": str(job.work_dir.resolve()),
        "logging_steps": train.logging_steps,
        # -> transformers' include_num_input_tokens_seen=True: token slots seen, padding included.
        "include_tokens_per_second": True,
        "save_strategy": "steps",
        "save_steps": save_steps(job),
        "save_total_limit": 2,
        "save_safetensors": True,
        "resume_from_checkpoint": str(Path(job.resume_from).resolve()) if job.resume_from else None,
    }
    if train.method == "lora":
        lora = train.lora
        config |= {"adapter": "lora", "lora_r": lora.r, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout}
        if lora.target_modules == ["all-linear"]:
            config["lora_target_linear"] = True
        else:
            config["lora_target_modules"] = list(lora.target_modules)
        config |= {kernel: False for kernel in CPU_OFF_KERNELS}
    return {key: value for key, value in config.items() if value is not None}


class Axolotl:
    name = "axolotl"

    def check(self, train: Train, hardware: Hardware) -> None:
        require_one_cpu_process(
            self.name, hardware, "yet (its environment, envs/axolotl.yaml,"
            " is built and tested with the CPU torch only)"
        )

    def run(self, job: TrainJob) -> TrainResult:
        import pyarrow.parquet as pq

        cpu_precision(job.plan)
        if "seq_lengths" in pq.read_schema(job.prepared_dir / "train.parquet").names:
            raise XtrainError(
                "train.backend axolotl: the prepared data is packed (data.packing: true), and Axolotl's own packing "
                "cannot keep packed sequences apart on the CPU; set data.packing: false for this lane"
            )
        dataset = job.work_dir / "axolotl_data" / "train.parquet"
        export_tokens(job.prepared_dir, dataset)
        config_path = job.work_dir / "axolotl.yaml"
        config_path.write_text(yaml.safe_dump(axolotl_config(job, dataset), sort_keys=False))
        python = lane_python(self.name, "axolotl")
        run_command([python, "-m", "axolotl.cli.train", str(config_path)], env=OFFLINE)
        return self.normalise(job)

    def normalise(self, job: TrainJob) -> TrainResult:
        """Axolotl saves the final adapter or model in output_dir and its log in the last checkpoint-N (saved at
        the final step)."""
        checkpoints = sorted(job.work_dir.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
        if not checkpoints:
            raise XtrainError(f"axolotl finished without a checkpoint in {job.work_dir}; see its log above")
        state = read_json(checkpoints[-1] / "trainer_state.json")
        for pattern in ADAPTER_FILES if job.train.method == "lora" else MODEL_FILES:
            for path in job.work_dir.glob(pattern):
                shutil.copyfile(path, job.out / path.name)
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(job.model_dir, trust_remote_code=job.trust_remote_code).save_pretrained(job.out)
        log_history = state["log_history"]
        runtime = next((entry["train_runtime"] for entry in reversed(log_history) if "train_runtime" in entry), 0.0)
        # The summary entry transformers' Trainer ends its own log with (the last step, whether logged or not).
        log_history = [*log_history, {"step": state["global_step"], "train_runtime": runtime}]
        return TrainResult(log_history, int(state.get("num_input_tokens_seen", 0)), float(runtime))
