"""Regression gates: the recipe's `eval.gate` bounds checked against eval.json.

Its own pipeline step after the report, so a failing gate fails the workflow while eval.json,
generations.json and report.html stay in place for the person who has to find out why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..artifacts import read_json, write_json
from ..errors import XtrainError
from ..recipe import Gate


def check(metrics: dict[str, float], gates: dict[str, Gate]) -> list[dict[str, Any]]:
    """One verdict per gate: the value, its bounds, whether it passed and by how much it missed."""
    verdicts = []
    for metric, gate in sorted(gates.items()):
        value = metrics[metric]
        missed = max(gate.min - value if gate.min is not None else 0.0,
                     value - gate.max if gate.max is not None else 0.0)
        verdicts.append({"metric": metric, "value": value, "min": gate.min, "max": gate.max,
                         "passed": missed <= 0, "missed_by": max(missed, 0.0)})
    return verdicts


def describe(verdict: dict[str, Any]) -> str:
    bounds = " and ".join(f"{word} {verdict[key]:g}" for key, word in (("min", "at least"), ("max", "at most"))
                          if verdict[key] is not None)
    outcome = "passes" if verdict["passed"] else f"FAILS by {verdict['missed_by']:.4g}"
    return f"{verdict['metric']} = {verdict['value']:.4g} (must be {bounds}): {outcome}"


def run_gate(metrics_path: Path, gates: dict[str, Gate], out: Path) -> list[dict[str, Any]]:
    """Write the verdicts to `out` when every gate passes; otherwise fail naming each metric that missed."""
    verdicts = check(read_json(metrics_path), gates)
    failed = [v for v in verdicts if not v["passed"]]
    if failed:
        lines = "\n".join(f"  {describe(v)}" for v in failed)
        raise XtrainError(
            f"{metrics_path}: {len(failed)} of {len(verdicts)} eval.gate checks failed\n{lines}\n"
            f"the report beside it shows the run; relax eval.gate in the recipe only if the change is intended"
        )
    write_json(out, verdicts)
    return verdicts
