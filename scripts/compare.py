"""Rule compare: reports/compare.html ranking the recipes evaluated on the same eval set by their eval metrics."""
import sys
from pathlib import Path

sys.path.insert(0, f"{snakemake.scriptdir}/../src")  # noqa: F821 (injected by Snakemake)
from xtrain.recipe import load_recipe
from xtrain.report import write_compare
from xtrain.stage import run_stage


def compare() -> None:
    metrics = {Path(path).parent.name: Path(path) for path in snakemake.input}
    folder = Path(snakemake.config["recipes"])
    write_compare(metrics, Path(snakemake.output[0]), {name: Path("prepared", name) for name in metrics},
                  {name: load_recipe(folder / f"{name}.yaml").model_dump(mode="json") for name in metrics})


run_stage(snakemake.log[0], compare)
