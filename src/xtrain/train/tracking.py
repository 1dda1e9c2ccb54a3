"""Experiment tracking (`train.report_to`): where each tracker writes, what it reads from the environment, how each
backend's native config names it, and the checks made before any training.

TensorBoard event files go to `runs/<recipe>/tensorboard/<run key>/` (offline; `tensorboard --logdir runs`), W&B's
local files to `runs/<recipe>/wandb/`; both stay when the trainer checkpoints beside them are removed. MLflow logs
to `train.mlflow_tracking_uri` or MLFLOW_TRACKING_URI. Credentials (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, ...) are
read by the trackers from the environment only. Trainers built on transformers use its own reporting integrations
(TensorBoardCallback, MLflowCallback, WandbCallback), configured through the variables `environment` returns;
`xtrain_backend_side.tracking` adds tokens/s and peak memory to what they record.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import XtrainError
from ..recipe import Train

if TYPE_CHECKING:
    from .backends.contract import TrainJob

# What stays in runs/<recipe>/ after a complete run: the trackers' local files.
KEPT = ("tensorboard", "wandb")
# The Python module each tracker needs in the interpreter that trains (pip package of the same name).
MODULES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


def recipe_name(job: TrainJob) -> str:
    """The run's name in the trackers: the recipe's (job.work_dir is runs/<recipe>/<run key>)."""
    return job.work_dir.parent.name


def tensorboard_dir(job: TrainJob) -> Path:
    return job.work_dir.parent / "tensorboard" / job.work_dir.name


def environment(job: TrainJob) -> dict[str, str]:
    """The variables the trackers of `train.report_to` read (transformers' integrations, and Axolotl's and torchtune's
    through them or their own): TensorBoard's folder, MLflow's URI when the recipe gives one, W&B's folder and
    project (WANDB_PROJECT, default xtrain)."""
    report_to, env = job.train.report_to, {}
    if "tensorboard" in report_to:
        env["TENSORBOARD_LOGGING_DIR"] = str(tensorboard_dir(job).resolve())
    if "mlflow" in report_to and job.train.mlflow_tracking_uri:
        env["MLFLOW_TRACKING_URI"] = job.train.mlflow_tracking_uri
    if "wandb" in report_to:
        env |= {"WANDB_DIR": str(job.work_dir.parent.resolve()), "WANDB_PROJECT": wandb_project()}
    return env


def wandb_project() -> str:
    return os.environ.get("WANDB_PROJECT", "xtrain")


@contextlib.contextmanager
def environment_set(env: dict[str, str]):
    """`env` in this process's environment while training here, then as it was."""
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def check(train: Train) -> None:
    """What the recipe and the environment must give before any job: MLflow's tracking URI."""
    if "mlflow" in train.report_to and not (train.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")):
        raise XtrainError(
            "train.report_to names mlflow but no tracking URI is given: set train.mlflow_tracking_uri (a local store "
            "such as file:mlruns, or a server such as https://mlflow.example.org) or MLFLOW_TRACKING_URI in the "
            "environment"
        )


def require_packages(train: Train, python: str = sys.executable, env_name: str = "envs/xtrain.yaml") -> None:
    """Stop before training when a tracker's package is missing from the interpreter that trains, naming it."""
    modules = [MODULES[tracker] for tracker in train.report_to]
    if python == sys.executable:
        missing = [module for module in modules if importlib.util.find_spec(module) is None]
    else:
        probe = "import importlib.util, sys; print(*[m for m in sys.argv[1:] if importlib.util.find_spec(m) is None])"
        missing = subprocess.run([python, "-c", probe, *modules], capture_output=True, text=True,
                                 check=True).stdout.split()
    if missing:
        raise XtrainError(
            f"train.report_to names {', '.join(missing)}, which is not installed in the environment that trains "
            f"({python}): install it there (`{python} -m pip install {' '.join(missing)}`, or add it to {env_name} "
            "and run `make lock`), or remove it from train.report_to"
        )


def start(job: TrainJob) -> None:
    """A run that does not resume starts its TensorBoard curves afresh (a restart would draw over the old ones)."""
    if not job.resume_from:
        shutil.rmtree(tensorboard_dir(job), ignore_errors=True)


def remove_all_but_tracking(work_dir: Path) -> None:
    """The run is complete: its trainer checkpoints go, the trackers' files stay."""
    for path in work_dir.iterdir() if work_dir.is_dir() else ():
        if path.name not in KEPT:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def axolotl_settings(job: TrainJob) -> dict:
    """Axolotl's own tracker keys (it turns them into transformers' report_to and run name)."""
    report_to, name = job.train.report_to, recipe_name(job)
    settings = {"use_tensorboard": "tensorboard" in report_to}
    if "mlflow" in report_to:
        settings |= {"use_mlflow": True, "mlflow_run_name": name}
        if job.train.mlflow_tracking_uri:
            settings["mlflow_tracking_uri"] = job.train.mlflow_tracking_uri
    if "wandb" in report_to:
        settings |= {"wandb_project": wandb_project(), "wandb_name": name}
    return settings


def torchtune_logger(job: TrainJob, disk_dir: Path) -> dict:
    """torchtune's metric_logger: its DiskLogger (the losses xtrain reads back) and a logger per tracker, through
    `xtrain_backend_side.tracking.TorchtuneLoggers`."""
    metric_logging, report_to = "torchtune.training.metric_logging", job.train.report_to
    loggers = {"disk": {"_component_": f"{metric_logging}.DiskLogger", "log_dir": str(disk_dir)}}
    if "tensorboard" in report_to:
        loggers["tensorboard"] = {"_component_": f"{metric_logging}.TensorBoardLogger",
                                  "log_dir": str(tensorboard_dir(job).resolve()), "organize_logs": False}
    if "mlflow" in report_to:
        loggers["mlflow"] = {"_component_": f"{metric_logging}.MLFlowLogger", "run_name": recipe_name(job),
                             **({"tracking_uri": job.train.mlflow_tracking_uri} if job.train.mlflow_tracking_uri else {})}
    if "wandb" in report_to:
        loggers["wandb"] = {"_component_": f"{metric_logging}.WandBLogger", "name": recipe_name(job),
                            "project": wandb_project(),
                            "log_dir": str(job.work_dir.parent.resolve())}
    return {"_component_": "xtrain_backend_side.tracking.TorchtuneLoggers", "loggers": loggers}


def megatron_settings(job: TrainJob) -> dict:
    """Megatron Bridge's logger settings (Primus overrides): TensorBoard's folder, W&B's project and folder. Megatron
    has no MLflow logger: the backend's capabilities refuse it."""
    report_to, settings = job.train.report_to, {}
    if "tensorboard" in report_to:
        settings["tensorboard_dir"] = str(tensorboard_dir(job).resolve())
    if "wandb" in report_to:
        settings |= {"wandb_project": wandb_project(), "wandb_exp_name": recipe_name(job),
                     "wandb_save_dir": str(job.work_dir.parent.resolve())}
    return settings
