"""The evaluate stage: base model vs tuned one on the held-out split -> eval.json and generations.json.

Both are scored on the prepared eval split with the same template and masking as training: the loss is the mean
negative log-likelihood over supervised (assistant) tokens, and perplexity is its exponential (`loss`). On
preference data (train.objective dpo, orpo, kto) the loss is over the chosen (desirable) answers, and
`preferences` adds how each model ranks the answers. Both also answer a fixed set of eval prompts greedily
(`generations`), scored against the reference answers. eval.json holds flat metric names -> numbers
(`recipe.EVAL_METRICS`), for `dvc metrics`; the answers themselves go to generations.json. lm-evaluation-harness
tasks listed in the recipe add their results (`harness`). The job runs where its plan puts it
(plans/<recipe>/evaluate.json: device, precision, batch), with one copy of the weights loaded at a time.

A recipe built on another (`model.recipe`) compares against its direct base, the upstream checkpoint (`base_*`),
and scores every model above it in the chain on the same split too: the root model (`root_loss`) and each stage
between (`upstream_<recipe>_loss`), so the report has one row per stage.
"""

from __future__ import annotations

import gc
import logging
import math
from pathlib import Path
from typing import Any

from xtrain_backend_side.progress import Progress

from ..artifacts import read_json, write_json
from ..chain import ChainModel
from ..errors import XtrainError
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
    chain: list[ChainModel] | None = None,
) -> dict[str, Any]:
    """Write eval.json to `out`, the generations and the preference pairs' scores beside it (or to `generations_out`
    and `pairs_out`); returns the metrics. `job` (plans/<recipe>/evaluate.json) places the models and sets the batch;
    without one, float32 on the CPU at `eval.batch_size`. `chain` (xtrain.chain.chain_models) lists the models of
    a recipe built on others, root first and this recipe's last; by default the model and the checkpoint."""
    from transformers import AutoTokenizer

    dtype, device = (DTYPES[job.precision], job.device_map) if job else ("float32", "cpu")
    batch_size = job.batch_size if job else settings.batch_size
    log.info("evaluating %s", job.reason if job else "on the CPU in float32")
    kind = read_json(prepared_dir / "manifest.json").get("data_kind", "chats")
    if kind == "prompts":  # no reference answers to score a loss on: greedy answers scored by the rewards, to come
        raise XtrainError(f"{prepared_dir} holds GRPO prompts, which evaluation does not score yet (docs/grpo.md): "
                          f"build the recipe's checkpoint (snakemake checkpoints/<recipe>) rather than its report")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir, trust_remote_code=trust_remote_code)
    pairs = load_preference_split(prepared_dir, kind) if kind != "chats" else None
    input_ids, masks, row_hashes = pairs.scored if pairs else load_eval_split(prepared_dir)
    prompts = []
    if settings.generations:
        special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
        prompts = generations.pick_prompts(input_ids, masks, row_hashes, settings.generations, special)
    stop = generations.stop_ids(tokenizer, prompts)
    metrics: dict[str, Any] = {"eval_rows": len(input_ids)}
    answers = {}
    scored = len(pairs.sequences[0]) if pairs else len(input_ids)
    progress = Progress(log.info, "evaluate: rows scored and answers generated", 2 * (scored + len(prompts)))
    chain = chain or [ChainModel(None, str(model_dir), None), ChainModel(None, str(model_dir), str(checkpoint_dir))]
    scores = {}
    for name, model in one_model_at_a_time(named(chain), dtype, device, trust_remote_code):
        if pairs:  # every answer scored once; the loss is over the chosen (desirable) ones among them
            scores[name] = row_nll(model, *pairs.sequences, batch_size, tokenizer.pad_token_id, progress.advance)
            chosen = [scores[name][i] for i in pairs.scored_sequences]
            total, count = sum(nll for nll, _ in chosen), sum(n for _, n in chosen)
        else:
            total, count = supervised_nll(model, input_ids, masks, batch_size, tokenizer.pad_token_id,
                                          progress.advance)
        loss = total / count
        metrics[f"{name}_loss"] = loss
        metrics[f"{name}_perplexity"] = math.exp(loss)
        if prompts and name in ("base", "tuned"):
            answers[name] = generations.generate(model, prompts, stop, tokenizer.pad_token_id, batch_size,
                                                 settings.max_new_tokens, progress.advance)
    del model  # lm-eval loads the models itself
    gc.collect()
    metrics["eval_supervised_tokens"] = count  # the same split and masks for both models
    metrics["loss_improvement"] = metrics["base_loss"] - metrics["tuned_loss"]
    answer_scores = {name: scores[name] for name in ("base", "tuned") if name in scores}
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


def named(chain: list[ChainModel]) -> list[tuple[str, ChainModel]]:
    """eval.json's name for each model of a chain: `tuned` (the last), `base` (its direct base), `root` (the root
    model of a longer chain) and `upstream_<recipe>` (each stage between)."""
    names = ["root", *(f"upstream_{model.recipe}" for model in chain[1:-2])] if len(chain) > 2 else []
    return list(zip([*names, "base", "tuned"], chain, strict=True))


def one_model_at_a_time(models: list[tuple[str, ChainModel]], dtype: str, device: str, trust_remote_code: bool):
    """(name, model) for each model in turn, never two copies of the weights: a folder already loaded is reused,
    scored as it is and then with an adapter on it (a previous adapter taken off first); any other model is loaded
    after the last one is freed. For one recipe: the base, then the base with the LoRA adapter on (or the full
    checkpoint)."""
    from peft import PeftModel

    loaded, weights = None, None
    for name, model in models:
        adapter = model.checkpoint is not None and is_adapter(Path(model.checkpoint))
        wanted = model.folder if model.checkpoint is None or adapter else model.checkpoint
        if loaded is not None and weights == wanted:
            base = loaded.unload() if isinstance(loaded, PeftModel) else loaded
        else:
            loaded = base = None
            gc.collect()
            base = load_model(Path(wanted), dtype, device, trust_remote_code)
        weights = wanted
        loaded = PeftModel.from_pretrained(base, model.checkpoint) if adapter else base
        yield name, loaded
