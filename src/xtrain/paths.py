"""Where a recipe may read from: the project folder, and folders the project's config allows.

A recipe may come from a colleague: every field of the schema that names a local file or folder (marked
`recipe.ProjectPath`: `model.path`, `data.sources[].path`, `eval.lm_eval.include_path`, and any added later) is
resolved (`..` and symbolic links followed), and so is each file inside a folder it names; all must lie inside the
project, or inside a folder listed in `allowed_paths` of config/config.yaml, and the path must exist (unless a rule
of the workflow builds it); anything else is refused before any job runs, naming the recipe file and the field.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import BaseModel

from .recipe import ProjectPath, Recipe, RecipeError


def recipe_paths(section: BaseModel, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(field, path) of every local path a recipe (or one of its sections) names: each field marked `ProjectPath`."""
    for name, info in type(section).model_fields.items():
        value, field = getattr(section, name), f"{prefix}{name}"
        if any(isinstance(marker, ProjectPath) for marker in info.metadata):
            if value is not None:
                yield field, value
        elif isinstance(value, BaseModel):
            yield from recipe_paths(value, f"{field}.")
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    yield from recipe_paths(item, f"{field}[{i}].")


def escapes(path: Path, roots: list[Path]) -> tuple[Path, Path] | None:
    """(entry, where it resolves) of the first of `path` or, for a folder, of the entries inside it (links not
    followed into, but resolved) that resolves outside every root; None when all lie inside."""
    entries = [path]
    if path.is_dir():
        for folder, dirs, files in os.walk(path):
            entries += [Path(folder, name) for name in (*dirs, *files)]
    for entry in entries:
        resolved = entry.resolve()
        if not any(resolved.is_relative_to(root) for root in roots):
            return entry, resolved
    return None


def check_recipe_paths(
    recipe: Recipe, source: str, project: Path, allowed: Iterable[str] = (), built: Iterable[str] = ()
) -> None:
    """Refuse a recipe path outside `project` and every `allowed` folder (relative to it), a folder with a file
    that links outside them, or a path that does not exist; `built` are paths a workflow rule creates (the demo
    model)."""
    project = project.resolve()
    roots = [project, *((project / folder).resolve() for folder in allowed)]
    built = {(project / path).resolve() for path in built}
    outside = f"outside the project {project}" + (
        f" and the allowed folders {[str(r) for r in roots[1:]]}" if len(roots) > 1 else "")
    fix = ": copy it into the project, or add its folder to `allowed_paths` in config/config.yaml"
    for field, value in recipe_paths(recipe):
        escaped = escapes(project / value, roots)
        if escaped is not None:
            entry, resolved = escaped
            inside = "" if entry == project / value else f" holds {entry.relative_to(project / value)}, which"
            raise RecipeError(f"{source}: {field} {value!r}{inside} resolves to {resolved}, {outside}{fix}")
        resolved = (project / value).resolve()
        if resolved in built:
            continue
        if field == "model.path" and not (resolved / "config.json").is_file():
            raise RecipeError(
                f"{source}: model.path {value!r} is not a model folder (no config.json there); "
                "point it at a local Hugging Face model folder"
            )
        if not resolved.exists():
            raise RecipeError(f"{source}: {field} {value!r} does not exist; fix the path or create the file")
