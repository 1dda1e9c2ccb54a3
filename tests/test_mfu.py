"""Model FLOPs utilisation (xtrain.plan.peak): the formula on fixed figures, the CPU peak measured once and then read,
a real training run's train_metrics.json, and the report's row."""

from __future__ import annotations

import json

import pytest
from conftest import build_run, sample_plan

from xtrain.plan import peak
from xtrain.recipe import Train


def test_mfu_is_tokens_per_second_times_flops_per_token_over_the_peak(monkeypatch):
    monkeypatch.setenv("XTRAIN_CPU_PEAK", "bf16=4e11,fp32=1.6e11")
    plan = sample_plan(precision="bf16", time={"flops_per_token": 2_000_000})
    efficiency = peak.train_efficiency(1000.0, plan)
    # 1,000 tokens/s × 2 MFLOP per token = 2 GFLOP/s, over the given bf16 peak of 400 GFLOP/s.
    assert efficiency["mfu"] == 0.005
    assert efficiency["mfu_peak_flops"] == 4e11 and efficiency["mfu_flops_per_token"] == 2_000_000
    assert "XTRAIN_CPU_PEAK" in efficiency["mfu_peak_source"] and "bf16" in efficiency["mfu_peak_source"]
    assert peak.train_efficiency(1000.0, sample_plan(time={"flops_per_token": 2_000_000}))["mfu"] == 0.0125, "fp32"
    assert peak.train_efficiency(None, plan)["mfu"] is None, "no tokens/s, no MFU"


def test_a_gpu_run_is_measured_against_the_datasheet_peak_of_all_its_devices():
    plan = sample_plan(precision="bf16", time={"flops_per_token": 3_000_000_000},
                       memory={"device": "h100"}, layout={"devices": 2, "nodes": 1})
    efficiency = peak.train_efficiency(100_000.0, plan)
    # 1e5 tokens/s × 3e9 FLOPs = 3e14 FLOP/s over 2 × 989 TFLOP/s.
    assert efficiency["mfu_peak_flops"] == 2 * 989e12
    assert efficiency["mfu"] == round(3e14 / (2 * 989e12), 4)
    assert efficiency["mfu_peak_source"] == "datasheet: h100, 989 TFLOP/s dense bf16 × 2 devices"
    fp32 = peak.train_efficiency(100_000.0, sample_plan(memory={"device": "h100"}))
    assert fp32["mfu"] is None and "no fp32 peak" in fp32["mfu_peak_source"]
    unknown = peak.device_peak("a800", "bf16", 1, 1)
    assert unknown == {"flops": None, "source": "no peak for device 'a800' in xtrain.models.gpus"}


def test_a_malformed_fixed_peak_names_the_variable(monkeypatch):
    with pytest.raises(SystemExit, match="XTRAIN_CPU_PEAK='fast'"):
        peak.fixed_peak("fast", "bf16")
    with pytest.raises(SystemExit, match="no figure for bf16"):
        peak.fixed_peak("fp32=1e11", "bf16")


def test_the_cpu_peak_is_measured_once_then_read_from_the_record(monkeypatch, tmp_path):
    monkeypatch.delenv("XTRAIN_CPU_PEAK")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(peak, "PEAK_SIZES", (128, 256))
    monkeypatch.setattr(peak, "PEAK_WINDOW_SECONDS", 0.01)
    first = peak.cached_cpu_peak("fp32", 1)
    assert first["matmul_flops"] > 1e8 and first["size"] in (128, 256)
    record = json.loads((tmp_path / "xtrain" / "cpu-peak.json").read_text())
    assert list(record) == [peak.peak_key("fp32", 1)] and record[peak.peak_key("fp32", 1)]["load_per_core"] >= 0

    def no_measurement(*_):
        raise AssertionError("a recorded peak is read, never measured again")

    monkeypatch.setattr(peak, "matmul_rate", no_measurement)
    assert peak.cached_cpu_peak("fp32", 1) == first


@pytest.mark.slow
def test_a_real_training_run_records_a_plausible_mfu_over_this_cpus_measured_peak(tiny_model, tmp_path, monkeypatch):
    monkeypatch.delenv("XTRAIN_CPU_PEAK")  # the real measurement, into this test's own cache
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    train = Train(method="lora", global_batch_size=4, max_steps=6, learning_rate=5e-3, logging_steps=2)
    run = build_run(tmp_path, tiny_model, train)
    metrics = json.loads((run["checkpoint"] / "train_metrics.json").read_text())
    plan = json.loads(run["plan"].read_text())
    assert 0 < metrics["mfu"] < 1, metrics
    assert metrics["mfu_flops_per_token"] == plan["time"]["flops_per_token"]
    assert metrics["mfu"] == round(metrics["tokens_per_second"] * metrics["mfu_flops_per_token"]
                                   / metrics["mfu_peak_flops"], 4)
    assert metrics["mfu_peak_source"].startswith(f"this CPU's {plan['precision']} matmul peak on ")
    assert (tmp_path / "cache" / "xtrain" / "cpu-peak.json").is_file(), "measured once and recorded"


def test_the_report_shows_mfu_against_the_plans_rate(tmp_path):
    from test_report import written_report

    text = written_report(tmp_path).read_text(encoding="utf-8")
    # written_report's run: 260 tokens/s at the sample plan's flops_per_token, over a peak of 240 GFLOP/s.
    assert "model FLOPs utilisation, of 240 GFLOP/s: this CPU&#x27;s fp32 matmul peak on 2 threads" in text
    # Measured 0.14%; the plan's 268 tokens per 0.0331 s step would have reached 4.47%.
    assert "<td>4.47%</td><td>0.14%</td><td>0.03×</td>" in text
