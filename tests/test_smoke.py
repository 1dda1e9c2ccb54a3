"""The smoke stage: a Llama-3.1-8B-shaped recipe (its real config.json, a tokenizer written for the test with the
family's special tokens and stock template, no weights) for 8 GPUs, rehearsed on this CPU through real Snakemake;
and the failures it must catch, each at its step with the message the full run gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO, copy_workflow, scheduled_jobs, snakemake
from test_model_families import config_only_model, published_config

from xtrain.artifacts import read_json
from xtrain.data import prepare
from xtrain.errors import XtrainError
from xtrain.recipe import parse_recipe
from xtrain.smoke import smoke

pytestmark = pytest.mark.slow

LLAMA_3_1_8B = published_config("Llama-3.1-8B-Instruct")
RECIPE = {
    "model": {"path": "models/llama8b"},
    "data": {"sources": [{"path": "data/demo/chat.jsonl"}], "seq_len": 512},
    "train": {"backend": "trl_local", "method": "lora", "global_batch_size": 64, "epochs": 2},
    "hardware": {"accelerator": "cuda", "gpus": 8, "gpu_model": "h100"},
}


def llama8b_folder(tiny_model: Path, out: Path, template: str | None = None, **config) -> Path:
    """config.json (LLAMA_3_1_8B updated with `config`) and the instruct tokenizer's files only: the weights of a
    model can be missing when it is smoke-tested."""
    config = {**LLAMA_3_1_8B, **config}
    return config_only_model(tiny_model, out, "llama3_1", config, eos="<|eot_id|>", template=template)


def test_an_8b_recipe_for_8_gpus_is_rehearsed_on_the_cpu_through_snakemake(tmp_path, tiny_model):
    """Rule smoke end to end, on trl_local. The other lanes' smokes, each with its validator and launch, are
    test_gpu_recipes' (the GPU recipes of recipes/gpu/ use axolotl, torchtune and unsloth)."""
    project = copy_workflow(tmp_path, {"llama8b": json.dumps(RECIPE)})
    llama8b_folder(tiny_model, project / "models/llama8b")
    config = project / "config/config.yaml"
    config.write_text(config.read_text().replace("gpu_hour_prices: {}", "gpu_hour_prices: {h100: 2.5}"))
    assert ("smoke", "llama8b") not in scheduled_jobs(snakemake(project, "-n").stdout), "not part of the build"
    snakemake(project, "--cores", "2", "smoke/llama8b")
    out = project / "smoke/llama8b"
    summary = read_json(out / "smoke.json")
    steps = {step["step"]: step for step in summary["steps"]}
    assert summary["verdict"] == "passed" and all(step["status"] == "passed" for step in steps.values()), steps
    assert list(steps) == ["prepare", "plan", "jobs", "launch", "model", "train", "evaluate"]
    # the shrunk model keeps the class, vocabulary, 4:1 grouped-query attention, rope scaling and untied embeddings
    shrunk = read_json(out / "model/config.json")
    assert (shrunk["num_attention_heads"], shrunk["num_key_value_heads"], shrunk["num_hidden_layers"]) == (4, 1, 2)
    for key in ("vocab_size", "tie_word_embeddings", "max_position_embeddings"):
        assert shrunk[key] == LLAMA_3_1_8B[key], key
    assert shrunk["rope_parameters"] == {**LLAMA_3_1_8B["rope_scaling"], "rope_theta": 500000.0}  # transformers 5's name
    assert not list(out.glob("model/*.gguf")) and not (project / "models/llama8b/model.safetensors").exists()
    assert steps["train"]["backend"] == "trl_local" and steps["train"]["steps"] == 3
    assert steps["prepare"]["masking"] == "incremental rendering"
    # the real plan: 8 H100s, memory within the device's, GPU-hours and their price
    plan = steps["plan"]
    assert plan["gpus"] == 8 and plan["device"] == "h100" and plan["peak_gib_per_device"] < plan["budget_gib_per_device"]
    assert plan["cost"] == pytest.approx(plan["gpu_hours"] * 2.5, abs=0.01)
    assert "--nproc-per-node=8" in steps["launch"]["argv"] and steps["launch"]["resources"]["gpus"] == 8
    # the jobs after training on the same hardware: evaluate on one H100 in bf16, within its memory
    evaluate = steps["jobs"]["jobs"]["evaluate"]
    assert evaluate["where"].startswith("on 1 x h100 in bf16") and evaluate["resources"]["gpus"] == 1
    assert evaluate["peak_gib_per_device"] < evaluate["budget_gib_per_device"]
    assert steps["launch"]["validated_by"].startswith("TRL's SFTConfig")
    assert read_json(out / "launch.json")["config"]["bf16"] is True
    report = (out / "report.md").read_text()
    assert report.startswith("# Smoke test of recipes/llama8b.yaml: PASSED") and "8 x h100 GPU(s) per node" in report
    assert "GPU-hours, cost" in report and "Verdict: ready to submit." in report
    assert "## The jobs after training" in report and "- evaluate: on 1 x h100 in bf16" in report
    assert f"accepted by {steps['launch']['validated_by']}" in report
    assert not (project / "prepared/llama8b").exists() and not (project / "checkpoints/llama8b").exists()
    assert not list((project / ".venvs").glob("*-cuda")), "the rehearsal trains on the CPU: no GPU environment built"
    # the evaluate job's plan, and what its Slurm submission would ask for
    snakemake(project, "--cores", "2", "plans/llama8b/evaluate.json")
    dry = snakemake(project, "--profile", "profiles/slurm", "-n", "reports/llama8b/eval.json")
    evaluate_job = (dry.stdout + dry.stderr).split("rule evaluate:")[1].split("rule ")[0]
    assert "gpu=1" in evaluate_job and "cpus_per_task=8" in evaluate_job, evaluate_job


def smoke_failure(tmp_path: Path, tiny_model: Path, recipe: dict, template: str | None = None,
                  data: Path | None = None, **config) -> tuple[str, dict]:
    """Smoke-test `recipe` on the 8B-shaped model (its config updated with `config`; the vocabulary cut to the test
    tokenizer's size, so the steps after a failure run in seconds); the error it fails with, and the recipe."""
    model = llama8b_folder(tiny_model, tmp_path / "llama8b", template, **{"vocab_size": 2048, **config})
    recipe = {**recipe, "model": {"path": str(model)}}
    if data is not None:
        recipe["data"] = {**recipe["data"], "sources": [{"path": str(data)}]}
    loaded = parse_recipe(recipe, "recipes/r.yaml")
    sources = [Path(source["path"] if data else REPO / source["path"]) for source in recipe["data"]["sources"]]
    with pytest.raises(XtrainError) as failure:
        smoke(recipe=loaded, name="r", model_dir=model, sources=sources, out=tmp_path / "smoke", prices={})
    assert not (tmp_path / "smoke").exists(), "a failed smoke test leaves no output behind"
    return str(failure.value), loaded


def test_a_template_that_cannot_mask_fails_at_prepare_as_the_full_run_does(tmp_path, tiny_model):
    # renders the last message first: neither a generation block, nor a TRL variant, nor prefix-preserving
    reversed_chat = "{% for m in messages|reverse %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    error, recipe = smoke_failure(tmp_path, tiny_model, RECIPE, template=reversed_chat)
    with pytest.raises(XtrainError) as full:
        prepare([REPO / "data/demo/chat.jsonl"], tmp_path / "llama8b", recipe.data, tmp_path / "prepared")
    assert error.startswith("smoke test of recipes/r.yaml failed at prepare: ") and str(full.value) in error


def test_a_data_file_of_no_known_format_fails_at_prepare(tmp_path, tiny_model):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"question": f"q{i}", "reply": f"a{i}"}) + "\n" for i in range(20)))
    error, recipe = smoke_failure(tmp_path, tiny_model, RECIPE, data=data)
    with pytest.raises(XtrainError) as full:
        prepare([data], tmp_path / "llama8b", recipe.data, tmp_path / "prepared")
    assert error == f"smoke test of recipes/r.yaml failed at prepare: {full.value}"


def test_a_lora_target_the_model_lacks_fails_at_plan_and_train(tmp_path, tiny_model):
    recipe = {**RECIPE, "train": {**RECIPE["train"], "lora": {"target_modules": ["q_proj", "query_key_value"]}}}
    error, _ = smoke_failure(tmp_path, tiny_model, recipe)
    assert error.startswith("smoke test of recipes/r.yaml failed at plan: train.lora.target_modules: "
                            "['query_key_value'] match no module of the model")


def test_a_plan_that_does_not_fit_the_gpu_fails_at_plan_with_the_fixes(tmp_path, tiny_model):
    """Full fine-tuning of a 2-layer cut of the 8B model (0.45B parameters, ~7 GiB of weights, gradients and
    optimizer states) on a 4 GiB partition of an H100; 2 layers, as the plan's trace of 32 takes minutes here."""
    recipe = {**RECIPE, "train": {**RECIPE["train"], "method": "full", "global_batch_size": 8},
              "hardware": {"accelerator": "cuda", "gpus": 1, "gpu_model": "h100", "gpu_memory_gb": 4}}
    error, _ = smoke_failure(tmp_path, tiny_model, recipe, num_hidden_layers=2)
    assert error.startswith("smoke test of recipes/r.yaml failed at plan: the run does not fit: ")
    assert "over h100" in error and "train.method: lora" in error


def test_a_launch_the_lanes_validator_refuses_fails_at_launch_with_its_message(tmp_path, tiny_model, monkeypatch):
    """An H100 node whose probe reports no bf16 (what transformers would see on it): the plan's bf16 settings are
    refused by TRL's config class, as the first rank of the real job would refuse them."""
    import xtrain.train.backends.validation as validation

    monkeypatch.setattr(validation, "probed_capabilities", lambda gpu: {"bf16": False, "tf32": True})
    error, _ = smoke_failure(tmp_path, tiny_model, RECIPE)
    assert error.startswith("smoke test of recipes/r.yaml failed at launch: ")
    assert "Your setup doesn't support bf16/gpu" in error
