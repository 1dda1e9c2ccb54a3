"""Packing train rows into data.seq_len sequences that do not attend to each other (data.packing)."""

from __future__ import annotations

import pyarrow as pa

from xtrain_backend_side.prepared import INPUT_IDS, LOSS_MASK


def pack(table: pa.Table, seq_len: int):
    """Best-fit-decreasing into seq_len bins with TRL's packer (the `seq_lengths` its collator turns into position ids)."""
    from datasets import Dataset
    from trl.data_utils import pack_dataset

    dataset = Dataset(table.select([INPUT_IDS, LOSS_MASK]))
    return pack_dataset(dataset, seq_len, strategy="bfd", map_kwargs={"batch_size": len(dataset)}).with_format(
        "arrow"
    )[:]
