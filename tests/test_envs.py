"""Per-backend environments: the pins come from the conda spec, and a missing build says how to make it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from xtrain.errors import XtrainError
from xtrain.project.envs import (
    LOCKED,
    backend_python,
    build,
    install_command,
    lock,
    lock_file,
    locked_versions,
    normalised,
    pip_requirements,
    stale_pins,
    venv_name,
    venv_parts,
)


def test_the_main_spec_pins_torch_for_both_materialisations():
    requirements = pip_requirements(REPO / "envs" / "xtrain.yaml")
    assert "torch==2.13.0" in requirements
    assert all("==" in requirement for requirement in requirements), "every package is pinned"


def test_a_spec_without_a_pip_list_is_refused(tmp_path):
    spec = tmp_path / "backend.yaml"
    spec.write_text("name: backend\ndependencies:\n  - python=3.11\n")
    with pytest.raises(XtrainError, match=r"backend\.yaml: no `pip:` list"):
        pip_requirements(spec)


def test_a_spec_without_a_torch_pin_is_refused_before_anything_is_locked(tmp_path):
    spec = tmp_path / "backend.yaml"
    spec.write_text("dependencies:\n  - pip\n  - pip:\n      - torch\n      - trl==1.16.0\n")
    with pytest.raises(XtrainError, match="pin torch"):
        lock(spec)
    assert not lock_file(spec).exists()


def test_a_backend_runs_here_when_this_interpreter_has_its_package():
    assert backend_python("trl_local", "trl") == sys.executable


def test_an_unbuilt_backend_environment_names_the_target_that_builds_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(XtrainError, match=r"snakemake --cores 1 \.venvs/axolotl/ready\.json"):
        backend_python("axolotl", "a_module_that_is_not_installed")
    (tmp_path / ".venvs" / "axolotl").mkdir(parents=True)
    (tmp_path / ".venvs" / "axolotl" / "ready.json").write_text("{}")
    assert backend_python("axolotl", "a_module_that_is_not_installed") == ".venvs/axolotl/bin/python"
    with pytest.raises(XtrainError, match=r"its cuda environment is not built.*\.venvs/axolotl-cuda/ready\.json"):
        backend_python("axolotl", "a_module_that_is_not_installed", accelerator="cuda")
    with pytest.raises(XtrainError, match=r"on rocm: xtrain builds no rocm environment.*--sdm apptainer"):
        backend_python("axolotl", "a_module_that_is_not_installed", accelerator="rocm")
    assert backend_python("axolotl", "a_module_that_is_not_installed", must_exist=False, accelerator="rocm") == "python"


def test_a_gpu_recipe_builds_the_lanes_environment_for_its_accelerator(tmp_path):
    assert [venv_parts(venv_name("axolotl", accelerator)) for accelerator in LOCKED] == [
        ("axolotl", "cpu"), ("axolotl", "cuda")]
    assert venv_parts("trl_local") == ("trl_local", "cpu")


SPECS = sorted((REPO / "envs").glob("*.yaml"))


@pytest.mark.parametrize("accelerator", LOCKED)
@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.stem)
def test_each_lock_is_current_with_its_spec_and_pins_every_package_with_hashes(spec, accelerator):
    lock = lock_file(spec, accelerator)
    assert lock.is_file(), f"{spec} has no {accelerator} lock: run `make lock`"
    assert not stale_pins(spec, accelerator), f"{lock} does not hold {stale_pins(spec, accelerator)} of {spec}"
    packages = "\n".join(line for line in lock.read_text().splitlines() if line and not line.startswith(("#", "--")))
    blocks = re.split(r"\n(?=[A-Za-z0-9])", packages)
    assert all(re.match(r"\S+==\S+ \\\n(\s+--hash=sha256:[0-9a-f]{64}( \\\n)?)+$", block) for block in blocks), (
        "every package is pinned to one version with its hashes")
    versions = locked_versions(lock)
    cuda_packages = [name for name in versions if name.startswith(("nvidia-cu", "nvidia-nccl", "nvidia-nv"))]
    if accelerator == "cpu":
        assert versions["torch"] == "2.13.0+cpu", "the CPU build, never PyPI's CUDA build"
        assert not cuda_packages
    else:
        assert versions["torch"] == "2.13.0" and "--find-links" not in lock.read_text(), "PyPI's CUDA build"
        assert {"nvidia-cublas", "nvidia-nccl-cu13"} <= set(versions), "with the CUDA libraries it runs on"
        cpu = locked_versions(lock_file(spec))
        # torch itself, and triton, which PyPI's CUDA torch pins (the CPU build does not depend on it).
        differ = [name for name in set(cpu) & set(versions) if name not in ("torch", "triton")
                  and cpu[name] != versions[name]]
        assert not differ, f"the CUDA lock keeps the CPU lock's versions: {sorted(differ)} differ"


def test_make_installs_the_main_lock_with_the_command_the_backend_builder_uses():
    makefile = (REPO / "Makefile").read_text()
    assert "$(STAMP): $(MAIN_LOCK)" in makefile, "a new lock reinstalls .venv"
    assert "MAIN_LOCK := envs/xtrain$(if $(filter cuda,$(XTRAIN_ACCELERATOR)),-cuda).lock" in makefile
    assert " ".join(install_command("$(BIN)/python", Path("$(MAIN_LOCK)"))) in makefile


def test_a_backend_build_refuses_a_lock_that_does_not_hold_the_specs_pins(tmp_path):
    spec = tmp_path / "backend.yaml"
    spec.write_text("dependencies:\n  - pip\n  - pip:\n      - torch==2.13.0\n      - trl==1.16.0\n")
    lock_file(spec).write_text("torch==2.13.0+cpu \\\n    --hash=sha256:" + "0" * 64 + "\n")
    with pytest.raises(XtrainError, match=r"backend\.lock does not hold .*\['trl==1\.16\.0'\]: run `make lock`"):
        build(spec, tmp_path / "venv")
    assert not (tmp_path / "venv").exists()


def test_this_venv_holds_the_main_lock():
    """`make venv` installed .venv from the lock (in CI, in a fresh clone): every locked package at its version.
    bench/bench_lock_install.py times the same in a new clone, and offline."""
    if Path(sys.prefix).resolve() != (REPO / ".venv").resolve():
        pytest.skip(f"the tests run in {sys.prefix}, not this checkout's .venv")
    listed = subprocess.run([sys.executable, "-m", "pip", "list", "--format=json"], check=True, capture_output=True,
                            text=True).stdout
    installed = {normalised(package["name"]): package["version"] for package in json.loads(listed)}
    wrong = {name: (version, installed.get(name)) for name, version in locked_versions(REPO / "envs/xtrain.lock").items()
             if installed.get(name) != version}
    assert not wrong, f"locked vs installed: {wrong}; run `make venv`"


def probe_wheel(folder: Path, version: str) -> Path:
    """A one-module wheel, xtrain-store-probe `version` (VALUE = version), for pip to install offline."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"xtrain_store_probe-{version}-py3-none-any.whl"
    info = f"xtrain_store_probe-{version}.dist-info"
    files = {"xtrain_store_probe.py": f"VALUE = {version!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: xtrain-store-probe\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(wheel, "w") as archive:  # dated 1980: the same bytes, so the same hash, every time
        for name, text in files.items():
            archive.writestr(zipfile.ZipInfo(name), text)
    return wheel


def probe_spec(project: Path, wheels: Path, version: str) -> Path:
    """envs/probe.yaml pinning xtrain-store-probe `version`, and its lock with the wheel's hash."""
    import hashlib

    wheel = probe_wheel(wheels, version)
    (project / "envs").mkdir(parents=True, exist_ok=True)
    spec = project / "envs" / "probe.yaml"
    spec.write_text(f"dependencies:\n  - pip:\n      - xtrain-store-probe=={version}\n")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    lock_file(spec).write_text(f"xtrain-store-probe=={version} \\\n    --hash=sha256:{digest}\n")
    return spec


def test_a_lock_is_built_once_in_the_store_and_every_clone_links_to_that_build(tmp_path, monkeypatch, caplog):
    """Two clones ask for the same lock: one install, both `.venvs/probe` link to it; Snakemake deleting ready.json
    before a rerun costs a link, not an install; a new lock gets a build of its own, and the first stays."""
    import logging

    monkeypatch.setenv("XTRAIN_ENV_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    caplog.set_level(logging.INFO, logger="xtrain.project.envs")
    first, second = tmp_path / "clone1", tmp_path / "clone2"
    for clone in (first, second):
        build(probe_spec(clone, tmp_path / "wheels", "1.0"), clone / ".venvs" / "probe")
    home = (first / ".venvs" / "probe").resolve()
    assert home.parent == tmp_path / "store" and (second / ".venvs" / "probe").resolve() == home
    assert caplog.text.count("reused") == 1, "the second clone installs nothing"

    def value(clone: Path) -> str:
        python = clone / ".venvs" / "probe" / "bin" / "python"
        return subprocess.run([python, "-c", "import xtrain_store_probe as p; print(p.VALUE)"], capture_output=True,
                              text=True, check=True).stdout.strip()

    assert value(first) == value(second) == "1.0"
    ready = json.loads((first / ".venvs" / "probe" / "ready.json").read_text())
    assert ready["store"] == str(home) and ready["lock"].endswith("probe.lock")

    (second / ".venvs" / "probe" / "ready.json").unlink()  # what Snakemake does before rerunning the rule
    build(second / "envs" / "probe.yaml", second / ".venvs" / "probe")
    assert caplog.text.count("reused") == 2 and value(second) == "1.0"

    build(probe_spec(second, tmp_path / "wheels", "2.0"), second / ".venvs" / "probe")
    assert (second / ".venvs" / "probe").resolve() != home and value(second) == "2.0"
    assert value(first) == "1.0", "the other clone's build is left as it was"
