"""Multi-stage fine-tuning (`model.recipe`): the chain as recipes see it (unit tests, milliseconds), and one real
chained build through Snakemake that the staleness dry runs, lineage and status checks share."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import HANG_SECONDS, copy_workflow, scheduled_jobs, snakemake

from xtrain.chain import base_folder, chain_models, check_chains, continued_adapter, root_model, upstream
from xtrain.recipe import RecipeError, parse_recipe
from xtrain.staleness import field_changes, flat

ROOT = {"path": "models/tiny-llama"}
DATA = {"sources": [{"path": "data/demo/chat.jsonl"}], "seq_len": 128}


def recipe(model: dict, **sections):
    return parse_recipe({"model": model, "data": DATA, **sections}, "test.yaml")


def folder(model):
    return model.path


# ---- the schema and the chain, without a workflow -----------------------------------------------------------


def test_model_names_exactly_one_source():
    assert recipe({"recipe": "sft"}).model.name == "recipe:sft"
    with pytest.raises(RecipeError, match="exactly one of `path`.*`hub`.*`recipe`.*got path and recipe"):
        recipe({"path": "models/tiny-llama", "recipe": "sft"})
    with pytest.raises(RecipeError, match="`adapter` says what to do with an upstream recipe's LoRA adapter"):
        recipe({**ROOT, "adapter": "merge"})
    with pytest.raises(RecipeError, match="model.adapter"):
        recipe({"recipe": "sft", "adapter": "fold"})


def test_base_folder_follows_what_the_upstream_trained():
    recipes = {"sft": recipe(ROOT), "full": recipe(ROOT, train={"method": "full"}),
               "on_sft": recipe({"recipe": "sft"}), "on_full": recipe({"recipe": "full"}),
               "more": recipe({"recipe": "sft", "adapter": "continue"}), "third": recipe({"recipe": "on_sft"})}
    check_chains(recipes)
    assert base_folder("sft", recipes, folder) == "models/tiny-llama"
    assert base_folder("on_sft", recipes, folder) == "bases/sft"  # the adapter merged once (rule merge_base)
    assert base_folder("on_full", recipes, folder) == "checkpoints/full"  # a full checkpoint as it is
    assert base_folder("more", recipes, folder) == "models/tiny-llama"  # the same adapter on the same base
    assert continued_adapter("more", recipes) == "checkpoints/sft" and continued_adapter("on_sft", recipes) is None
    assert upstream("third", recipes) == ["sft", "on_sft"] and root_model("third", recipes).path == "models/tiny-llama"
    assert [(m.recipe, m.folder, m.checkpoint) for m in chain_models("third", recipes, folder)] == [
        (None, "models/tiny-llama", None), ("sft", "models/tiny-llama", "checkpoints/sft"),
        ("on_sft", "bases/sft", "checkpoints/on_sft"), ("third", "bases/on_sft", "checkpoints/third")]


@pytest.mark.parametrize(("recipes", "message"), [
    ({"a": recipe({"recipe": "nowhere"})}, r"recipes/a.yaml: model.recipe 'nowhere' names no recipe in recipes/"),
    ({"a": recipe({"recipe": "b"}), "b": recipe({"recipe": "a"})}, r"recipes/a.yaml: model.recipe makes a cycle "
                                                                   r"\(a -> b -> a\)"),
    ({"a": recipe(ROOT, train={"method": "full"}), "b": recipe({"recipe": "a", "adapter": "merge"})},
     r"recipes/b.yaml: model.adapter: recipe 'a' is a full fine-tune"),
    ({"a": recipe(ROOT), "b": recipe({"recipe": "a", "adapter": "continue"}, train={"lora": {"r": 8}})},
     r"recipes/b.yaml: train.lora must equal recipe 'a''s with model.adapter: continue"),
    ({"a": recipe(ROOT), "b": recipe({"recipe": "a", "adapter": "continue"}, train={"backend": "axolotl"})},
     r"recipes/b.yaml: model.adapter: continue: train.backend axolotl cannot start from a trained adapter"),
    ({"a": recipe(ROOT, data={**DATA, "chat_template": "chatml"}),
      "b": recipe({"recipe": "a"}, data={**DATA, "chat_template": "llama3"})},
     r"recipes/b.yaml: data.chat_template 'llama3' differs from 'chatml', the template recipe 'a'"),
    ({"a": recipe(ROOT), "b": recipe({"recipe": "a", "trust_remote_code": True})},
     r"recipes/b.yaml: model.trust_remote_code is True but the chain's root model models/tiny-llama has False"),
])
def test_a_broken_chain_is_refused_naming_the_recipes(recipes, message):
    with pytest.raises(RecipeError, match=message):
        check_chains(recipes)


def test_a_stage_may_keep_its_upstreams_template_by_name():
    check_chains({"a": recipe(ROOT, data={**DATA, "chat_template": "chatml"}),
                  "b": recipe({"recipe": "a"}), "c": recipe({"recipe": "b"}, data={**DATA, "chat_template": "chatml"})})


def test_field_changes_name_each_field():
    old = {"train": {"learning_rate": 0.005, "lora": {"r": 16}}, "data": {"sources": [{"path": "a.jsonl"}]}}
    new = {"train": {"learning_rate": 0.01, "lora": {"r": 16}}, "data": {"sources": [{"path": "b.jsonl"}]}}
    assert flat(old)["data.sources[0].path"] == "a.jsonl"
    assert field_changes(old, new) == ['data.sources[0].path: "a.jsonl" → "b.jsonl"',
                                       "train.learning_rate: 0.005 → 0.01"]


# ---- one real chain through Snakemake ------------------------------------------------------------------------

SFT = """
model: {path: models/tiny-llama}
data:
  sources: [{path: data/demo/chat.jsonl, format: messages}]
  seq_len: 128
train: {max_steps: 3, global_batch_size: 4, learning_rate: 5.0e-3, lora: {r: 8, alpha: 16, dropout: 0.0}}
eval: {generations: 2, max_new_tokens: 8}
"""
# DPO on the SFT checkpoint merged into its base; exported, so the export reads the merged base too.
DPO = """
model: {recipe: sft}
data:
  sources: [{path: data/pref/colours_sums.jsonl}]
  seq_len: 128
  eval_fraction: 0.2
train: {objective: dpo, max_steps: 2, global_batch_size: 4, learning_rate: 5.0e-3, logging_steps: 1}
eval: {generations: 0}
export: {merged: true}
"""
# The SFT adapter trained further on the same data: its direct base is the SFT checkpoint.
CONT = """
model: {recipe: sft, adapter: continue}
data:
  sources: [{path: data/demo/chat.jsonl, format: messages}]
  seq_len: 128
train: {max_steps: 2, global_batch_size: 4, learning_rate: 1.0e-2, lora: {r: 8, alpha: 16, dropout: 0.0}}
eval: {generations: 0}
"""
TRAINED = ("prepare", "plan", "train", "plan_evaluate", "evaluate", "report", "gate")


@pytest.fixture(scope="module")
def chained(tmp_path_factory) -> Path:
    root = copy_workflow(tmp_path_factory.mktemp("chain"), {"sft": SFT, "dpo": DPO, "cont": CONT})
    snakemake(root, "--cores", "2")
    return root


def dry_run(root: Path, *args: str) -> set:
    result = snakemake(root, "-n", *args)
    return scheduled_jobs(result.stdout + result.stderr)


def read(root: Path, path: str):
    return json.loads((root / path).read_text())


class edited:
    """A recipe's YAML changed by `change` for the duration of a block, then restored with its timestamps."""

    def __init__(self, path: Path, change):
        self.path, self.change = path, change

    def __enter__(self):
        self.original, self.stat = self.path.read_text(), self.path.stat()
        data = yaml.safe_load(self.original)
        self.change(data)
        self.path.write_text(yaml.safe_dump(data))

    def __exit__(self, *exc):
        self.path.write_text(self.original)
        os.utime(self.path, ns=(self.stat.st_atime_ns, self.stat.st_mtime_ns))


@pytest.mark.slow
def test_the_merged_base_is_one_job_every_stage_below_reads(chained):
    forced = snakemake(chained, "-n", "--forceall")
    jobs = scheduled_jobs(forced.stdout + forced.stderr)
    assert [job for job in jobs if job[0] == "merge_base"] == [("merge_base", "sft")]
    assert (chained / "bases/sft/config.json").is_file() and not (chained / "bases/cont").exists()
    text = forced.stdout
    for rule in ("prepare", "plan", "train", "evaluate", "export"):  # dpo's jobs all read the one merged base
        block = next(b for b in text.split("\nrule ")[1:] if b.startswith(f"{rule}:") and "recipe=dpo" in b)
        assert "bases/sft" in block, block
    assert dry_run(chained) == set()


@pytest.mark.slow
def test_an_upstream_edit_makes_the_whole_chain_stale(chained):
    with edited(chained / "recipes/sft.yaml", lambda r: r["data"].update(seq_len=96)):
        jobs = dry_run(chained)
    for name in ("sft", "dpo", "cont"):
        assert ("train", name) in jobs and ("evaluate", name) in jobs
    assert ("merge_base", "sft") in jobs and ("export", "dpo") in jobs


@pytest.mark.slow
def test_a_downstream_edit_touches_nothing_upstream(chained):
    with edited(chained / "recipes/dpo.yaml", lambda r: r["train"].update(learning_rate=0.01)):
        jobs = dry_run(chained)
        status = subprocess.run([str(Path(sys.executable).with_name("xtrain")), "status", "dpo"], cwd=chained,
                                capture_output=True, text=True, timeout=HANG_SECONDS)
    assert {name for _, name in jobs} == {"dpo"} and ("train", "dpo") in jobs and ("prepare", "dpo") not in jobs
    assert status.returncode == 0, status.stderr
    assert "dpo train: train.learning_rate: 0.005 → 0.01" in status.stdout, status.stdout
    with edited(chained / "recipes/sft.yaml", lambda r: r["train"].update(learning_rate=0.01)):
        status = subprocess.run([str(Path(sys.executable).with_name("xtrain")), "status", "sft"], cwd=chained,
                                capture_output=True, text=True, timeout=HANG_SECONDS)
    assert "sft train: train.learning_rate: 0.005 → 0.01" in status.stdout, status.stdout
    assert "every stage of cont, dpo (built on it) is stale too" in status.stdout, status.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("recipes", "named"), [
    ({"loop_a": "model: {recipe: loop_b}", "loop_b": "model: {recipe: loop_a}"}, "loop_a -> loop_b -> loop_a"),
    ({"orphan": "model: {recipe: nowhere}"}, "recipes/orphan.yaml: model.recipe 'nowhere' names no recipe"),
])
def test_a_cycle_or_a_missing_upstream_stops_snakemake_before_any_job(chained, recipes, named):
    paths = [chained / "recipes" / f"{name}.yaml" for name in recipes]
    try:
        for path, text in zip(paths, recipes.values()):
            path.write_text(f"{text}\ndata: {{sources: [{{path: data/demo/chat.jsonl}}]}}\n")
        result = snakemake(chained, "-n", check=False)
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
    assert result.returncode != 0 and named in result.stdout + result.stderr, result.stdout + result.stderr


@pytest.mark.slow
def test_the_chained_dpo_starts_at_ln2_against_the_upstream_checkpoint(chained):
    """Policy and reference are both the SFT checkpoint (merged) at step 0: the first DPO loss is ln 2."""
    first = read(chained, "checkpoints/dpo/train_metrics.json")["loss"][0]
    assert first["step"] == 1 and math.isclose(first["loss"], math.log(2), abs_tol=1e-4)


@pytest.mark.slow
def test_evaluation_compares_with_the_direct_base_and_shows_the_root(chained):
    sft, cont = read(chained, "reports/sft/eval.json"), read(chained, "reports/cont/eval.json")
    # cont's data and split are sft's: its direct base is sft's tuned model, its root sft's base.
    assert math.isclose(cont["base_loss"], sft["tuned_loss"], rel_tol=1e-5)
    assert math.isclose(cont["root_loss"], sft["base_loss"], rel_tol=1e-5)
    assert cont["tuned_loss"] != cont["base_loss"]  # the continued adapter trained for real
    dpo = read(chained, "reports/dpo/eval.json")
    assert {"root_loss", "base_loss", "tuned_loss", "reward_accuracy"} <= set(dpo) and "root_loss" not in sft


@pytest.mark.slow
def test_lineage_in_manifest_card_and_report(chained):
    sft, dpo = read(chained, "checkpoints/sft/manifest.json"), read(chained, "checkpoints/dpo/manifest.json")
    assert [stage["recipe"] for stage in dpo["lineage"]] == ["sft", "dpo"]
    assert dpo["lineage"][0] == sft["lineage"][0] and dpo["root_model"] == "models/tiny-llama"
    assert dpo["lineage"][1]["base_model"] == "bases/sft"
    card = (chained / "checkpoints/dpo/README.md").read_text()
    assert "## Stages" in card and sft["recipe_hash"][:12] in card and sft["data_fingerprint"][:12] in card
    assert "## Stages" in (chained / "exports/dpo/README.md").read_text()
    report = (chained / "reports/dpo/report.html").read_text()
    assert "<h2>Stages</h2>" in report and sft["recipe_hash"][:12] in report and "models/tiny-llama" in report
    cont = read(chained, "checkpoints/cont/manifest.json")
    assert [stage["base_model"] for stage in cont["lineage"]] == ["models/tiny-llama", "models/tiny-llama"]


def test_dvc_stage_depends_on_the_upstream_checkpoint():
    from xtrain.project.dvc_stages import recipe_stage

    assert "checkpoints/sft" in recipe_stage("dpo", recipe({"recipe": "sft"}))["deps"]
    assert not any(dep.startswith("checkpoints/") for dep in recipe_stage("sft", recipe(ROOT))["deps"])


def test_dvc_versions_a_merged_base_in_its_upstreams_stage():
    """bases/<upstream> is built and versioned by the upstream's stage (one stage, however many recipes merge it):
    a clone that pulls has the base its downstream trained on, so it neither rebuilds it nor retrains."""
    import yaml

    from xtrain.project.dvc_stages import merged_upstreams, render

    recipes = {"sft": recipe(ROOT), "dpo": recipe({"recipe": "sft"}), "kto": recipe({"recipe": "sft"}),
               "more": recipe({"recipe": "sft", "adapter": "continue"}), "full": recipe(ROOT, train={"method": "full"}),
               "on_full": recipe({"recipe": "full"}), "base": recipe(ROOT), "cont": recipe({"recipe": "base",
                                                                                          "adapter": "continue"})}
    assert merged_upstreams(recipes) == {"sft"}  # not a full fine-tune's checkpoint, not a continued adapter
    stages = yaml.safe_load(render(Path(__file__).parents[1]))["stages"]
    assert stages["demo"]["cmd"].endswith(" bases/demo") and {"bases/demo": {"persist": True}} in stages["demo"]["outs"]
    assert not any("bases/" in str(stage) for name, stage in stages.items() if name != "demo")
