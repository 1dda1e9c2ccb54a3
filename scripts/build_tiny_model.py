"""Rule build_tiny_model: the embedded demo model, built offline from text in the repo."""
import sys
from pathlib import Path

sys.path.insert(0, f"{snakemake.scriptdir}/../src")  # noqa: F821 (injected by Snakemake)
from xtrain.artifacts import atomic_dir
from xtrain.models.tiny import build_tiny_model
from xtrain.stage import run_stage


def build():
    with atomic_dir(snakemake.output[0]) as staging:
        build_tiny_model(Path(snakemake.input.corpus), staging, **snakemake.params.settings)


run_stage(snakemake.log[0], build)
