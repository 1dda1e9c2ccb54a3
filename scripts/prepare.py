"""Rule prepare: recipe data -> tokenized, masked train/eval splits + manifest.json."""
import sys
from pathlib import Path

sys.path.insert(0, f"{snakemake.scriptdir}/../src")  # noqa: F821 (injected by Snakemake)
from xtrain.data import prepare
from xtrain.recipe import Data, trusts_remote_code
from xtrain.stage import recipe_file, run_stage

run_stage(
    snakemake.log[0],
    lambda: prepare(
        sources=[Path(p) for p in snakemake.input.sources],
        model_dir=Path(snakemake.input.model),
        data=Data.model_validate(snakemake.params.recipe["data"]),
        out=Path(snakemake.output[0]),
        trust_remote_code=trusts_remote_code(snakemake.params.recipe),
        kind=snakemake.params.recipe.get("data_kind", "chats"),
        prompt_settings=snakemake.params.recipe.get("prompts"),
    ),
    recipe_file(snakemake),
    threads=snakemake.threads,
)
