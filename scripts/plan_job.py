"""Rules plan_evaluate and plan_export: plan.json + the job's recipe section -> plans/<recipe>/<job>.json."""
import sys
from pathlib import Path

sys.path.insert(0, f"{snakemake.scriptdir}/../src")  # noqa: F821 (injected by Snakemake)
from xtrain.artifacts import read_json
from xtrain.plan import read_plan, write_plan
from xtrain.plan.jobs import plan_evaluate, plan_export
from xtrain.recipe import Eval, Export, Hardware, trusts_remote_code
from xtrain.stage import recipe_file, run_stage


def plan_job():
    recipe, model_dir = snakemake.params.recipe, Path(snakemake.input.model)
    plan, hardware, trust = read_plan(snakemake.input.plan), Hardware.model_validate(recipe["hardware"]), \
        trusts_remote_code(recipe)
    if snakemake.rule == "plan_evaluate":
        manifest = read_json(Path(snakemake.input.prepared) / "manifest.json")
        job = plan_evaluate(plan, manifest, Eval.model_validate(recipe["eval"]), hardware, model_dir, trust)
    else:
        job = plan_export(plan, Export.model_validate(recipe["export"]), hardware, model_dir, trust)
    write_plan(snakemake.output[0], job)


run_stage(snakemake.log[0], plan_job, recipe_file(snakemake))
