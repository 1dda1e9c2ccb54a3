"""A rendered launch checked by the lane's own validator before any GPU is allocated (the smoke stage's launch step,
and the tests of each lane's GPU shapes): `xtrain_backend_side.validate` in the lane's CPU environment, its device
probe answering what the recipe's GPU (`hardware.gpu`) reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xtrain_backend_side import BACKEND_SIDE_PATH

from ...artifacts import write_json
from ...models.gpus import probed_capabilities
from ...recipe import Hardware
from ...stage import run_command

MARK = "VALIDATED "


def validated(python: str, requests: list[dict[str, Any]], scratch: Path,
              env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run the validator on each request (its framework and inputs), in one interpreter, and return what the
    framework read back for each; the framework's own error fails the call (XtrainError with its last lines)."""
    scratch.mkdir(parents=True, exist_ok=True)
    requests_file = scratch / "validate.json"
    write_json(requests_file, requests)
    lines = run_command([python, "-m", "xtrain_backend_side.validate", str(requests_file)],
                        env={**(env or {}), "PYTHONPATH": BACKEND_SIDE_PATH})
    return [json.loads(line.removeprefix(MARK)) for line in lines if line.startswith(MARK)]


def device_probe(hardware: Hardware) -> dict[str, Any]:
    """The request's device: what the recipe's GPU answers a framework's probe (None on the CPU), and the launch's
    process count."""
    on_gpu = hardware.accelerator != "cpu"
    return {"capabilities": probed_capabilities(hardware.gpu) if on_gpu else None, "world_size": hardware.devices}
