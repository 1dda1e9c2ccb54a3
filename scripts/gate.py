"""Rule gate: the recipe's eval.gate bounds against eval.json; fails the job when one is missed."""
import sys
from pathlib import Path

sys.path.insert(0, f"{snakemake.scriptdir}/../src")  # noqa: F821 (injected by Snakemake)
from xtrain.evaluate.gate import run_gate
from xtrain.recipe import Gate
from xtrain.stage import run_stage

run_stage(
    snakemake.log[0],
    lambda: run_gate(
        Path(snakemake.input.metrics),
        {metric: Gate.model_validate(bounds) for metric, bounds in snakemake.params.recipe["gate"].items()},
        Path(snakemake.output[0]),
    ),
)
