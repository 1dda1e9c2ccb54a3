"""Which rows a run trains on, in the order its backend sends them: the mean length of the rows a plan's steps see.

SFT's unpacked rows go out in transformers' length-grouped order (`get_length_grouped_indices`: TRL's SFTTrainer with
`train_sampling_strategy: group_by_length`, and Axolotl's and Unsloth's trainers with `group_by_length`). Each epoch
the rows are shuffled, cut into megabatches of min(rows // (4 b), 50) × b rows (b: the rows of one optimizer step:
xtrain's TRL lanes group over the global batch, `step_grouped`; the others run one process), and each megabatch is
sorted longest first. A whole megabatch, and so a whole epoch, averages the split's mean length; a run that stops
inside a megabatch (train.max_steps) trains on that megabatch's longest rows. The showcase's full fine-tune (seq_len
1024, 882 rows, 4 a step) stopped at 38 steps trained 1,044 tokens a step where the split's mean gives 815, and took
1.24x the plan that assumed the mean (BENCHMARKS.md, "The rows a short run trains on").

A megabatch is a sample of the split drawn without replacement, so the expected lengths of its first k rows follow
from the split's length histogram (manifest.json's `length_histogram`): each bin's rows at the bin's midpoint (at
most the longest row), rescaled to the split's mean. transformers then swaps the split's longest row to the front of
the epoch, so the first megabatch's longest row is the split's (the row swapped out, now first in another
megabatch, is left out).
"""

from __future__ import annotations

import math

MEGABATCH_STEPS = 50  # transformers' mega_batch_mult: at most 50 steps' rows per megabatch


def megabatch_rows(rows: int, group_rows: int) -> int:
    """Rows per megabatch as transformers sizes it: 50 steps' rows, or fewer so that the split has four."""
    return max(1, min(rows // (4 * group_rows), MEGABATCH_STEPS)) * group_rows


def expected_min(k: int, population: int, marked: int, sample: int) -> float:
    """E[min(k, X)] for X the marked rows in a sample of `sample` rows drawn without replacement from `population`
    rows of which `marked` are marked (hypergeometric)."""
    def log_choose(n: int, r: int) -> float:
        return math.lgamma(n + 1) - math.lgamma(r + 1) - math.lgamma(n - r + 1)

    total = log_choose(population, sample)
    low, high = max(0, sample - (population - marked)), min(marked, sample)
    return sum(min(k, x) * math.exp(log_choose(marked, x) + log_choose(population - marked, sample - x) - total)
               for x in range(low, high + 1))


def top_rows_tokens(histogram: dict, rows: int, mean_len: float, longest: int, k: int, sample: int) -> float:
    """Expected tokens of the k longest rows of a `sample`-row megabatch drawn from a split of `rows` rows whose
    lengths `histogram` counts (in proportion: a sample's histogram serves for its whole split)."""
    bins = length_bins(histogram, mean_len, longest)
    counted = sum(count for _, count in bins)
    tokens, above, taken = 0.0, 0, 0.0
    for length, count in sorted(bins, reverse=True):
        above += count
        # Expected rows among the megabatch's k longest that come from this bin or a longer one.
        through = expected_min(k, rows, round(above / counted * rows), min(sample, rows))
        tokens += (through - taken) * length
        taken = through
    return tokens


def length_bins(histogram: dict, mean_len: float, longest: int) -> list[tuple[float, int]]:
    """(length, rows) of each bin of the histogram that holds rows: its midpoint (at most the longest row), rescaled
    so that the bins average `mean_len`."""
    edges, counts = histogram["bin_edges"], histogram["counts"]
    bins = [(min((low + high) / 2, longest), count) for low, high, count in zip(edges, edges[1:], counts) if count]
    scale = mean_len * sum(count for _, count in bins) / sum(length * count for length, count in bins)
    return [(length * scale, count) for length, count in bins]


def length_shares(histogram: dict, mean_len: float, longest: int, shares: int) -> list[float]:
    """The root-mean-square length of each of `shares` equal shares of the rows, shortest first (the histogram's
    rows rescaled to average `mean_len`). A length-grouped batch is about as long as each of its rows, and attention's
    cost grows with the square of a batch's length: a share of the rows costs about what batches of its
    root-mean-square length would."""
    bins = sorted(length_bins(histogram, mean_len, longest))
    share = sum(count for _, count in bins) / shares
    lengths, rows, squares = [], 0.0, 0.0
    for length, count in bins:
        left = float(count)
        while left > 0:
            taken = min(left, share - rows)
            rows, squares, left = rows + taken, squares + taken * length ** 2, left - taken
            if rows >= share * (1 - 1e-9):
                lengths.append(math.sqrt(squares / rows))
                rows, squares = 0.0, 0.0
    return lengths[:shares]


def trained_mean_length(histogram: dict, rows: int, mean_len: float, longest: int, rows_trained: int,
                        group_rows: int) -> float:
    """The expected mean length of the `rows_trained` rows a length-grouped run trains on (epochs over `rows` rows,
    `group_rows` rows per optimizer step)."""
    into_epoch = rows_trained % rows
    megabatch = megabatch_rows(rows, group_rows)
    into_megabatch = into_epoch % megabatch
    if into_megabatch == 0:
        return mean_len
    # The megabatch the run stops in: a full one, or the epoch's last, shorter one.
    sample = megabatch if into_epoch - into_megabatch + megabatch <= rows else rows % megabatch
    top = top_rows_tokens(histogram, rows, mean_len, longest, into_megabatch, sample)
    if into_epoch < megabatch:  # the epoch's first megabatch: its longest row swapped for the split's longest
        top += longest - top_rows_tokens(histogram, rows, mean_len, longest, 1, sample)
    return ((rows_trained - into_megabatch) * mean_len + top) / rows_trained
