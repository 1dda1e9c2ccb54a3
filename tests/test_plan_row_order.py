"""The rows a run's steps train on (xtrain.plan.row_order): a run stopped inside a length-grouped megabatch trains on
its longest rows, and the plan's time counts them."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from test_plan import manifest
from transformers.trainer_pt_utils import get_length_grouped_indices

from xtrain.plan import make_plan
from xtrain.plan.row_order import megabatch_rows, trained_mean_length
from xtrain.recipe import Hardware, Train

SEQ_LEN = 1024


def skewed_lengths(rows: int = 882) -> list[int]:
    """Chat rows as instruction data has them: most short, a long tail (the showcase's alpaca split: mean 204)."""
    generator = random.Random(0)
    return [min(SEQ_LEN, max(8, round(generator.lognormvariate(5.0, 0.7)))) for _ in range(rows)]


def histogram(lengths: list[int]) -> dict:
    """The split's length histogram as prepare writes it: 16 bins over 0..seq_len."""
    counts, edges = np.histogram(lengths, bins=16, range=(0, SEQ_LEN))
    return {"bin_edges": [int(edge) for edge in edges], "counts": [int(count) for count in counts]}


def sampled_mean_length(lengths: list[int], rows_trained: int, group_rows: int, draws: int = 300) -> float:
    """The mean length of the first `rows_trained` rows in transformers' own length-grouped order, over many seeds."""
    means = []
    for seed in range(draws):
        order = get_length_grouped_indices(lengths, group_rows, generator=torch.Generator().manual_seed(seed))
        means.append(np.mean([lengths[i] for i in order[:rows_trained]]))
    return float(np.mean(means))


@pytest.mark.parametrize(("steps", "group_rows"), [(1, 4), (10, 4), (38, 4), (60, 4), (3, 16), (12, 16)])
def test_the_expected_length_matches_transformers_own_order(steps, group_rows):
    lengths = skewed_lengths()
    mean = float(np.mean(lengths))
    expected = trained_mean_length(histogram(lengths), len(lengths), mean, max(lengths), steps * group_rows, group_rows)
    sampled = sampled_mean_length(lengths, steps * group_rows, group_rows)
    assert expected == pytest.approx(sampled, rel=0.04)
    assert expected > mean * 1.05 or steps * group_rows % megabatch_rows(len(lengths), group_rows) == 0


def test_whole_megabatches_and_whole_epochs_average_the_splits_mean():
    lengths = skewed_lengths()
    mean, rows = float(np.mean(lengths)), len(lengths)
    assert megabatch_rows(rows, 4) == 200  # 50 steps of 4 rows
    for rows_trained in (200, 800, rows, 3 * rows):
        assert trained_mean_length(histogram(lengths), rows, mean, max(lengths), rows_trained, 4) == mean


def skewed_manifest(packing: bool = False) -> dict:
    lengths = skewed_lengths()
    data = manifest(rows=len(lengths), mean_len=round(np.mean(lengths)), seq_len=SEQ_LEN)
    data["splits"]["train"] |= {"length_histogram": histogram(lengths), "max_len": max(lengths)}
    return data | {"packing": packing}


def test_a_short_run_is_planned_on_the_longest_rows_of_its_megabatch(tiny_model):
    """A run of 10 steps of 4 length-grouped rows trains on the longest fifth of its megabatch: more tokens a step
    and more seconds a step than the split's mean gives; a whole epoch, packed rows, DPO's shuffled pairs and
    torchtune's sampler train at the split's mean."""
    data = skewed_manifest()
    mean = data["splits"]["train"]["tokens"] / data["splits"]["train"]["rows"]
    short = make_plan(tiny_model, data, Train(max_steps=10, global_batch_size=4), Hardware())
    epoch = make_plan(tiny_model, data, Train(epochs=1, global_batch_size=4), Hardware())
    assert short.time.tokens_per_step > 1.5 * 4 * mean
    assert epoch.time.tokens_per_step == round(4 * mean)
    assert short.time.seconds_per_step > epoch.time.seconds_per_step
    torchtune = make_plan(tiny_model, data, Train(max_steps=10, global_batch_size=4, backend="torchtune"),
                          Hardware())
    assert torchtune.time.tokens_per_step == round(4 * mean)


def test_a_samples_histogram_serves_for_its_whole_split():
    """The smoke plans the full data from a sample's histogram (its counts, the full split's rows): the counts are
    read in proportion, so ten times the counts give the same lengths."""
    lengths = skewed_lengths()
    mean, rows, counts = float(np.mean(lengths)), len(lengths), histogram(lengths)
    tenfold = counts | {"counts": [10 * count for count in counts["counts"]]}
    for rows_trained in (4, 40, 152):
        assert trained_mean_length(tenfold, rows, mean, max(lengths), rows_trained, 4) == pytest.approx(
            trained_mean_length(counts, rows, mean, max(lengths), rows_trained, 4), rel=1e-3)
