"""Rule evaluate: base vs tuned held-out loss, perplexity and greedy answers (for GRPO: the held-out prompts' greedy
answers scored by the rewards) -> eval.json, generations.json, and each held-out preference pair's scores ->
pairs.json (empty for SFT and GRPO recipes)."""
import sys
from pathlib import Path

sys.path.insert(0, f"{snakemake.scriptdir}/../src")  # noqa: F821 (injected by Snakemake)
from xtrain.chain import ChainModel
from xtrain.evaluate import evaluate
from xtrain.plan import read_plan
from xtrain.plan.schema import JobPlan
from xtrain.recipe import Eval, trusts_remote_code
from xtrain.stage import recipe_file, run_stage

run_stage(
    snakemake.log[0],
    lambda: evaluate(
        model_dir=Path(snakemake.input.model),
        checkpoint_dir=Path(snakemake.input.checkpoint),
        prepared_dir=Path(snakemake.input.prepared),
        settings=Eval.model_validate(snakemake.params.recipe["eval"]),
        out=Path(snakemake.output.metrics),
        generations_out=Path(snakemake.output.generations),
        pairs_out=Path(snakemake.output.pairs),
        trust_remote_code=trusts_remote_code(snakemake.params.recipe),
        job=read_plan(snakemake.input.job_plan, JobPlan),
        # A recipe built on another (model.recipe): every model of its chain, root first (xtrain.chain).
        chain=[ChainModel(**model) for model in snakemake.params.recipe.get("chain", {}).get("models", [])],
        # A GRPO recipe: its prompts are answered and scored by train.rewards (user files from the project's root).
        rewards=snakemake.params.recipe.get("train", {}).get("rewards"),
    ),
    recipe_file(snakemake),
    threads=snakemake.threads,
)
