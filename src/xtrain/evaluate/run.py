"""The evaluate stage: base model vs tuned one on the held-out split -> eval.json and generations.json.

Both are scored on the prepared eval split with the same template and masking as training: the loss is the mean
negative log-likelihood over supervised (assistant) tokens, and perplexity is its exponential (`loss`). On
preference data (train.objective dpo, orpo, kto) the loss is over the chosen (desirable) answers, and
`preferences` adds how each model ranks the answers. Both also answer a fixed set of eval prompts greedily
(`generations`), scored against the reference answers. eval.json holds flat metric names -> numbers
(`recipe.EVAL_METRICS`), for `dvc metrics`; the answers themselves go to generations.json. lm-evaluation-harness
tasks listed in the recipe add their results (`harness`). The job runs where its plan puts it
(plans/<recipe>/evaluate.json: device, precision, batch), with one copy of the weights loaded at a time.
"""

from __future__ import annotations

import gc
import logging
import math
from pathlib import Path
from typing import Any

from xtrain_backend_side.progress import Progress

from ..artifacts import read_json, write_json
from ..models.loading import DTYPES, is_adapter, load_model
from ..plan.schema import JobPlan
from ..recipe import Eval
from ..train import tracking
from . import generations
from .loss import load_eval_split, row_nll, supervised_nll
from .preferences import load_preference_split

log = logging.getLogger(__name__)


def evaluate(
    model_dir: Path,
    checkpoint_dir: Path,
    prepared_dir: Path,
    settings: Eval,
    out: Path,
    generations_out: Path | None = None,
    trust_remote_code: bool = False,
    pairs_out: Path | None = None,
    job: JobPlan | None = None,
) -> dict[str, Any]:
    """Write eval.json to `out`, the generations and the preference pairs' scores beside it (or to `generations_out`
    and `pairs_out`); returns the metrics. `job` (plans/<recipe>/evaluate.json) places the models and sets the batch;
    without one, float32 on the CPU at `eval.batch_size`."""
    from transformers import AutoTokenizer

    dtype, device = (DTYPES[job.precision], job.device_map) if job else ("float32", "cpu")
    batch_size = job.batch_size if job else settings.batch_size
    log.info("evaluating %s", job.reason if job else "on the CPU in float32")
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
    answers, answer_scores = {}, {}
    scored = len(pairs.sequences[0]) if pairs else len(input_ids)
    progress = Progress(log.info, "evaluate: rows scored and answers generated", 2 * (scored + len(prompts)))
    for name, model in one_model_at_a_time(model_dir, checkpoint_dir, dtype, device, trust_remote_code):
        if pairs:  # every answer scored once; the loss is over the chosen (desirable) ones among them
            answer_scores[name] = row_nll(model, *pairs.sequences, batch_size, tokenizer.pad_token_id,
                                          progress.advance)
            chosen = [answer_scores[name][i] for i in pairs.scored_sequences]
            total, count = sum(nll for nll, _ in chosen), sum(n for _, n in chosen)
        else:
            total, count = supervised_nll(model, input_ids, masks, batch_size, tokenizer.pad_token_id,
                                          progress.advance)
        loss = total / count
        metrics[f"{name}_loss"] = loss
        metrics[f"{name}_perplexity"] = math.exp(loss)
        if prompts:
            answers[name] = generations.generate(model, prompts, stop, tokenizer.pad_token_id, batch_size,
                                                 settings.max_new_tokens, progress.advance)
    del model  # lm-eval loads the models itself
    gc.collect()
    metrics["eval_supervised_tokens"] = count  # the same split and masks for both models
    metrics["loss_improvement"] = metrics["base_loss"] - metrics["tuned_loss"]
    if pairs:
        metrics.update(pairs.metrics(answer_scores))
    if settings.lm_eval is not None:
        from .harness import run_tasks

        metrics.update(run_tasks(settings.lm_eval, model_dir, checkpoint_dir, job.lm_eval_batch_size if job else
                                 settings.batch_size, dtype, device))
    records = []
    if prompts:
        scores, records = generations.score(tokenizer, prompts, answers)
        metrics.update(scores)
        generations.warn_if_not_stopping(metrics)
    write_json(generations_out or out.with_name("generations.json"), records)
    write_json(pairs_out or out.with_name("pairs.json"), pairs.records(answer_scores, tokenizer) if pairs else [])
    write_json(out, metrics)
    tracking.log_evaluation(checkpoint_dir, metrics)  # beside training's curves
    return metrics


def one_model_at_a_time(model_dir: Path, checkpoint_dir: Path, dtype: str, device: str, trust_remote_code: bool):
    """("base", model) then ("tuned", model), never two copies of the weights: a LoRA checkpoint's base is loaded
    once and scored as it is, then with the adapter on it; a full checkpoint is loaded after the base is freed."""
    base = load_model(model_dir, dtype, device, trust_remote_code)
    yield "base", base
    if is_adapter(checkpoint_dir):
        from peft import PeftModel

        yield "tuned", PeftModel.from_pretrained(base, checkpoint_dir)
        return
    del base
    gc.collect()
    yield "tuned", load_model(checkpoint_dir, dtype, device, trust_remote_code)
