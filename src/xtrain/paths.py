"""Where a recipe may read from: the project folder, and folders the project's config allows.

A recipe may come from a colleague: its `model.path` and `data.sources[].path` are resolved (`..` and
symbolic links followed) and must lie inside the project, or inside a folder listed in
`allowed_paths` of config/config.yaml, and must exist (unless a rule of the workflow builds them);
anything else is refused before any job runs, naming the recipe file and the field.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .recipe import Recipe, RecipeError


def recipe_paths(recipe: Recipe) -> list[tuple[str, str]]:
    """(field, path) of every local path a recipe names."""
    paths = [("model.path", recipe.model.path)] if recipe.model.path is not None else []
    paths += [(f"data.sources[{i}].path", s.path) for i, s in enumerate(recipe.data.sources) if s.path is not None]
    return paths


def check_recipe_paths(
    recipe: Recipe, source: str, project: Path, allowed: Iterable[str] = (), built: Iterable[str] = ()
) -> None:
    """Refuse a recipe path outside `project` and every `allowed` folder (relative to it), or one that does
    not exist; `built` are paths a workflow rule creates (the demo model)."""
    project = project.resolve()
    roots = [project, *((project / folder).resolve() for folder in allowed)]
    built = {(project / path).resolve() for path in built}
    for field, value in recipe_paths(recipe):
        resolved = (project / value).resolve()
        if not any(resolved.is_relative_to(root) for root in roots):
            raise RecipeError(
                f"{source}: {field} {value!r} resolves to {resolved}, outside the project {project}"
                + (f" and the allowed folders {[str(r) for r in roots[1:]]}" if len(roots) > 1 else "")
                + ": copy it into the project, or add its folder to `allowed_paths` in config/config.yaml"
            )
        if resolved in built:
            continue
        if field == "model.path" and not (resolved / "config.json").is_file():
            raise RecipeError(
                f"{source}: model.path {value!r} is not a model folder (no config.json there); "
                "point it at a local Hugging Face model folder"
            )
        if not resolved.exists():
            raise RecipeError(f"{source}: {field} {value!r} does not exist; fix the path or create the file")
