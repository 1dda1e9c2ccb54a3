"""Rule smoke: smoke/<recipe>/ (smoke.json, report.md, launch.json): the recipe rehearsed on the CPU."""
import sys
from pathlib import Path

sys.path.insert(0, f"{snakemake.scriptdir}/../src")  # noqa: F821 (injected by Snakemake)
from xtrain.train import allocator

# Its train step runs in this process: under the train job's allocator, as the train job would (the 8B DPO recipe's
# smoke: 160 s under glibc, 87 s under the lock's mimalloc; BENCHMARKS.md, "CI's time").
allocator.preload()
from xtrain.recipe import parse_recipe
from xtrain.smoke import smoke
from xtrain.stage import recipe_file, run_stage

name = snakemake.wildcards.recipe
run_stage(
    snakemake.log[0],
    lambda: smoke(
        recipe=parse_recipe(snakemake.params.recipe, recipe_file(snakemake)),
        name=name,
        model_dir=Path(snakemake.input.model),
        sources=[Path(path) for path in snakemake.input.sources],
        out=Path(snakemake.output[0]),
        prices=snakemake.params.gpu_hour_prices,
    ),
    recipe_file(snakemake),
    threads=snakemake.threads,
)
