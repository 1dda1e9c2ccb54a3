"""A recipe cannot run code unless it says so: model.trust_remote_code is off by default, and when a recipe
turns it on, every stage passes it to transformers, a warning is logged and the checkpoint manifest
records it; lm-eval task folders run no Python unless eval.lm_eval.trust_code; a chat template the Jinja sandbox
refuses is blamed by file. Every path field of the schema is confined; one trainer holds a run folder. (Recipe
parsing refuses Python YAML tags, and preflight's table of refused paths, model folders and task folders:
tests/test_bad_input.py; shell syntax in recipe fields and planted tokens through the whole workflow:
tests/test_robustness.py; docs/security.md lists every place code could come from.)"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest
from conftest import REPO
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from xtrain.data import prepare
from xtrain.errors import XtrainError
from xtrain.evaluate import evaluate
from xtrain.evaluate.harness import check_task_code, run_tasks, sandbox_task_templates, task_code
from xtrain.paths import check_recipe_paths, recipe_paths
from xtrain.plan import make_plan, write_plan
from xtrain.recipe import (Data, DataSource, Eval, Hardware, LmEval, ProjectPath, Recipe, RecipeError, Train,
                           load_recipe, parse_recipe, stage_params, trusts_remote_code)
from xtrain.train.run import LOCK_FILE, one_trainer, run_training

# A model folder that ships its own code: importing it leaves a mark, so the test sees whether it ran.
CUSTOM_CODE = '''
import os
from pathlib import Path

from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

with Path(os.environ["XTRAIN_TEST_REMOTE_CODE_MARK"]).open("a") as mark:
    mark.write("imported\\n")


class CustomConfig(LlamaConfig):
    model_type = "xtrain_custom_llama"


class CustomForCausalLM(LlamaForCausalLM):
    config_class = CustomConfig


class CustomTokenizerFast(PreTrainedTokenizerFast):
    pass
'''


@pytest.fixture
def custom_model(tiny_model, tmp_path, monkeypatch) -> tuple[Path, Path]:
    model = tmp_path / "custom-model"
    shutil.copytree(tiny_model, model)
    (model / "custom_llama.py").write_text(CUSTOM_CODE)
    config = json.loads((model / "config.json").read_text())
    config["model_type"] = "xtrain_custom_llama"
    config["auto_map"] = {"AutoConfig": "custom_llama.CustomConfig",
                          "AutoModelForCausalLM": "custom_llama.CustomForCausalLM"}
    (model / "config.json").write_text(json.dumps(config))
    tokenizer = json.loads((model / "tokenizer_config.json").read_text())
    tokenizer["auto_map"] = {"AutoTokenizer": [None, "custom_llama.CustomTokenizerFast"]}
    tokenizer["tokenizer_class"] = "CustomTokenizerFast"
    (model / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    mark = tmp_path / "remote-code-ran"
    monkeypatch.setenv("XTRAIN_TEST_REMOTE_CODE_MARK", str(mark))
    return model, mark


def test_trust_remote_code_is_off_unless_the_recipe_sets_it(tmp_path):
    recipe = load_recipe(REPO / "recipes/demo.yaml")
    assert recipe.model.trust_remote_code is False
    stages = ("prepare", "plan", "train", "evaluate")
    assert not any(trusts_remote_code(stage_params(recipe, stage)) for stage in stages)
    on = tmp_path / "on.yaml"
    on.write_text((REPO / "recipes/demo.yaml").read_text().replace(
        "  path: models/tiny-llama\n", "  path: models/tiny-llama\n  trust_remote_code: true\n"))
    recipe = load_recipe(on)
    assert all(trusts_remote_code(stage_params(recipe, stage)) for stage in stages)


def test_custom_code_is_refused_without_trust(custom_model, tmp_path):
    model, mark = custom_model
    data = Data(sources=[DataSource(path=str(REPO / "data/demo/chat.jsonl"))], seq_len=128)
    with pytest.raises(ValueError, match="trust_remote_code"):
        make_plan(model, {}, Train(method="lora"), Hardware())
    with pytest.raises(ValueError, match="trust_remote_code"):
        prepare([Path(data.sources[0].path)], model, data, tmp_path / "prepared")
    assert not mark.exists(), "the model's code did not run"
    assert not (tmp_path / "prepared").exists()


@pytest.mark.slow
def test_trusted_custom_code_runs_in_every_stage_warns_and_is_in_the_manifest(custom_model, tmp_path, caplog):
    model, mark = custom_model
    data = Data(sources=[DataSource(path=str(REPO / "data/demo/chat.jsonl"))], seq_len=128, eval_fraction=0.1)
    train, hardware = Train(method="lora", global_batch_size=4, max_steps=2), Hardware()
    manifest = prepare([Path(data.sources[0].path)], model, data, tmp_path / "prepared", trust_remote_code=True)
    plan = tmp_path / "plan.json"
    write_plan(plan, make_plan(model, manifest, train, hardware, trust_remote_code=True))
    checkpoint = tmp_path / "checkpoint"
    with caplog.at_level(logging.WARNING, logger="xtrain"):
        run_training(model_dir=model, prepared_dir=tmp_path / "prepared", plan_path=plan, train=train,
                     hardware=hardware, out=checkpoint, work_dir=tmp_path / "runs", trust_remote_code=True)
    assert "model.trust_remote_code is set" in caplog.text
    assert json.loads((checkpoint / "manifest.json").read_text())["trust_remote_code"] is True
    report = evaluate(model, checkpoint, tmp_path / "prepared", Eval(batch_size=8), tmp_path / "eval.json",
                      trust_remote_code=True)
    assert report["tuned_loss"] > 0
    assert mark.read_text().count("imported") >= 1


def schema_fields(section: type[BaseModel], prefix: str = "") -> dict[str, FieldInfo]:
    """Every leaf field of the schema by its dotted name (list items unnamed: data.sources.path)."""
    fields = {}
    for name, info in section.model_fields.items():
        inner = [t for arg in get_args(info.annotation) or (info.annotation,) for t in get_args(arg) or (arg,)]
        sections = [t for t in inner if isinstance(t, type) and issubclass(t, BaseModel)]
        for sub in sections:
            fields |= schema_fields(sub, f"{prefix}{name}.")
        if not sections:
            fields[f"{prefix}{name}"] = info
    return fields


def recipe_naming(model: str, data: str, tasks: str, reward: str) -> dict:
    """A recipe that sets every path field of the schema (the coverage test fails when one is added and not here)."""
    return {"model": {"path": model}, "data": {"sources": [{"path": data}]},
            "train": {"objective": "grpo", "rewards": [{"type": "python", "file": reward, "function": "score"}]},
            "eval": {"lm_eval": {"tasks": ["t"], "include_path": tasks}}}


def test_every_path_field_of_the_schema_declares_itself_and_is_confined(tmp_path):
    fields = schema_fields(Recipe)
    marked = {name for name, info in fields.items() if any(isinstance(m, ProjectPath) for m in info.metadata)}
    named_like_paths = {name for name in fields if re.search(r"(^|_)(path|dir|file|folder)$", name.rsplit(".")[-1])}
    assert named_like_paths <= marked, f"path fields without the ProjectPath marker: {named_like_paths - marked}"
    project, outside = tmp_path / "project", tmp_path / "outside"
    (project / "model").mkdir(parents=True)
    (project / "model/config.json").write_text("{}")
    (project / "data.jsonl").write_text("{}\n")
    (project / "tasks").mkdir()
    (project / "rewards").mkdir()
    (project / "rewards/mine.py").write_text("def score(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    outside.mkdir()
    inside = {"model.path": "model", "data.sources.path": "data.jsonl", "eval.lm_eval.include_path": "tasks",
              "train.rewards.file": "rewards/mine.py"}
    recipe = parse_recipe(recipe_naming(*inside.values()), "r.yaml")
    assert {re.sub(r"\[\d+\]", "", field) for field, _ in recipe_paths(recipe)} == marked == set(inside)
    check_recipe_paths(recipe, "r.yaml", project)
    for field in marked:  # each one alone outside the project is refused, naming it
        listed = field.replace("sources.", "sources[0].")
        # A reward file is held to the project's rewards/ folder by the schema itself.
        refusal = (r"train\.rewards\[0\]: file .*reward code lives in the project's rewards/ folder"
                   if field == "train.rewards.file" else re.escape(listed) + ".*outside")
        with pytest.raises(RecipeError, match=refusal):
            recipe = parse_recipe(recipe_naming(*{**inside, field: str(outside)}.values()), "r.yaml")
            check_recipe_paths(recipe, "r.yaml", project)


@pytest.fixture
def task_folders(tmp_path, monkeypatch) -> tuple[Path, Path, Path]:
    """(project, a task folder inside it, one outside it), each with a task that imports Python leaving a mark."""
    project, outside = tmp_path / "project", tmp_path / "outside-tasks"
    mark = tmp_path / "task-code-ran"
    for folder in (project / "tasks", outside):
        folder.mkdir(parents=True)
        (folder / "t.yaml").write_text("task: t\ndataset_path: json\nprocess_docs: !function evil.process_docs\n")
        (folder / "evil.py").write_text(f"open({str(mark)!r}, 'w').write('ran')\n")
    monkeypatch.chdir(project)
    return project, project / "tasks", outside


def test_lm_eval_task_code_is_refused_inside_and_outside_the_project(task_folders, caplog):
    project, inside, outside = task_folders
    for include in ("tasks", str(outside)):  # outside: a folder config/config.yaml allows
        settings = LmEval(tasks=["t"], include_path=include)
        with pytest.raises(XtrainError, match=r"eval.lm_eval.include_path .*t.yaml:3: tag !function.*"
                                              r"set eval.lm_eval.trust_code: true"):
            check_task_code(settings, project)
        with caplog.at_level(logging.WARNING, logger="xtrain"):
            check_task_code(LmEval(tasks=["t"], include_path=include, trust_code=True), project)
        assert "eval.lm_eval.trust_code is set" in caplog.text
    # The evaluate job checks again before lm-eval reads the folder.
    with pytest.raises(XtrainError, match="eval.lm_eval.trust_code: true"):
        run_tasks(LmEval(tasks=["t"], include_path="tasks"), project / "model", project / "checkpoint", 1)
    assert not (project.parent / "task-code-ran").exists(), "no task code ran"
    assert sorted(p.name for p in project.rglob("*")) == ["evil.py", "t.yaml", "tasks"], "nothing written"


@pytest.mark.parametrize(("yaml_text", "found"), [
    ("task: t\nclass: !function evil.Task\n", "t.yaml:2: tag !function"),
    ("task: t\nclass: evil.Task\n", "t.yaml: `class` (a Python task)"),
    ("include: ../elsewhere/base.yaml\ntask: t\n", "t.yaml: `include: ../elsewhere/base.yaml` (a file outside"),
    ("task: t\nmetric_list:\n  - metric: !!python/name:os.system\n", "t.yaml:3: tag tag:yaml.org,2002:python/name"),
    ("task: t\ndoc_to_text: '{{question}}'\ninclude: base.yaml\n", None),
])
def test_every_way_a_task_yaml_imports_python_is_found(tmp_path, yaml_text, found):
    (tmp_path / "t.yaml").write_text(yaml_text)
    (tmp_path / "base.yaml").write_text("output_type: generate_until\n")
    found_here = task_code(tmp_path)
    assert [where for where in found_here if where.startswith(found)] if found else found_here == [], found_here


def test_lm_eval_templates_render_in_the_sandbox_unless_trusted(monkeypatch):
    from jinja2.exceptions import SecurityError
    from lm_eval import utils

    monkeypatch.setattr(utils, "env", utils.env)  # restored after the test
    assert utils.apply_template("{{ question }}", {"question": "Hi"}) == "Hi"
    sandbox_task_templates()
    assert utils.apply_template("{{ question | regex_replace('i', 'o') }}", {"question": "Hi"}) == "Ho"
    with pytest.raises(SecurityError):
        utils.apply_template("{{ ''.__class__.__mro__[1].__subclasses__() }}", {})


def test_a_second_trainer_on_a_run_folder_is_refused_naming_the_live_one(tmp_path):
    work_dir = tmp_path / "runs" / "r"
    work_dir.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"f = open({str(work_dir / LOCK_FILE)!r}, 'a+'); fcntl.flock(f, fcntl.LOCK_EX)\n"
         "f.truncate(0); f.write(f'{os.getpid()}\\n'); f.flush(); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(XtrainError, match=rf"{re.escape(str(work_dir))} is in use by a trainer that is still "
                                              rf"running \(PID {holder.pid}\)"):
            with one_trainer(work_dir):
                pytest.fail("a second trainer got the run folder")
    finally:
        holder.kill()
        holder.wait()
    with one_trainer(work_dir):  # a dead trainer's lock never blocks
        assert (work_dir / LOCK_FILE).read_text() == f"{os.getpid()}\n"


def test_a_template_the_sandbox_refuses_is_blamed_by_file_not_the_rows(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    from xtrain.data.templates import resolve
    from xtrain.data.tokenize import PROBE, encode_chats

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}{% generation %}{{ m.content.__class__.__mro__[1].__subclasses__() }}"
        "{% endgeneration %}{% endfor %}")
    tokenizer = AutoTokenizer.from_pretrained(model)
    with pytest.raises(XtrainError) as info:
        encode_chats(tokenizer, resolve(tokenizer, "tokenizer", model), [PROBE], [None])
    message = str(info.value)
    assert f"{model / 'chat_template.jinja'}: the tokenizer's chat template" in message, message
    assert "the template is at fault, not the data" in message and "Remove such rows" not in message, message
