"""`trl_cpu`: the shared TRL trainer (`backends/trl.py`) in this one process, on the CPU."""

from __future__ import annotations

from pathlib import Path

from ...recipe import Hardware, Train
from .capabilities import CAPABILITIES
from .contract import ONE_CPU_PROCESS, TrainJob, TrainResult
from .trl import TRL_FIELDS, cpu_placement, native, train_and_save, validate_with_trl


class TrlCpu:
    name = "trl_cpu"
    capabilities = CAPABILITIES[name]
    fields = TRL_FIELDS | ONE_CPU_PROCESS

    def check(self, train: Train, hardware: Hardware) -> None:
        """Nothing beyond its capabilities."""

    def native(self, job: TrainJob) -> dict:
        return native(job, cpu_placement(job.plan))

    def validate(self, job: TrainJob, native: dict, scratch: Path) -> dict:
        return validate_with_trl(job, native, scratch)

    def run(self, job: TrainJob) -> TrainResult:
        return train_and_save(job, cpu_placement(job.plan))
