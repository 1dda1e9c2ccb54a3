"""The prepared-data contract: what `prepared/<recipe>/<split>.parquet` holds, in one place.

SFT rows have the token ids (`input_ids`) and a loss mask over them (`assistant_masks`: 1 where the loss is
computed, the assistant's tokens unless data.train_on_inputs). Packed train rows also have `seq_lengths`, the
lengths of the sequences packed into the row, which must not attend to each other. Trainers that take labels
get the token id where the mask is 1 and IGNORE_INDEX elsewhere.
"""

from __future__ import annotations

from pathlib import Path

INPUT_IDS = "input_ids"
LOSS_MASK = "assistant_masks"
SEQ_LENGTHS = "seq_lengths"
# Preference data (train.objective dpo / orpo / kto), in TRL's column names: the prompt's tokens once, then each answer's.
PROMPT_IDS, CHOSEN_IDS, REJECTED_IDS, COMPLETION_IDS, LABEL = (
    "prompt_ids", "chosen_ids", "rejected_ids", "completion_ids", "label")
PREFERENCE_COLUMNS = {"pairs": (PROMPT_IDS, CHOSEN_IDS, REJECTED_IDS), "labelled": (PROMPT_IDS, COMPLETION_IDS, LABEL)}
IGNORE_INDEX = -100  # the label of a token without loss (PyTorch cross-entropy's default ignore_index)


def split_file(prepared_dir: str | Path, split: str = "train") -> Path:
    return Path(prepared_dir) / f"{split}.parquet"


def is_packed(columns) -> bool:
    """Whether rows with these column names are packed."""
    return SEQ_LENGTHS in columns


def training_columns(packed: bool) -> list[str]:
    """The columns a trainer reads."""
    return [INPUT_IDS, LOSS_MASK] + ([SEQ_LENGTHS] if packed else [])


def labels(ids: list[int], mask: list[int]) -> list[int]:
    """Per-token labels: the id where the loss mask is 1, IGNORE_INDEX elsewhere."""
    return [token if keep else IGNORE_INDEX for token, keep in zip(ids, mask, strict=True)]


def answer_row(prompt: list[int], answer: list[int]) -> tuple[list[int], list[int]]:
    """A preference answer as one sequence after its prompt: (token ids, labels on the answer only)."""
    return prompt + answer, [IGNORE_INDEX] * len(prompt) + answer


def row_tokens(row: dict) -> int:
    """The tokens a trainer reads for one prepared row: its sequence, or each answer after the prompt."""
    if INPUT_IDS in row:
        return len(row[INPUT_IDS])
    answers = [row[column] for column in (CHOSEN_IDS, REJECTED_IDS, COMPLETION_IDS) if column in row]
    return sum(len(row[PROMPT_IDS]) + len(answer) for answer in answers)


def train_split_is_packed(prepared_dir: str | Path) -> bool:
    import pyarrow.parquet as pq

    return is_packed(pq.read_schema(split_file(prepared_dir)).names)
