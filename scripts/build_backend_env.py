"""Rule build_backend_env: a backend's lock for an accelerator (envs/<backend>.lock, envs/<backend>-cuda.lock, from its
spec) -> the virtual environment .venvs/<backend>/ or .venvs/<backend>-cuda/."""
import sys
from pathlib import Path

sys.path.insert(0, f"{snakemake.scriptdir}/../src")  # noqa: F821 (injected by Snakemake)
from xtrain.project.envs import build
from xtrain.stage import run_stage

run_stage(
    snakemake.log[0],
    lambda: build(Path(snakemake.input.spec), Path(snakemake.output[0]).parent, snakemake.params.uninstall,
                  snakemake.params.accelerator),
)
