"""Rule export: a checkpoint -> exports/<recipe>/ (merged model, GGUF files, Ollama Modelfile, model card with
the evaluation results)."""
import sys
from pathlib import Path

sys.path.insert(0, f"{snakemake.scriptdir}/../src")  # noqa: F821 (injected by Snakemake)
from xtrain.artifacts import read_json
from xtrain.export import export
from xtrain.plan import read_plan
from xtrain.plan.schema import JobPlan
from xtrain.recipe import Export, Hardware, Train, trusts_remote_code
from xtrain.stage import recipe_file, run_stage

params = snakemake.params.recipe
run_stage(
    snakemake.log[0],
    lambda: export(
        model_dir=Path(snakemake.input.model),
        checkpoint_dir=Path(snakemake.input.checkpoint),
        prepared_dir=Path(snakemake.input.prepared),
        evaluation=read_json(Path(snakemake.input.metrics)),
        settings=Export.model_validate(params["export"]),
        train=Train.model_validate(params["train"]),
        hardware=Hardware.model_validate(params["hardware"]),
        out=Path(snakemake.output[0]),
        trust_remote_code=trusts_remote_code(params),
        device=read_plan(snakemake.input.job_plan, JobPlan).device_map,
    ),
    recipe_file(snakemake),
    threads=snakemake.threads,
)
