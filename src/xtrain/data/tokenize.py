"""Template checks, and batched tokenization with the loss mask.

Owns the one place text becomes tokens. Chats are rendered with the chat template (`templates`), and each
assistant turn's characters are found by its `{% generation %}` blocks or by incremental rendering; the
rendered texts are tokenized in batches by the fast (Rust) tokenizer, and a token is supervised when it
overlaps an assistant span (the same rule as `apply_chat_template(..., return_assistant_tokens_mask=True)`,
one row at a time). Plain documents are tokenized as they are, end with the end-of-sequence token, and are
supervised everywhere.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pyarrow as pa
from jinja2.exceptions import SecurityError, TemplateError

from xtrain_backend_side.prepared import INPUT_IDS, LOSS_MASK
from xtrain_backend_side.progress import Progress

from ..errors import XtrainError
from ..recipe import Data, content_hash
from .formats import TEXT_ROLE, Chat
from .templates import ChatTemplate, assistant_spans

log = logging.getLogger(__name__)

BATCH_ROWS = 1000
PROBE = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]


def check_template(tokenizer, template: ChatTemplate) -> dict:
    """Refuse a template whose masking supervises nothing or leaves the end of turn untrained; the end-of-turn
    token it supervises (`{"token", "id"}`), which the checkpoint's generation config stops at."""
    (ids, mask), = encode_chats(tokenizer, template, [PROBE], [None])
    if not any(mask):
        raise XtrainError(f"{template.label} masks every token ({template.method} finds no assistant text): nothing "
                          "would train")
    first = mask.index(1)  # the first assistant turn's span ends with its end-of-turn token
    last = first + (mask[first:] + [0]).index(0) - 1
    stop_ids = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    if ids[last] not in stop_ids:
        after = tokenizer.convert_ids_to_tokens(ids[last + 1]) if last + 1 < len(ids) else None
        raise XtrainError(
            f"{template.label} does not train on the end-of-turn token {after!r} after an assistant reply "
            f"({template.method}), so the model would never learn to stop: move {{% endgeneration %}} after that token"
        )
    return {"token": tokenizer.convert_ids_to_tokens(ids[last]), "id": ids[last]}


def encode_chats(tokenizer, template: ChatTemplate, chats: list[list[dict]], tools: list[str | None]):
    """(input_ids, assistant mask) of each chat; the Rust tokenizer spreads the batch over every core."""
    texts, spans = [], []
    for messages, row_tools in zip(chats, tools, strict=True):
        try:
            text, generation = render_spans(tokenizer, template, messages, json.loads(row_tools) if row_tools else None)
        except SecurityError as exc:  # the template, not the row, reached for something the sandbox forbids
            raise XtrainError(f"{template.label} does something the Jinja sandbox refuses ({exc}): the template is at "
                              "fault, not the data; fix that template, or choose another in data.chat_template"
                              ) from None
        except TemplateError as exc:  # the template's own refusal (`raise_exception`), e.g. roles it does not know
            first = next((m["content"] for m in messages if m["role"] == "user"), "")[:60]
            raise XtrainError(f"{template.label} cannot render the chat that begins {first!r}: {exc}. Remove such "
                              "rows, or choose a template that renders them in data.chat_template") from None
        texts.append(text)
        spans.append(supervised(messages, generation, template))
    encodings = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    return [(encoding.ids, assistant_mask(encoding, row_spans)) for encoding, row_spans in zip(encodings, spans)]


def render_spans(tokenizer, template: ChatTemplate, messages: list[dict], tools) -> tuple[str, list[tuple[int, int]]]:
    """A chat's text and the character spans of its assistant turns."""
    from transformers.utils.chat_template_utils import render_jinja_template

    if template.masking is None:
        return assistant_spans(tokenizer, template.stock, messages, tools)
    (text,), (generation,) = render_jinja_template(
        conversations=[messages], tools=tools, chat_template=template.masking, return_assistant_tokens_mask=True,
        **tokenizer.special_tokens_map,
    )
    # TRL's Phi-3 variant also marks the eos that closes the whole conversation: not an assistant's answer.
    return text, [(start, end) for start, end in (trimmed(text, *span) for span in generation)
                  if text[start:end] != tokenizer.eos_token]


def supervised(messages: list[dict], spans: list[tuple[int, int]], template: ChatTemplate) -> list[tuple[int, int]]:
    """The spans of the assistant turns that train (a turn with `train: false` is context only)."""
    turns = [message.get("train", True) for message in messages if message["role"] == "assistant"]
    if all(turns):
        return spans
    if len(spans) != len(turns):
        raise XtrainError(f"{template.label} marks {len(spans)} assistant spans in a chat of {len(turns)} assistant "
                          "turns, so per-turn supervision (loss_weight / train) cannot tell which is which")
    return [span for span, trains in zip(spans, turns) if trains]


def trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    """A generation block without the whitespace around it: the answer and its end-of-turn token (TRL's training
    variants also mark the newline after the role header and after the end-of-turn token)."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def assistant_mask(encoding, spans: list[tuple[int, int]]) -> list[int]:
    """1 on every token overlapping a generation span (the Rust side maps characters to tokens)."""
    mask = [0] * len(encoding.ids)
    for start, end in spans:
        first, last = encoding.char_to_token(start), encoding.char_to_token(end - 1)
        if first is None or last is None:  # a span edge on a character no token covers: scan the offsets
            return overlap_mask(np.asarray(encoding.offsets).reshape(-1, 2), spans)
        mask[first : last + 1] = [1] * (last + 1 - first)
    return mask


def overlap_mask(offsets: np.ndarray, spans: list[tuple[int, int]]) -> list[int]:
    mask = np.zeros(len(offsets), dtype=bool)
    for start, end in spans:
        mask |= (offsets[:, 0] < end) & (offsets[:, 1] > start)
    return mask.astype(np.int8).tolist()


def encode_texts(tokenizer, texts: list[str]):
    """Plain documents: the tokenizer's own special tokens, then end-of-sequence so the model learns to stop."""
    encoded = tokenizer(texts, add_special_tokens=True)["input_ids"]
    ids = [row if row[-1:] == [tokenizer.eos_token_id] else row + [tokenizer.eos_token_id] for row in encoded]
    return [(row, [1] * len(row)) for row in ids]


def encode_batch(batch: dict[str, list], tokenizer, template: ChatTemplate | None, train_on_inputs: bool) -> dict[str, list]:
    """`datasets.map` function: chat-form rows (messages as JSON text) -> input_ids, assistant_masks (in row order)."""
    batch = {**batch, "messages": [json.loads(messages) for messages in batch["messages"]]}
    is_text = [messages[0]["role"] == TEXT_ROLE for messages in batch["messages"]]
    chat_rows = [i for i, text in enumerate(is_text) if not text]
    text_rows = [i for i, text in enumerate(is_text) if text]
    encoded = {}
    if chat_rows:
        chats = encode_chats(tokenizer, template, [batch["messages"][i] for i in chat_rows],
                             [batch["tools"][i] for i in chat_rows])
        encoded.update(zip(chat_rows, chats))
    if text_rows:
        encoded.update(zip(text_rows, encode_texts(tokenizer, [batch["messages"][i][0]["content"] for i in text_rows])))
    rows = [encoded[i] for i in range(len(is_text))]
    return {
        INPUT_IDS: [ids for ids, _ in rows],
        LOSS_MASK: [[1] * len(ids) if train_on_inputs else mask for ids, mask in rows],
    }


def tokenize_chats(chats: list[Chat], tokenizer, template: ChatTemplate | None, data: Data) -> pa.Table:
    """input_ids and assistant_masks of every chat, in order.

    One process: each batch is tokenized by the Rust tokenizer on every core already, and measured on
    2 cores, `datasets` workers (num_proc=2) made this stage slower (bench/bench_prepare.py).
    """
    from datasets import Dataset, disable_progress_bars

    disable_progress_bars()  # its bar redraws with carriage returns; Progress writes log lines instead
    progress = Progress(log.info, "tokenize: chats", len(chats))

    def encode_counted(batch, **settings):
        encoded = encode_batch(batch, **settings)
        progress.advance(len(batch["messages"]))
        return encoded

    # As JSON text: messages differ in their keys (tool calls, reasoning), which one Arrow schema would merge.
    dataset = Dataset.from_dict({"messages": [json.dumps(c["messages"], ensure_ascii=False) for c in chats],
                                 "tools": [c["tools"] for c in chats]})
    encoded = dataset.map(
        encode_counted,
        batched=True,
        batch_size=BATCH_ROWS,
        remove_columns=["messages", "tools"],
        fn_kwargs={"tokenizer": tokenizer, "template": template, "train_on_inputs": data.train_on_inputs},
        new_fingerprint=content_hash([len(chats), data.model_dump(mode="json")])[:32],  # skip hashing the tokenizer
    )
    return encoded.with_format("arrow")[:]


def encode_in_batches(tokenizer, template: ChatTemplate, chats: list[Chat]):
    """Each chat's (input_ids, mask), in order, encoded BATCH_ROWS at a time with a progress line."""
    progress = Progress(log.info, "tokenize: chats", len(chats))
    for start in range(0, len(chats), BATCH_ROWS):
        batch = chats[start : start + BATCH_ROWS]
        encoded = list(encode_chats(tokenizer, template, [c["messages"] for c in batch], [c["tools"] for c in batch]))
        progress.advance(len(batch))
        yield from encoded
