"""Experiment tracking (`train.report_to`): where each backend's native config sends the trackers (rendered only,
nothing trains here), and what stops a run before training. tests/test_train.py reads a real run's TensorBoard
events back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import sample_plan
from pydantic import ValidationError

from xtrain.errors import XtrainError
from xtrain.recipe import Hardware, Train
from xtrain.train import tracking
from xtrain.train.backends import registry as backends
from xtrain.train.backends.capabilities import refusal
from xtrain.train.backends.contract import TrainJob
from xtrain.train.backends.registry import REGISTRY

EVERY_TRACKER = {"report_to": ["tensorboard", "mlflow", "wandb"], "mlflow_tracking_uri": "file:mlruns"}
ROCM = Hardware(accelerator="rocm", gpus=8)


def job(backend: str, model: Path, prepared: Path, tmp_path: Path, hardware: Hardware = Hardware(), **train) -> TrainJob:
    """A job of recipe `mine` whose trainer checkpoints would go to runs/mine/key."""
    return TrainJob(model, prepared, sample_plan(time={"steps": 8}), Train(backend=backend, global_batch_size=8, **train),
                    hardware, tmp_path / "out", tmp_path / "runs" / "mine" / "key", None)


def test_axolotl_names_each_tracker_with_its_own_keys(tiny_model, prepared, tmp_path):
    launch = REGISTRY["axolotl"].native(job("axolotl", tiny_model, prepared, tmp_path, **EVERY_TRACKER))
    config = launch["config"]
    assert config["use_tensorboard"] is True
    assert (config["use_mlflow"], config["mlflow_tracking_uri"], config["mlflow_run_name"]) == (True, "file:mlruns", "mine")
    assert (config["wandb_project"], config["wandb_name"]) == ("xtrain", "mine")
    # transformers' TensorBoardCallback under Axolotl writes where the other backends do.
    assert launch["env"]["TENSORBOARD_LOGGING_DIR"] == str((tmp_path / "runs/mine/tensorboard/key").resolve())
    off = REGISTRY["axolotl"].native(job("axolotl", tiny_model, prepared, tmp_path, report_to="none"))
    assert off["config"]["use_tensorboard"] is False and not {"use_mlflow", "wandb_project"} & set(off["config"])
    assert "TENSORBOARD_LOGGING_DIR" not in off["env"]


def test_torchtune_logs_to_disk_and_to_each_tracker(tiny_model, prepared, tmp_path):
    config = REGISTRY["torchtune"].native(job("torchtune", tiny_model, prepared, tmp_path, **EVERY_TRACKER))["config"]
    logger = config["metric_logger"]
    assert logger["_component_"] == "xtrain_backend_side.tracking.TorchtuneLoggers"
    components = {name: settings["_component_"].rsplit(".", 1)[1] for name, settings in logger["loggers"].items()}
    assert components == {"disk": "DiskLogger", "tensorboard": "TensorBoardLogger", "mlflow": "MLFlowLogger",
                          "wandb": "WandBLogger"}
    assert logger["loggers"]["tensorboard"]["log_dir"] == str((tmp_path / "runs/mine/tensorboard/key").resolve())
    assert logger["loggers"]["mlflow"]["tracking_uri"] == "file:mlruns"
    off = REGISTRY["torchtune"].native(job("torchtune", tiny_model, prepared, tmp_path, report_to=[]))["config"]
    assert list(off["metric_logger"]["loggers"]) == ["disk"], "its losses are read back from the disk log"


def test_primus_writes_tensorboard_and_wandb_and_refuses_mlflow_by_name(tiny_model, prepared, tmp_path):
    train = {"report_to": ["tensorboard", "wandb"]}
    overrides = REGISTRY["primus"].native(job("primus", tiny_model, prepared, tmp_path, ROCM, **train))["config"][
        "modules"]["post_trainer"]["overrides"]
    assert overrides["tensorboard_dir"] == str((tmp_path / "runs/mine/tensorboard/key").resolve())
    assert (overrides["wandb_project"], overrides["wandb_exp_name"]) == ("xtrain", "mine")
    reason = refusal("primus", REGISTRY["primus"].capabilities, Train(backend="primus", **EVERY_TRACKER), ROCM, False)
    assert "cannot report to mlflow (train.report_to)" in reason and "remove mlflow from train.report_to" in reason


def test_mlflow_without_a_tracking_uri_is_refused_before_any_job(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(XtrainError, match="set train.mlflow_tracking_uri .* or MLFLOW_TRACKING_URI"):
        backends.check("trl_cpu", Train(report_to=["mlflow"]), Hardware())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:mlruns")
    backends.check("trl_cpu", Train(report_to=["mlflow"]), Hardware())


def test_a_tracker_missing_from_the_training_environment_stops_before_training_naming_its_package():
    tracking.require_packages(Train())  # tensorboard is pinned in every environment
    train = Train(report_to=["tensorboard", "wandb"])
    with pytest.raises(XtrainError, match=r"names wandb, which is not installed .* -m pip install wandb"):
        tracking.require_packages(train)
    # Another environment's interpreter (a backend's own) is asked in a subprocess.
    other = str(Path(sys.executable).parent / "." / Path(sys.executable).name)
    with pytest.raises(XtrainError, match=r"add it to envs/axolotl\.yaml and run `make lock`"):
        tracking.require_packages(train, other, "envs/axolotl.yaml")


def test_report_to_none_goes_alone_and_mlflow_credentials_stay_out_of_the_recipe():
    assert Train(report_to="none").report_to == [] and Train().report_to == ["tensorboard"]
    with pytest.raises(ValidationError, match="goes alone"):
        Train(report_to=["none", "tensorboard"])
    with pytest.raises(ValidationError, match="MLFLOW_TRACKING_USERNAME"):
        Train(report_to=["mlflow"], mlflow_tracking_uri="https://me:secret@mlflow.example.org")
    with pytest.raises(ValidationError, match="add mlflow to report_to or remove mlflow_tracking_uri"):
        Train(mlflow_tracking_uri="file:mlruns")
