"""bench/gpu_check.py: what its table says of a stage's memory, a row for every backend, and the CPU dry run of the
demo through every stage of the DAG. The GPU runs themselves are on the GPU machine (bench/gpu_check.sh;
BENCHMARKS.md), not in the suite."""

from __future__ import annotations

import argparse
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import gpu_check  # noqa: E402

from xtrain.train.backends.registry import REGISTRY  # noqa: E402

GIB = 2**30


def test_a_prediction_within_ten_percent_passes_and_one_outside_fails_the_check():
    assert gpu_check.memory_cells(int(10.5 * GIB), 10 * GIB) == {
        "predicted": "10.50", "measured": "10.00", "ratio": "1.05 (+5.0%)", "failed": False}
    over = gpu_check.memory_cells(12 * GIB, 10 * GIB)
    assert over["ratio"] == "1.20 (+20.0%, outside ±10%)" and over["failed"]
    assert gpu_check.memory_cells(8 * GIB, 10 * GIB)["failed"], "under-predicting fails too"
    assert gpu_check.memory_cells(GIB, None) == {"predicted": "1.00", "measured": "n/a (no GPU)", "ratio": "-",
                                                 "failed": False}


def test_host_memory_is_an_upper_bound_that_fails_only_below_the_measured_peak():
    assert not gpu_check.memory_cells(12 * GIB, 10 * GIB, upper_bound=True)["failed"]
    under = gpu_check.memory_cells(9 * GIB, 10 * GIB, upper_bound=True)
    assert under["ratio"] == "0.90 (-10.0%, under the measured)" and under["failed"]


def test_every_backend_is_run_or_listed_with_why_not():
    rows = gpu_check.not_run_rows()
    assert {row.where for row in rows} | {"trl_local"} == set(REGISTRY)
    assert all(row.run.startswith("not run: ") and not row.failed for row in rows)


def test_a_row_stays_one_table_row_whatever_its_error_says():
    row = gpu_check.Row("demo", "train", result="failed: a | b\nc", failed=True)
    assert row.markdown() == "| demo | train | - | - | - | - | - | - | - | - | - | failed: a / b c |"
    assert row.markdown().count("|") == gpu_check.HEADER.splitlines()[0].count("|")


@pytest.mark.slow
def test_the_cpu_dry_run_takes_the_demo_through_every_stage_against_its_plans(tiny_model, tmp_path):
    recipe = gpu_check.demo_recipe(argparse.Namespace(device="cpu", steps=2))
    rows = list(gpu_check.DagRun("demo", recipe, tiny_model, tmp_path / "demo").rows())
    assert [row.stage for row in rows] == ["prepare", "plan", "train", "evaluate", "export"], rows[-1].result
    assert not any(row.failed for row in rows), [row.markdown() for row in rows]
    train, evaluate, export = rows[2:]
    assert train.result == "ok: contract, 2 steps"
    share, peak = train.mfu.split("% of ")
    assert 0 < float(share) < 100 and peak == "0.24 TFLOP/s", train.mfu  # over conftest's XTRAIN_CPU_PEAK
    assert evaluate.where == "cpu, fp32, batch 8" and evaluate.measured == "n/a (no GPU)"
    assert export.memory == "host RSS" and float(export.measured) > 0 and float(export.predicted_seconds) >= 0
    assert (tmp_path / "demo" / "exports" / "demo" / "demo-q8_0.gguf").is_file()
