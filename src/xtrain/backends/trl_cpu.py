"""`trl_cpu`: the shared TRL trainer (`backends/trl.py`) in this one process, on the CPU."""

from __future__ import annotations

from ..recipe import Hardware, Train
from . import TrainJob, TrainResult, require_one_cpu_process
from .trl import cpu_placement, train_and_save


class TrlCpu:
    name = "trl_cpu"

    def check(self, train: Train, hardware: Hardware) -> None:
        require_one_cpu_process(self.name, hardware, "(this lane trains on the CPU)")

    def run(self, job: TrainJob) -> TrainResult:
        return train_and_save(job, cpu_placement(job.plan))
