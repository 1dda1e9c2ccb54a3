"""`trl_cpu`: the shared TRL trainer (`backends/trl.py`) in this one process, on the CPU."""

from __future__ import annotations

from ..errors import XtrainError
from ..recipe import Hardware, Train
from . import TrainJob, TrainResult
from .trl import cpu_placement, train_and_save


class TrlCpu:
    name = "trl_cpu"

    def check(self, train: Train, hardware: Hardware) -> None:
        if hardware.accelerator != "cpu":
            raise XtrainError(
                f"train.backend trl_cpu trains on the CPU, but hardware.accelerator is {hardware.accelerator!r}: "
                "set hardware.accelerator: cpu and gpus: 0, or use backend trl_local"
            )
        if hardware.nodes != 1 or hardware.processes != 1:
            raise XtrainError(
                "train.backend trl_cpu runs one process: set hardware.nodes: 1 and hardware.processes: 1, "
                "or use backend trl_local"
            )

    def run(self, job: TrainJob) -> TrainResult:
        return train_and_save(job, cpu_placement(job.plan))
