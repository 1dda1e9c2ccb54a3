"""Greedy answers to eval prompts, and how they compare with the references: exact match, token F1, stop.

Prompts come from the prepared eval split itself, so they carry exactly the chat template and special
tokens the model was trained with: a row's prompt is every token before its last supervised run (the
last assistant turn, opened by the template's generation prompt) and its reference answer is that run,
which ends with the end-of-turn token the model was trained to emit. Rows without such a split (plain
documents, `train_on_inputs`, answers truncated before their end-of-turn token) cannot be asked.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import XtrainError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prompt:
    row_hash: str
    prompt_ids: list[int]
    reference_ids: list[int]  # the answer, ending with its end-of-turn token


def split_row(ids: list[int], mask: list[int]) -> tuple[list[int], list[int]] | None:
    """(prompt, answer) at the start of the last supervised run; None when nothing precedes it."""
    supervised = [i for i, bit in enumerate(mask) if bit]
    if not supervised:
        return None
    end = supervised[-1] + 1
    start = end - 1
    while start > 0 and mask[start - 1]:
        start -= 1
    return (ids[:start], ids[start:end]) if start > 0 else None


def pick_prompts(input_ids, masks, row_hashes, count: int, special_ids: set[int]) -> list[Prompt]:
    """The first `count` askable eval rows by content hash: the same rows however the split is ordered.

    An answer is complete when it ends with a special token (the template's end of turn)."""
    prompts = []
    for row_hash, ids, mask in sorted(zip(row_hashes, input_ids, masks), key=lambda row: row[0]):
        parts = split_row(ids, mask)
        if parts is not None and parts[1][-1] in special_ids:
            prompts.append(Prompt(row_hash, *parts))
            if len(prompts) == count:
                break
    if not prompts:
        raise XtrainError(
            "eval.generations: no eval row has a prompt followed by a complete assistant answer (plain text data, "
            "data.train_on_inputs: true, or answers truncated before their end-of-turn token); set "
            "eval.generations: 0"
        )
    if len(prompts) < count:
        log.warning("eval.generations asks for %d prompts; the eval split has %d askable rows", count, len(prompts))
    return prompts


def stop_ids(tokenizer, prompts: list[Prompt]) -> set[int]:
    """Tokens that end an answer: the end-of-turn tokens the references end with, and end of sequence."""
    ids = {p.reference_ids[-1] for p in prompts}
    return ids | {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else ids


def generate(model, prompts: list[Prompt], stop_ids: set[int], pad_id: int, batch_size: int,
             max_new_tokens: int, advance: Callable[[int], None] = lambda prompts: None) -> list[dict[str, Any]]:
    """Greedy continuation of each prompt, batched with left padding: new token ids and whether it stopped;
    `advance` is told each batch's prompt count."""
    import torch

    model.eval()
    results: list[dict[str, Any]] = [{}] * len(prompts)
    # Prompts of similar length share a batch, so little of it is padding; answers come back in the prompts' order.
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i].prompt_ids))
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            batch = [prompts[i] for i in order[start : start + batch_size]]
            width = max(len(p.prompt_ids) for p in batch)
            ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            attention = torch.zeros((len(batch), width), dtype=torch.long)
            for i, prompt in enumerate(batch):
                ids[i, width - len(prompt.prompt_ids) :] = torch.tensor(prompt.prompt_ids)
                attention[i, width - len(prompt.prompt_ids) :] = 1
            out = model.generate(  # greedy, with the KV cache
                input_ids=ids.to(model.device), attention_mask=attention.to(model.device),
                max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=sorted(stop_ids), pad_token_id=pad_id,
                top_p=None, top_k=None, temperature=None,
            )
            for index, row in zip(order[start : start + batch_size], out[:, width:].tolist()):
                end = next((i for i, token in enumerate(row) if token in stop_ids), None)
                results[index] = {"ids": row if end is None else row[: end + 1], "stopped": end is not None}
            advance(len(batch))
    return results


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


def token_f1(answer: str, reference: str) -> float:
    """Word-level F1 (SQuAD's measure without its English-specific article removal)."""
    got, want = normalise(answer).split(), normalise(reference).split()
    if not got or not want:
        return float(got == want)
    common = sum((Counter(got) & Counter(want)).values())
    if not common:
        return 0.0
    precision, recall = common / len(got), common / len(want)
    return 2 * precision * recall / (precision + recall)


def answer_text(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True).strip()


def score(tokenizer, prompts: list[Prompt], answers: dict[str, list[dict]]) -> tuple[dict[str, float], list[dict]]:
    """Per-model exact match, token F1 and stop rate, and the side-by-side records for generations.json."""
    references = [answer_text(tokenizer, p.reference_ids) for p in prompts]
    metrics: dict[str, float] = {"generations": len(prompts)}
    records = [
        {"row_hash": p.row_hash, "prompt": tokenizer.decode(p.prompt_ids), "reference": ref}
        for p, ref in zip(prompts, references)
    ]
    for name, results in answers.items():
        texts = [answer_text(tokenizer, r["ids"]) for r in results]
        metrics[f"{name}_exact_match"] = sum(normalise(t) == normalise(r) for t, r in zip(texts, references)) / len(texts)
        metrics[f"{name}_token_f1"] = sum(token_f1(t, r) for t, r in zip(texts, references)) / len(texts)
        metrics[f"{name}_stop_rate"] = sum(r["stopped"] for r in results) / len(results)
        for record, text, result in zip(records, texts, results):
            record[name] = {"text": text, "raw": tokenizer.decode(result["ids"]), "stopped": result["stopped"],
                            "new_tokens": len(result["ids"])}
    return metrics, records


def warn_if_not_stopping(metrics: dict[str, float]) -> str | None:
    """A loud message when the tuned model runs to the length limit more often than the base model, or ever."""
    tuned, base = metrics["tuned_stop_rate"], metrics["base_stop_rate"]
    if tuned >= 1.0:
        return None
    message = (
        f"THE TUNED MODEL DOES NOT STOP: {1 - tuned:.0%} of its answers ran to eval.max_new_tokens without the "
        f"end-of-turn token (base model: {1 - base:.0%}); check that training supervises the end-of-turn token "
        "and that it trained long enough"
    )
    log.warning(message)
    return message

