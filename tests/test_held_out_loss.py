"""The held-out loss (xtrain.evaluate.loss): each row's summed next-token NLL over its supervised positions, scored
a few positions at a time, is the NLL a plain cross-entropy over the whole sequence gives."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from xtrain.evaluate import loss
from xtrain.models.loading import load_model


def test_row_nll_scored_in_chunks_is_the_whole_sequences_cross_entropy(tiny_model, monkeypatch):
    model = load_model(tiny_model)
    generator = torch.Generator().manual_seed(0)
    vocabulary = model.config.vocab_size
    rows = [torch.randint(3, vocabulary, (length,), generator=generator).tolist() for length in (9, 23, 16)]
    masks = [[0] * 4 + [1] * (len(row) - 4) for row in rows]  # the first four tokens are the prompt
    monkeypatch.setattr(loss, "NLL_POSITIONS", 5)  # several chunks, the last one short
    scored = loss.row_nll(model, rows, masks, batch_size=2, pad_id=0)
    with torch.no_grad():
        for row, mask, (nll, count) in zip(rows, masks, scored):
            logits = model(input_ids=torch.tensor([row])).logits[0, :-1].float()
            targets = torch.tensor([token if keep else -100 for token, keep in zip(row[1:], mask[1:])])
            expected = F.cross_entropy(logits, targets, ignore_index=-100, reduction="sum").item()
            assert count == sum(mask[1:])
            assert nll == pytest.approx(expected, rel=1e-5)
