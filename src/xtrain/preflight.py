"""Everything checked about a recipe before any job runs: its schema, its paths, its model, its data (each local
source's format is detected and its first rows parse), its batch layout and what its backend can honour.

The workflow (rules/common.smk) runs `preflight` on every recipe as it starts, so a mistake costs no
compute; a failure is a `RecipeError` that names the recipe file, the field and what to do.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from .data.pipeline import check_first_rows
from .errors import XtrainError
from .models.hub import model_folder
from .paths import check_recipe_paths
from .plan.planner import check_micro_batch
from .recipe import DATA_KINDS, Recipe, RecipeError, load_recipe
from .train.backends import registry

log = logging.getLogger(__name__)


def preflight(path: str | Path, project: Path, allowed: Iterable[str] = (), built: Iterable[str] = ()) -> Recipe:
    """Load and check one recipe file; `allowed` and `built` as in `paths.check_recipe_paths`."""
    recipe = load_recipe(path)
    check_recipe_paths(recipe, str(path), project, allowed, built)
    try:
        model_folder(recipe.model)  # a hub model must be in the cache
        for source in recipe.data.sources:
            if source.path is not None and (project / source.path).exists():
                check_first_rows(source, project / source.path, DATA_KINDS[recipe.train.objective])
        check_micro_batch(recipe.train, recipe.hardware)
        registry.check(recipe.train.backend, recipe.train, recipe.hardware, packed=recipe.data.packing)
    except XtrainError as exc:  # these name the field; the recipe file is added here
        raise RecipeError(f"{path}: {exc}") from None
    if recipe.model.trust_remote_code:
        log.warning("%s: model.trust_remote_code is set: the Python code in %s will run", path, recipe.model.name)
    return recipe
