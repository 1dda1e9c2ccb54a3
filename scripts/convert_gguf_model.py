"""Rule convert_gguf_model: a GGUF model file -> a Hugging Face model folder (offline)."""
import sys
from pathlib import Path

sys.path.insert(0, f"{snakemake.scriptdir}/../src")  # noqa: F821 (injected by Snakemake)
from xtrain.models.gguf import convert
from xtrain.stage import run_stage

run_stage(
    snakemake.log[0],
    lambda: convert(Path(snakemake.input[0]), Path(snakemake.output[0])),
)
