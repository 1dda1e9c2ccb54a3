"""The axolotl backend: its translation checked by Axolotl's own config loader, its refusals, and a real run."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml
from backend_runs import ensure_backend_env, train_tiny_recipe_with_backend, trl_cpu_reference  # noqa: F401 (a fixture)
from backend_runs import tiny_train as backend_train
from conftest import HANG_SECONDS, REPO, sample_plan

from xtrain import backends
from xtrain.backends import TrainJob
from xtrain.backends.axolotl import OFFLINE, axolotl_config, cpu_precision, export_tokens
from xtrain.errors import XtrainError
from xtrain.plan import Plan
from xtrain.recipe import Hardware, Lora, Train

PYTHON = str(REPO / ".venvs" / "axolotl" / "bin" / "python")
# Axolotl's loader (the one `axolotl train` uses) on each config given: it validates against its pydantic schema
# and normalises; one process for all of them, as importing Axolotl takes seconds.
LOAD = """
import json, sys, yaml
from axolotl.cli.config import load_cfg
from axolotl.utils.schemas.config import AxolotlInputConfig
for path in sys.argv[1:]:
    raw = yaml.safe_load(open(path))
    cfg = load_cfg(path)
    print("CONFIG " + json.dumps({"unknown": sorted(set(raw) - set(AxolotlInputConfig.model_fields)),
                                  "cfg": {key: cfg.get(key) for key in raw}}, default=str))
"""


def tiny_train(**changes) -> Train:
    return backend_train("axolotl", **changes)


def plan(**changes) -> Plan:
    return sample_plan(**{"precision": "fp32", "gradient_checkpointing": False, "data": {"seq_len": 128},
                          "layout": {"micro_batch_size": 2, "gradient_accumulation_steps": 2},
                          "time": {"steps": 40, "seconds_per_step": 30.0}, **changes})


def job(tmp_path, train, plan_, model=None) -> TrainJob:
    return TrainJob(model or tmp_path / "model", tmp_path / "prepared", plan_, train, Hardware(), tmp_path / "out",
                    tmp_path / "work", None)


@pytest.mark.parametrize("accelerator, gpus", [("cuda", 1), ("rocm", 8)])
def test_a_gpu_recipe_is_refused_before_launch(accelerator, gpus):
    with pytest.raises(XtrainError, match=f"runs on hardware.accelerator cpu, not '{accelerator}'"):
        backends.check("axolotl", tiny_train(), Hardware(accelerator=accelerator, gpus=gpus))


def test_packed_data_is_refused_with_the_field_to_change():
    with pytest.raises(XtrainError, match="set data.packing: false"):
        backends.check("axolotl", tiny_train(), Hardware(), packed=True)


def test_export_keeps_the_prepared_tokens_and_masks_the_unsupervised_ones(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "prepared").mkdir()
    pq.write_table(pa.table({"input_ids": [[5, 6, 7, 8], [9, 10]], "assistant_masks": [[0, 0, 1, 1], [1, 0]]}),
                   tmp_path / "prepared" / "train.parquet")
    assert export_tokens(tmp_path / "prepared", tmp_path / "train.parquet") == 2
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert rows == [
        {"input_ids": [5, 6, 7, 8], "attention_mask": [1, 1, 1, 1], "labels": [-100, -100, 7, 8]},
        {"input_ids": [9, 10], "attention_mask": [1, 1], "labels": [9, -100]},
    ]


def test_checkpoint_minutes_becomes_the_steps_the_plan_predicts_for_them(tmp_path):
    config = axolotl_config(job(tmp_path, tiny_train(checkpoint_minutes=2), plan()), tmp_path / "d.parquet")
    assert config["save_steps"] == 4  # 120 s / 30 s per step, sooner than a quarter of 40 steps
    config = axolotl_config(job(tmp_path, tiny_train(checkpoint_minutes=60), plan()), tmp_path / "d.parquet")
    assert config["save_steps"] == 10  # a quarter of the run


def test_a_bf16_plan_trains_in_fp32_and_says_so(tmp_path, caplog):
    config = axolotl_config(job(tmp_path, tiny_train(), plan(precision="bf16")), tmp_path / "d.parquet")
    assert config["bf16"] is False and config["fp16"] is False
    cpu_precision(plan(precision="bf16"))
    assert "the plan's bf16 autocast -> fp32" in caplog.text
    with pytest.raises(XtrainError, match="plan precision 'fp16' cannot run on the CPU"):
        cpu_precision(plan(precision="fp16"))


@pytest.mark.slow
def test_axolotls_loader_accepts_the_translation_and_reads_every_field_as_meant(tiny_model, tmp_path):
    ensure_backend_env("axolotl")
    trains = [
        tiny_train(lr_scheduler="linear", warmup_ratio=0.1, weight_decay=0.01, max_grad_norm=0.5, seed=3,
                   lora=Lora(r=4, alpha=8, dropout=0.1, target_modules=["q_proj", "v_proj"])),
        tiny_train(method="full", max_steps=None, epochs=2, lr_scheduler="constant"),
        tiny_train(lora=Lora(target_modules=["all-linear"])),
        # Every tracker: Axolotl's own keys for each (xtrain.tracking.axolotl_settings).
        tiny_train(report_to=["tensorboard", "mlflow", "wandb"], mlflow_tracking_uri="file:mlruns"),
    ]
    configs, paths = [], []
    for index, train in enumerate(trains):
        configs.append(axolotl_config(job(tmp_path, train, plan(precision="bf16", gradient_checkpointing=True),
                                          model=tiny_model), tmp_path / "d.parquet"))
        paths.append(tmp_path / f"axolotl-{index}.yaml")
        paths[-1].write_text(yaml.safe_dump(configs[-1]))
    loaded = subprocess.run([PYTHON, "-c", LOAD, *map(str, paths)], capture_output=True, text=True, timeout=HANG_SECONDS,
                            cwd=tmp_path, env={**os.environ, **OFFLINE})
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    reports = [json.loads(line[7:]) for line in loaded.stdout.splitlines() if line.startswith("CONFIG ")]
    assert len(reports) == len(trains)
    for train, config, report in zip(trains, configs, reports):
        assert report["unknown"] == [], "every key is one Axolotl's schema knows (none silently ignored)"
        cfg = report["cfg"]
        for key in ("micro_batch_size", "gradient_accumulation_steps", "learning_rate", "weight_decay",
                    "max_grad_norm", "seed", "sequence_len", "bf16", "gradient_checkpointing", "save_steps", "lora_r",
                    "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_linear", "max_steps",
                    "warmup_ratio", "use_tensorboard", "use_mlflow", "mlflow_tracking_uri", "wandb_project"):
            if key in config:
                assert cfg[key] == config[key], key
        assert cfg["num_epochs"] == train.epochs
        assert cfg["lr_scheduler"] == train.lr_scheduler
        assert cfg["optimizer"] == "adamw_torch"
        assert (cfg.get("adapter") == "lora") == (train.method == "lora")


@pytest.mark.slow
def test_axolotl_trains_the_tiny_recipe_like_trl_cpu(trl_cpu_reference, tiny_model, tmp_path, monkeypatch):
    # Same prepared tokens and labels in the same order (Axolotl's own shuffle is off), the same seed and the same
    # length-grouped sampler (Axolotl's trainer is transformers' Trainer): step 1's loss was seen equal to 5
    # digits, 6.98145, on 2026-12-02; with Axolotl's shuffle on it was 6.97258, another batch.
    train_tiny_recipe_with_backend("axolotl", trl_cpu_reference, tiny_model, tmp_path, monkeypatch)
