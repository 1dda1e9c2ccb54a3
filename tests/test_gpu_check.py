"""bench/gpu_check.py's pure parts: what its table says of a GPU run's memory, and a row for every backend. The
check itself runs on the GPU machine (bench/gpu_check.sh; BENCHMARKS.md), or with --device cpu, not in the suite."""

from __future__ import annotations

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import gpu_check  # noqa: E402

from xtrain.train.backends.registry import REGISTRY  # noqa: E402

GIB = 2**30


def test_a_prediction_within_ten_percent_passes_and_one_outside_fails_the_check():
    assert gpu_check.memory_cells(int(10.5 * GIB), 10 * GIB) == {
        "predicted": "10.50", "measured": "10.00", "ratio": "1.05", "failed": False}
    over = gpu_check.memory_cells(12 * GIB, 10 * GIB)
    assert over["ratio"] == "1.20 (outside ±10%)" and over["failed"]
    assert gpu_check.memory_cells(8 * GIB, 10 * GIB)["failed"], "under-predicting fails too"
    assert gpu_check.memory_cells(GIB, None) == {"predicted": "1.00", "measured": "n/a (no GPU)", "ratio": "-"}


def test_every_backend_is_run_or_listed_with_why_not():
    rows = gpu_check.not_run_rows()
    assert {row.backend for row in rows} | {"trl_local"} == set(REGISTRY)
    assert all(row.run.startswith("not run: ") and not row.failed for row in rows)


def test_a_row_stays_one_table_row_whatever_its_error_says():
    row = gpu_check.Row("demo", "trl_local", contract="failed: a | b\nc", failed=True)
    assert row.markdown() == "| demo | trl_local | - | - | - | - | - | - | failed: a / b c |"
