"""The backends are listed once: the registry, recipe.BACKENDS, config/config.yaml and envs/ agree, and the
docs' capability table is generated from the declared capabilities."""

from __future__ import annotations

import yaml
from conftest import REPO

from xtrain.project import docs
from xtrain.recipe import BACKENDS, Train
from xtrain.train.backends import capabilities
from xtrain.train.backends.registry import REGISTRY


def test_registry_recipe_config_and_envs_name_the_same_backends():
    assert tuple(REGISTRY) == tuple(capabilities.CAPABILITIES) == BACKENDS
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    assert set(config["backends"]) == set(BACKENDS)
    for name in BACKENDS:
        assert (REPO / config["backends"][name]["conda"]).is_file(), f"{name}: its conda spec is missing"
    own_specs = {path.stem for path in (REPO / "envs").glob("*.yaml")} - {"xtrain"}
    assert own_specs <= set(BACKENDS), f"envs/ has specs of no backend: {sorted(own_specs - set(BACKENDS))}"
    assert Train.model_fields["backend"].annotation.__args__ == BACKENDS


def test_every_backend_declares_its_capabilities_and_field_map():
    for name, backend in REGISTRY.items():
        assert backend.name == name
        assert backend.capabilities is capabilities.CAPABILITIES[name]
        assert backend.capabilities.status in ("trains", "translate-only")
        assert "sft" in backend.capabilities.objectives


def test_capability_table_in_the_docs_is_current():
    assert docs.BACKENDS_PATH.read_text() == docs.backends_page(), "run `make docs` and commit the result"
    for name in BACKENDS:
        assert f"`{name}`" in docs.backends_page().split(docs.CAPABILITIES[1])[0]


def test_backend_side_code_imports_only_the_standard_library_and_a_backends_stack():
    """src/xtrain_backend_side runs in the backends' own interpreters, where xtrain's stack is not installed."""
    import ast

    for path in (REPO / "src" / "xtrain_backend_side").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for name in names:
                assert name.split(".")[0] not in ("xtrain", "pydantic", "yaml"), f"{path.name} imports {name}"


def test_a_recipe_error_is_an_xtrain_error():
    from xtrain.errors import RecipeError, XtrainError

    assert issubclass(RecipeError, XtrainError)
