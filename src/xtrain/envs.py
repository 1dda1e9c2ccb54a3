"""Software environments: the pinned specs in envs/, their locks, and the per-backend virtual environments.

Every environment has a pinned conda spec `envs/<name>.yaml` (the direct packages) and a lock `envs/<name>.lock`
next to it (every transitive package at one version, with hashes), written from the spec by `lock` (`make lock`,
through uv). `make venv` installs `.venv` from envs/xtrain.lock; `build` installs a backend's lock into the virtual
environment `.venvs/<backend>/`, whose interpreter then runs the backend's native command. `snakemake --sdm
conda` builds the spec itself (pip resolves the rest there). A build counts only once its `ready.json` (which
records the hash of the spec and its lock) is written: an interrupted build is redone from scratch.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from .artifacts import write_json
from .errors import XtrainError
from .launch import run_command

log = logging.getLogger(__name__)

VENVS = Path(".venvs")
READY = "ready.json"
# What a lock is resolved for: this project's machines (CPython 3.11, x86-64 Linux). Torch's CPU build
# (2.13.0+cpu) comes from the local wheel folder (the find-links of this machine's pip configuration), which the
# lock names so that pip finds it there; PyPI's torch 2.13.0 is the CUDA build, with the nvidia-* packages.
TORCH_WHEELS = "/opt/wheels"
LOCK_TARGET = ["--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28"]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def pip_requirements(spec: Path) -> list[str]:
    """The pip section of a conda environment spec: the one list of pins both materialisations use."""
    for dependency in yaml.safe_load(spec.read_text()).get("dependencies", []):
        if isinstance(dependency, dict) and "pip" in dependency:
            return [str(requirement) for requirement in dependency["pip"]]
    raise XtrainError(f"{spec}: no `pip:` list under `dependencies:`; list the backend's pinned packages there")


def lock_file(spec: Path) -> Path:
    return spec.with_suffix(".lock")


def lock(spec: Path, extra: list[str] = ()) -> Path:
    """Write the spec's lock: its pip pins (and `extra` ones: the main environment's development tools) resolved
    with every transitive package pinned and hashed. Versions already in the lock are kept while they still fit
    the pins (uv prefers them); delete the lock to take the newest that fit."""
    requirements = pip_requirements(spec)
    if not any(requirement.startswith("torch==") for requirement in requirements):
        raise XtrainError(f"{spec}: pin torch in its pip list (torch==2.13.0); an unpinned torch pulls a CUDA build")
    out = lock_file(spec)
    with tempfile.TemporaryDirectory() as folder:
        pins = Path(folder) / f"{spec.stem}.in"
        pins.write_text("\n".join([*requirements, *extra]) + "\n")
        run_command([str(Path(sys.executable).with_name("uv")), "pip", "compile", str(pins), "--output-file", str(out),
                     "--generate-hashes", "--no-annotate", "--find-links", TORCH_WHEELS, "--emit-find-links",
                     *LOCK_TARGET, "--custom-compile-command", "make lock", "--quiet"])
    if stale := stale_pins(spec):
        raise XtrainError(f"{out}: the resolver did not keep the spec's pins {stale}")
    return out


def locked_versions(lock_path: Path) -> dict[str, str]:
    """Package name (normalised) -> version, for every package of a lock."""
    versions = {}
    for line in lock_path.read_text().splitlines():
        if match := PIN.match(line):
            versions[normalised(match.group(1))] = match.group(2)
    return versions


def stale_pins(spec: Path) -> list[str]:
    """The spec's pins its lock does not hold at the same version (a lock's `+cpu` local label matches the plain
    version the spec pins); empty when the lock is current."""
    locked = locked_versions(lock_file(spec)) if lock_file(spec).is_file() else {}
    stale = []
    for requirement in pip_requirements(spec):
        name, _, version = requirement.partition("==")
        if locked.get(normalised(name), "").split("+")[0] != version:
            stale.append(requirement)
    return stale


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def install_command(python: str, lock_path: Path) -> list[str]:
    """Install exactly a lock's packages, each checked against its hash (what `make venv` runs for .venv)."""
    return [python, "-m", "pip", "--disable-pip-version-check", "install", "--quiet", "--require-hashes", "--no-deps",
            "-r", str(lock_path)]


def build(spec: Path, target: Path, uninstall: list[str] = ()) -> None:
    """Create `target` as a virtual environment holding exactly the spec's lock."""
    if stale := stale_pins(spec):
        raise XtrainError(f"{lock_file(spec)} does not hold {spec}'s pins {stale}: run `make lock` and commit the lock")
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    run_command([sys.executable, "-m", "venv", str(target)])
    python = str(target / "bin" / "python")
    run_command(install_command(python, lock_file(spec)))
    if uninstall:
        run_command([python, "-m", "pip", "uninstall", "--yes", *uninstall])
    check = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True)
    if check.returncode:
        log.warning("pip check in %s reports:\n%s", target, check.stdout.strip())
    write_json(target / READY, {"spec": str(spec), "sha256": spec_hash(spec),
                                "uninstalled": list(uninstall)})


def is_built(spec: Path, target: Path) -> bool:
    """Whether `target` is a complete build of `spec` and its lock as they are now."""
    ready = target / READY
    return ready.is_file() and json.loads(ready.read_text())["sha256"] == spec_hash(spec)


def spec_hash(spec: Path) -> str:
    """The hash of the spec and its lock: a new lock rebuilds the environment."""
    lock_path = lock_file(spec)
    return hashlib.sha256(spec.read_bytes() + (lock_path.read_bytes() if lock_path.is_file() else b"")).hexdigest()


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
    commands = parser.add_subparsers(dest="command", required=True)
    making = commands.add_parser("build", help="install a spec's lock as a virtual environment")
    making.add_argument("spec", type=Path, help="conda spec, e.g. envs/axolotl.yaml")
    making.add_argument("target", type=Path, help="virtual environment folder, e.g. .venvs/axolotl")
    making.add_argument("--uninstall", nargs="*", default=[], help="packages to remove after installing")
    locking = commands.add_parser("lock", help="write envs/<name>.lock from the spec's pins (make lock)")
    locking.add_argument("spec", type=Path, help="conda spec, e.g. envs/xtrain.yaml")
    locking.add_argument("--with", dest="extra", nargs="*", default=[], help="more pins, e.g. development tools")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # pip's and uv's output, streamed
    if args.command == "lock":
        log.info("wrote %s", lock(args.spec, args.extra))
    else:
        build(args.spec, args.target, args.uninstall)


if __name__ == "__main__":
    main()
