"""torchtune components of the `torchtune` backend; this module runs inside torchtune's own environment.

The backend's config names these by `_component_` (`xtrain_backend_side.torchtune_components.…`). They let
torchtune train on xtrain's prepared tokens, chats or preference pairs (so every backend sees the same data and
loss mask), give its
recipe the pad id of the model's own tokenizer, and run the recipe's learning-rate schedule. Only the
standard library, torch, torchtune and `xtrain_backend_side` are imported here: xtrain's stack is not in that
environment.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from xtrain_backend_side.prepared import (
    CHOSEN_IDS,
    IGNORE_INDEX,
    INPUT_IDS,
    LOSS_MASK,
    PREFERENCE_COLUMNS,
    PROMPT_IDS,
    REJECTED_IDS,
    SEQ_LENGTHS,
    answer_row,
    is_packed,
    labels,
    training_columns,
)

SAMPLER_SEED = 0  # torchtune 0.6.1's recipes build their sampler with seed=0, whatever the config's seed


def row_order(rows: int, seed: int) -> list[int]:
    """The order the dataset presents the prepared rows in: a permutation by the recipe's seed, so that
    train.seed changes the data order as in the other backends (torchtune's own sampler ignores the seed)."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    return torch.randperm(rows, generator=generator).tolist()


def rows_trained(rows: int, seed: int, epochs: int, rows_per_epoch: int, replicas: int = 1) -> list[int]:
    """The prepared rows (indices into train.parquet) torchtune trains on, over all `replicas` devices: each
    epoch its sampler draws randperm(rows) seeded SAMPLER_SEED + epoch over our seed-ordered dataset, padded to a
    multiple of `replicas` with its first rows, device r taking every replicas-th from r; the epoch ends after
    `rows_per_epoch` rows over all devices (whole optimizer steps), i.e. the padded permutation's first ones."""
    order = row_order(rows, seed)
    padding = -rows % replicas
    trained = []
    for epoch in range(epochs):
        generator = torch.Generator()
        generator.manual_seed(SAMPLER_SEED + epoch)
        drawn = torch.randperm(rows, generator=generator).tolist()
        trained += [order[i] for i in (drawn + drawn[:padding])[:rows_per_epoch]]
    return trained


class PreparedTokens(Dataset):
    """Rows of xtrain's prepared `train.parquet`: tokens, and labels that are the tokens where
    the loss mask is 1 and IGNORE_INDEX elsewhere (xtrain_backend_side.prepared; torchtune's recipe shifts them by one
    itself, and its CROSS_ENTROPY_IGNORE_IDX is the same -100).

    Packed rows come as torchtune's pack format, as its PackedDataset makes it:
    tensors padded to `seq_len` (pad id, labels IGNORE_INDEX, the padding one more "sequence"), positions that
    restart at each sequence, and `seq_lens`, from which `padded_collate_packed` builds the block-causal
    mask, so sequences sharing a row do not attend to each other.
    """

    def __init__(self, path: str, packed: bool = False, seed: int = 0, seq_len: int | None = None, pad_id: int = 0):
        table = pq.read_table(path)
        if packed != is_packed(table.column_names):
            raise ValueError(f"{path}: dataset.packed is {packed} but the rows are {'' if not packed else 'not '}packed")
        if packed and not seq_len:
            raise ValueError(f"{path}: packed rows need dataset.seq_len, the length torchtune pads each pack to")
        self.packed, self.seq_len, self.pad_id = packed, seq_len, pad_id
        self.rows = table.select(training_columns(packed)).to_pylist()
        self.order = row_order(len(self.rows), seed)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        row = self.rows[self.order[index]]
        tokens = row[INPUT_IDS]
        targets = labels(tokens, row[LOSS_MASK])
        if not self.packed:
            return {"tokens": tokens, "labels": targets}
        padding = self.seq_len - len(tokens)
        positions = [position for length in row[SEQ_LENGTHS] for position in range(length)]
        # As torchtune's PackedDataset pads: positions go on counting (capped at seq_len - 1).
        positions += [min(positions[-1] + 1 + i, self.seq_len - 1) for i in range(padding)]
        return {
            "tokens": torch.tensor(tokens + [self.pad_id] * padding),
            "labels": torch.tensor(targets + [IGNORE_INDEX] * padding),
            "input_pos": torch.tensor(positions),
            "seq_lens": torch.tensor(list(row[SEQ_LENGTHS]) + ([padding] if padding else [])),
        }


def prepared_dataset(tokenizer, path: str, packed: bool = False, seed: int = 0, seq_len: int | None = None):
    """torchtune instantiates datasets with the tokenizer first; the tokens are already prepared, so it
    only gives the pad id of packed rows."""
    return PreparedTokens(path, packed, seed, seq_len, tokenizer.pad_id)


class PreparedPairs(Dataset):
    """Pairs of xtrain's prepared `train.parquet` (train.objective dpo) as torchtune's DPO recipe collates them
    (`padded_collate_dpo`): each answer after the prompt, labelled on the answer only; in the order of the seed, as
    `PreparedTokens`."""

    def __init__(self, path: str, seed: int = 0):
        self.rows = pq.read_table(path, columns=list(PREFERENCE_COLUMNS["pairs"])).to_pylist()
        self.order = row_order(len(self.rows), seed)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        row = self.rows[self.order[index]]
        item = {}
        for name, column in (("chosen", CHOSEN_IDS), ("rejected", REJECTED_IDS)):
            item[f"{name}_input_ids"], item[f"{name}_labels"] = answer_row(row[PROMPT_IDS], row[column])
        return item


def prepared_pairs(tokenizer, path: str, seed: int = 0) -> PreparedPairs:
    """torchtune instantiates datasets with the tokenizer first; the pairs are already tokenized."""
    return PreparedPairs(path, seed)


class SpecialTokens:
    """The ids torchtune's recipe reads from its tokenizer (pad and end of sequence), taken from the model's
    Hugging Face tokenizer files. The data is already tokenized, so nothing here encodes text."""

    def __init__(self, path: str):
        folder = Path(path)
        config = json.loads((folder / "tokenizer_config.json").read_text())
        vocab = json.loads((folder / "tokenizer.json").read_text())
        ids = {token["content"]: token["id"] for token in vocab.get("added_tokens", [])}
        ids.update(vocab["model"]["vocab"])

        def token_id(name: str) -> int | None:
            token = config.get(name)
            return ids[token] if token is not None else None

        self.eos_id = token_id("eos_token")
        self.bos_id = token_id("bos_token")
        pad = token_id("pad_token")
        self.pad_id = pad if pad is not None else self.eos_id
        self.max_seq_len = None


def special_tokens(path: str) -> SpecialTokens:
    return SpecialTokens(path)


def lr_scheduler(
    optimizer: torch.optim.Optimizer,
    num_training_steps: int,
    schedule: str,
    warmup_ratio: float = 0.0,
    last_epoch: int = -1,
) -> torch.optim.lr_scheduler.LambdaLR:
    """The recipe's schedule with the formulas of transformers' get_scheduler, so that every backend walks
    the same learning-rate curve: linear warmup over ceil(ratio x steps), then linear decay to 0, half a
    cosine to 0, or constant (`constant` has no warmup)."""
    warmup = 0 if schedule == "constant" else math.ceil(num_training_steps * warmup_ratio)

    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        if schedule in ("constant", "constant_with_warmup"):
            return 1.0
        progress = (step - warmup) / max(1, num_training_steps - warmup)
        if schedule == "linear":
            return max(0.0, 1.0 - progress)
        if schedule == "cosine":
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
        raise ValueError(f"unknown lr schedule {schedule!r}")

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor, last_epoch)
