"""Chat template choice and checks, and batched tokenization with the loss mask.

Owns the one place text becomes tokens. Chats are rendered with the chat template, whose
`{% generation %}` blocks mark what the assistant says; the rendered texts are tokenized in batches by
the fast (Rust) tokenizer, and a token is supervised when it overlaps a generation block (the same rule
as `apply_chat_template(..., return_assistant_tokens_mask=True)`, one row at a time). Plain documents
are tokenized as they are, end with the end-of-sequence token, and are supervised everywhere.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import XtrainError
from ..tiny_model import CHATML_TEMPLATE
from .formats import TEXT_ROLE

# Templates a recipe may name in data.chat_template instead of using the tokenizer's own.
CHAT_TEMPLATES = {"chatml": CHATML_TEMPLATE}
GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")
PROBE = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]


def choose_template(tokenizer, name: str, model_dir: Path) -> tuple[str, str]:
    """The template text, and how error messages name it."""
    if name != "tokenizer":
        return CHAT_TEMPLATES[name], f"data.chat_template {name!r}"
    if not tokenizer.chat_template:
        raise XtrainError(f"{model_dir}: the tokenizer has no chat template; name one in data.chat_template (chatml)")
    return tokenizer.chat_template, f"{model_dir}: the tokenizer's chat template"


def check_template(tokenizer, template: str, label: str) -> None:
    """Refuse a template that cannot mark assistant tokens, masks everything, or leaves the end of turn untrained."""
    if not GENERATION_BLOCK.search(template):
        raise XtrainError(
            f"{label} has no {{% generation %}} block, so assistant tokens cannot be found for loss masking; "
            "use a template that marks assistant turns, or set data.train_on_inputs: true"
        )
    (ids, mask), = encode_chats(tokenizer, template, [PROBE], [None])
    if not any(mask):
        raise XtrainError(f"{label} masks every token (its {{% generation %}} blocks are empty): nothing would train")
    last = max(i for i, bit in enumerate(mask) if bit)
    stop_ids = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    if ids[last] not in stop_ids:
        after = tokenizer.convert_ids_to_tokens(ids[last + 1]) if last + 1 < len(ids) else None
        raise XtrainError(
            f"{label} does not train on the end-of-turn token {after!r} after an assistant reply, so the model "
            "would never learn to stop: move {% endgeneration %} after that token"
        )


def template_messages(messages: list[dict], tools: str | None, template: str) -> tuple[list[dict], Any]:
    """Messages and `tools` for the template; a template that ignores tools gets them in the system turn."""
    if tools is None:
        return messages, None
    if "tools" in template:
        return messages, json.loads(tools)
    note = f"You can call these tools:\n{tools}"
    if messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{note}"}, *messages[1:]], None
    return [{"role": "system", "content": note}, *messages], None


def encode_chats(tokenizer, template: str, chats: list[list[dict]], tools: list[str | None]):
    """(input_ids, assistant mask) of each chat; the Rust tokenizer spreads the batch over every core."""
    from transformers.utils.chat_template_utils import render_jinja_template

    texts, spans = [], []
    for messages, row_tools in zip(chats, tools, strict=True):
        messages, row_tools = template_messages(messages, row_tools, template)
        (text,), (generation,) = render_jinja_template(
            conversations=[messages], tools=row_tools, chat_template=template, return_assistant_tokens_mask=True,
            **tokenizer.special_tokens_map,
        )
        texts.append(text)
        spans.append(generation)
    encodings = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    return [(encoding.ids, assistant_mask(encoding, row_spans)) for encoding, row_spans in zip(encodings, spans)]


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


def encode_batch(batch: dict[str, list], tokenizer, template: str | None, train_on_inputs: bool) -> dict[str, list]:
    """`datasets.map` function: chat-form rows -> input_ids, assistant_masks (in row order)."""
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
        "input_ids": [ids for ids, _ in rows],
        "assistant_masks": [[1] * len(ids) if train_on_inputs else mask for ids, mask in rows],
    }
