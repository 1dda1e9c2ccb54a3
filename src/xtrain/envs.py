"""Per-backend software environments, materialised without conda.

Backends whose packages pin another version of the stack (axolotl, unsloth, torchtune) each have a pinned
conda spec `envs/<backend>.yaml`. `snakemake --sdm conda` uses that spec as it is; without conda, `build`
turns the same spec's pip section into a virtual environment `.venvs/<backend>/` and the backend launches its
native command with that interpreter. A build counts only once its `ready.json` (which records the spec's
hash) is written: an interrupted build is redone from scratch.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from .artifacts import write_json
from .errors import XtrainError
from .launch import run_command

log = logging.getLogger(__name__)

VENVS = Path(".venvs")
READY = "ready.json"


def pip_requirements(spec: Path) -> list[str]:
    """The pip section of a conda environment spec: the one list of pins both materialisations use."""
    for dependency in yaml.safe_load(spec.read_text()).get("dependencies", []):
        if isinstance(dependency, dict) and "pip" in dependency:
            return [str(requirement) for requirement in dependency["pip"]]
    raise XtrainError(f"{spec}: no `pip:` list under `dependencies:`; list the backend's pinned packages there")


def build(spec: Path, target: Path, uninstall: list[str] = ()) -> None:
    """Create `target` as a virtual environment holding the spec's pip pins (torch first: see below)."""
    requirements = pip_requirements(spec)
    torch = [requirement for requirement in requirements if requirement.startswith("torch==")]
    if not torch:
        raise XtrainError(f"{spec}: pin torch in its pip list (torch==2.13.0); an unpinned torch pulls a CUDA build")
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    run_command([sys.executable, "-m", "venv", str(target)])
    pip = [str(target / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    # torch alone first, so that pip takes the CPU build before anything can ask for another one.
    run_command([*pip, "install", "--quiet", *torch])
    run_command([*pip, "install", "--quiet", *requirements])
    if uninstall:
        run_command([*pip, "uninstall", "--yes", *uninstall])
    check = subprocess.run([*pip, "check"], capture_output=True, text=True)
    if check.returncode:
        log.warning("pip check in %s reports:\n%s", target, check.stdout.strip())
    write_json(target / READY, {"spec": str(spec), "sha256": spec_hash(spec),
                                "uninstalled": list(uninstall)})


def is_built(spec: Path, target: Path) -> bool:
    """Whether `target` is a complete build of `spec` as it is now."""
    ready = target / READY
    return ready.is_file() and json.loads(ready.read_text())["sha256"] == spec_hash(spec)


def spec_hash(spec: Path) -> str:
    return hashlib.sha256(spec.read_bytes()).hexdigest()


def backend_python(backend: str, module: str, must_exist: bool = True) -> str:
    """The interpreter that runs `backend`: this one when it already has the backend's package (a conda env or
    container picked by the train rule), else the backend's virtual environment (which must be built, unless the
    command is only being rendered)."""
    if importlib.util.find_spec(module) is not None:
        return sys.executable
    venv = VENVS / backend
    if must_exist and not (venv / READY).is_file():
        raise XtrainError(
            f"train.backend {backend}: its environment is not built (no {venv / READY}); run "
            f"`snakemake --cores 1 {venv / READY}`, or run snakemake with --sdm conda"
        )
    return str(venv / "bin" / "python")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path, help="conda spec, e.g. envs/axolotl.yaml")
    parser.add_argument("target", type=Path, help="virtual environment folder, e.g. .venvs/axolotl")
    parser.add_argument("--uninstall", nargs="*", default=[], help="packages to remove after installing")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # pip's output, streamed
    build(args.spec, args.target, args.uninstall)


if __name__ == "__main__":
    main()
