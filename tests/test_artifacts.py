"""Outputs and trainer checkpoints are never half-there: what a killed writer leaves behind is cleared or
restored by the next one. (Real kills through snakemake: tests/test_robustness.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from xtrain.artifacts import atomic_dir, write_json
from xtrain.train.backends.guards import COMPLETE_MARKER, last_complete_checkpoint


def test_resume_uses_the_newest_complete_trainer_checkpoint_and_drops_cut_short_ones(tmp_path):
    for step, complete in ((2, True), (4, True), (6, False)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "optimizer.pt").write_bytes(b"\0" * 10)
        if complete:
            (folder / COMPLETE_MARKER).write_text(f"{step}\n")
    (tmp_path / "README.md").write_text("not a checkpoint")
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    assert not (tmp_path / "checkpoint-6").exists()
    assert (tmp_path / "checkpoint-2").is_dir() and (tmp_path / "README.md").is_file()
    assert last_complete_checkpoint(tmp_path / "absent") is None


def test_a_failed_block_leaves_the_previous_output_untouched(tmp_path):
    final = tmp_path / "out"
    with atomic_dir(final) as staging:
        (staging / "a.txt").write_text("first")
    with pytest.raises(RuntimeError), atomic_dir(final) as staging:
        (staging / "a.txt").write_text("second, half")
        raise RuntimeError("killed")
    assert (final / "a.txt").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


KILLED_WRITER = """
import os, signal, sys
from xtrain.artifacts import atomic_dir
final = sys.argv[1]
with atomic_dir(final) as staging:
    (staging / "a.txt").write_text("second")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_writer_killed_mid_block_leaves_staging_that_the_next_one_clears(tmp_path):
    final = tmp_path / "out"
    with atomic_dir(final) as staging:
        (staging / "a.txt").write_text("first")
    result = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(final)])
    assert result.returncode == -9
    assert (final / "a.txt").read_text() == "first"
    assert [p.name for p in tmp_path.glob(".out.partial-*")], "the killed writer's staging is left"
    with atomic_dir(final) as staging:
        (staging / "a.txt").write_text("third")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (final / "a.txt").read_text() == "third"


def test_an_output_set_aside_by_a_killed_swap_is_put_back(tmp_path):
    # A kill between the two renames of the swap: the old output is under its aside name, no `out`.
    aside = tmp_path / ".out.previous-12345"
    aside.mkdir()
    (aside / "a.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "out"):
        raise RuntimeError("this run fails too")
    assert (tmp_path / "out/a.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_write_json_clears_what_a_killed_writer_left(tmp_path):
    path = tmp_path / "eval.json"
    (tmp_path / ".eval.json.partial-999").write_text('{"half": ')
    write_json(path, {"loss": 1.5})
    assert json.loads(path.read_text()) == {"loss": 1.5}
    assert sorted(os.listdir(tmp_path)) == ["eval.json"]
