"""`make venv` from envs/xtrain.lock in a fresh clone: online (PyPI, with pip's cache) and offline (no network at all).

    .venv/bin/python bench/bench_lock_install.py   # ~10 min on 2 cores; clones HEAD into a temporary folder

1. A fresh clone runs `make venv`: pip installs the lock's files, each checked against its hash.
2. `pip download` puts the lock's files in a folder (the wheels of the lock itself, setuptools included: the
   editable install of xtrain builds with it).
3. Another fresh clone runs `PIP_NO_INDEX=1 PIP_FIND_LINKS=<folder> make venv` in a network namespace with no
   network (`unshare -n`, as root): nothing is resolved or fetched.
Each .venv must hold exactly the lock's versions (and xtrain, pip).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from xtrain.project.envs import locked_versions, normalised  # noqa: E402


def timed(command: list[str], **kwargs) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, **kwargs)
    return time.perf_counter() - started


def fresh_venv(folder: Path, env: dict[str, str], prefix: list[str] = ()) -> float:
    """Seconds `make venv` took in a new clone of HEAD; checks the result is exactly the lock."""
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(folder)], check=True)
    seconds = timed([*prefix, "make", "venv"], cwd=folder, env=env, stdout=subprocess.DEVNULL)
    listed = subprocess.run([str(folder / ".venv/bin/python"), "-m", "pip", "list", "--format=json"], check=True,
                            capture_output=True, text=True).stdout
    installed = {normalised(package["name"]): package["version"] for package in json.loads(listed)}
    installed.pop("xtrain"), installed.pop("pip")
    assert installed == locked_versions(folder / "envs/xtrain.lock"), "the venv is not exactly the lock"
    return seconds


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        online = fresh_venv(scratch / "online", dict(os.environ))
        print(f"make venv, fresh clone, online (pip cache): {online:.0f} s")
        wheels = scratch / "wheels"
        download = timed([sys.executable, "-m", "pip", "download", "--quiet", "--require-hashes", "--no-deps", "-r",
                          str(ROOT / "envs/xtrain.lock"), "-d", str(wheels)])
        size = sum(path.stat().st_size for path in wheels.iterdir()) / 2**20
        print(f"pip download of the lock's {len(list(wheels.iterdir()))} files ({size:.0f} MiB): {download:.0f} s")
        offline_env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
        offline = fresh_venv(scratch / "offline", offline_env, prefix=["unshare", "--net"])
        print(f"make venv, fresh clone, no network (unshare --net): {offline:.0f} s")


if __name__ == "__main__":
    main()
