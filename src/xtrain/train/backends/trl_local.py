"""`trl_local`: the shared TRL trainer (`backends/trl.py`) on the device this machine has, in one process or
in one process per device through `torchrun`.

- The device found at run time must be the recipe's `hardware` (accelerator, GPUs per node, nodes), else
  a clear error before anything loads.
- GPUs (CUDA, or ROCm: `torch.version.hip`) train with the plan's bf16 autocast, fp16 where the GPU lacks
  bf16; the CPU with the CPU settings (fp32, or bf16 autocast).
- One CPU process trains in this process. More processes (`hardware.processes` on a CPU, GPUs per node,
  nodes) and every GPU run go through `torchrun`, whose workers run this module (`python -m
  xtrain.train.backends.trl_local job.json`): DDP, or FSDP when the plan's layout says so. A one-GPU run goes
  through it too, so that it is one process on one GPU rather than DataParallel over all visible ones.
- Several nodes: inside a Slurm allocation, `srun` starts one torchrun per node with a c10d rendezvous on
  the allocation's first host.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from ...errors import XtrainError
from ...project.envs import backend_python
from ...recipe import Hardware, Train
from ...stage import run_command
from .capabilities import CAPABILITIES
from .contract import TrainJob, TrainResult
from .distributed import cpu_threads, found_device, slurm_placeholders, torchrun_command
from .trl import TRL_FIELDS, Device, Placement, cpu_placement, native, train_and_save, validate_with_trl

log = logging.getLogger(__name__)

JOB_FILE, RESULT_FILE = "trl_local_job.json", "trl_local_result.json"


def gpu_placement(plan: dict, device: Device) -> Placement:
    """The plan's autocast dtype on this GPU; bf16 becomes fp16 (logged) on a GPU without bf16."""
    import torch

    precision = plan.precision
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        log.warning("plan precision bf16 mapped to fp16: %s has no bf16", torch.cuda.get_device_name())
        precision = "fp16"
    return Placement(device, precision)


def placement(plan: dict, hardware: Hardware) -> Placement:
    device = found_device(hardware)
    return cpu_placement(plan) if device == "cpu" else gpu_placement(plan, device)


def write_job(job: TrainJob, path: Path) -> None:
    path.write_text(json.dumps(job.to_json(), indent=1))


def read_job(path: Path) -> TrainJob:
    return TrainJob.from_json(json.loads(path.read_text()))


class TrlLocal:
    name = "trl_local"
    capabilities = CAPABILITIES[name]
    fields = TRL_FIELDS | {
        "hardware.accelerator": "placement.device",
        "hardware.gpus": "argv",
        "hardware.nodes": "argv",
        "hardware.processes": "argv",
    }

    def check(self, train: Train, hardware: Hardware) -> None:
        if hardware.accelerator == "cpu" and hardware.nodes != 1:
            raise XtrainError(
                "train.backend trl_local runs CPU training on one node: set hardware.nodes: 1 (more CPU processes "
                "with hardware.processes), or train on GPUs"
            )

    def native(self, job: TrainJob) -> dict:
        """The trainer's settings for the recipe's device (bf16 -> fp16 on a GPU without bf16 is decided at run
        time), and the torchrun launch: one worker per device of a node, under srun on several nodes."""
        hardware = job.hardware
        where = (cpu_placement(job.plan) if hardware.accelerator == "cpu"
                 else Placement(hardware.accelerator, job.plan.precision))
        argv = (None if hardware.devices == 1 and hardware.accelerator == "cpu" else
                torchrun_command(backend_python(self.name, "trl"), hardware, self.worker(job.work_dir / JOB_FILE),
                                 slurm_placeholders(hardware)))
        return native(job, where) | {"argv": argv}

    def validate(self, job: TrainJob, native: dict, scratch: Path) -> dict:
        return validate_with_trl(job, native, scratch)

    @staticmethod
    def worker(job_file: Path) -> list[str]:
        return ["-m", __name__, str(job_file)]

    def run(self, job: TrainJob) -> TrainResult:
        hardware = job.hardware
        # Only the device's presence is checked here: this process opens no GPU context, the workers do.
        device = found_device(hardware)
        if device == "cpu":
            where = cpu_placement(job.plan)  # a plan the CPU cannot run stops before any launch
            if hardware.devices == 1:
                return train_and_save(job, where)
        job.work_dir.mkdir(parents=True, exist_ok=True)
        job_file, result_file = job.work_dir / JOB_FILE, job.work_dir / RESULT_FILE
        result_file.unlink(missing_ok=True)
        write_job(job, job_file)
        python = backend_python(self.name, "trl")
        run_command(torchrun_command(python, hardware, self.worker(job_file), dict(os.environ)),
                    env=cpu_threads(hardware) if device == "cpu" else {})
        if not result_file.is_file():
            raise XtrainError(f"the trl_local workers exited without writing {result_file}; see the log above")
        result = json.loads(result_file.read_text())
        return TrainResult(result["log_history"], result["tokens_seen"], result["train_seconds"])


def worker(job_file: Path) -> None:
    """One torchrun worker: train its share; the main process reports the result to the launcher."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    job = read_job(job_file)
    result = train_and_save(job, placement(job.plan, job.hardware))
    if int(os.environ.get("RANK", "0")) == 0:
        (job.work_dir / RESULT_FILE).write_text(json.dumps(
            {"log_history": result.log_history, "tokens_seen": result.tokens_seen,
             "train_seconds": result.train_seconds}
        ))


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
