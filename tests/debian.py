"""Debian packages the tests need (Slurm, Chromium), installed when missing; apt runs one install at a time,
so concurrent test processes take turns."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess


def ensure_installed(commands: list[str], packages: list[str]) -> bool:
    """Install `packages` unless every one of `commands` is on PATH; False when that needs root we lack."""
    if all(shutil.which(command) for command in commands):
        return True
    if os.geteuid() != 0:
        return False
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with open("/tmp/xtrain-tests-apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all(shutil.which(command) for command in commands):
            subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
            subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=True, env=env)
    return True
