"""A stage runs on the threads Snakemake gives its job."""

from __future__ import annotations

import os

import torch

from xtrain.stage import use_threads


def test_a_jobs_threads_reach_torch_and_the_tokenizer(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for variable in ("MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
        monkeypatch.setenv(variable, "")
    before = torch.get_num_threads()
    try:
        assert use_threads(1) == 1
        assert torch.get_num_threads() == 1
        assert os.environ["RAYON_NUM_THREADS"] == os.environ["OMP_NUM_THREADS"] == "1"
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a smaller limit set by whoever started the workflow holds
        assert use_threads(2) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
