"""Experiment tracking (`train.report_to`): where each backend's native config sends the trackers (rendered only,
nothing trains here), and what stops a run before training. tests/test_train.py reads a real run's TensorBoard
events back."""

from __future__ import annotations

import dataclasses
import json
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
    assert (config["use_mlflow"], config["mlflow_tracking_uri"], config["mlflow_run_name"]) == (True, "file:mlruns",
                                                                                                   "mine-key")
    assert (config["wandb_project"], config["wandb_name"]) == ("xtrain", "mine-key")
    # transformers' TensorBoardCallback under Axolotl writes where the other backends do.
    assert launch["env"]["TENSORBOARD_LOGGING_DIR"] == str((tmp_path / "runs/mine/tensorboard/mine-key").resolve())
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
    assert logger["loggers"]["tensorboard"]["log_dir"] == str((tmp_path / "runs/mine/tensorboard/mine-key").resolve())
    assert logger["loggers"]["mlflow"]["tracking_uri"] == "file:mlruns"
    off = REGISTRY["torchtune"].native(job("torchtune", tiny_model, prepared, tmp_path, report_to=[]))["config"]
    assert list(off["metric_logger"]["loggers"]) == ["disk"], "its losses are read back from the disk log"


def test_primus_writes_tensorboard_and_wandb_and_refuses_mlflow_by_name(tiny_model, prepared, tmp_path):
    train = {"report_to": ["tensorboard", "wandb"]}
    overrides = REGISTRY["primus"].native(job("primus", tiny_model, prepared, tmp_path, ROCM, **train))["config"][
        "modules"]["post_trainer"]["overrides"]
    assert overrides["tensorboard_dir"] == str((tmp_path / "runs/mine/tensorboard/mine-key").resolve())
    assert (overrides["wandb_project"], overrides["wandb_exp_name"]) == ("xtrain", "mine-key")
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


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_runs_are_named_by_recipe_key_and_what_changed_and_carry_hparams_and_evaluation(tiny_model, prepared, tmp_path):
    """The first run is `mine-<key>`; the next names the fields that differ from it, and a resumed run keeps its name;
    after training its settings go to TensorBoard's HParams and evaluate's metrics to the same run."""
    first = job("trl_cpu", tiny_model, prepared, tmp_path)
    tracking.start(first)
    assert tracking.run_name(first) == "mine-key" and tracking.tensorboard_dir(first).name == "mine-key"
    second = job("trl_cpu", tiny_model, prepared, tmp_path, learning_rate=5e-4, lr_scheduler="constant")
    second = dataclasses.replace(second, work_dir=second.work_dir.with_name("9f3a1c0d"))
    tracking.start(second)
    name = "mine-9f3a1c,learning_rate=0.0005,lr_scheduler=constant"
    assert tracking.run_name(second) == name
    assert REGISTRY["trl_cpu"].native(second)["env"]["TENSORBOARD_LOGGING_DIR"].endswith(f"tensorboard/{name}")
    resumed = dataclasses.replace(job("trl_cpu", tiny_model, prepared, tmp_path, learning_rate=3e-4),
                                  work_dir=second.work_dir, resume_from="checkpoint-4")
    tracking.start(resumed)
    assert tracking.run_name(resumed) == name, "a resumed run keeps its name"

    folder = tracking.record_hparams(second, {"final_loss": 1.5, "tokens_per_second": 900.0, "steps": 8})
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "train_metrics.json").write_text(json.dumps({"tensorboard_run": folder, "steps": 8}))
    tracking.log_evaluation(checkpoint, {"tuned_loss": 1.2, "loss_improvement": 0.3, "eval_rows": 40})
    logged = scalars(Path(folder))
    assert logged["train/final_loss"] == [(8, 1.5)] and logged["eval/tuned_loss"] == [(8, pytest.approx(1.2))]
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    session = plugin_data_pb2.HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/session_start_info"]).session_start_info
    assert session.hparams["train.learning_rate"].number_value == 5e-4
    assert session.hparams["train.lr_scheduler"].string_value == "constant"
    tracking.remove_all_but_tracking(tmp_path / "runs" / "mine")
    assert sorted(p.name for p in (tmp_path / "runs" / "mine").iterdir()) == ["last_run.json", "tensorboard"]
