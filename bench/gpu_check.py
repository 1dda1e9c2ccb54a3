"""The GPU check: each backend that can train on this machine's GPU, through xtrain's library, in one table.

    bench/gpu_check.sh                                   # on the GPU machine (installs the carried wheels first)
    .venv/bin/python bench/gpu_check.py --device cpu --steps 2   # here: the same code path on the CPU, ~1 min

Runs, each prepare -> plan -> `run_training` -> `check_checkpoint` (the checkpoint contract) with
train.backend trl_local, on hardware {accelerator: cuda, gpus: 1, gpu_model: h200} (`--gpu-model`):
- the embedded demo recipe (recipes/demo.yaml, its tiny model built offline as rule build_tiny_model builds it);
- a Qwen2.5-0.5B-shaped Llama (bench/gpu_check_plan.py's model, random weights, the demo tokenizer) on
  data/real/c4_demo.jsonl cut into blocks of exactly seq_len tokens, so every batch is as long as the plan
  assumes: LoRA, then a full fine-tune.
For each run the table gives the plan's predicted peak GPU memory per device (plan.json
memory.peak_bytes_per_device), the training process's `torch.cuda.max_memory_allocated` (train_metrics.json
peak_gpu_memory_bytes), their ratio predicted / measured (flagged outside gpu_check_plan.TOLERANCE), the train
stage's wall time (launch, load, train, save), train_metrics.json's tokens/s (its trainer checkpoints included),
and whether the checkpoint meets the contract. Backends that cannot run here get a row that says why. The table
goes to stdout, row by row, logs to stderr; the exit status is 1 when a run fails, breaks the contract or misses
the memory tolerance.

`--device cpu` runs the same three runs on this machine's CPU with hardware {accelerator: cpu}: the 0.5B
shape shrunk as the smoke stage shrinks a recipe's model (xtrain.smoke.model: same vocabulary and module
names, two small layers) and seq_len 128. There is no GPU memory to measure; everything else is checked.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import gpu_check_plan  # bench/: the 0.5B-shaped model and the memory tolerance
import yaml

ROOT = gpu_check_plan.ROOT
GIB = 2**30
GPU_SEQ_LEN, CPU_SEQ_LEN = 1024, 128
LARGE_DATA = "data/real/c4_demo.jsonl"  # plain documents: blocks of exactly seq_len tokens
METHODS = ("lora", "full")
# Every backend of xtrain.train.backends.REGISTRY but trl_local, with why this check does not train it (one NVIDIA GPU
# whose image lacks the lane's stack, and no network to fetch it).
NOT_RUN = {
    "trl_cpu": "the CPU lane; trl_local runs the same trainer on the GPU",
    "axolotl": "its stack (envs/axolotl-cuda.lock: axolotl 0.19 with its own transformers, trl and peft pins, "
               "bitsandbytes, xformers, liger-kernel) is not in the image, and bitsandbytes alone is a 41 MiB wheel: "
               "with this check's own 26 MiB, over the 64 MiB a call carries",
    "unsloth": "its stack (envs/unsloth-cuda.lock: unsloth with trl 1.15 and datasets 4.8, bitsandbytes, xformers) "
               "is not in the image, and bitsandbytes alone is a 41 MiB wheel: with this check's own 26 MiB, over "
               "the 64 MiB a call carries",
    "torchtune": "torchtune 0.6.1 and torchao 0.11.0 are not in the image (an option: see bench/gpu_check.sh)",
    "primus": "AMD's ROCm-only stack (rocm/primus image); this machine's GPU is NVIDIA",
}
HEADER = ("| run | backend | steps | predicted GiB | measured GiB | ratio | seconds | tokens/s | contract ok |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")

log = logging.getLogger("gpu_check")


@dataclass
class Row:
    """One line of the table; `failed` when it fails the check."""

    run: str
    backend: str
    steps: str = "-"
    predicted: str = "-"
    measured: str = "-"
    ratio: str = "-"
    seconds: str = "-"
    tokens_per_second: str = "-"
    contract: str = "-"
    failed: bool = False

    def markdown(self) -> str:
        cells = (self.run, self.backend, self.steps, self.predicted, self.measured, self.ratio, self.seconds,
                 self.tokens_per_second, self.contract)
        return "| " + " | ".join(cell.replace("|", "/").replace("\n", " ") for cell in cells) + " |"


def memory_cells(predicted: int, measured: int | None) -> dict:
    """The table's memory cells for a run; `failed` when the prediction misses the tolerance."""
    if measured is None:
        return {"predicted": f"{predicted / GIB:.2f}", "measured": "n/a (no GPU)", "ratio": "-"}
    error = gpu_check_plan.prediction_error(predicted, measured)
    outside = abs(error) > gpu_check_plan.TOLERANCE
    ratio = f"{predicted / measured:.2f}" + (f" (outside ±{gpu_check_plan.TOLERANCE:.0%})" if outside else "")
    return {"predicted": f"{predicted / GIB:.2f}", "measured": f"{measured / GIB:.2f}", "ratio": ratio,
            "failed": outside}


def train_row(name: str, recipe, model_dir: Path, work: Path) -> Row:
    """Prepare, plan and train `recipe` into `work`, check its checkpoint: the run's row."""
    from xtrain.data import prepare
    from xtrain.errors import XtrainError
    from xtrain.plan import make_plan, write_plan
    from xtrain.train.checkpoint import check_checkpoint
    from xtrain.train.run import run_training

    work.mkdir()
    sources = [ROOT / source.path for source in recipe.data.sources]
    manifest = prepare(sources, model_dir, recipe.data, work / "prepared")
    plan = make_plan(model_dir, manifest, recipe.train, recipe.hardware)
    write_plan(work / "plan.json", plan)
    started = time.perf_counter()
    metrics = run_training(model_dir=model_dir, prepared_dir=work / "prepared", plan_path=work / "plan.json",
                           train=recipe.train, hardware=recipe.hardware, out=work / "checkpoint",
                           work_dir=work / "runs")
    seconds = time.perf_counter() - started
    try:
        check_checkpoint(work / "checkpoint", recipe.train.backend)
        contract, broken = "ok", False
    except XtrainError as exc:
        contract, broken = f"no: {exc}", True
    speed = metrics["tokens_per_second"]
    cells = {"steps": str(metrics["steps"]), "seconds": f"{seconds:.1f}",
             "tokens_per_second": f"{speed:,.0f}" if speed else "-", "contract": contract,
             **memory_cells(plan.memory.peak_bytes_per_device, metrics["peak_gpu_memory_bytes"])}
    return Row(name, recipe.train.backend, **{**cells, "failed": broken or cells.get("failed", False)})


def hardware(args) -> dict:
    if args.device == "cpu":
        return {"accelerator": "cpu", "gpus": 0}
    return {"accelerator": "cuda", "gpus": 1, "gpu_model": args.gpu_model}


def demo_recipe(args):
    """recipes/demo.yaml on trl_local and this check's hardware, for `args.steps` steps, each one logged."""
    from xtrain.recipe import load_recipe, parse_recipe

    recipe = load_recipe(ROOT / "recipes" / "demo.yaml").model_dump(mode="json")
    recipe["train"] |= {"backend": "trl_local", "max_steps": args.steps, "logging_steps": 1}
    return parse_recipe({**recipe, "hardware": hardware(args)}, "recipes/demo.yaml as the GPU check runs it")


def large_recipe(args, method: str):
    """The 0.5B-shaped run: c4 documents in blocks of seq_len tokens, `args.steps` steps of 8 sequences."""
    from xtrain.recipe import parse_recipe

    seq_len = CPU_SEQ_LEN if args.device == "cpu" else GPU_SEQ_LEN
    return parse_recipe({
        "model": {"path": "built by bench/gpu_check.py"},
        "data": {"sources": [{"path": LARGE_DATA, "format": "text"}], "seq_len": seq_len},
        "train": {"backend": "trl_local", "method": method, "global_batch_size": 8, "max_steps": args.steps,
                  "learning_rate": 1e-4, "logging_steps": 1},
        "hardware": hardware(args),
    }, f"the GPU check's 0.5B-shaped {method} recipe")


def tiny_model(out: Path) -> Path:
    """The embedded demo model, built as rule build_tiny_model builds it."""
    from xtrain.models.tiny import build_tiny_model

    settings = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["tiny_model"]
    out.mkdir()
    build_tiny_model(ROOT / settings["corpus"], out, **settings["settings"])
    return out


def large_model(args, tokenizer_dir: Path, work: Path) -> tuple[str, Path]:
    """The 0.5B-shaped model with the demo tokenizer: random weights on the GPU; shrunk on the CPU. Its name too."""
    from transformers import AutoTokenizer

    from xtrain.smoke.model import build_shrunk_model

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    folder = work / "qwen2.5-0.5b-shaped"
    if args.device == "cuda":
        return "0.5B-shaped", gpu_check_plan.build_model(folder, tokenizer)
    folder.mkdir()
    gpu_check_plan.model_config(tokenizer).save_pretrained(folder)  # no weights: the shrunk copy reads none
    tokenizer.save_pretrained(folder)
    build_shrunk_model(folder, work / "shrunk")
    return "0.5B-shaped, shrunk", work / "shrunk"


def failed_row(name: str, exc: Exception) -> Row:
    """A run that raised: its row says how, the log has the traceback."""
    log.error("%s failed:\n%s", name, "".join(traceback.format_exception(exc)))
    return Row(name, "trl_local", contract=f"failed: {type(exc).__name__}: {exc}"[:300], failed=True)


def checked_runs(args, work: Path):
    """Each run's row, in order: a run that raises gives a failed row, and the next one still runs."""
    tiny = work / "tiny-llama"
    try:
        yield train_row("demo (tiny), lora", demo_recipe(args), tiny_model(tiny), work / "demo")
    except Exception as exc:  # every failure is a finding of the check
        yield failed_row("demo (tiny), lora", exc)
    try:
        name, model_dir = large_model(args, tiny, work)
    except Exception as exc:
        yield from (failed_row(f"0.5B-shaped, {method}", exc) for method in METHODS)
        return
    for method in METHODS:
        try:
            yield train_row(f"{name}, {method}", large_recipe(args, method), model_dir, work / method)
        except Exception as exc:
            yield failed_row(f"{name}, {method}", exc)


def not_run_rows() -> list[Row]:
    from xtrain.train.backends.registry import REGISTRY

    unlisted = set(REGISTRY) - set(NOT_RUN) - {"trl_local"}
    if unlisted:  # a new backend must be run here or say why not
        raise SystemExit(f"bench/gpu_check.py: backends {sorted(unlisted)} are neither run nor listed in NOT_RUN")
    return [Row(f"not run: {reason}", backend) for backend, reason in NOT_RUN.items()]


def environment(args) -> str:
    """The device and the versions that trained, for the record above the table."""
    import torch

    from xtrain.train.run import package_versions

    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    versions = {**package_versions(), "pyarrow": importlib.metadata.version("pyarrow")}
    listed = ", ".join(f"{name} {version}" for name, version in versions.items() if name != "xtrain")
    planned = f"planned as {args.gpu_model}" if args.device == "cuda" else "planned for the CPU"
    return f"{device}, Python {sys.version.split()[0]}, {listed}; {planned}, {args.steps} steps per run"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda: the GPU check; cpu: the same path on this machine's CPU (a dry run)")
    parser.add_argument("--gpu-model", default="h200", help="hardware.gpu_model: a key of xtrain.models.gpus.GPUS")
    # The trainer saves a checkpoint every steps // 4 steps (backends/trl.py): 8 steps save 4, as a longer run does.
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    for name in ("xtrain", "gpu_check"):
        logging.getLogger(name).setLevel(logging.INFO)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU here: run on the GPU machine, or with --device cpu", file=sys.stderr)
        return 2
    rows = not_run_rows()
    print(environment(args), end="\n\n")
    print(HEADER, flush=True)
    failed = False
    with tempfile.TemporaryDirectory(prefix="xtrain-gpu-check-") as tmp:
        for row in checked_runs(args, Path(tmp)):
            print(row.markdown(), flush=True)
            failed |= row.failed
    for row in rows:
        print(row.markdown(), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    os.chdir(ROOT)  # recipe and data paths are relative to the project, as in the workflow
    sys.exit(main())
