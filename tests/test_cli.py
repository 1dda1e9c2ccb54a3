"""The `xtrain` command, as a user runs it in a project folder: new, status, plan, run --dry-run; and each command's
exact Snakemake call, in-process."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_SECONDS, REPO, copy_workflow

from xtrain import cli
from xtrain.recipe import load_recipe

XTRAIN = str(Path(sys.executable).with_name("xtrain"))


def xtrain(project: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([XTRAIN, *args], cwd=project, capture_output=True, text=True, timeout=HANG_SECONDS,
                            stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise AssertionError(f"xtrain {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("cli"), {"demo": (REPO / "recipes/demo.yaml").read_text()})


def test_new_writes_a_recipe_that_loads_with_the_format_detected(project):
    out = xtrain(project, "new", "mine", "--model", "models/tiny-llama", "--data", "data/demo/chat.jsonl")
    assert "data/demo/chat.jsonl: messages" in out.stdout
    recipe = load_recipe(project / "recipes/mine.yaml")
    assert recipe.data.sources[0].format == "messages" and recipe.train.learning_rate == 2e-4, "defaults shown"
    again = xtrain(project, "new", "mine", "--model", "models/tiny-llama", "--data", "data/demo/chat.jsonl", check=False)
    assert again.returncode == 1 and "recipes/mine.yaml exists" in again.stderr
    wrong = xtrain(project, "new", "pairs", "--model", "m", "--data", "data/demo/chat.jsonl", "--objective", "dpo",
                   check=False)
    assert wrong.returncode == 1 and "set train.objective: sft" in wrong.stderr
    assert not (project / "recipes/pairs.yaml").exists()
    (project / "recipes/mine.yaml").unlink()


def test_plan_builds_and_shows_the_plan_and_status_says_what_is_stale_and_why(project):
    before = xtrain(project, "status", "demo").stdout
    assert before.splitlines()[1].split()[1:] == ["missing"] * 6
    shown = xtrain(project, "plan", "demo").stdout
    assert "micro-batch" in shown and "peak per device" in shown and "asks for" in shown
    assert xtrain(project, "status", "demo").stdout.splitlines()[1].split()[1:3] == ["done", "done"]
    recipe = project / "recipes/demo.yaml"
    recipe.write_text(recipe.read_text().replace("seq_len: 128", "seq_len: 120"))
    after = xtrain(project, "status", "demo").stdout
    assert after.splitlines()[1].split()[1:3] == ["stale", "stale"]
    assert "demo prepare: params changed" in after


def test_run_dry_run_lists_the_jobs_and_an_unknown_recipe_is_named(project, tmp_path):
    dry = xtrain(project, "run", "demo", "--dry-run")
    assert "rule train:" in dry.stdout and "rule gate:" in dry.stdout
    (tmp_path / "mine.yaml").write_text((project / "recipes/demo.yaml").read_text())
    outside = xtrain(project / "data", "run", str(tmp_path / "mine.yaml"), "--dry-run")  # from a subfolder
    assert "wildcards: recipe=mine" in outside.stdout and "wildcards: recipe=demo" not in outside.stdout
    unknown = xtrain(project, "run", "nope", check=False)
    assert unknown.returncode == 1 and "no recipe nope in recipes/; known recipes: demo" in unknown.stderr


def test_smoke_names_an_unknown_recipe_before_running_anything(project):
    unknown = xtrain(project, "smoke", "nope", check=False)
    assert unknown.returncode == 1 and "no recipe nope in recipes/; known recipes: demo" in unknown.stderr
    assert not (project / "smoke").exists()


# The commands in-process on a bare project (a Snakefile, the config, two recipes, the demo data), with the snakemake
# call recorded instead of run: each form's exact command and targets, in milliseconds.
EXPORTED = (REPO / "recipes/demo.yaml").read_text() + "export: {gguf: f16}\n"


@pytest.fixture
def bare(tmp_path, monkeypatch) -> tuple[Path, list]:
    (tmp_path / "Snakefile").write_text("")
    (tmp_path / "config").mkdir()
    shutil.copy(REPO / "config/config.yaml", tmp_path / "config/config.yaml")
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes/demo.yaml").write_text((REPO / "recipes/demo.yaml").read_text())
    (tmp_path / "recipes/exported.yaml").write_text(EXPORTED)
    shutil.copytree(REPO / "data/demo", tmp_path / "data/demo")
    calls = []

    def recorded(command, **kwargs):
        calls.append((command[1:], Path.cwd()))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(cli.subprocess, "run", recorded)
    monkeypatch.chdir(tmp_path / "data/demo")  # anywhere inside the project
    return tmp_path, calls


def test_run_and_train_build_gates_and_exports_from_anywhere_in_the_project(bare):
    root, calls = bare
    assert cli.main(["run", "demo"]) == 0
    assert cli.main(["train", "exported", "--cores", "2", "--dry-run"]) == 0
    assert cli.main(["run", "../../recipes/demo.yaml"]) == 0
    assert cli.main(["run"]) == 0
    assert calls == [
        (["reports/demo/gate.json", "--cores", "all"], root),
        (["reports/exported/gate.json", "exports/exported", "--cores", "2", "--dry-run"], root),
        (["reports/demo/gate.json", "--cores", "all"], root),
        (["--cores", "all"], root),  # rule all: every recipe, exports included
    ]


def test_a_recipe_outside_recipes_is_read_in_its_folder(bare, tmp_path_factory, capsys):
    root, calls = bare
    (root / "experiments").mkdir()
    (root / "experiments/mine.yaml").write_text(EXPORTED)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "theirs.yaml").write_text(EXPORTED)
    (elsewhere / "demo.yaml").write_text(EXPORTED)
    assert cli.main(["run", "../../experiments/mine.yaml"]) == 0
    assert cli.main(["eval", str(elsewhere / "theirs.yaml")]) == 0
    assert calls == [
        (["reports/mine/gate.json", "exports/mine", "--config", "recipes=experiments", "--cores", "all"], root),
        (["reports/theirs/eval.json", "reports/theirs/report.html", "--config", f"recipes={elsewhere}", "--cores",
          "all"], root),
    ]
    refused = {
        (str(elsewhere / "demo.yaml"),): "share the name demo, and with it every output",
        (str(elsewhere / "theirs.yaml"), "demo"): "these recipes lie in 2 folders",
        ("../../experiments/mine.yml",): "rename it to mine.yaml",
        ("../../experiments/nope.yaml",): "no such recipe file",
        ("nope",): "no recipe nope in recipes/; known recipes: demo, exported",
    }
    for argv, message in refused.items():
        assert cli.main(["run", *argv]) == 1
        assert message in capsys.readouterr().err
    assert len(calls) == 2


def test_export_and_chat_build_their_stage(bare, monkeypatch, capsys):
    root, calls = bare
    chats = []
    monkeypatch.setattr("xtrain.chat.main", lambda argv: chats.append((argv, Path.cwd())) or 0)
    assert cli.main(["export", "exported"]) == 0
    assert cli.main(["chat", "demo", "--system", "Be brief.", "--temperature", "0.5"]) == 0
    (root / "exports/exported/merged").mkdir(parents=True)
    assert cli.main(["chat", str(root / "exports/exported")]) == 0  # a folder: as it is, nothing built
    assert calls == [(["exports/exported", "--cores", "all"], root), (["checkpoints/demo", "--cores", "all"], root)]
    assert chats == [
        (["checkpoints/demo", "--system", "Be brief.", "--max-new-tokens", "256", "--temperature", "0.5"], root),
        (["exports/exported", "--max-new-tokens", "256", "--temperature", "0.0"], root),
    ]
    assert cli.main(["export", "demo"]) == 1
    assert "recipes/demo.yaml has no `export:` section: add one" in capsys.readouterr().err


def test_new_takes_a_hub_id_a_format_and_a_column_mapping(bare):
    root, _ = bare
    rows = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}. #### {2 * i}"} for i in range(30)]
    (root / "gsm8k.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert cli.main(["new", "gsm", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--data", "../../gsm8k.jsonl",
                     "--columns", "prompt=question,completion=answer"]) == 0
    recipe = load_recipe(root / "recipes/gsm.yaml")
    assert recipe.model.hub == "Qwen/Qwen2.5-0.5B-Instruct" and recipe.model.path is None
    source = recipe.data.sources[0]
    assert (source.path, source.format, source.columns) == (
        "gsm8k.jsonl", "prompt_completion", {"prompt": "question", "completion": "answer"})
    assert cli.main(["new", "alpaca", "--model", "../../models/tiny-llama", "--data", "../../gsm8k.jsonl", "--format",
                     "alpaca", "--columns", "instruction=question,output=answer", "--objective", "sft"]) == 0
    recipe = load_recipe(root / "recipes/alpaca.yaml")
    assert recipe.model.path == "models/tiny-llama" and recipe.data.sources[0].format == "alpaca"


def test_new_refuses_what_it_cannot_write(bare, capsys):
    refused = {
        ("--model", "nowhere", "--data", "chat.jsonl"): "--model nowhere: neither a model folder",
        ("--model", "a/b", "--data", "chat.jsonl", "--columns", "prompt"): "give OURS=THEIRS pairs",
        ("--model", "a/b", "--data", "chat.jsonl", "--columns", "text=x,prompt=y"): "no row format reads these names",
        ("--model", "a/b", "--data", "chat.jsonl", "--format", "text", "--format", "alpaca", "--format", "text"):
            "--format is given 3 times for 1 --data sources",
    }
    for argv, message in refused.items():
        assert cli.main(["new", "x", *argv]) == 1
        assert message in capsys.readouterr().err


def test_every_help_is_complete_with_an_example(capsys):
    top = cli.parser()
    assert top.description.endswith("inside a project folder.")
    commands = next(action for action in top._actions if isinstance(action, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        assert "examples:\n  xtrain " in sub.epilog, name
        assert all(action.help for action in sub._actions), [a.dest for a in sub._actions if not a.help]
    with pytest.raises(SystemExit):
        cli.main(["chat", "--help"])
    assert "xtrain chat demo" in capsys.readouterr().out


def test_outside_a_project_it_says_where_it_looked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "demo"]) == 1
    assert f"no Snakefile in {tmp_path} or any folder above it" in capsys.readouterr().err
