"""The backend contract: what a training backend receives, what it returns, and what it declares it can do.

A backend turns a `TrainJob` (recipe sections + plan + prepared data) into the checkpoint contract:
HF-loadable weights (a PEFT adapter or a full model) and the tokenizer in `job.out`, and the training
log it returns. Each backend declares its `Capabilities` as data: `refusal` checks a recipe against them
before any job runs (preflight and the train stage), and docs/backends.md's capability table is generated
from them. A recipe
field a backend honours is listed in its `fields` with where it lands in the backend's native config or
launch (`native`); tests/test_backend_coverage.py checks every `train` and `hardware` field is one or the
other for every backend.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, Protocol

from ..errors import XtrainError
from ..plan.schema import Plan
from ..recipe import TRACKERS, Hardware, Preference, Train

log = logging.getLogger(__name__)
Status = Literal["trains", "translate-only"]


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

    def to_json(self) -> dict[str, Any]:
        """The job as plain JSON, for a backend's worker processes (another interpreter, or torchrun ranks)."""
        return {
            "model_dir": str(self.model_dir), "prepared_dir": str(self.prepared_dir), "plan": self.plan.to_json(),
            "train": self.train.model_dump(mode="json"), "hardware": self.hardware.model_dump(mode="json"),
            "out": str(self.out), "work_dir": str(self.work_dir), "resume_from": self.resume_from,
            "trust_remote_code": self.trust_remote_code,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainJob:
        return cls(
            Path(data["model_dir"]), Path(data["prepared_dir"]), Plan.model_validate(data["plan"]),
            Train.model_validate(data["train"]),
            Hardware.model_validate(data["hardware"]), Path(data["out"]), Path(data["work_dir"]),
            data["resume_from"], data["trust_remote_code"],
        )


@dataclass(frozen=True)
class TrainResult:
    log_history: list[dict[str, Any]]  # one dict per logged step, as the trainer reports it
    tokens_seen: int
    train_seconds: float


@dataclass(frozen=True)
class Capabilities:
    """What a backend can run, as data. Each field is documented in docs/backends.md's capability table."""

    status: Status  # trains, or only writes its native config and launch (not yet run end to end)
    accelerators: tuple[str, ...]  # hardware.accelerator values
    max_gpus_per_node: int | None  # hardware.gpus (0: the CPU only; None: any count)
    max_nodes: int | None  # hardware.nodes (None: any count, through Slurm)
    max_processes: int | None  # hardware.processes: CPU data-parallel processes per node (None: any)
    methods: tuple[str, ...]  # train.method values
    objectives: tuple[str, ...]  # training objectives (supervised fine-tuning: sft)
    precisions: tuple[str, ...]  # autocast dtypes the plan may choose for it
    packing: bool  # trains on packed rows (data.packing: true)
    resume: bool  # continues an interrupted run from its last trainer checkpoint
    compiles: bool = False  # trains under torch.compile (and buckets batch lengths) when the plan decides it pays
    trackers: tuple[str, ...] = TRACKERS  # train.report_to values it writes to


# Field maps most backends share: the hardware the plan sizes memory, time and resources for, and the
# placement fields of a backend that trains in one CPU process (only those values pass its capabilities).
PLANNED_HARDWARE = {field: "plan" for field in ("hardware.gpu_model", "hardware.gpu_memory_gb", "hardware.cpus",
                                                "hardware.host_memory_gb")}
ONE_CPU_PROCESS = {field: "capabilities" for field in ("hardware.accelerator", "hardware.gpus", "hardware.nodes",
                                                       "hardware.processes")}
# The objective fields of a backend that trains supervised fine-tuning only: preflight refuses the others by name.
SFT_ONLY = {field: "capabilities" for field in ("train.objective", *(f"train.preference.{name}"
                                                                     for name in Preference.model_fields))}


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


def refusal(name: str, can: Capabilities, train: Train, hardware: Hardware, packed: bool) -> str | None:
    """Why backend `name` cannot run these settings, naming the field and the fix; None when it can."""
    others = "or choose another train.backend (docs/backends.md lists what each one runs)"
    if hardware.accelerator not in can.accelerators:
        return (f"train.backend {name} runs on hardware.accelerator {' or '.join(can.accelerators)}, not "
                f"{hardware.accelerator!r}: set hardware.accelerator: {can.accelerators[0]}"
                + (" and hardware.gpus: 0" if can.accelerators[0] == "cpu" else "") + f", {others}")
    if not at_most(hardware.gpus, can.max_gpus_per_node):
        return (f"train.backend {name} runs on at most {can.max_gpus_per_node} GPU(s) per node, not hardware.gpus "
                f"{hardware.gpus}: set hardware.gpus: {can.max_gpus_per_node}, {others}")
    if not at_most(hardware.nodes, can.max_nodes):
        return (f"train.backend {name} runs on {can.max_nodes} node(s) at most, not hardware.nodes {hardware.nodes}: "
                f"set hardware.nodes: {can.max_nodes}, {others}")
    if not at_most(hardware.processes, can.max_processes):
        return (f"train.backend {name} runs {can.max_processes} CPU process(es) per node at most, not "
                f"hardware.processes {hardware.processes}: set hardware.processes: {can.max_processes}, {others}")
    if train.method not in can.methods:
        return f"train.backend {name} does not train method {train.method!r}: set train.method: {can.methods[0]}, {others}"
    if train.objective not in can.objectives:
        return (f"train.backend {name} does not train objective {train.objective!r} (train.objective): set "
                f"train.objective: {' or '.join(can.objectives)}, {others}")
    if unsupported := [tracker for tracker in train.report_to if tracker not in can.trackers]:
        return (f"train.backend {name} cannot report to {', '.join(unsupported)} (train.report_to): it writes to "
                f"{', '.join(can.trackers)}; remove {', '.join(unsupported)} from train.report_to, {others}")
    if packed and not can.packing:
        return f"train.backend {name} cannot train on packed rows: set data.packing: false, {others}"
    if can.status != "trains":
        return (f"train.backend {name} is {can.status} in this version: it writes its native config and launch "
                f"command, but has not trained end to end; {others.removeprefix('or ')}")
    return None


def at_most(value: int, limit: int | None) -> bool:
    return limit is None or value <= limit


def capability_rows(backends: Mapping[str, Backend]) -> list[str]:
    """docs/backends.md's capability table (markdown lines), one column per backend."""
    names = list(backends)
    rows = ["| capability | " + " | ".join(f"`{name}`" for name in names) + " |",
            "| --- |" + " --- |" * len(names)]
    for field in fields(Capabilities):
        values = [getattr(backends[name].capabilities, field.name) for name in names]
        cells = [", ".join(map(str, value)) if isinstance(value, tuple) else "any" if value is None else
                 ("yes" if value else "no") if isinstance(value, bool) else str(value) for value in values]
        rows.append(f"| {field.name} | " + " | ".join(cells) + " |")
    return rows


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
