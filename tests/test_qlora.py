"""QLoRA and the LoRA variants trained for real on the CPU (trl_cpu, the tiny model, a few steps each), NEFTune's
noise, and the plan's 4-bit memory (issue 36)."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from checkpoint_contract import assert_checkpoint_contract
from safetensors import safe_open

from xtrain.artifacts import read_json
from xtrain.plan import make_plan, write_plan
from xtrain.plan.memory import four_bit_bytes
from xtrain.plan.model import stored_bytes_per_weight
from xtrain.plan.planner import HOST_REQUEST_MARGIN, cpu_process_bytes
from xtrain.recipe import Hardware, Lora, Train
from xtrain.train.checkpoint import check_checkpoint
from xtrain.train.run import run_training

STEPS = {"global_batch_size": 4, "learning_rate": 5e-3, "logging_steps": 1, "report_to": []}


def train_only(folder, model_dir, prepared, train: Train) -> dict:
    """plan -> train (no evaluation) on the session's prepared demo data: the checkpoint and its metrics."""
    manifest = read_json(prepared / "manifest.json")
    write_plan(folder / "plan.json", make_plan(model_dir, manifest, train, Hardware()))
    run_training(model_dir=model_dir, prepared_dir=prepared, plan_path=folder / "plan.json", train=train,
                 hardware=Hardware(), out=folder / "checkpoint", work_dir=folder / "runs")
    return {"checkpoint": folder / "checkpoint", "plan": read_json(folder / "plan.json"),
            "metrics": read_json(folder / "checkpoint" / "train_metrics.json")}


@pytest.fixture(scope="module")
def runs(tiny_model, prepared, tmp_path_factory) -> dict:
    """QLoRA (6 steps), DoRA and rsLoRA (2 steps each) through trl_cpu; the QLoRA run's log."""
    handler = logging.Handler()
    records: list[str] = []
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("xtrain")
    level, _ = logger.level, logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        qlora = train_only(tmp_path_factory.mktemp("qlora"), tiny_model, prepared,
                           Train(method="qlora", max_steps=6, **STEPS))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return {
        "qlora": qlora, "qlora_log": records,
        "dora": train_only(tmp_path_factory.mktemp("dora"), tiny_model, prepared,
                           Train(lora=Lora(use_dora=True), max_steps=2, **STEPS)),
        "rslora": train_only(tmp_path_factory.mktemp("rslora"), tiny_model, prepared,
                             Train(lora=Lora(use_rslora=True, r=8, alpha=4), max_steps=2, **STEPS)),
    }


@pytest.mark.slow
def test_qlora_trains_a_4bit_base_on_the_cpu(runs, tiny_model):
    run = runs["qlora"]
    assert any("base loaded in 4 bits: 14 Linear4bit layers (nf4, double-quantized)" in line
               for line in runs["qlora_log"]), runs["qlora_log"]
    metrics = assert_checkpoint_contract(run["checkpoint"], tiny_model, "trl_cpu")
    losses = [entry["loss"] for entry in metrics["loss"]]
    assert metrics["steps"] == 6 and losses[-1] < losses[0], losses
    adapter = json.loads((run["checkpoint"] / "adapter_config.json").read_text())
    assert adapter["peft_type"] == "LORA" and adapter["r"] == 16
    assert run["plan"]["model"]["quantized"] > 0


@pytest.mark.slow
def test_dora_and_rslora_train_for_real(runs):
    for name, key in (("dora", "use_dora"), ("rslora", "use_rslora")):
        checkpoint = runs[name]["checkpoint"]
        check_checkpoint(checkpoint, "trl_cpu")  # the files; the QLoRA run above loads its checkpoint in a fresh interpreter
        assert runs[name]["metrics"]["steps"] == 2 and all(math.isfinite(e["loss"]) for e in runs[name]["metrics"]["loss"])
        adapter = json.loads((checkpoint / "adapter_config.json").read_text())
        assert adapter[key] is True and adapter["use_dora" if name == "rslora" else "use_rslora"] is False
    with safe_open(runs["dora"]["checkpoint"] / "adapter_model.safetensors", "pt") as weights:
        assert any("lora_magnitude_vector" in name for name in weights.keys()), "DoRA saves its magnitudes"


def test_neftune_noises_the_embeddings_in_training_only(tiny_model):
    from transformers import AutoModelForCausalLM
    from transformers.integrations.neftune import activate_neftune

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    ids = torch.tensor([[5, 6, 7, 8]])
    clean = model.get_input_embeddings()(ids)
    activate_neftune(model, 5.0)  # what the trainer does with train.neftune_noise_alpha
    embeddings = model.get_input_embeddings()
    model.train()
    noisy = embeddings(ids)
    assert not torch.equal(noisy, clean)
    bound = 5.0 / (ids.shape[1] * clean.shape[-1]) ** 0.5  # uniform noise of magnitude alpha / sqrt(L * d)
    assert (noisy - clean).abs().max() <= bound + 1e-6
    model.eval()
    assert torch.equal(embeddings(ids), clean)


def test_the_plan_counts_a_4bit_base(tiny_model, prepared):
    manifest = read_json(prepared / "manifest.json")
    lora = make_plan(tiny_model, manifest, Train(), Hardware())
    qlora = make_plan(tiny_model, manifest, Train(method="qlora"), Hardware())
    quantized = qlora.model.quantized
    assert quantized and lora.model.quantized is None
    saved = lora.memory.breakdown_bytes["weights"] - qlora.memory.breakdown_bytes["weights"]
    trainable = qlora.model.trainable
    # fp32 base layers -> 4 bits + constants; fp32 adapters -> bf16 (TRL's cast for quantized models)
    assert saved == pytest.approx(quantized * (4 - four_bit_bytes(True)) + trainable * 2, abs=8)
    assert qlora.memory.breakdown_bytes["optimizer"] == lora.memory.breakdown_bytes["optimizer"] // 2
    assert four_bit_bytes(False) - four_bit_bytes(True) == pytest.approx((4 - 1 - 4 / 256) / 64)
    # On the CPU the checkpoint stays mapped beside the 4-bit copies, every page of the quantized layers read: the
    # host request counts their stored bytes (the tiny model is saved in float32).
    assert qlora.model.quantized_stored_bytes == quantized * 4
    host = cpu_process_bytes(qlora.memory.peak_bytes_per_device, qlora.resources.allocator) + quantized * 4
    assert qlora.resources.mem_mb == math.ceil(host * HOST_REQUEST_MARGIN / 2**20)


@pytest.mark.parametrize(("config", "stored"), [({"dtype": "bfloat16"}, 2), ({"torch_dtype": "float16"}, 2),
                                                ({"dtype": "float32"}, 4), ({}, 4)])
def test_the_stored_dtype_is_the_configs(tiny_model, tmp_path, config, stored):
    written = {key: value for key, value in read_json(tiny_model / "config.json").items()
               if key not in ("dtype", "torch_dtype")}
    (tmp_path / "config.json").write_text(json.dumps(written | config))
    assert stored_bytes_per_weight(tmp_path) == stored


@pytest.mark.slow
def test_a_qlora_export_merges_into_the_unquantized_base(runs, tiny_model):
    from xtrain.export.merge import merged_model
    from xtrain.models.inference_files import quantized_lines

    model = merged_model(tiny_model, runs["qlora"]["checkpoint"], "bfloat16")
    assert model.dtype == torch.bfloat16 and not hasattr(model, "peft_config")
    projections = [type(module).__name__ for name, module in model.named_modules() if name.endswith("q_proj")]
    assert projections and set(projections) == {"Linear"}, "plain 16-bit layers, no 4-bit ones"
    card = "\n".join(quantized_lines(Train(method="qlora").model_dump(mode="json"), "bfloat16"))
    assert "Trained quantized (QLoRA)" in card and "nf4, double-quantized" in card and "unquantized in bfloat16" in card
    assert quantized_lines(Train().model_dump(mode="json"), "bfloat16") == []
