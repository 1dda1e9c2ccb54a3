"""Software environments: the pinned specs in envs/, their locks, and the per-backend virtual environments.

Every environment has a pinned conda spec `envs/<name>.yaml` (the direct packages) and, per accelerator, a lock
next to it (every transitive package at one version, with hashes), written from the spec by `lock` (`make lock`,
through uv): `envs/<name>.lock` with torch's CPU build, `envs/<name>-cuda.lock` with PyPI's torch (the CUDA
build and its nvidia-* packages). `make venv` installs `.venv` from envs/xtrain.lock (`XTRAIN_ACCELERATOR=cuda`:
envs/xtrain-cuda.lock); `build` installs a backend's lock into the virtual environment `.venvs/<backend>/` (CPU)
or `.venvs/<backend>-cuda/`, whose interpreter then runs the backend's native command. That folder links to the
lock's build in the environment store (`$XDG_CACHE_HOME/xtrain/venvs`), made once per lock for every clone of the
project on the machine: a second clone, a CI run or a worktree reuses it, and a new lock gets a build of its own.
`snakemake --sdm conda` builds the spec itself (pip resolves the rest there; on a GPU node PyPI's torch is the
CUDA build). A build counts only once its `ready.json` (which records the hash of the spec and its lock) is
written: an interrupted build is redone from scratch.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from ..artifacts import write_json
from ..errors import XtrainError
from ..stage import run_command

log = logging.getLogger(__name__)

VENVS = Path(".venvs")
READY = "ready.json"
# The environment store (`store_folder`): each lock's build, shared by the project's clones, and the file that marks a
# build there finished (Snakemake deletes a rule's output, ready.json, before it runs the rule again).
STORE = "XTRAIN_ENV_STORE"
COMPLETE = "complete.json"
# What a lock is resolved for: this project's machines (CPython 3.11, x86-64 Linux). Torch's CPU build
# (2.13.0+cpu) comes from the local wheel folder (the find-links of this machine's pip configuration), which the
# lock names so that pip finds it there; PyPI's torch 2.13.0 is the CUDA build, with the nvidia-* packages.
TORCH_WHEELS = "/opt/wheels"
LOCK_TARGET = ["--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28"]
# The accelerators a lock is written for. ROCm's torch wheels are on PyTorch's own index (download.pytorch.org),
# which the machines that write the locks cannot reach: a ROCm run uses an image or conda env of its own.
LOCKED = ("cpu", "cuda")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def pip_requirements(spec: Path) -> list[str]:
    """The pip section of a conda environment spec: the one list of pins both materialisations use."""
    for dependency in yaml.safe_load(spec.read_text()).get("dependencies", []):
        if isinstance(dependency, dict) and "pip" in dependency:
            return [str(requirement) for requirement in dependency["pip"]]
    raise XtrainError(f"{spec}: no `pip:` list under `dependencies:`; list the backend's pinned packages there")


def lock_file(spec: Path, accelerator: str = "cpu") -> Path:
    return spec.with_suffix(".lock") if accelerator == "cpu" else spec.with_name(f"{spec.stem}-{accelerator}.lock")


def venv_name(backend: str, accelerator: str) -> str:
    """The folder under .venvs/ of a backend's environment for an accelerator."""
    return backend if accelerator == "cpu" else f"{backend}-{accelerator}"


def venv_parts(name: str) -> tuple[str, str]:
    """(backend, accelerator) of a folder under .venvs/: `axolotl-cuda` -> (axolotl, cuda)."""
    backend, _, accelerator = name.rpartition("-")
    return (backend, accelerator) if accelerator in LOCKED else (name, "cpu")


def lock(spec: Path, extra: list[str] = (), accelerator: str = "cpu") -> Path:
    """Write the spec's lock for `accelerator`: its pip pins (and `extra` ones: the main environment's development
    tools) resolved with every transitive package pinned and hashed; torch is the CPU build from the local wheel
    folder, or PyPI's CUDA build. Versions already in the lock (for a new GPU lock: in the CPU lock) are kept while
    they still fit the pins (uv prefers them); delete the lock to take the newest that fit."""
    if accelerator not in LOCKED:
        raise XtrainError(f"no {accelerator} lock: xtrain writes locks for {', '.join(LOCKED)} (see LOCKED)")
    requirements = pip_requirements(spec)
    if not any(requirement.startswith("torch==") for requirement in requirements):
        raise XtrainError(f"{spec}: pin torch in its pip list (torch==2.13.0); an unpinned torch pulls a CUDA build")
    out = lock_file(spec, accelerator)
    if not out.is_file() and lock_file(spec).is_file():  # a new GPU lock starts from the CPU lock's versions
        shutil.copyfile(lock_file(spec), out)
    torch_source = ["--find-links", TORCH_WHEELS, "--emit-find-links"] if accelerator == "cpu" else []
    with tempfile.TemporaryDirectory() as folder:
        pins = Path(folder) / f"{spec.stem}.in"
        pins.write_text("\n".join([*requirements, *extra]) + "\n")
        run_command([str(Path(sys.executable).with_name("uv")), "pip", "compile", str(pins), "--output-file", str(out),
                     "--generate-hashes", "--no-annotate", *torch_source, *LOCK_TARGET, "--no-config",
                     "--custom-compile-command", "make lock", "--quiet"])
    if stale := stale_pins(spec, accelerator):
        raise XtrainError(f"{out}: the resolver did not keep the spec's pins {stale}")
    return out


def locked_versions(lock_path: Path) -> dict[str, str]:
    """Package name (normalised) -> version, for every package of a lock."""
    versions = {}
    for line in lock_path.read_text().splitlines():
        if match := PIN.match(line):
            versions[normalised(match.group(1))] = match.group(2)
    return versions


def stale_pins(spec: Path, accelerator: str = "cpu") -> list[str]:
    """The spec's pins its lock for `accelerator` does not hold at the same version (a lock's `+cpu` local label
    matches the plain version the spec pins); empty when the lock is current."""
    lock_path = lock_file(spec, accelerator)
    locked = locked_versions(lock_path) if lock_path.is_file() else {}
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


def build(spec: Path, target: Path, uninstall: list[str] = (), accelerator: str = "cpu") -> None:
    """Make `target` a virtual environment holding exactly the spec's lock for `accelerator` (less `uninstall`): a
    link to its build in the environment store (`store_folder`), installed there the first time any clone of the
    project asks for that lock, and reused by every later one."""
    lock_path = lock_file(spec, accelerator)
    if stale := stale_pins(spec, accelerator):
        raise XtrainError(f"{lock_path} does not hold {spec}'s pins {stale}: run `make lock` and commit the lock")
    digest = spec_hash(spec, accelerator)
    home = store_folder(target.name, hashlib.sha256(f"{digest} {sorted(uninstall)}".encode()).hexdigest())
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f".{home.name}.lock", "w") as builder:
        fcntl.flock(builder, fcntl.LOCK_EX)  # one build of a lock at a time, whichever clone asks
        if (home / COMPLETE).is_file():
            log.info("%s: the build of %s in %s, reused", target, lock_path, home)
        else:
            install(home, lock_path, uninstall)
    if target.is_symlink() or target.is_file():
        target.unlink()
    else:
        shutil.rmtree(target, ignore_errors=True)  # a build from before the store, installed in place
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(home, target_is_directory=True)
    write_json(target / READY, {"spec": str(spec), "lock": str(lock_path), "sha256": digest,
                                "uninstalled": list(uninstall), "store": str(home)})


def store_folder(name: str, digest: str) -> Path:
    """Where the build of one lock lives: `$XTRAIN_ENV_STORE` (default `$XDG_CACHE_HOME/xtrain/venvs`), one folder
    per environment name and hash of its spec, lock and removed packages. A virtual environment cannot be moved (its
    scripts name their interpreter's path), so it is built there and each clone's `.venvs/<name>` links to it."""
    root = os.environ.get(STORE) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xtrain" / "venvs"
    return Path(root).resolve() / f"{name}-{digest[:16]}"


def install(home: Path, lock_path: Path, uninstall: list[str]) -> None:
    """A new virtual environment at `home` with exactly the lock's packages, less `uninstall`; COMPLETE written last,
    so an interrupted build is redone from scratch."""
    shutil.rmtree(home, ignore_errors=True)
    run_command([sys.executable, "-m", "venv", str(home)])
    python = str(home / "bin" / "python")
    run_command(install_command(python, lock_path))
    if uninstall:
        run_command([python, "-m", "pip", "uninstall", "--yes", *uninstall])
    check = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True)
    if check.returncode:
        log.warning("pip check in %s reports:\n%s", home, check.stdout.strip())
    write_json(home / COMPLETE, {"lock": str(lock_path.resolve()), "uninstalled": list(uninstall)})


def is_built(spec: Path, target: Path, accelerator: str = "cpu") -> bool:
    """Whether `target` is a complete build of `spec` and its lock for `accelerator` as they are now."""
    ready = target / READY
    return ready.is_file() and json.loads(ready.read_text())["sha256"] == spec_hash(spec, accelerator)


def spec_hash(spec: Path, accelerator: str = "cpu") -> str:
    """The hash of the spec and its lock: a new lock rebuilds the environment."""
    lock_path = lock_file(spec, accelerator)
    return hashlib.sha256(spec.read_bytes() + (lock_path.read_bytes() if lock_path.is_file() else b"")).hexdigest()


def backend_python(backend: str, module: str, must_exist: bool = True, accelerator: str = "cpu") -> str:
    """The interpreter that runs `backend` on `accelerator`: this one when it already has the backend's package (a
    conda env or container picked by the train rule), else the backend's virtual environment for that accelerator
    (which must be built, unless the command is only being rendered). No environment is built for ROCm: its
    launch is rendered with the `python` of the image it runs in."""
    if importlib.util.find_spec(module) is not None:
        return sys.executable
    if accelerator not in LOCKED and not must_exist:
        return "python"
    if accelerator not in LOCKED:
        raise XtrainError(
            f"train.backend {backend} on {accelerator}: xtrain builds no {accelerator} environment (torch's "
            f"{accelerator} wheels are on PyTorch's own index); run snakemake with --sdm apptainer and a "
            f"{accelerator} image that has torch and {module} (config/config.yaml backends.{backend}.container), "
            f"or from a Python environment that has them"
        )
    venv = VENVS / venv_name(backend, accelerator)
    if must_exist and not (venv / READY).is_file():
        raise XtrainError(
            f"train.backend {backend}: its {accelerator} environment is not built (no {venv / READY}); run "
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
    making.add_argument("--accelerator", choices=LOCKED, default="cpu", help="whose lock to install")
    locking = commands.add_parser("lock", help="write envs/<name>.lock from the spec's pins (make lock)")
    locking.add_argument("spec", type=Path, help="conda spec, e.g. envs/xtrain.yaml")
    locking.add_argument("--with", dest="extra", nargs="*", default=[], help="more pins, e.g. development tools")
    locking.add_argument("--accelerator", choices=LOCKED, default="cpu", help="whose torch build to lock")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # pip's and uv's output, streamed
    if args.command == "lock":
        log.info("wrote %s", lock(args.spec, args.extra, args.accelerator))
    else:
        build(args.spec, args.target, args.uninstall, args.accelerator)


if __name__ == "__main__":
    main()
