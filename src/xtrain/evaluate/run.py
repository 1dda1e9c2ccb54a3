"""The evaluate stage: base model vs tuned one on the held-out split -> eval.json and generations.json.

Both are scored on the prepared eval split with the same template and masking as training: the loss is the mean
negative log-likelihood over supervised (assistant) tokens, and perplexity is its exponential (`loss`). On
preference data (train.objective dpo, orpo, kto) the loss is over the chosen (desirable) answers, and
`preferences` adds how each model ranks the answers. Both also answer a fixed set of eval prompts greedily
(`generations`), scored against the reference answers. eval.json holds flat metric names -> numbers
(`recipe.EVAL_METRICS`), for `dvc metrics`; the answers themselves go to generations.json. lm-evaluation-harness
tasks listed in the recipe add their results (`harness`). GRPO's prompts have no reference answer to take a loss on:
every held-out prompt is answered greedily and scored by the recipe's rewards (`rewarded`). The job runs where its
plan puts it (plans/<recipe>/evaluate.json: device, precision, batch), with one copy of the weights loaded at a time.

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
from .rewarded import RewardScorer, load_prompts

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
    rewards: list[dict[str, Any]] | None = None,
    project: Path | None = None,
) -> dict[str, Any]:
    """Write eval.json to `out`, the generations and the preference pairs' scores beside it (or to `generations_out`
    and `pairs_out`); returns the metrics. `job` (plans/<recipe>/evaluate.json) places the models and sets the batch;
    without one, float32 on the CPU at `eval.batch_size`. `chain` (xtrain.chain.chain_models) lists the models of
    a recipe built on others, root first and this recipe's last; by default the model and the checkpoint. GRPO's
    prompts are scored by `rewards` (train.rewards, dumped), user reward files read from `project` (default: the
    working directory, the project's root as Snakemake runs the job)."""
    from transformers import AutoTokenizer

    dtype, device = (DTYPES[job.precision], job.device_map) if job else ("float32", "cpu")
    batch_size = job.batch_size if job else settings.batch_size
    log.info("evaluating %s", job.reason if job else "on the CPU in float32")
    manifest = read_json(prepared_dir / "manifest.json")
    kind = manifest.get("data_kind", "chats")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir, trust_remote_code=trust_remote_code)
    chain = chain or [ChainModel(None, str(model_dir), None), ChainModel(None, str(model_dir), str(checkpoint_dir))]
    models = one_model_at_a_time(named(chain), dtype, device, trust_remote_code)
    if kind == "prompts":
        if not rewards:
            raise XtrainError(f"{prepared_dir} holds GRPO prompts, which are scored by the recipe's train.rewards: "
                              "pass them (the evaluate rule's params hold them for a grpo recipe)")
        scorer = RewardScorer(rewards, project or Path.cwd(), load_prompts(prepared_dir))
        metrics, records, pair_records = score_prompts(models, len(chain), scorer, tokenizer, manifest, settings,
                                                       batch_size)
    else:
        metrics, records, pair_records = score_sequences(models, len(chain), prepared_dir, kind, tokenizer, settings,
                                                         batch_size)
    del models  # lm-eval loads the models itself
    gc.collect()
    if settings.lm_eval is not None:
        from .harness import run_tasks

        metrics.update(run_tasks(settings.lm_eval, model_dir, checkpoint_dir, job.lm_eval_batch_size if job else
                                 settings.batch_size, dtype, device))
    write_json(generations_out or out.with_name("generations.json"), records)
    write_json(pairs_out or out.with_name("pairs.json"), pair_records)
    write_json(out, metrics)
    tracking.log_evaluation(checkpoint_dir, metrics)  # beside training's curves
    return metrics


def score_sequences(models, count: int, prepared_dir: Path, kind: str, tokenizer, settings: Eval, batch_size: int
                    ) -> tuple[dict[str, Any], list[dict], list[dict]]:
    """Chats and preference data: each model's held-out loss (`count` models), base's and tuned's greedy answers
    against the references; the metrics, generations.json's records and pairs.json's."""
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
    progress = Progress(log.info, "evaluate: rows scored and answers generated", count * scored + 2 * len(prompts))
    scores = {}
    for name, model in models:
        if pairs:  # every answer scored once; the loss is over the chosen (desirable) ones among them
            scores[name] = row_nll(model, *pairs.sequences, batch_size, tokenizer.pad_token_id, progress.advance)
            chosen = [scores[name][i] for i in pairs.scored_sequences]
            total, supervised = sum(nll for nll, _ in chosen), sum(n for _, n in chosen)
        else:
            total, supervised = supervised_nll(model, input_ids, masks, batch_size, tokenizer.pad_token_id,
                                               progress.advance)
        loss = total / supervised
        metrics[f"{name}_loss"] = loss
        metrics[f"{name}_perplexity"] = math.exp(loss)
        if prompts and name in ("base", "tuned"):
            answers[name] = generations.generate(model, prompts, stop, tokenizer.pad_token_id, batch_size,
                                                 settings.max_new_tokens, progress.advance)
    metrics["eval_supervised_tokens"] = supervised  # the same split and masks for both models
    metrics["loss_improvement"] = metrics["base_loss"] - metrics["tuned_loss"]
    answer_scores = {name: scores[name] for name in ("base", "tuned") if name in scores}
    if pairs:
        metrics.update(pairs.metrics(answer_scores))
    records = []
    if prompts:
        answer_metrics, records = generations.score(tokenizer, prompts, answers)
        metrics.update(answer_metrics)
        generations.warn_if_not_stopping(metrics)
    return metrics, records, pairs.records(answer_scores, tokenizer) if pairs else []


def score_prompts(models, count: int, scorer: RewardScorer, tokenizer, manifest: dict[str, Any], settings: Eval,
                  batch_size: int) -> tuple[dict[str, Any], list[dict], list[dict]]:
    """GRPO's prompts: every held-out prompt answered greedily by each model (`count` of them) and scored by the
    recipe's rewards (evaluate.rewarded); the metrics, generations.json's records (the first eval.generations
    prompts) and no pairs."""
    prompts = scorer.prompts()
    # Answers end where training's completions do: at the template's end of turn, or the end of sequence.
    stop = {manifest["end_of_turn"]["id"]} | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
    metrics: dict[str, Any] = {"eval_rows": len(prompts), "generations": len(prompts)}
    progress = Progress(log.info, "evaluate: held-out prompts answered and scored", count * len(prompts))
    answers, scores = {}, {}
    for name, model in models:
        answers[name] = generations.generate(model, prompts, stop, tokenizer.pad_token_id, batch_size,
                                             settings.max_new_tokens, progress.advance)
        scores[name] = scorer.score(tokenizer, answers[name])
        metrics.update(scorer.metrics(name, scores[name]))
        metrics[f"{name}_stop_rate"] = sum(answer["stopped"] for answer in answers[name]) / len(prompts)
    metrics["reward_improvement"] = metrics["tuned_reward_mean"] - metrics["base_reward_mean"]
    generations.warn_if_not_stopping(metrics)
    return metrics, scorer.records(tokenizer, answers, scores, settings.generations), []


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
