"""Generate the recipe's JSON schema and field reference from the pydantic models, and the backends'
capability table from their declared capabilities.

`python -m xtrain.project.docs` writes `config/recipe.schema.json` (for editors and validators), `docs/recipe.md`
(the field table), the capability table in `docs/backends.md` and the field table in `docs/plan.md` (from the
typed plan); a test fails when one is out of date.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import UnionType
from typing import Annotated, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from ..recipe import Recipe, json_schema

ROOT = Path(__file__).resolve().parents[3]
SCHEMA_PATH = ROOT / "config" / "recipe.schema.json"
REFERENCE_PATH = ROOT / "docs" / "recipe.md"
BACKENDS_PATH = ROOT / "docs" / "backends.md"
CAPABILITIES = ("<!-- capability table: generated from each backend's `capabilities` by `make docs` -->",
                "<!-- end of the capability table -->")
PLAN_PATH = ROOT / "docs" / "plan.md"
PLAN_FIELDS = ("<!-- plan fields: generated from src/xtrain/plan/schema.py by `make docs` -->",
               "<!-- end of the plan fields -->")
JOB_PLAN_FIELDS = ("<!-- job plan fields: generated from src/xtrain/plan/schema.py by `make docs` -->",
                   "<!-- end of the job plan fields -->")


def _type_name(annotation) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return " or ".join(repr(a) for a in args)
    if origin in (Union, UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    return annotation.__name__


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation = field.annotation
        nested = [a for a in (get_args(annotation) or (annotation,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if nested:
            rows.extend(_rows(nested[0], f"{path}[]." if get_origin(annotation) is list else f"{path}."))
            continue
        default = "required" if field.is_required() else repr(field.get_default(call_default_factory=True))
        rows.append(f"| `{path}` | `{_type_name(annotation)}` | `{default}` | {field.description or ''} |")
    return rows


def reference() -> str:
    lines = [
        "# Recipe reference",
        "",
        "Generated from `src/xtrain/recipe.py` by `make docs`; do not edit by hand.",
        "Unknown fields are errors (a misspelt one names the closest field). A list field given one value (`gguf: f16`) "
        "holds that one value. Paths are relative to the project root.",
    ]
    for name, field in Recipe.model_fields.items():
        # An optional section (`export`) is its model or null.
        section = next(a for a in (get_args(field.annotation) or (field.annotation,)) if a is not type(None))
        optional = " Optional: without this section the stage does not run." if not field.is_required() and \
            field.get_default() is None else ""
        lines += ["", f"## `{name}`", "", (section.__doc__ or "").strip().splitlines()[0] + optional, "",
                  "| field | type | default | meaning |", "| --- | --- | --- | --- |"]
        lines += _rows(section, f"{name}.")
    return "\n".join(lines) + "\n"


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def spliced(text: str, markers: tuple[str, str], lines: list[str]) -> str:
    """`text` with the generated `lines` between its two marker lines (the rest is written by hand)."""
    start, end = markers
    head, rest = text.split(start, 1)
    return "\n".join([head + start, *lines, end]) + rest.split(end, 1)[1]


def backends_page() -> str:
    """docs/backends.md with its capability table regenerated."""
    from ..train.backends import capabilities

    return spliced(BACKENDS_PATH.read_text(), CAPABILITIES,
                   capabilities.capability_rows(capabilities.CAPABILITIES))


def plan_page() -> str:
    """docs/plan.md with its field tables regenerated from the typed plans (plan.json's, and the jobs')."""
    from ..plan.schema import JobPlan, Plan

    header = ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    text = spliced(PLAN_PATH.read_text(), PLAN_FIELDS, [*header, *_rows(Plan, "")])
    return spliced(text, JOB_PLAN_FIELDS, [*header, *_rows(JobPlan, "")])


def main() -> None:
    SCHEMA_PATH.write_text(schema_text())
    REFERENCE_PATH.parent.mkdir(exist_ok=True)
    REFERENCE_PATH.write_text(reference())
    BACKENDS_PATH.write_text(backends_page())
    PLAN_PATH.write_text(plan_page())
    print(f"wrote {SCHEMA_PATH.relative_to(ROOT)}, {REFERENCE_PATH.relative_to(ROOT)}, "
          f"{BACKENDS_PATH.relative_to(ROOT)} and {PLAN_PATH.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
