"""The backend contract: what a training backend receives, what it returns, and which recipe fields it honours.

A backend turns a `TrainJob` (recipe sections + plan + prepared data) into the checkpoint contract:
HF-loadable weights (a PEFT adapter or a full model) and the tokenizer in `job.out`, and the training
log it returns. What it can run is declared as data in `capabilities`. A recipe field a backend honours is
listed in its `fields` with where it lands in the backend's native config or launch (`native`);
tests/test_backend_coverage.py checks every `train` and `hardware` field is one or the other for every backend.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ...errors import XtrainError
from ...plan.schema import Plan
from ...recipe import Hardware, Preference, Reward, Rl, Train
from .capabilities import Capabilities

log = logging.getLogger(__name__)

# Every backend's optimizer: AdamW with torch's fused kernel (transformers' own default from torch 2.8 on), one kernel
# over all of a step's weights where torch's choice on a CPU, the single-tensor loop, runs a dozen ops on each weight
# in turn: a full fine-tune of SmolLM2-135M updates in 0.054 s fused against 0.136 s (2 cores, the train job's
# allocator; bench/bench_optimizer.py). The plan traces the same optimizer (plan.memory). This is transformers' name
# for it (Axolotl's too); torchtune's config sets `fused`.
ADAMW = "adamw_torch_fused"


@dataclass(frozen=True)
class TrainJob:
    model_dir: Path
    prepared_dir: Path
    plan: Plan
    train: Train
    hardware: Hardware
    out: Path  # staging folder that becomes checkpoints/<recipe>/
    work_dir: Path  # trainer checkpoints, outside the declared output so a rerun resumes
    resume_from: str | None  # the last trainer checkpoint of an interrupted identical run
    trust_remote_code: bool = False  # model.trust_remote_code: run the model folder's own code
    # model.adapter: continue: the upstream recipe's checkpoint, whose LoRA adapter on `model_dir` trains further
    adapter_init: Path | None = None

    def to_json(self) -> dict[str, Any]:
        """The job as plain JSON, for a backend's worker processes (another interpreter, or torchrun ranks)."""
        return {
            "model_dir": str(self.model_dir), "prepared_dir": str(self.prepared_dir), "plan": self.plan.to_json(),
            "train": self.train.model_dump(mode="json"), "hardware": self.hardware.model_dump(mode="json"),
            "out": str(self.out), "work_dir": str(self.work_dir), "resume_from": self.resume_from,
            "trust_remote_code": self.trust_remote_code,
            "adapter_init": None if self.adapter_init is None else str(self.adapter_init),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainJob:
        return cls(
            Path(data["model_dir"]), Path(data["prepared_dir"]), Plan.model_validate(data["plan"]),
            Train.model_validate(data["train"]),
            Hardware.model_validate(data["hardware"]), Path(data["out"]), Path(data["work_dir"]),
            data["resume_from"], data["trust_remote_code"],
            None if data.get("adapter_init") is None else Path(data["adapter_init"]),
        )


@dataclass(frozen=True)
class TrainResult:
    log_history: list[dict[str, Any]]  # one dict per logged step, as the trainer reports it
    tokens_seen: int
    train_seconds: float


# Field maps most backends share: the hardware the plan sizes memory, time and resources for, and the
# placement fields of a backend that trains in one CPU process (only those values pass its capabilities).
PLANNED_HARDWARE = {field: "plan" for field in ("hardware.gpu_model", "hardware.gpu_memory_gb", "hardware.cpus",
                                                "hardware.host_memory_gb")}
ONE_CPU_PROCESS = {field: "capabilities" for field in ("hardware.accelerator", "hardware.gpus", "hardware.nodes",
                                                       "hardware.processes")}
# The objective fields of a backend that trains supervised fine-tuning only: preflight refuses the others by name.
SFT_ONLY = {field: "capabilities" for field in ("train.objective", *(f"train.preference.{name}"
                                                                     for name in Preference.model_fields))}
# The GRPO fields of a backend that does not train it: preflight refuses objective grpo by its capabilities.
GRPO_REFUSED = {field: "capabilities" for field in (*(f"train.rl.{name}" for name in Rl.model_fields),
                                                    *(f"train.rewards.{name}" for name in Reward.model_fields))}


class Backend(Protocol):
    name: str
    capabilities: Capabilities
    # Recipe field ("train.x" / "hardware.y") -> where it lands: a key path in `native(job)` ("config.lr",
    # "argv"), or "plan" for a field the plan turns into the settings the backend reads (layout, time).
    fields: Mapping[str, str]

    def check(self, train: Train, hardware: Hardware) -> None:
        """Refuse what `capabilities` cannot say: a value of a field the backend maps only in part."""

    def native(self, job: TrainJob) -> dict[str, Any]:
        """What the backend would launch for `job`, without running it: {"config": ..., "argv": [...], ...}."""

    def validate(self, job: TrainJob, native: dict[str, Any], scratch: Path) -> dict[str, Any]:
        """`native` (for `job`'s hardware) checked by the framework's own validator in the lane's CPU environment, as
        the target GPU's node would check it (backends/validation.py): {"validator": what ran, "read_back": what
        the framework read}; the framework's refusal raises XtrainError. Files go to `scratch`."""

    def run(self, job: TrainJob) -> TrainResult: ...


def grouped_lora_targets(backend: str, targets: list[str], groups: Mapping[str, tuple[str, ...]]) -> list[str]:
    """The recipe's LoRA target modules as a backend's adapter groups (each group: module names the backend adapts
    only together, e.g. Megatron's fused q/k/v). `all-linear` is every group; a name no group holds, or part of a
    group, is an error naming the fix."""
    if targets == ["all-linear"]:
        return list(groups)
    wanted = set(targets)
    known = {module for modules in groups.values() for module in modules}
    if wanted - known:
        raise XtrainError(
            f"train.lora.target_modules {sorted(wanted - known)}: the {backend} backend adapts only "
            f"{sorted(known)} (or all-linear)"
        )
    chosen = []
    for group, modules in groups.items():
        present = wanted & set(modules)
        if present and present != set(modules):
            raise XtrainError(
                f"train.lora.target_modules: the {backend} backend adapts {', '.join(modules)} together; list all "
                f"of {list(modules)} or none of them"
            )
        if present:
            chosen.append(group)
    return chosen


def save_steps(job: TrainJob) -> int:
    """For a backend that saves every N steps only (no time-based save): train.checkpoint_minutes becomes the step
    count the plan predicts for that many minutes, unless a quarter of the run (trl_cpu's cadence) comes sooner."""
    steps = job.plan.time.steps
    quarter = max(1, steps // 4)
    per_step = job.plan.time.seconds_per_step
    in_minutes = max(1, math.floor(job.train.checkpoint_minutes * 60 / per_step)) if per_step > 0 else quarter
    chosen = min(quarter, in_minutes)
    log.info("%s: train.checkpoint_minutes %s -> a save every %s steps (plan: %.2f s/step, %s steps)",
             job.train.backend, job.train.checkpoint_minutes, chosen, per_step, steps)
    return chosen
