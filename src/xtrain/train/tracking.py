"""Experiment tracking (`train.report_to`): where each tracker writes, what it reads from the environment, how each
backend's native config names it, and the checks made before any training.

TensorBoard event files go to `runs/<recipe>/tensorboard/<run name>/` (offline; `tensorboard --logdir runs`), W&B's
local files to `runs/<recipe>/wandb/`; both stay when the trainer checkpoints beside them are removed. A run's name
(`run_name`) is one a person can read: the recipe, the run key's first characters, and the recipe fields that differ
from the recipe's run before (`runs/<recipe>/last_run.json`), e.g. `demo-3f9a1c,learning_rate=0.0002`; the trackers
all get it. After training, the run's hyperparameters (every train and hardware field) go to TensorBoard's HParams
with its final loss and tokens/s (`record_hparams`), and evaluate adds its metrics to the same run
(`log_evaluation`), so runs compare side by side there. MLflow logs
to `train.mlflow_tracking_uri` or MLFLOW_TRACKING_URI. Credentials (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, ...) are
read by the trackers from the environment only. Trainers built on transformers use its own reporting integrations
(TensorBoardCallback, MLflowCallback, WandbCallback), configured through the variables `environment` returns;
`xtrain_backend_side.tracking` adds tokens/s and peak memory to what they record.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import XtrainError
from ..recipe import Train

if TYPE_CHECKING:
    from .backends.contract import TrainJob

# runs/<recipe>/<run key>/RUN_NAME: the run's readable name, kept while the run resumes; runs/<recipe>/LAST_RUN: the
# name and settings of the recipe's last run, which the next one's name is told apart from.
RUN_NAME, LAST_RUN = "run_name", "last_run.json"
# What stays in runs/<recipe>/ after a complete run: the trackers' local files.
KEPT = ("tensorboard", "wandb", LAST_RUN)
# Fields named in a run's name, at most (the rest counted), and the metrics the HParams view shows for each run.
NAMED_FIELDS = 3
HPARAM_METRICS = ("train/final_loss", "train/tokens_per_second", "eval/tuned_loss", "eval/loss_improvement",
                  "eval/tuned_exact_match", "eval/reward_accuracy")
# The Python module each tracker needs in the interpreter that trains (pip package of the same name).
MODULES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


def recipe_name(job: TrainJob) -> str:
    """The recipe's name (job.work_dir is runs/<recipe>/<run key>)."""
    return job.work_dir.parent.name


def run_name(job: TrainJob) -> str:
    """The run's name in every tracker, as `start` chose it; before that (a config rendered, not trained), the
    recipe's and the run key's."""
    chosen = job.work_dir / RUN_NAME
    return chosen.read_text(encoding="utf-8").strip() if chosen.is_file() else f"{recipe_name(job)}-{job.work_dir.name[:6]}"


def tensorboard_dir(job: TrainJob) -> Path:
    return job.work_dir.parent / "tensorboard" / run_name(job)


def run_settings(job: TrainJob) -> dict[str, Any]:
    """What makes a run what it is, flat: every train and hardware field (`train.learning_rate`, ...), the base
    model and the data's fingerprint."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        else:
            flat[prefix] = value

    walk("train", job.train.model_dump(mode="json"))
    walk("hardware", job.hardware.model_dump(mode="json"))
    return flat | {"model": str(job.model_dir), "data": job.plan.data.fingerprint}


def differing(now: dict[str, Any], before: dict[str, Any]) -> list[str]:
    """`field=value` for each setting that differs from the run before (the data and model by name only)."""
    changed = [key for key in now if before.get(key) != now[key]]
    shown = [key if key in ("data", "model") else f"{key.split('.', 1)[1]}={now[key]}" for key in changed]
    return [item.replace("/", "∕") for item in shown]  # one folder name, whatever the values hold


def choose_run_name(job: TrainJob) -> str:
    """`recipe-<run key[:6]>`, then the fields that differ from the recipe's last run (none for its first)."""
    last = job.work_dir.parent / LAST_RUN
    before = json.loads(last.read_text(encoding="utf-8"))["settings"] if last.is_file() else None
    changes = differing(run_settings(job), before) if before is not None else []
    if len(changes) > NAMED_FIELDS:
        changes = changes[:NAMED_FIELDS] + [f"{len(changes) - NAMED_FIELDS}_more"]
    return ",".join([f"{recipe_name(job)}-{job.work_dir.name[:6]}", *changes])


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
    """Name the run (a resumed one keeps its name) and remember it as the recipe's last; a run that does not resume
    starts its TensorBoard curves afresh (a restart would draw over the old ones)."""
    chosen = job.work_dir / RUN_NAME
    if not (job.resume_from and chosen.is_file()):
        name = choose_run_name(job)
        job.work_dir.mkdir(parents=True, exist_ok=True)
        chosen.write_text(name + "\n", encoding="utf-8")
        (job.work_dir.parent / LAST_RUN).write_text(json.dumps({"name": name, "settings": run_settings(job)}, indent=1),
                                                    encoding="utf-8")
    if not job.resume_from:
        shutil.rmtree(tensorboard_dir(job), ignore_errors=True)


def _writer(folder: Path):
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(folder))


def record_hparams(job: TrainJob, metrics: dict[str, Any]) -> str | None:
    """With TensorBoard in train.report_to: the run's settings in TensorBoard's HParams view, with the metrics it
    compares runs by (HPARAM_METRICS: training's now, evaluate's when `log_evaluation` adds them). Returns the run's
    folder, which train_metrics.json records for the report and for evaluate."""
    if "tensorboard" not in job.train.report_to:
        return None
    from torch.utils.tensorboard.summary import hparams

    values = {key: value if isinstance(value, int | float | str | bool) else json.dumps(value)
              for key, value in run_settings(job).items()}
    folder = tensorboard_dir(job)
    with contextlib.closing(_writer(folder)) as writer:
        for summary in hparams(values, dict.fromkeys(HPARAM_METRICS, 0.0)):
            writer.file_writer.add_summary(summary)
        for key in ("final_loss", "tokens_per_second"):
            if metrics.get(key) is not None:
                writer.add_scalar(f"train/{key}", metrics[key], metrics["steps"])
    return str(folder)


def log_evaluation(checkpoint_dir: Path, metrics: dict[str, Any]) -> None:
    """Evaluate's metrics (eval.json) added to the TensorBoard folder of the run that trained `checkpoint_dir` (its
    train_metrics.json names it) as `eval/<metric>` at its last step; nothing when it wrote none."""
    recorded = checkpoint_dir / "train_metrics.json"
    train_metrics = json.loads(recorded.read_text(encoding="utf-8")) if recorded.is_file() else {}
    folder = train_metrics.get("tensorboard_run")
    if not folder or not Path(folder).is_dir():
        return
    with contextlib.closing(_writer(Path(folder))) as writer:
        for key, value in metrics.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                writer.add_scalar(f"eval/{key}", value, train_metrics["steps"])


def remove_all_but_tracking(work_dir: Path) -> None:
    """The run is complete: its trainer checkpoints go, the trackers' files stay."""
    for path in work_dir.iterdir() if work_dir.is_dir() else ():
        if path.name not in KEPT:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def axolotl_settings(job: TrainJob) -> dict:
    """Axolotl's own tracker keys (it turns them into transformers' report_to and run name)."""
    report_to, name = job.train.report_to, run_name(job)
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
        loggers["mlflow"] = {"_component_": f"{metric_logging}.MLFlowLogger", "run_name": run_name(job),
                             **({"tracking_uri": job.train.mlflow_tracking_uri} if job.train.mlflow_tracking_uri else {})}
    if "wandb" in report_to:
        loggers["wandb"] = {"_component_": f"{metric_logging}.WandBLogger", "name": run_name(job),
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
        settings |= {"wandb_project": wandb_project(), "wandb_exp_name": run_name(job),
                     "wandb_save_dir": str(job.work_dir.parent.resolve())}
    return settings
