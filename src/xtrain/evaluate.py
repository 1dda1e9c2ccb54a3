"""The evaluate stage: base model vs tuned one on the held-out split -> eval.json and generations.json.

Both are scored on the prepared eval split with the same template and masking as training:
the loss is the mean negative log-likelihood over supervised (assistant) tokens, and perplexity
is its exponential. On preference data (train.objective dpo, orpo, kto) the loss is over the chosen (desirable)
answers, and `preference_eval` adds how each model ranks the answers. Both also answer a fixed set of eval prompts greedily (`generations`), scored
against the reference answers. eval.json holds flat metric names -> numbers (`recipe.EVAL_METRICS`),
for `dvc metrics`; the answers themselves go to generations.json. lm-evaluation-harness tasks listed in
the recipe add their results (`harness`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xtrain_backend_side.prepared import IGNORE_INDEX, INPUT_IDS, LOSS_MASK, labels, split_file
from xtrain_backend_side.progress import Progress

from . import generations
from .artifacts import read_json, write_json
from .preference_eval import load_preference_split
from .recipe import Eval

log = logging.getLogger(__name__)


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
            logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits.float()
            # Position t predicts token t+1.
            targets = targets[:, 1:]
            nll = F.cross_entropy(
                logits[:, :-1].transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none"
            ).sum(dim=1)
            counts = (targets != IGNORE_INDEX).sum(dim=1)
            for i, row in enumerate(order[start : start + batch_size]):
                out[row] = (nll[i].item(), int(counts[i]))
            advance(len(rows))
    return out


def load_tuned(model_dir: Path, checkpoint_dir: Path, trust_remote_code: bool = False):
    """The tuned model: base + PEFT adapter, or the full model the checkpoint holds."""
    import torch
    from transformers import AutoModelForCausalLM

    if (checkpoint_dir / "adapter_config.json").is_file():
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, trust_remote_code=trust_remote_code)
        return PeftModel.from_pretrained(base, checkpoint_dir)
    return AutoModelForCausalLM.from_pretrained(
        checkpoint_dir, dtype=torch.float32, trust_remote_code=trust_remote_code
    )


def evaluate(
    model_dir: Path,
    checkpoint_dir: Path,
    prepared_dir: Path,
    settings: Eval,
    out: Path,
    generations_out: Path | None = None,
    trust_remote_code: bool = False,
    pairs_out: Path | None = None,
) -> dict[str, Any]:
    """Write eval.json to `out`, the generations and the preference pairs' scores beside it (or to `generations_out`
    and `pairs_out`); returns the metrics."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir, trust_remote_code=trust_remote_code)
    kind = read_json(prepared_dir / "manifest.json").get("data_kind", "chats")
    pairs = load_preference_split(prepared_dir, kind) if kind != "chats" else None
    input_ids, masks, row_hashes = pairs.scored if pairs else load_eval_split(prepared_dir)
    prompts = []
    if settings.generations:
        special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
        prompts = generations.pick_prompts(input_ids, masks, row_hashes, settings.generations, special)
    stop = generations.stop_ids(tokenizer, prompts)
    metrics: dict[str, Any] = {"eval_rows": len(input_ids)}
    candidates = {
        "base": lambda: AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, trust_remote_code=trust_remote_code
        ),
        "tuned": lambda: load_tuned(model_dir, checkpoint_dir, trust_remote_code),
    }
    answers, answer_scores = {}, {}
    scored = len(pairs.sequences[0]) if pairs else len(input_ids)
    progress = Progress(log.info, "evaluate: rows scored and answers generated", len(candidates) * (scored + len(prompts)))
    for name, load in candidates.items():
        model = load()
        if pairs:  # every answer scored once; the loss is over the chosen (desirable) ones among them
            answer_scores[name] = row_nll(model, *pairs.sequences, settings.batch_size, tokenizer.pad_token_id,
                                          progress.advance)
            chosen = [answer_scores[name][i] for i in pairs.scored_sequences]
            total, count = sum(nll for nll, _ in chosen), sum(n for _, n in chosen)
        else:
            total, count = supervised_nll(model, input_ids, masks, settings.batch_size, tokenizer.pad_token_id,
                                          progress.advance)
        loss = total / count
        metrics[f"{name}_loss"] = loss
        metrics[f"{name}_perplexity"] = math.exp(loss)
        if prompts:
            answers[name] = generations.generate(model, prompts, stop, tokenizer.pad_token_id, settings.batch_size,
                                                 settings.max_new_tokens, progress.advance)
    metrics["eval_supervised_tokens"] = count  # the same split and masks for both models
    metrics["loss_improvement"] = metrics["base_loss"] - metrics["tuned_loss"]
    if pairs:
        metrics.update(pairs.metrics(answer_scores))
    if settings.lm_eval is not None:
        from .harness import run_tasks

        metrics.update(run_tasks(settings.lm_eval, model_dir, checkpoint_dir, settings.batch_size))
    records = []
    if prompts:
        scores, records = generations.score(tokenizer, prompts, answers)
        metrics.update(scores)
        generations.warn_if_not_stopping(metrics)
    write_json(generations_out or out.with_name("generations.json"), records)
    write_json(pairs_out or out.with_name("pairs.json"), pairs.records(answer_scores, tokenizer) if pairs else [])
    write_json(out, metrics)
    return metrics
