"""Base models by hub id, from a Hugging Face cache the tests fill themselves (never the network)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from xtrain.errors import RecipeError, XtrainError
from xtrain.models.hub import cached_revision, model_folder
from xtrain.preflight import preflight
from xtrain.recipe import Model, parse_recipe

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tiny_model, tmp_path, monkeypatch) -> Path:
    """A Hugging Face cache holding `xtrain-tests/tiny-llama` at COMMIT as `main`, laid out as the hub client lays it."""
    home = tmp_path / "hf"
    repo = home / "hub" / "models--xtrain-tests--tiny-llama"
    shutil.copytree(tiny_model, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(home / "hub"))
    return repo


def test_a_hub_id_resolves_to_its_cached_snapshot_and_commit(hub_cache):
    folder = model_folder(Model(hub="xtrain-tests/tiny-llama"))
    assert Path(folder) == hub_cache / "snapshots" / COMMIT
    assert model_folder(Model(hub="xtrain-tests/tiny-llama", revision=COMMIT)) == folder
    assert cached_revision(Path(folder)) == COMMIT
    assert cached_revision(REPO / "data") is None


def test_a_model_not_in_the_cache_is_named_with_the_command_that_downloads_it(hub_cache):
    with pytest.raises(XtrainError, match=r"model.hub 'org/absent' .* not in the Hugging Face cache.*hf download org/absent"):
        model_folder(Model(hub="org/absent"))
    with pytest.raises(XtrainError, match="hf download xtrain-tests/tiny-llama --revision v2"):
        model_folder(Model(hub="xtrain-tests/tiny-llama", revision="v2"))


def test_preflight_refuses_an_uncached_hub_model_before_any_job(hub_cache, tmp_path):
    recipe = {"model": {"hub": "org/absent"}, "data": {"sources": [{"path": "data/demo/chat.jsonl"}]}}
    path = tmp_path / "recipes" / "r.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(RecipeError, match=r"r.yaml: model.hub 'org/absent'"):
        preflight(path, REPO)
    path.write_text(yaml.safe_dump({**recipe, "model": {"hub": "xtrain-tests/tiny-llama"}}))
    assert preflight(path, REPO).model.hub == "xtrain-tests/tiny-llama"


def test_a_model_is_a_path_or_a_hub_id():
    data = {"sources": [{"path": "d.jsonl"}]}
    with pytest.raises(RecipeError, match="exactly one of `path`"):
        parse_recipe({"model": {"path": "m", "hub": "a/b"}, "data": data}, "r.yaml")
    with pytest.raises(RecipeError, match="`revision` picks a version of a `hub` model"):
        parse_recipe({"model": {"path": "m", "revision": "main"}, "data": data}, "r.yaml")
    with pytest.raises(RecipeError, match="model.hub"):
        parse_recipe({"model": {"hub": "not an id"}, "data": data}, "r.yaml")
