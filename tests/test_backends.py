"""The backends are listed once: the registry, recipe.BACKENDS, config/config.yaml and envs/ agree, and the
docs' capability table is generated from the declared capabilities."""

from __future__ import annotations

import yaml
from conftest import REPO

from xtrain import docs
from xtrain.backends import REGISTRY, base
from xtrain.recipe import BACKENDS, Train


def test_registry_recipe_config_and_envs_name_the_same_backends():
    assert tuple(REGISTRY) == BACKENDS
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
        assert isinstance(backend.capabilities, base.Capabilities)
        assert backend.capabilities.status in ("trains", "translate-only")
        assert "sft" in backend.capabilities.objectives


def test_capability_table_in_the_docs_is_current():
    assert docs.BACKENDS_PATH.read_text() == docs.backends_page(), "run `make docs` and commit the result"
    for name in BACKENDS:
        assert f"`{name}`" in docs.backends_page().split(docs.CAPABILITIES[1])[0]
