"""Prepared preference tokens as text, for a backend whose framework reads preference data only as text and
tokenizes it itself (Axolotl's DPO and KTO, through TRL 1.9's trainers).

TRL 1.9 tokenizes a text example as `tokenizer(prompt)` and `tokenizer(prompt + answer)`, an answer's ids being
those after the prompt's, once it has appended the EOS token to an answer that does not end with it. Here each
prepared row's ids are decoded and tokenized that way with the model's tokenizer: the text is written only when
it gives back exactly the prepared ids for every row, so the framework trains on the tokens prepare made;
otherwise an error names the first row that differs.
"""

from __future__ import annotations

import logging
from pathlib import Path

from xtrain_backend_side.prepared import CHOSEN_IDS, COMPLETION_IDS, LABEL, PROMPT_IDS, REJECTED_IDS, split_file

from ...errors import XtrainError

log = logging.getLogger(__name__)

# Prepared answer columns -> the text columns TRL reads.
ANSWER_TEXT = {CHOSEN_IDS: "chosen", REJECTED_IDS: "rejected", COMPLETION_IDS: "completion"}


def as_text(tokenizer, row: dict, answers: list[str]) -> dict[str, str]:
    """One prepared row as TRL's text columns, or ValueError naming the column whose ids do not come back."""
    text = {"prompt": tokenizer.decode(row[PROMPT_IDS], clean_up_tokenization_spaces=False)}
    prompt_ids = tokenizer(text=text["prompt"])["input_ids"]
    if prompt_ids != row[PROMPT_IDS]:
        raise ValueError(f"{PROMPT_IDS}: {row[PROMPT_IDS]} -> {text['prompt']!r} -> {prompt_ids}")
    for column in answers:
        answer = tokenizer.decode(row[column], clean_up_tokenization_spaces=False)
        eos = tokenizer.eos_token or ""
        tokenized = answer if answer.endswith(eos) else answer + eos
        ids = tokenizer(text=text["prompt"] + tokenized)["input_ids"]
        if ids[:len(prompt_ids)] != prompt_ids or ids[len(prompt_ids):] != row[column]:
            raise ValueError(f"{column}: {row[column]} -> {answer!r} -> {ids[len(prompt_ids):]} after the prompt")
        text[ANSWER_TEXT[column]] = answer
    return text


def export_text(prepared_dir: Path, model_dir: Path, target: Path, backend: str, trust_remote_code: bool) -> int:
    """The prepared train split as text columns (prompt, chosen, rejected; or prompt, completion, label) in
    `target`, checked to tokenize back to the prepared ids. Returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    source = split_file(prepared_dir)
    table = pq.read_table(source)
    answers = [column for column in ANSWER_TEXT if column in table.column_names]
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    columns: dict[str, list] = {}
    for index, row in enumerate(table.to_pylist()):
        try:
            text = as_text(tokenizer, row, answers)
        except ValueError as error:
            raise XtrainError(
                f"{source} row {index}: train.backend {backend} trains preference data as text, which its framework "
                f"tokenizes again, and this row's text does not give back its prepared ids ({error}); train it with "
                "train.backend trl_cpu or trl_local, which train the prepared ids themselves"
            ) from None
        if LABEL in row:
            text[LABEL] = row[LABEL]
        for key, value in text.items():
            columns.setdefault(key, []).append(value)
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), target)
    rows = len(table)
    log.info("%s: %d prepared rows decoded to text (%s); re-tokenized as TRL does, each gives back its prepared ids",
             backend, rows, ", ".join(columns))
    return rows
