"""Launching a training program as one process per device: torchrun on one node, `srun` + torchrun with a c10d
rendezvous on several (inside the Slurm allocation the train job runs in). Shared by every backend whose
framework trains under torchrun (trl_local's workers, Axolotl's CLI, torchtune's `tune run`, which takes
torchrun's own options), with the device check before a launch and the decoder blocks FSDP wraps.
"""

from __future__ import annotations

import os
import re

from ...errors import XtrainError
from ...recipe import Hardware
from .contract import TrainJob

RENDEZVOUS_PORT = 29500  # torchrun's default; MASTER_PORT overrides it
TORCHRUN = ("-m", "torch.distributed.run")


def check_nodes(hardware: Hardware, env: dict[str, str]) -> None:
    """Several nodes are reached through the Slurm allocation this job runs in, which must have them."""
    if hardware.nodes == 1:
        return
    if "SLURM_JOB_ID" not in env:
        raise XtrainError(
            f"hardware.nodes is {hardware.nodes}: a multi-node run starts from inside a Slurm allocation of "
            f"{hardware.nodes} nodes (snakemake --profile profiles/slurm); SLURM_JOB_ID is not set here"
        )
    allocated = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 0)
    if allocated != hardware.nodes:
        raise XtrainError(
            f"hardware.nodes is {hardware.nodes} but Slurm job {env['SLURM_JOB_ID']} has {allocated} node(s): "
            "ask for the recipe's node count (the plan's resources.nodes) or change hardware.nodes"
        )


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: `gpu[03-05,09],cpu1` -> `gpu03`."""
    match = re.match(r"([^,\[]+)(?:\[([^\],-]+))?", nodelist.strip())
    if not match:
        raise XtrainError(f"cannot read the Slurm node list {nodelist!r} (SLURM_JOB_NODELIST)")
    return match.group(1) + (match.group(2) or "")


def torchrun_command(python: str, hardware: Hardware, worker: list[str], env: dict[str, str],
                     launcher: tuple[str, ...] = TORCHRUN) -> list[str]:
    """The launch of `worker` (the program and arguments each process runs, e.g. `-m module config`): torchrun
    (or `launcher`, another program that takes torchrun's options, run by `python`) with one process per device
    of a node; on several nodes, under `srun` (one launcher per node) with a c10d rendezvous on the allocation's
    first host."""
    torchrun = [python, *launcher, f"--nproc-per-node={hardware.processes_per_node}"]
    if hardware.nodes == 1:
        return [*torchrun, "--standalone", *worker]  # a free local port: runs side by side do not collide
    check_nodes(hardware, env)
    endpoint = f"{first_host(env['SLURM_JOB_NODELIST'])}:{env.get('MASTER_PORT', RENDEZVOUS_PORT)}"
    srun = [
        "srun", f"--nodes={hardware.nodes}", f"--ntasks={hardware.nodes}", "--ntasks-per-node=1",
        # The Snakemake job itself runs in an `srun -n1` step holding the first node's cores.
        "--overlap", "--kill-on-bad-exit=1",
    ]
    return [
        *srun, *torchrun, f"--nnodes={hardware.nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={env['SLURM_JOB_ID']}", *worker,
    ]


def found_device(hardware: Hardware) -> str:
    """The device kind this machine can train on (cpu, cuda or rocm), checked against what the recipe's
    `hardware` asks for, before any launch."""
    import torch

    if hardware.accelerator == "cpu":
        return "cpu"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", os.environ.get("HIP_VISIBLE_DEVICES", "unset"))
    if not torch.cuda.is_available():
        build = f"ROCm {torch.version.hip}" if torch.version.hip else (
            f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU only")
        raise XtrainError(
            f"hardware.accelerator is {hardware.accelerator!r} but torch {torch.__version__} ({build} build) sees no "
            f"GPU here (CUDA_VISIBLE_DEVICES={visible}): run on a {hardware.accelerator} GPU node, or set "
            "hardware.accelerator: cpu and gpus: 0"
        )
    kind = "rocm" if torch.version.hip else "cuda"
    if kind != hardware.accelerator:
        raise XtrainError(
            f"hardware.accelerator is {hardware.accelerator!r} but this machine's GPUs are {kind} "
            f"(torch {torch.__version__}): set hardware.accelerator: {kind}, or run on a {hardware.accelerator} node"
        )
    count = torch.cuda.device_count()
    if count < hardware.gpus:
        raise XtrainError(
            f"hardware.gpus is {hardware.gpus} per node but {count} {kind} GPU(s) are visible here "
            f"(CUDA_VISIBLE_DEVICES={visible}): set hardware.gpus: {count}, or ask the scheduler for {hardware.gpus}"
        )
    return kind


def slurm_placeholders(hardware: Hardware) -> dict[str, str]:
    """The Slurm variables a multi-node launch reads, as the shell names them: for rendering the launch of a
    job that has not been allocated yet (a backend's `native`)."""
    if hardware.nodes == 1:
        return {}
    return {"SLURM_JOB_ID": "$SLURM_JOB_ID", "SLURM_JOB_NUM_NODES": str(hardware.nodes),
            "SLURM_JOB_NODELIST": "$SLURM_JOB_NODELIST"}


def cpu_threads(hardware: Hardware) -> dict[str, str]:
    """torchrun gives each CPU worker one thread; the processes share the job's cores instead."""
    return {"OMP_NUM_THREADS": str(max(1, len(os.sched_getaffinity(0)) // hardware.processes))}


def decoder_blocks(job: TrainJob) -> list[str]:
    """The model's decoder block classes (FSDP's wrapping units), from a copy built on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(job.model_dir, trust_remote_code=job.trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=job.trust_remote_code)
    return list(model._no_split_modules or [])
