"""The end of a run: what each recipe's jobs came to, printed by the workflow's `onsuccess` and `onerror` handlers
(Snakefile), so a run ends on what was built and whether it passed rather than on Snakemake's log line.

For each recipe with a job in the run: the report's path; the held-out figures of eval.json, base -> tuned (the loss,
and what else it holds: how often the chosen answer wins for a preference objective, answer scores when
generations ran; for GRPO the held-out prompts' mean reward and how often each reward passed); the gate's verdict on
each bound of `eval.gate`; the export's folder and the smoke report; or the job that failed, its log, and the jobs it
kept from running.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from .artifacts import read_json
from .evaluate.gate import check, describe
from .recipe import Recipe

DONE, FAILED, NOT_RUN = "done", "failed", "not run"
# A recipe's jobs in the order they run; the last of them shown first when it failed.
ORDER = ("prepare", "plan", "train", "plan_evaluate", "evaluate", "report", "gate", "plan_export", "export", "smoke")


class Job(NamedTuple):
    """One job of the run, as the workflow's handler hands it over."""

    recipe: str
    rule: str
    state: str  # DONE, FAILED or NOT_RUN (the run stopped before it)
    log: tuple[str, ...] = ()


def scores(metrics: dict[str, float]) -> list[tuple[str, str]]:
    """(label, base -> tuned) for each held-out figure eval.json holds."""
    rows = []
    if "tuned_loss" in metrics:
        change = (metrics["tuned_loss"] - metrics["base_loss"]) / metrics["base_loss"]
        rows.append(("loss", f"{metrics['base_loss']:.4f} -> {metrics['tuned_loss']:.4f} held out, base -> tuned "
                             f"({change:+.1%})"))
    if "tuned_reward_mean" in metrics:
        rows.append(("reward", f"{metrics['base_reward_mean']:.4f} -> {metrics['tuned_reward_mean']:.4f} mean over "
                               f"{metrics['eval_rows']} held-out prompts, base -> tuned"))
        rows += [(f"{key.removeprefix('tuned_reward_').removesuffix('_accuracy')} passes",
                  f"{metrics['base' + key.removeprefix('tuned')]:.1%} -> {metrics[key]:.1%} of held-out prompts")
                 for key in metrics if key.startswith("tuned_reward_") and key.endswith("_accuracy")]
    rates = [("preference_accuracy", "chosen wins", "of held-out pairs the chosen answer is the likelier"),
             ("exact_match", "exact", "of answers equal the reference"),
             ("token_f1", "token F1", "mean word overlap with the reference")]
    for key, label, meaning in rates:
        if f"tuned_{key}" in metrics:
            rows.append((label, f"{metrics[f'base_{key}']:.1%} -> {metrics[f'tuned_{key}']:.1%} ({meaning})"))
    if "reward_accuracy" in metrics:
        rows.append(("reward", f"{metrics['reward_accuracy']:.1%} of held-out rows ranked right by the implicit reward"))
    return rows


def gate_verdict(state: str, metrics: dict[str, float] | None, recipe: Recipe) -> str:
    """Each bound of `eval.gate` against eval.json, as the gate job judged it."""
    if state == NOT_RUN or metrics is None:
        return "not reached"
    verdicts = check(metrics, recipe.eval.gate)
    if not verdicts:
        return "no bounds set (eval.gate in the recipe)"
    missed = [v for v in verdicts if not v["passed"]]
    head = f"FAILS {len(missed)} of {len(verdicts)} bounds" if missed else "passes"
    return f"{head}: " + "; ".join(describe(v) for v in missed or verdicts)


def recipe_block(name: str, jobs: list[Job], recipe: Recipe | None, root: Path) -> list[str]:
    """The recipe's name, then one aligned row per thing to tell."""
    state = {job.rule: job.state for job in jobs}
    jobs = sorted(jobs, key=lambda job: ORDER.index(job.rule) if job.rule in ORDER else len(ORDER))
    rows = [("built", ", ".join(job.rule for job in jobs if job.state == DONE) or "nothing")]
    rows += [("FAILED", f"{job.rule}, see {', '.join(job.log) or f'logs/{name}/'}") for job in jobs
             if job.state == FAILED]
    if stopped := [job.rule for job in jobs if job.state == NOT_RUN]:
        rows.append(("not run", ", ".join(stopped)))
    if state.get("report") == DONE:
        rows.append(("report", f"reports/{name}/report.html"))
    # eval.json is this run's when evaluate ran, or was up to date for a report or gate job that ran.
    current = state.get("evaluate", DONE) == DONE and any(state.get(rule) in (DONE, FAILED)
                                                          for rule in ("evaluate", "report", "gate"))
    metrics = read_json(root / "reports" / name / "eval.json") if current else None
    if metrics is not None:
        rows += scores(metrics)
    if "gate" in state and recipe is not None:
        rows.append(("gate", gate_verdict(state["gate"], metrics, recipe)))
    if state.get("export") == DONE:
        folder = root / "exports" / name
        rows.append(("export", f"exports/{name} ({', '.join(sorted(p.name for p in folder.iterdir()))})"))
    if state.get("smoke") == DONE:
        rows.append(("smoke", f"smoke/{name}/report.md"))
    width = max(len(label) for label, _ in rows)
    return [name, *(f"  {label:<{width}}  {text}" for label, text in rows)]


def end_of_run(jobs: Iterable[Job], recipes: Mapping[str, Recipe], root: Path) -> str:
    """The summary of a run's jobs per recipe (empty when no job had a recipe)."""
    by_recipe: dict[str, list[Job]] = {}
    for job in jobs:
        by_recipe.setdefault(job.recipe, []).append(job)
    if not by_recipe:
        return ""
    lines = ["", "xtrain: what this run built"]
    for name in sorted(by_recipe):
        lines += recipe_block(name, by_recipe[name], recipes.get(name), root)
    return "\n".join(lines)
