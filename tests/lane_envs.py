"""Lane environments for the tests: built once into the work tree's .venvs/<lane>/ (as rule build_lane_env
builds them) and reused while their ready.json records the current spec's hash."""

from __future__ import annotations

import hashlib
import json

import yaml

from conftest import REPO
from xtrain.envs import READY, build


def ensure_lane_env(backend: str) -> None:
    spec = REPO / "envs" / f"{backend}.yaml"
    target = REPO / ".venvs" / backend
    ready = target / READY
    if ready.is_file() and json.loads(ready.read_text())["sha256"] == hashlib.sha256(spec.read_bytes()).hexdigest():
        return
    lanes = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["backends"]
    build(spec, target, lanes[backend].get("uninstall", []))
