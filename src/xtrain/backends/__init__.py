"""Training lanes, looked up by the recipe's `train.backend`.

A backend turns a `TrainJob` (recipe sections + plan + prepared data) into the checkpoint contract:
HF-loadable weights (a PEFT adapter or a full model) and the tokenizer in `job.out`, and the training
log it returns. `check` refuses, before anything is launched, a recipe field the lane cannot honour.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..errors import XtrainError
from ..recipe import Hardware, Train


@dataclass(frozen=True)
class TrainJob:
    model_dir: Path
    prepared_dir: Path
    plan: dict[str, Any]
    train: Train
    hardware: Hardware
    out: Path  # staging folder that becomes checkpoints/<recipe>/
    work_dir: Path  # trainer checkpoints, outside the declared output so a rerun resumes
    resume_from: str | None  # the last trainer checkpoint of an interrupted identical run
    trust_remote_code: bool = False  # model.trust_remote_code: run the model folder's own code

    def to_json(self) -> dict[str, Any]:
        """The job as plain JSON, for a lane's worker processes (another interpreter, or torchrun ranks)."""
        return {
            "model_dir": str(self.model_dir), "prepared_dir": str(self.prepared_dir), "plan": self.plan,
            "train": self.train.model_dump(mode="json"), "hardware": self.hardware.model_dump(mode="json"),
            "out": str(self.out), "work_dir": str(self.work_dir), "resume_from": self.resume_from,
            "trust_remote_code": self.trust_remote_code,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainJob:
        return cls(
            Path(data["model_dir"]), Path(data["prepared_dir"]), data["plan"], Train.model_validate(data["train"]),
            Hardware.model_validate(data["hardware"]), Path(data["out"]), Path(data["work_dir"]),
            data["resume_from"], data["trust_remote_code"],
        )


@dataclass(frozen=True)
class TrainResult:
    log_history: list[dict[str, Any]]  # one dict per logged step, as the trainer reports it
    tokens_seen: int
    train_seconds: float


class Backend(Protocol):
    name: str

    def check(self, train: Train, hardware: Hardware) -> None: ...

    def run(self, job: TrainJob) -> TrainResult: ...


def require_one_cpu_process(backend: str, hardware: Hardware, why: str) -> None:
    """`check` of a lane that trains in one process on the CPU: refuse GPUs, nodes and processes, with the fix."""
    if hardware.accelerator != "cpu":
        raise XtrainError(
            f"train.backend {backend}: hardware.accelerator {hardware.accelerator!r} is not supported {why}: set "
            "hardware.accelerator: cpu and gpus: 0, or use backend trl_local for GPUs"
        )
    if hardware.nodes != 1 or hardware.processes != 1:
        raise XtrainError(
            f"train.backend {backend} runs one process: set hardware.nodes: 1 and hardware.processes: 1, "
            "or use backend trl_local"
        )


def _registry() -> dict[str, Backend]:
    from .axolotl import Axolotl
    from .primus import Primus
    from .torchtune import Torchtune
    from .trl_cpu import TrlCpu
    from .trl_local import TrlLocal
    from .unsloth import Unsloth

    return {
        backend.name: backend
        for backend in (TrlCpu(), TrlLocal(), Axolotl(), Unsloth(), Torchtune(), Primus())
    }


def get_backend(name: str) -> Backend:
    registry = _registry()
    if name not in registry:
        raise XtrainError(
            f"train.backend {name!r} is not available yet in this version of xtrain; "
            f"available: {', '.join(sorted(registry))}"
        )
    return registry[name]
