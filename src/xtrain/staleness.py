"""What an edit to a recipe changed, field by field, for `xtrain status`.

Snakemake decides what is stale (the recipe slice of each stage is a rule's params) and records the params each
output was built with in `.snakemake/metadata/`. Staleness stays Snakemake's; this only reads that record back and
compares it with the slice the recipe gives now, so `xtrain status` can say `train.learning_rate: 0.005 → 0.01`
instead of "params changed", and name the recipes built on this one (`model.recipe`) that the edit makes stale.
"""

from __future__ import annotations

import ast
import json
from base64 import urlsafe_b64encode
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .chain import chain_params, upstream
from .models.hub import model_folder
from .recipe import Recipe, stage_params

# Each stage whose params are a recipe slice, and the output Snakemake records them under.
OUTPUTS = {"prepare": "prepared/{}", "plan": "plans/{}/plan.json", "train": "checkpoints/{}",
           "evaluate": "reports/{}/eval.json", "report": "reports/{}/report.html", "gate": "reports/{}/gate.json"}
# The stages an edit to which changes the checkpoint, and so every recipe built on it.
CHECKPOINT_STAGES = ("prepare", "plan", "train")


def recorded_slice(project: Path, output: str, slice_now: dict[str, Any]) -> dict[str, Any] | None:
    """The recipe slice `output` was last built with, or None: of its rule's recorded params (Snakemake keeps them
    sorted as text, not by name), the dict sharing the most keys with the slice the recipe gives now (train's
    reward file hashes are a dict too)."""
    record = project / ".snakemake" / "metadata" / urlsafe_b64encode(output.encode()).decode()
    if not record.is_file():
        return None
    params = json.loads(record.read_text()).get("params") or []
    slices = [value for value in map(_literal, params) if isinstance(value, dict)]
    return max(slices, key=lambda recorded: len(recorded.keys() & slice_now.keys()), default=None)


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested slice as dotted field names -> values (lists of sections by index: data.sources[0].path)."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}{key}.").items()} or \
            {prefix.rstrip("."): {}}
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        return {k: v for i, item in enumerate(value) for k, v in flat(item, f"{prefix.rstrip('.')}[{i}].").items()}
    return {prefix.rstrip("."): value}


def field_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`field: old → new` for every field whose value differs (`(none)` where one side lacks it)."""
    before, after = flat(old), flat(new)
    return [f"{field}: {json.dumps(before.get(field, '(none)'))} → {json.dumps(after.get(field, '(none)'))}"
            for field in sorted(set(before) | set(after)) if before.get(field, "(none)") != after.get(field, "(none)")]


def downstream(name: str, recipes: Mapping[str, Recipe]) -> list[str]:
    """The recipes built on `name`, directly or through others."""
    return sorted(other for other in recipes if other != name and name in upstream(other, recipes))


def what_changed(name: str, recipes: Mapping[str, Recipe], project: Path = Path()) -> list[str]:
    """Lines for `xtrain status`: each stage of `name` built with a recipe slice that has since changed, its changed
    fields, and the recipes below it that the change makes stale."""
    lines, retrains = [], False
    for stage, output in OUTPUTS.items():
        new = stage_params(recipes[name], stage) | chain_params(name, recipes, model_folder, stage)
        old = recorded_slice(project, output.format(name), new)
        if old is None:
            continue
        changes = field_changes(old, new)
        if changes:
            lines.append(f"  {name} {stage}: " + "; ".join(changes))
            retrains |= stage in CHECKPOINT_STAGES
    below = downstream(name, recipes)
    if retrains and below:
        lines.append(f"  {name}: its checkpoint will be rebuilt, so every stage of {', '.join(below)} (built on it) "
                     "is stale too")
    return lines
