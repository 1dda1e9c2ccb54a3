"""The GPU check: each backend that can train on this machine's GPU, through xtrain's library and every stage of the
DAG, in one table of predicted against measured.

    bench/gpu_check.sh                                   # on the GPU machine (installs the carried wheels first)
    .venv/bin/python bench/gpu_check.py --device cpu --steps 2   # here: the same code path on the CPU, a few minutes

Runs, each through the workflow's stages as its rules run them (prepare -> plan, with the evaluate and export job
plans of `xtrain.plan.jobs` -> `run_training` and `check_checkpoint` -> `xtrain.evaluate.evaluate` on its job plan
-> `xtrain.export.export`), with train.backend trl_local, on hardware {accelerator: cuda, gpus: 1, gpu_model: h200}
(`--gpu-model`):
- the embedded demo recipe (recipes/demo.yaml, its tiny model built offline as rule build_tiny_model builds it),
  evaluated with EVAL and exported with EXPORT (a merged model and a q8_0 GGUF file: the check's one export);
- a Qwen2.5-0.5B-shaped Llama (bench/gpu_check_plan.py's model, random weights, the demo tokenizer) on
  data/real/c4_demo.jsonl cut into blocks of exactly seq_len tokens, so every batch is as long as the plan
  assumes: LoRA, then a full fine-tune, each evaluated (held-out loss: plain text has no prompts to answer).
The table has a row per stage of a run: where it ran, its wall time (predicted: the plan's `time.seconds`), and
memory, predicted against measured with their ratio and the plan's error (predicted / measured − 1):
- train: plan.json `memory.peak_bytes_per_device` against the training process's `torch.cuda.max_memory_allocated`
  (train_metrics.json `peak_gpu_memory_bytes`); its wall time is launch, load, train and save, its tokens/s
  train_metrics.json's (trainer checkpoints included), and its MFU train_metrics.json's `mfu` (tokens/s × the plan's
  FLOPs per token over the GPU's datasheet peak, or the CPU's measured one); the checkpoint checked with the contract;
- evaluate: evaluate.json's `memory.peak_bytes_per_device` against this process's `torch.cuda.max_memory_allocated`
  from a reset before the stage to its end; the base and tuned losses, which must be finite;
- export: export.json's `memory.host_bytes` against the peak RSS (VmHWM) of the fresh process it runs in, imports
  included, as the export job's; its wall time is the `export()` call, the parts export.json times beside it;
- prepare and plan: their wall time and what they decided.
GPU memory misses when the ratio is outside gpu_check_plan.TOLERANCE (±10%) either way, for train and evaluate
alike; host memory is what the export job asks the scheduler for, so it misses only below the measured peak. Time is
shown, not judged. Backends that cannot run here get a row that says why. The table goes to stdout, row by row,
logs to stderr; the exit status is 1 when a stage fails, the checkpoint breaks the contract, a loss is not finite,
or memory misses.

`--device cpu` runs the same three runs through the same stages on this machine's CPU with hardware {accelerator:
cpu}: the 0.5B shape shrunk as the smoke stage shrinks a recipe's model (xtrain.smoke.model: same vocabulary and
module names, two small layers), seq_len 128 and CPU_EVAL_FRACTION of it held out. There is no GPU memory to
measure; everything else is checked.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import math
import multiprocessing
import os
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import astuple, dataclass
from pathlib import Path

import gpu_check_plan  # bench/: the 0.5B-shaped model and the memory tolerance
import yaml

ROOT = gpu_check_plan.ROOT
GIB = 2**30
GPU_SEQ_LEN, CPU_SEQ_LEN = 1024, 128
# On the CPU the shrunk model (the whole 0.5B vocabulary: fp32 logits of 151,936 per token) scores a batch of 8
# held-out blocks in seconds: 9 blocks of 128 tokens, not the default fraction's 192. The GPU runs keep the default:
# 38 blocks of 1,024 tokens, more than a batch holds, so the batch the plan sizes is the batch measured.
CPU_EVAL_FRACTION = 0.01
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
# Every run's evaluate stage: a few short answers (the check is of placement, memory and time, not of the answers).
EVAL = {"batch_size": 8, "generations": 2, "max_new_tokens": 16}
# The demo run's export stage, the check's one export: a merged model and one quantized GGUF file.
EXPORT = {"merged": True, "gguf": ["q8_0"]}
COLUMNS = ("run", "stage", "where", "memory", "predicted GiB", "measured GiB", "ratio (error)", "predicted s",
           "measured s", "tokens/s", "MFU", "result")
HEADER = "| " + " | ".join(COLUMNS) + " |\n|" + " --- |" * len(COLUMNS)

log = logging.getLogger("gpu_check")


@dataclass
class Row:
    """One line of the table, a stage of a run; `failed` when it fails the check."""

    run: str
    stage: str
    where: str = "-"
    memory: str = "-"
    predicted: str = "-"
    measured: str = "-"
    ratio: str = "-"
    predicted_seconds: str = "-"
    seconds: str = "-"
    tokens_per_second: str = "-"
    mfu: str = "-"
    result: str = "-"
    failed: bool = False

    def markdown(self) -> str:
        cells = astuple(self)[:-1]  # the columns, in order; not `failed`
        return "| " + " | ".join(cell.replace("|", "/").replace("\n", " ") for cell in cells) + " |"


def memory_cells(predicted: int, measured: int | None, upper_bound: bool = False) -> dict:
    """The table's memory cells for a stage, and `failed` when the prediction misses: off by more than
    gpu_check_plan.TOLERANCE either way, or, for an `upper_bound` (host memory, which the job asks the scheduler
    for), below the measured peak."""
    if measured is None:
        return {"predicted": f"{predicted / GIB:.2f}", "measured": "n/a (no GPU)", "ratio": "-", "failed": False}
    error = gpu_check_plan.prediction_error(predicted, measured)
    outside = error < 0 if upper_bound else abs(error) > gpu_check_plan.TOLERANCE
    miss = ", under the measured" if upper_bound else f", outside ±{gpu_check_plan.TOLERANCE:.0%}"
    return {"predicted": f"{predicted / GIB:.2f}", "measured": f"{measured / GIB:.2f}",
            "ratio": f"{predicted / measured:.2f} ({error:+.1%}{miss if outside else ''})", "failed": outside}


def mfu_cell(metrics: dict) -> str:
    """train_metrics.json's model FLOPs utilisation and the peak it is over (a GPU's datasheet figure × devices, the
    CPU's measured peak)."""
    if metrics.get("mfu") is None:
        return f"n/a ({metrics.get('mfu_peak_source', 'not recorded')})"
    return f"{metrics['mfu'] * 100:.3g}% of {metrics['mfu_peak_flops'] / 1e12:.3g} TFLOP/s"


def since(started: float) -> str:
    return f"{time.perf_counter() - started:.1f}"


def peak_rss() -> int:
    """This process's peak resident memory: VmHWM, its own address space's (ru_maxrss would carry what the process
    it was forked from held across fork and exec)."""
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:"))


def export_job(arguments: dict) -> dict:
    """`xtrain.export.export(**arguments)` in a fresh process, as the export job runs: its export.json summary, the
    seconds of the call, and the process's peak RSS (its imports included, as the job's process has them)."""
    configure_logging()
    from xtrain.export import export

    started = time.perf_counter()
    summary = export(**arguments)
    return {"summary": summary, "seconds": since(started), "peak_rss_bytes": peak_rss()}


class DagRun:
    """One recipe through the workflow's stages in `work`, each as its rule runs it and reading what the stage before
    it wrote (prepared/, plan.json, evaluate.json and export.json, the checkpoint, eval.json): one row per stage."""

    def __init__(self, name: str, recipe, model_dir: Path, work: Path):
        self.name, self.recipe, self.model_dir, self.work = name, recipe, model_dir, work
        self.gpu = recipe.hardware.accelerator != "cpu"
        self.manifest: dict = {}

    def rows(self):
        """Each stage's row, in order; a stage that raises gives a failed row, and the stages after it do not run."""
        stages = [self.prepare, self.plan, self.train, self.evaluate] + ([self.export] if self.recipe.export else [])
        self.work.mkdir()
        for stage in stages:
            try:
                yield stage()
            except Exception as exc:  # every failure is a finding of the check
                yield failed_row(self.name, stage.__name__, exc)
                return

    def prepare(self) -> Row:
        from xtrain.data import prepare

        started = time.perf_counter()
        sources = [ROOT / source.path for source in self.recipe.data.sources]
        self.manifest = prepare(sources, self.model_dir, self.recipe.data, self.work / "prepared")
        splits = self.manifest["splits"]
        return Row(self.name, "prepare", "cpu", seconds=since(started),
                   result=f"ok: {splits['train']['rows']} train, {splits['eval']['rows']} eval rows")

    def plan(self) -> Row:
        """plan.json, then the jobs after training: rules plan, plan_evaluate and plan_export."""
        from xtrain.plan import make_plan, write_plan
        from xtrain.plan.jobs import plan_evaluate, plan_export

        recipe, started = self.recipe, time.perf_counter()
        plan = make_plan(self.model_dir, self.manifest, recipe.train, recipe.hardware)
        write_plan(self.work / "plan.json", plan)
        write_plan(self.work / "evaluate.json",
                   plan_evaluate(plan, self.manifest, recipe.eval, recipe.hardware, self.model_dir))
        if recipe.export:
            write_plan(self.work / "export.json", plan_export(plan, recipe.export, recipe.hardware, self.model_dir))
        layout = plan.layout
        return Row(self.name, "plan", "cpu", seconds=since(started),
                   result=f"ok: micro-batch {layout.micro_batch_size} x {layout.gradient_accumulation_steps}, "
                          f"{plan.precision}, checkpointing {'on' if plan.gradient_checkpointing else 'off'}")

    def train(self) -> Row:
        """The checkpoint, checked with the contract; memory: the training process's max_memory_allocated."""
        from xtrain.errors import XtrainError
        from xtrain.plan import read_plan
        from xtrain.train.checkpoint import check_checkpoint
        from xtrain.train.run import run_training

        recipe, plan = self.recipe, read_plan(self.work / "plan.json")
        started = time.perf_counter()
        metrics = run_training(model_dir=self.model_dir, prepared_dir=self.work / "prepared",
                               plan_path=self.work / "plan.json", train=recipe.train, hardware=recipe.hardware,
                               out=self.work / "checkpoint", work_dir=self.work / "runs")
        seconds = since(started)
        try:
            check_checkpoint(self.work / "checkpoint", recipe.train.backend)
            result, broken = f"ok: contract, {metrics['steps']} steps", False
        except XtrainError as exc:
            result, broken = f"no: {exc}", True
        speed = metrics["tokens_per_second"]
        row = Row(self.name, "train", f"{recipe.train.backend}, {recipe.hardware.accelerator}, {plan.precision}",
                  self.memory_kind(), predicted_seconds=f"{plan.time.seconds:.1f}", seconds=seconds,
                  tokens_per_second=f"{speed:,.0f}" if speed else "-", mfu=mfu_cell(metrics), result=result,
                  **memory_cells(plan.memory.peak_bytes_per_device, metrics["peak_gpu_memory_bytes"]))
        row.failed |= broken
        return row

    def evaluate(self) -> Row:
        """eval.json on the job plan's device and precision; memory: this process's max_memory_allocated over it."""
        import torch

        from xtrain.evaluate import evaluate
        from xtrain.plan import read_plan
        from xtrain.plan.schema import JobPlan

        job = read_plan(self.work / "evaluate.json", JobPlan)
        if self.gpu:
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        metrics = evaluate(self.model_dir, self.work / "checkpoint", self.work / "prepared", self.recipe.eval,
                           self.work / "eval.json", job=job)
        seconds = since(started)
        peak = None
        if self.gpu:
            peak = torch.cuda.max_memory_allocated()
            torch.cuda.empty_cache()  # what this process cached, the next run's training process needs
        losses = metrics["base_loss"], metrics["tuned_loss"]
        finite = all(map(math.isfinite, losses))
        row = Row(self.name, "evaluate", f"{job.device_map}, {job.precision}, batch {job.batch_size}",
                  self.memory_kind(), predicted_seconds=f"{job.time.seconds:.1f}", seconds=seconds,
                  result=f"{'ok' if finite else 'no'}: loss base {losses[0]:.3f}, tuned {losses[1]:.3f}",
                  **memory_cells(job.memory.peak_bytes_per_device, peak))
        row.failed |= not finite
        return row

    def export(self) -> Row:
        """exports/<run>/ in a process of its own, on the device its plan places it (the CPU); memory: that process's
        peak RSS against the plan's host memory, an upper bound."""
        from xtrain.artifacts import read_json
        from xtrain.plan import read_plan
        from xtrain.plan.schema import JobPlan

        job, recipe = read_plan(self.work / "export.json", JobPlan), self.recipe
        arguments = {"model_dir": self.model_dir, "checkpoint_dir": self.work / "checkpoint",
                     "prepared_dir": self.work / "prepared", "evaluation": read_json(self.work / "eval.json"),
                     "settings": recipe.export, "train": recipe.train, "hardware": recipe.hardware,
                     "out": self.work / "exports" / self.work.name, "device": job.device_map}
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            done = pool.submit(export_job, arguments).result()
        files, parts = done["summary"]["files"], done["summary"]["seconds"]
        made = [name for name in files if name.endswith(".gguf")] + (["merged/"] if recipe.export.merged else [])
        return Row(self.name, "export", f"{job.device}, {job.precision}", "host RSS",
                   predicted_seconds=f"{job.time.seconds:.1f}", seconds=done["seconds"],
                   result=f"ok: {', '.join(made)} ({sum(files.values()) / 2**20:.1f} MiB in {len(files)} files; "
                          f"its parts {sum(parts.values()):.1f} s of export.json)",
                   **memory_cells(job.memory.host_bytes, done["peak_rss_bytes"], upper_bound=True))

    def memory_kind(self) -> str:
        return "GPU" if self.gpu else "host"


def hardware(args) -> dict:
    if args.device == "cpu":
        return {"accelerator": "cpu", "gpus": 0}
    return {"accelerator": "cuda", "gpus": 1, "gpu_model": args.gpu_model}


def demo_recipe(args):
    """recipes/demo.yaml on trl_local and this check's hardware, for `args.steps` steps, each one logged; evaluated
    with EVAL and exported with EXPORT."""
    from xtrain.recipe import load_recipe, parse_recipe

    recipe = load_recipe(ROOT / "recipes" / "demo.yaml").model_dump(mode="json")
    recipe["train"] |= {"backend": "trl_local", "max_steps": args.steps, "logging_steps": 1}
    return parse_recipe({**recipe, "hardware": hardware(args), "eval": EVAL, "export": EXPORT},
                        "recipes/demo.yaml as the GPU check runs it")


def large_recipe(args, method: str):
    """The 0.5B-shaped run: c4 documents in blocks of seq_len tokens, `args.steps` steps of 8 sequences; evaluated
    with EVAL's batch (held-out loss only), not exported."""
    from xtrain.recipe import parse_recipe

    cpu = args.device == "cpu"
    data = {"sources": [{"path": LARGE_DATA, "format": "text"}], "seq_len": CPU_SEQ_LEN if cpu else GPU_SEQ_LEN}
    return parse_recipe({
        "model": {"path": "built by bench/gpu_check.py"},
        "data": data | ({"eval_fraction": CPU_EVAL_FRACTION} if cpu else {}),
        "train": {"backend": "trl_local", "method": method, "global_batch_size": 8, "max_steps": args.steps,
                  "learning_rate": 1e-4, "logging_steps": 1},
        "hardware": hardware(args),
        "eval": EVAL | {"generations": 0},  # plain text has no prompts to answer: evaluate refuses generations
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


def failed_row(name: str, stage: str, exc: Exception) -> Row:
    """A stage that raised: its row says how, the log has the traceback."""
    log.error("%s, %s failed:\n%s", name, stage, "".join(traceback.format_exception(exc)))
    return Row(name, stage, result=f"failed: {type(exc).__name__}: {exc}"[:300], failed=True)


def checked_runs(args, work: Path):
    """Each run's rows, stage by stage: a run that raises gives a failed row, and the next run still runs."""
    tiny = work / "tiny-llama"
    try:
        demo = DagRun("demo (tiny), lora", demo_recipe(args), tiny_model(tiny), work / "demo")
    except Exception as exc:  # every failure is a finding of the check
        yield failed_row("demo (tiny), lora", "model", exc)
    else:
        yield from demo.rows()
    try:
        name, model_dir = large_model(args, tiny, work)
    except Exception as exc:
        yield from (failed_row(f"0.5B-shaped, {method}", "model", exc) for method in METHODS)
        return
    for method in METHODS:
        yield from DagRun(f"{name}, {method}", large_recipe(args, method), model_dir, work / method).rows()


def not_run_rows() -> list[Row]:
    from xtrain.train.backends.registry import REGISTRY

    unlisted = set(REGISTRY) - set(NOT_RUN) - {"trl_local"}
    if unlisted:  # a new backend must be run here or say why not
        raise SystemExit(f"bench/gpu_check.py: backends {sorted(unlisted)} are neither run nor listed in NOT_RUN")
    return [Row(f"not run: {reason}", "train", backend) for backend, reason in NOT_RUN.items()]


def environment(args) -> str:
    """The device and the versions that trained, for the record above the table."""
    import torch

    from xtrain.train.run import package_versions

    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    versions = {**package_versions(), "pyarrow": importlib.metadata.version("pyarrow")}
    listed = ", ".join(f"{name} {version}" for name, version in versions.items() if name != "xtrain")
    planned = f"planned as {args.gpu_model}" if args.device == "cuda" else "planned for the CPU"
    return f"{device}, Python {sys.version.split()[0]}, {listed}; {planned}, {args.steps} steps per run"


def configure_logging() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    for name in ("xtrain", "gpu_check"):
        logging.getLogger(name).setLevel(logging.INFO)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda: the GPU check; cpu: the same path on this machine's CPU (a dry run)")
    parser.add_argument("--gpu-model", default="h200", help="hardware.gpu_model: a key of xtrain.models.gpus.GPUS")
    # The trainer saves a checkpoint every steps // 4 steps (backends/trl.py): 8 steps save 4, as a longer run does.
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run")
    args = parser.parse_args()
    configure_logging()
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
