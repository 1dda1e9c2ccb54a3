"""Rule compare: reports/compare.html ranking every recipe by its eval metrics."""
import sys
from pathlib import Path

sys.path.insert(0, f"{snakemake.scriptdir}/../src")  # noqa: F821 (injected by Snakemake)
from xtrain.report import write_compare
from xtrain.stage import run_stage

run_stage(
    snakemake.log[0],
    lambda: write_compare({Path(path).parent.name: Path(path) for path in snakemake.input}, Path(snakemake.output[0])),
)
