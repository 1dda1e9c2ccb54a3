"""The train stage: run the recipe's backend and write the checkpoint contract.

Every backend ends in the same `checkpoints/<recipe>/`: HF-loadable weights, the tokenizer with its (stock)
chat template, `generation_config.json` that stops at the end of turn, a model card `README.md`,
`train_metrics.json` and `manifest.json`. The folder appears only when complete.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import logging
import os
import resource
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from xtrain_backend_side.prepared import train_split_is_packed

from ..artifacts import atomic_dir, read_json, write_json
from ..data.output import CHAT_TEMPLATE_FILE
from ..errors import XtrainError
from ..models.hub import cached_revision
from ..models.inference_files import base_license, model_card, write_generation_config
from ..plan.peak import train_efficiency
from ..plan.schema import read_plan
from ..recipe import Hardware, Train, content_hash
from . import allocator, tracking
from .backends import registry
from .backends.contract import TrainJob, TrainResult
from .backends.guards import last_complete_checkpoint

log = logging.getLogger(__name__)

LOCK_FILE = "train.lock"
PACKAGES = ("xtrain", "torch", "transformers", "trl", "peft", "datasets", "accelerate")


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit(directory: Path) -> str | None:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None


def train_metrics(result: TrainResult) -> dict[str, Any]:
    losses = [
        {"step": entry["step"], "loss": entry["loss"], "learning_rate": entry.get("learning_rate")}
        for entry in result.log_history
        if "loss" in entry
    ]
    summary = next((entry for entry in reversed(result.log_history) if "train_runtime" in entry), {})
    gpu_peaks = [entry["peak_gpu_memory_mib"] for entry in result.log_history if "peak_gpu_memory_mib" in entry]
    rl = rl_steps(result.log_history)
    return {
        "loss": losses,
        **({"rl": rl} if rl else {}),
        "final_loss": losses[-1]["loss"] if losses else None,
        "steps": result.log_history[-1]["step"] if result.log_history else 0,
        "tokens_seen": result.tokens_seen,
        "tokens_per_second": round(result.tokens_seen / result.train_seconds, 1) if result.train_seconds else None,
        "wall_seconds": round(result.train_seconds, 2),
        "trainer_runtime_seconds": summary.get("train_runtime"),
        # ru_maxrss is KiB on Linux: the peak resident memory of this process, or of the largest process it
        # waited for (a backend that trains in its own environment's interpreter).
        "peak_host_memory_bytes": max(resource.getrusage(who).ru_maxrss
                                      for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) * 1024,
        # torch.cuda.max_memory_allocated of the (main) training process, as its logged steps recorded it; None on
        # the CPU and for backends whose steps do not reach the log history.
        "peak_gpu_memory_bytes": round(max(gpu_peaks) * 2**20) if gpu_peaks else None,
        "allocator": allocator.running(),
    }


# What a GRPO step logs that the report plots: the mean reward (weighted sum), each reward's mean, the KL to the base
# (logged when train.rl.kl_weight is not 0), and the completions' mean length in tokens.
RL_KEYS = ("reward", "reward_std", "kl", "completions/mean_length", "completions/clipped_ratio")


def rl_steps(log_history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each logged GRPO step's rewards, KL and completion length; empty for other objectives."""
    return [{"step": entry["step"], **{key: entry[key] for key in entry
                                       if key in RL_KEYS or (key.startswith("rewards/") and key.endswith("/mean"))}}
            for entry in log_history if "reward" in entry]


def machine_load(at_start: tuple[float, float, float]) -> dict[str, Any]:
    """How busy the machine was while training: its CPUs and the 1/5/15-minute load averages (processes running or
    waiting for a CPU) when training started and ended. Load above the CPU count means other work competed for
    them, which the report gives next to a training time that missed the plan."""
    return {"cpus": os.cpu_count(), "load_average_start": [round(x, 2) for x in at_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()]}


def sort_adapter_targets(checkpoint: Path) -> None:
    """PEFT writes an adapter's target modules in set order, which changes from run to run: sorted, two identical
    runs give identical files."""
    config_file = checkpoint / "adapter_config.json"
    if config_file.is_file():
        config = read_json(config_file)
        if isinstance(config.get("target_modules"), list):
            config["target_modules"] = sorted(config["target_modules"])
            config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def upstream_lineage(upstream: Path | None) -> list[dict[str, Any]]:
    """The stages an upstream checkpoint records (its manifest's lineage); none for a recipe on a model."""
    if upstream is None:
        return []
    manifest = read_json(upstream / "manifest.json")
    if "lineage" not in manifest:
        raise XtrainError(f"{upstream}/manifest.json records no lineage (it was written before chained recipes): "
                          f"remove {upstream} and run snakemake again to rebuild it")
    return manifest["lineage"]


@contextmanager
def one_trainer(work_dir: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on the run folder's lock file (runs/<recipe>/train.lock), which names the holder's
    PID: a second trainer of the same recipe (say after `snakemake --unlock`) would resume from and overwrite the
    live one's trainer checkpoints, so it is refused; the kernel drops the lock of a process that dies."""
    work_dir.mkdir(parents=True, exist_ok=True)
    with (work_dir / LOCK_FILE).open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            raise XtrainError(f"{work_dir} is in use by a trainer that is still running (PID {holder}): wait for it "
                              "to finish, or stop it (Snakemake's --unlock does not)") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield


def run_training(
    *,
    model_dir: Path,
    prepared_dir: Path,
    plan_path: Path,
    train: Train,
    hardware: Hardware,
    out: Path,
    work_dir: Path,
    trust_remote_code: bool = False,
    upstream: Path | None = None,
    adapter_init: Path | None = None,
) -> dict[str, Any]:
    """Train into `out`; `upstream` is the checkpoint of the recipe this one is built on (`model.recipe`), whose
    lineage the manifest extends, and `adapter_init` its adapter when training continues it (`model.adapter:
    continue`)."""
    backend = registry.check(train.backend, train, hardware, packed=train_split_is_packed(prepared_dir))
    if trust_remote_code:
        log.warning("model.trust_remote_code is set: the Python code in %s runs in this process", model_dir)
    with one_trainer(work_dir):  # held for the whole run, released by the kernel if this process dies
        plan = read_plan(plan_path)
        prepared = read_json(prepared_dir / "manifest.json")
        data_fingerprint = prepared["fingerprint"]
        recipe_hash = content_hash({"train": train.model_dump(mode="json"),
                                    "hardware": hardware.model_dump(mode="json")})
        plan_hash = hashlib.sha256(plan_path.read_bytes()).hexdigest()
        stage = {"recipe": out.name, "recipe_hash": recipe_hash, "data_fingerprint": data_fingerprint,
                 "method": train.method, "base_model": str(model_dir)}
        lineage = [*upstream_lineage(upstream), stage]
        # Trainer checkpoints of an interrupted run are resumed only by the very same run (on the same upstream).
        run_dir = work_dir / content_hash([recipe_hash, plan_hash, data_fingerprint, str(model_dir),
                                           *([lineage[:-1]] if upstream else [])])[:16]
        resume_from = last_complete_checkpoint(run_dir)
        if resume_from:
            log.info("resuming an interrupted run from %s", resume_from)
        with atomic_dir(out) as staging:
            job = TrainJob(model_dir, prepared_dir, plan, train, hardware, staging, run_dir, resume_from,
                           trust_remote_code, adapter_init)
            tracking.start(job)
            load_at_start = os.getloadavg()
            result = backend.run(job)
            # Whatever the backend saved, the checkpoint's template is the one the data was rendered with.
            template = prepared_dir / CHAT_TEMPLATE_FILE
            if template.is_file():
                shutil.copyfile(template, staging / CHAT_TEMPLATE_FILE)
            sort_adapter_targets(staging)
            metrics = train_metrics(result) | {"machine": machine_load(load_at_start)}
            # Model FLOPs utilisation, here where every lane's run ends: tokens/s × the plan's FLOPs per token over
            # the device's peak (a CPU's measured once per machine, after training, on the threads it trained with).
            metrics |= train_efficiency(metrics["tokens_per_second"], plan)
            metrics["tensorboard_run"] = tracking.record_hparams(job, metrics)
            write_json(staging / "train_metrics.json", metrics)
            write_generation_config(model_dir, staging, prepared.get("end_of_turn"), trust_remote_code)
            (staging / "README.md").write_text(model_card(
                recipe=out.name, base_model=str(model_dir), backend=train.backend,
                train=train.model_dump(mode="json"), hardware=hardware.model_dump(mode="json"), data=prepared,
                metrics=metrics, license_=base_license(model_dir), lineage=lineage,
            ), encoding="utf-8")
            write_json(
                staging / "manifest.json",
                {
                    "backend": train.backend,
                    "method": train.method,
                    "base_model": str(model_dir),
                    # The commit of a hub model's cached snapshot: a rebuild with the same revision uses the same
                    # weights.
                    "base_model_revision": cached_revision(model_dir),
                    "trust_remote_code": trust_remote_code,
                    # Only the sections that shape training reach this stage; the hash covers them.
                    "recipe_hash": recipe_hash,
                    "recipe_hash_sections": ["train", "hardware"],
                    "data_fingerprint": data_fingerprint,
                    "plan_hash": plan_hash,
                    "packages": package_versions(),
                    "git_commit": git_commit(Path.cwd()),
                    "seed": train.seed,
                    "resumed_from": resume_from,
                    # Each stage from the root model down to this one (model.recipe chains), this one last.
                    "root_model": lineage[0]["base_model"],
                    "lineage": lineage,
                },
            )
        tracking.remove_all_but_tracking(work_dir)  # the checkpoint is complete: nothing left to resume
    log.info("trained %s steps, final loss %s, %s tokens/s, model FLOPs utilisation %s", metrics["steps"],
             metrics["final_loss"], metrics["tokens_per_second"],
             f"{metrics['mfu']:.1%} of {metrics['mfu_peak_source']}" if metrics["mfu"] is not None else "unknown")
    return metrics
