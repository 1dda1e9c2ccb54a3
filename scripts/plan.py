"""Rule plan: model shape + data stats + hardware -> plan.json."""
import sys
from pathlib import Path

sys.path.insert(0, f"{snakemake.scriptdir}/../src")  # noqa: F821 (injected by Snakemake)
from xtrain.artifacts import read_json
from xtrain.plan import make_plan, write_plan
from xtrain.recipe import Hardware, Train, trusts_remote_code
from xtrain.stage import recipe_file, run_stage


def plan():
    recipe = snakemake.params.recipe
    result = make_plan(
        model_dir=Path(snakemake.input.model),
        manifest=read_json(Path(snakemake.input.prepared) / "manifest.json"),
        train=Train.model_validate(recipe["train"]),
        hardware=Hardware.model_validate(recipe["hardware"]),
        trust_remote_code=trusts_remote_code(recipe),
    )
    write_plan(snakemake.output[0], result)


run_stage(snakemake.log[0], plan, recipe_file(snakemake))
