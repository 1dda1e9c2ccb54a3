"""`smoke/<recipe>/report.md`: each step's result and time, the real plan's figures, and a verdict line."""

from __future__ import annotations

from typing import Any

from ..recipe import Recipe


def duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def plan_lines(plan: dict[str, Any], recipe: Recipe) -> list[str]:
    hardware = recipe.hardware
    where = (f"{hardware.gpus} x {plan['device']} GPU(s) per node x {hardware.nodes} node(s)" if hardware.gpus
             else f"the CPU ({hardware.processes} process(es) per node x {hardware.nodes} node(s))")
    fits = plan["peak_gib_per_device"] <= plan["budget_gib_per_device"]
    lines = [f"- Hardware: {where}; {plan['precision']}, {plan['strategy']}.",
             f"- Memory per device: {plan['peak_gib_per_device']} GiB of {plan['budget_gib_per_device']} GiB usable"
             f" ({'fits' if fits else 'does not fit'}; at worst, every row data.seq_len long).",
             *([f"- Generation (GRPO): {plan['generation']}."] if "generation" in plan else []),
             f"- Time: {plan['steps']} steps, {duration(plan['run_seconds'])}" + (f", {plan['gpu_hours']} GPU-hours" if plan['gpus'] else "")
             + (f", cost {plan['cost']} at {plan['price_per_gpu_hour']} per GPU-hour" if "cost" in plan else "") + "."]
    return lines


def job_lines(jobs: dict[str, Any]) -> list[str]:
    """One line per job after training: where it runs and why, memory, time and what it asks the scheduler for."""
    lines = []
    for name, job in jobs.items():
        resources = job["resources"]
        lines.append(f"- {name}: {job['where']}; {job['peak_gib_per_device']} GiB of {job['budget_gib_per_device']} "
                     f"GiB per device; {duration(job['seconds'])}; asks for {resources['gpus']} GPU(s), "
                     f"{resources['cpus']} CPUs, {resources['mem_mb']} MB, {resources['runtime']} min.")
    return lines


def report_markdown(summary: dict[str, Any], recipe: Recipe) -> str:
    steps = {record["step"]: record for record in summary["steps"]}
    rows = [f"| {r['step']} | {r['status']} | {r['seconds']} s | {r.get('error', '')} |" for r in summary["steps"]]
    lines = [f"# Smoke test of recipes/{summary['recipe']}.yaml: {summary['verdict'].upper()}", "",
             "| step | result | time | error |", "| --- | --- | --- | --- |", *rows, ""]
    if steps.get("prepare", {}).get("status") == "passed":  # the sample, and what prepare dropped from it
        prepare = steps["prepare"]
        lines += [f"Prepared each source's first {prepare['sample_rows_per_source']} rows only (the full run reads "
                  "all): " + "; ".join(f"`{name}` kept {stats['kept']}, dropped "
                                       f"{', '.join(f'{r} {n}' for r, n in stats['dropped'].items()) or 'none'}"
                                       for name, stats in prepare["sources"].items()) + ".", ""]
    if steps.get("plan", {}).get("status") == "passed":
        lines += ["## The real run's plan", "", *plan_lines(steps["plan"], recipe), ""]
    if steps.get("jobs", {}).get("status") == "passed":
        lines += ["## The jobs after training", "", *job_lines(steps["jobs"]["jobs"]), ""]
    if steps.get("launch", {}).get("status") == "passed":
        launch = steps["launch"]
        lines += ["## Launch", "", f"backend `{recipe.train.backend}`; native config in `launch.json`, accepted by "
                  f"{launch['validated_by']}.", "",
                  "```sh", " ".join(launch["argv"]) or "(in process)", "```", "",
                  "Slurm resources of the train job: " + ", ".join(f"{k} {v}" for k, v in launch["resources"].items())
                  + ".", ""]
    if steps.get("train", {}).get("status") == "passed":
        train = steps["train"]
        lines += [f"Trained {train['steps']} steps through `{train['backend']}` on the CPU on the shrunk model "
                  f"({steps['model']['class']}: {', '.join(steps['model']['changed'])}); losses {train['losses']}"
                  + (f"; {train['completions']} completions per step, mean reward per step {train['rewards']}"
                     if "rewards" in train else "") + ".", ""]
    verdict = ("Verdict: ready to submit." if summary["verdict"] == "passed"
               else "Verdict: fix the failed step before submitting; the full run would stop there too.")
    return "\n".join([*lines, verdict, ""])
