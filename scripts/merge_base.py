"""Rule merge_base: a LoRA checkpoint merged into its base -> bases/<recipe>/, the model the recipes built on it
(model.recipe) train on."""
import sys
from pathlib import Path

sys.path.insert(0, f"{snakemake.scriptdir}/../src")  # noqa: F821 (injected by Snakemake)
from xtrain.export.merge import write_merged_base
from xtrain.recipe import trusts_remote_code
from xtrain.stage import recipe_file, run_stage

run_stage(
    snakemake.log[0],
    lambda: write_merged_base(
        model_dir=Path(snakemake.input.model),
        checkpoint_dir=Path(snakemake.input.checkpoint),
        out=Path(snakemake.output[0]),
        trust_remote_code=trusts_remote_code(snakemake.params.recipe),
    ),
    recipe_file(snakemake),
    threads=snakemake.threads,
)
