"""Rule report: reports/<recipe>/report.html and its plots, from every stage's outputs."""
import sys
from pathlib import Path

sys.path.insert(0, f"{snakemake.scriptdir}/../src")  # noqa: F821 (injected by Snakemake)
from xtrain.report import PLOTS, write_report
from xtrain.stage import run_stage

run_stage(
    snakemake.log[0],
    lambda: write_report(
        name=snakemake.wildcards.recipe,
        recipe=snakemake.params.recipe,
        plan_path=Path(snakemake.input.plan),
        checkpoint_dir=Path(snakemake.input.checkpoint),
        prepared_dir=Path(snakemake.input.prepared),
        metrics_path=Path(snakemake.input.metrics),
        generations_path=Path(snakemake.input.generations),
        pairs_path=Path(snakemake.input.pairs),
        out=Path(snakemake.output.html),
        plot_paths={key: Path(snakemake.output[f"{key}_plot"]) for key in PLOTS},
    ),
)
