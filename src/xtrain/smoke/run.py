"""The smoke stage: a recipe's own path, end to end on the CPU in minutes, before it waits in a GPU queue.

`smoke/<recipe>/` (rule smoke; nothing there is an input of another stage):
- prepare: the recipe's tokenizer, chat template and data (each source's first `SAMPLE_ROWS` rows) through the
  real prepare code, so a template, format, mask or length problem shows as the full run would show it;
- plan: the real plan for the recipe's own hardware, from the model's `config.json` (no weights), the full
  data's row count and the sample's lengths at worst (every row `data.seq_len` long): memory per device
  against the device's, time, GPU-hours, and a cost where the config prices the GPU;
- jobs: the real plans of the jobs after training (`plan.jobs`: evaluate, and export when the recipe asks): where
  each runs and why, memory per device against the device's, time, and the resources it asks for; a job that
  does not fit its node fails here;
- launch: what the backend would run on that hardware (`native`: its native config and argv), checked by the
  lane's own validator as that hardware's node would check it (`validate`: Axolotl's config loader with the GPU's
  capabilities, `tune validate`, TRL's config classes), and the Slurm resources the train job would request;
- model: the recipe's model shrunk (`smoke.model`: same class, vocabulary, attention layout, module names);
- train: `SMOKE_STEPS` optimizer steps through the recipe's own backend on the CPU, in its own environment,
  checked against the checkpoint contract; a GRPO recipe's steps sample `train.rl.generations` completions for
  each of `SMOKE_BATCH` prompts (at most `SMOKE_COMPLETION` tokens) and score them with the recipe's own rewards;
- evaluate: the sample's eval rows and two greedy answers, base vs tuned.
Each step passes or fails with its time and error (`smoke.json`, `report.md`, and the log); a step that needs a
failed one is skipped. Any failure fails the stage with the first error, the message the full run would give.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..artifacts import atomic_dir, write_json
from ..data import prepare
from ..data.pipeline import local_paths
from ..data.sources import read_source
from ..errors import XtrainError
from ..evaluate import evaluate
from ..plan import make_plan, write_plan
from ..plan.jobs import plan_evaluate, plan_export
from ..plan.schema import Generation, JobPlan
from ..recipe import DATA_KINDS, Eval, Hardware, Recipe, Train, stage_params
from ..train.backends.contract import TrainJob
from ..train.backends.registry import check
from ..train.checkpoint import check_checkpoint
from ..train.run import run_training
from .model import build_shrunk_model
from .report import report_markdown

log = logging.getLogger(__name__)

SAMPLE_ROWS = 100  # about 10 eval rows at the default data.eval_fraction
SMOKE_STEPS = 3
SMOKE_BATCH = 2  # rows per step: sequences, pairs, or GRPO prompts (each with its group of completions)
SMOKE_COMPLETION = 16  # GRPO: longest completion sampled in the smoke's steps
SMOKE_EVAL = Eval(batch_size=4, generations=2, max_new_tokens=8)


class Steps:
    """The smoke steps run so far: each one's status, seconds, result details or error."""

    def __init__(self):
        self.records: list[dict[str, Any]] = []

    def run(self, name: str, needs: tuple[str, ...], action: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        if failed := [step for step in needs if not self.passed(step)]:
            self.records.append({"step": name, "status": "skipped", "seconds": 0, "error": f"needs {', '.join(failed)}"})
            return None
        started = time.perf_counter()
        try:
            details = action()
        except Exception as exc:  # every failure is a finding of the smoke test, reported with its step
            if not isinstance(exc, XtrainError):
                log.error("smoke step %s:\n%s", name, traceback.format_exc())
            error = str(exc) if isinstance(exc, XtrainError) else f"{type(exc).__name__}: {exc}"
            self.records.append({"step": name, "status": "failed", "seconds": round(time.perf_counter() - started, 1),
                                 "error": error})
            log.error("smoke step %s failed: %s", name, error)
            return None
        self.records.append({"step": name, "status": "passed", "seconds": round(time.perf_counter() - started, 1),
                             **details})
        log.info("smoke step %s passed in %.1f s", name, self.records[-1]["seconds"])
        return details

    def passed(self, name: str) -> bool:
        return any(record["step"] == name and record["status"] == "passed" for record in self.records)

    def first_error(self) -> str | None:
        return next((f"{r['step']}: {r['error']}" for r in self.records if r["status"] == "failed"), None)


def smoke_settings(train: Train) -> Train:
    """The recipe's train section for the smoke's few CPU steps: `SMOKE_STEPS` steps of `SMOKE_BATCH` rows; for GRPO
    that many prompts, each with its `train.rl.generations` completions of at most `SMOKE_COMPLETION` tokens, one
    generation per step."""
    update = {"max_steps": SMOKE_STEPS, "global_batch_size": SMOKE_BATCH, "micro_batch_size": None, "logging_steps": 1}
    if train.objective == "grpo":
        rl = train.rl.model_copy(update={"max_completion_length": min(train.rl.max_completion_length, SMOKE_COMPLETION),
                                         "steps_per_generation": None})
        update |= {"global_batch_size": SMOKE_BATCH * train.rl.generations, "rl": rl}
    return train.model_copy(update=update)


def full_data_manifest(sample: dict[str, Any], sources: list[Path], recipe: Recipe) -> dict[str, Any]:
    """The sample's manifest as the full data would give it: each split scaled to every source's row count, and
    every row as long as data.seq_len (the longest the full run may meet), for the real plan."""
    total = sum(len(read_source(source, path).rows) for source, path in zip(recipe.data.sources,
                                                                               local_paths(recipe.data, sources)))
    read = sum(stats["rows"] for stats in sample["sources"].values())
    scale = total / read
    splits = {}
    for name, split in sample["splits"].items():
        splits[name] = dict(split)
        for key in ("rows", "tokens", "supervised_tokens"):
            splits[name][key] = max(1, round(split[key] * scale))
        splits[name]["max_len"] = sample["seq_len"]
    return {**sample, "splits": splits}


def real_plan(recipe: Recipe, model_dir: Path, manifest: dict, prices: dict[str, float]):
    plan = make_plan(model_dir, manifest, recipe.train, recipe.hardware, recipe.model.trust_remote_code)
    devices = recipe.hardware.devices if recipe.hardware.gpus else 0
    gpu_hours = plan.time.seconds / 3600 * devices
    price = prices.get(recipe.hardware.gpu or "")
    return plan, {
        "device": plan.memory.device, "peak_gib_per_device": round(plan.memory.peak_bytes_per_device / 2**30, 2),
        "budget_gib_per_device": round(plan.memory.budget_bytes_per_device / 2**30, 2),
        "precision": plan.precision, "strategy": plan.layout.strategy, "steps": plan.time.steps,
        "run_seconds": round(plan.time.seconds), "gpus": devices, "gpu_hours": round(gpu_hours, 2),
        **({"cost": round(gpu_hours * price, 2), "price_per_gpu_hour": price} if price is not None else {}),
        **({"generation": generation_summary(plan.generation)} if plan.generation else {}),
    }


def generation_summary(phase: Generation) -> str:
    """GRPO's generation phase in words, for the smoke report."""
    gib = 2**30
    return (f"{phase.completions_per_device} completions per device ({phase.prompts_per_device} prompts) of up to "
            f"{phase.completion_tokens} tokens after prompts of up to {phase.prompt_tokens}; KV cache "
            f"{phase.kv_cache_bytes / gib:.2f} GiB, phase peak {phase.peak_bytes_per_device / gib:.2f} GiB (training "
            f"step {phase.training_peak_bytes_per_device / gib:.2f} GiB); {phase.tokens_per_second:g} completion "
            f"tokens/s, {phase.seconds_per_step:g} s of each optimizer step")


def job_figures(job: JobPlan) -> dict[str, Any]:
    """What the smoke report shows of a job after training."""
    return {"where": job.reason, "peak_gib_per_device": round(job.memory.peak_bytes_per_device / 2**30, 2),
            "budget_gib_per_device": round(job.memory.budget_bytes_per_device / 2**30, 2),
            "seconds": round(job.time.seconds), "resources": job.resources.model_dump()}


def smoke(*, recipe: Recipe, name: str, model_dir: Path, sources: list[Path], out: Path,
          prices: dict[str, float]) -> dict[str, Any]:
    """Run every step into `out`; raise the first failure's error after writing the record to the log."""
    steps, trust = Steps(), recipe.model.trust_remote_code
    kind = DATA_KINDS[recipe.train.objective]
    smoke_train = smoke_settings(recipe.train)
    with atomic_dir(out) as staging:
        prepared = staging / "prepared"
        manifest: dict[str, Any] = {}

        def prepare_sample():
            manifest.update(prepare(sources, model_dir, recipe.data, prepared, trust, kind, limit=SAMPLE_ROWS,
                                    prompt_settings=stage_params(recipe, "prepare").get("prompts")))
            train = manifest["splits"]["train"]
            return {"sample_rows_per_source": SAMPLE_ROWS, "rows": train["rows"], "tokens": train["tokens"],
                    "masking": manifest.get("masking"),
                    "sources": {n: {"kept": s["kept"], "dropped": dict(s["dropped"])}
                                for n, s in manifest["sources"].items()}}

        steps.run("prepare", (), prepare_sample)
        plan_holder: dict[str, Any] = {}

        def plan_real():
            plan_holder["manifest"] = full_data_manifest(manifest, sources, recipe)
            plan_holder["plan"], figures = real_plan(recipe, model_dir, plan_holder["manifest"], prices)
            return figures

        steps.run("plan", ("prepare",), plan_real)

        def plan_jobs():
            plan, full = plan_holder["plan"], plan_holder["manifest"]
            jobs = {"evaluate": plan_evaluate(plan, full, recipe.eval, recipe.hardware, model_dir, trust)}
            if recipe.export is not None:
                jobs["export"] = plan_export(plan, recipe.export, recipe.hardware, model_dir, trust)
            return {"jobs": {name: job_figures(job) for name, job in jobs.items()}}

        steps.run("jobs", ("plan",), plan_jobs)

        def render_launch():
            backend = check(recipe.train.backend, recipe.train, recipe.hardware, manifest.get("packing", False))
            # On the sample's prepared data (the backend reads it to decide packing): paths point into smoke/.
            job = TrainJob(model_dir, prepared, plan_holder["plan"], recipe.train, recipe.hardware,
                           Path("checkpoints") / name, Path("runs") / name, None, trust)
            native = backend.native(job)
            write_json(staging / "launch.json", json.loads(json.dumps(native, default=str)))
            checked = backend.validate(job, native, staging / "validate")
            return {"argv": [str(arg) for arg in native.get("argv") or []], "validated_by": checked["validator"],
                    "resources": plan_holder["plan"].resources.model_dump()}

        steps.run("launch", ("plan",), render_launch)
        shrunk = staging / "model"
        steps.run("model", (), lambda: build_shrunk_model(model_dir, shrunk, recipe.train.seed, trust))

        def train_steps():
            cpu = Hardware()
            plan = make_plan(shrunk, manifest, smoke_train, cpu, trust)
            write_plan(staging / "plan.json", plan)
            run_training(model_dir=shrunk, prepared_dir=prepared, plan_path=staging / "plan.json", train=smoke_train,
                         hardware=cpu, out=staging / "checkpoint", work_dir=staging / "runs", trust_remote_code=trust)
            metrics = check_checkpoint(staging / "checkpoint", recipe.train.backend)
            return {"backend": recipe.train.backend, "steps": metrics["steps"],
                    "losses": [round(entry["loss"], 4) for entry in metrics["loss"]],
                    **({"rewards": [round(entry["reward"], 4) for entry in metrics["rl"]],
                        "completions": smoke_train.global_batch_size} if "rl" in metrics else {})}

        steps.run("train", ("prepare", "model"), train_steps)

        def evaluate_sample():
            # A GRPO recipe's held-out prompts are answered and scored by its own rewards (user files from the project).
            scoring = ({"rewards": recipe.model_dump(mode="json")["train"]["rewards"]}
                       if recipe.train.objective == "grpo" else {})
            metrics = evaluate(shrunk, staging / "checkpoint", prepared, SMOKE_EVAL, staging / "eval.json",
                               trust_remote_code=trust, **scoring)
            # Prompts have no reference answer, so no loss: the tuned model's mean reward instead.
            return {"eval_rows": metrics["eval_rows"],
                    **{name: round(metrics[name], 4) for name in ("tuned_loss", "tuned_reward_mean") if name in metrics}}

        steps.run("evaluate", ("train",), evaluate_sample)
        error = steps.first_error()
        summary = {"recipe": name, "verdict": "failed" if error else "passed", "steps": steps.records}
        report = report_markdown(summary, recipe)
        log.info("smoke report:\n%s", report)
        if error:
            raise XtrainError(f"smoke test of recipes/{name}.yaml failed at {error}")
        write_json(staging / "smoke.json", summary)
        (staging / "report.md").write_text(report, encoding="utf-8")
    return summary
