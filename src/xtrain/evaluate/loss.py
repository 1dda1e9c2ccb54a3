"""The held-out loss: summed next-token negative log-likelihood over the supervised (assistant) tokens of the
prepared eval split, the same template and masking as training."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from xtrain_backend_side.prepared import IGNORE_INDEX, INPUT_IDS, LOSS_MASK, labels, split_file

# Positions whose float32 log-softmax is taken at once when scoring (row_nll).
NLL_POSITIONS = 256


def load_eval_split(prepared_dir: Path) -> tuple[list[list[int]], list[list[int]], list[str]]:
    from datasets import Dataset

    split = Dataset.from_parquet(str(split_file(prepared_dir, "eval")))
    return split[INPUT_IDS], split[LOSS_MASK], split["row_hash"]


def supervised_nll(model, input_ids, masks, batch_size: int, pad_id: int,
                   advance: Callable[[int], None] = lambda rows: None) -> tuple[float, int]:
    """Summed next-token NLL over supervised positions, and how many positions that was."""
    rows = row_nll(model, input_ids, masks, batch_size, pad_id, advance)
    return sum(nll for nll, _ in rows), sum(count for _, count in rows)


def row_nll(model, input_ids, masks, batch_size: int, pad_id: int, advance: Callable[[int], None] = lambda rows: None
            ) -> list[tuple[float, int]]:
    """Each row's summed next-token NLL over its supervised positions, and how many positions that was;
    `advance` is told each batch's row count."""
    import torch
    import torch.nn.functional as F

    model.eval()
    out: list[tuple[float, int]] = [(0.0, 0)] * len(input_ids)
    # Rows of similar length share a batch, so little of it is padding (the sum does not depend on order).
    order = sorted(range(len(input_ids)), key=lambda i: len(input_ids[i]))
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            rows = [input_ids[i] for i in order[start : start + batch_size]]
            row_masks = [masks[i] for i in order[start : start + batch_size]]
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
            attention = torch.zeros((len(rows), width), dtype=torch.long)
            targets = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
            for i, (row, mask) in enumerate(zip(rows, row_masks)):
                ids[i, : len(row)] = torch.tensor(row)
                attention[i, : len(row)] = 1
                targets[i, : len(row)] = torch.tensor(labels(row, mask))
            logits = model(input_ids=ids.to(model.device), attention_mask=attention.to(model.device),
                           use_cache=False).logits
            # Position t predicts token t+1. The log-softmax runs in float32 over a few positions at a time: over the
            # whole batch at once it holds several copies of batch x length x vocabulary (4 GiB each for 4 rows of
            # 2,048 tokens and Llama 3's 128k vocabulary).
            targets = targets[:, 1:].to(logits.device)
            nll = torch.zeros(len(rows), dtype=torch.float32, device=logits.device)
            for begin in range(0, width - 1, NLL_POSITIONS):
                end = min(begin + NLL_POSITIONS, width - 1)
                nll += F.cross_entropy(
                    logits[:, begin:end].float().flatten(0, 1), targets[:, begin:end].flatten(),
                    ignore_index=IGNORE_INDEX, reduction="none",
                ).view(len(rows), end - begin).sum(dim=1)
            counts = (targets != IGNORE_INDEX).sum(dim=1)
            for i, row in enumerate(order[start : start + batch_size]):
                out[row] = (nll[i].item(), int(counts[i]))
            advance(len(rows))
    return out
