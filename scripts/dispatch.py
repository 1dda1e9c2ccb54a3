"""Rule train: the one dispatch script for every backend (looked up by train.backend)."""
import sys
from pathlib import Path

sys.path.insert(0, f"{snakemake.scriptdir}/../src")  # noqa: F821 (injected by Snakemake)
from xtrain.train import allocator

allocator.preload()  # TCMalloc or jemalloc when the machine has one: this script starts again under it
from xtrain.recipe import Hardware, Train, trusts_remote_code
from xtrain.stage import recipe_file, run_stage
from xtrain.train.run import run_training

recipe = snakemake.params.recipe
# A recipe built on another (model.recipe): the upstream checkpoint, and whether its adapter trains further.
upstream = Path(snakemake.input.upstream[0]) if snakemake.input.upstream else None
continued = recipe.get("chain", {}).get("adapter") == "continue"
run_stage(
    snakemake.log[0],
    lambda: run_training(
        model_dir=Path(snakemake.input.model),
        prepared_dir=Path(snakemake.input.prepared),
        plan_path=Path(snakemake.input.plan),
        train=Train.model_validate(recipe["train"]),
        hardware=Hardware.model_validate(recipe["hardware"]),
        out=Path(snakemake.output[0]),
        work_dir=Path(snakemake.params.work_dir),
        trust_remote_code=trusts_remote_code(recipe),
        upstream=upstream,
        adapter_init=upstream if continued else None,
    ),
    recipe_file(snakemake),
    threads=snakemake.threads,
)
