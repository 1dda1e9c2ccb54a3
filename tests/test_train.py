"""End to end through the library: prepare -> plan -> train for real (a few steps) -> evaluate."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from checkpoint_contract import assert_checkpoint_contract
from conftest import build_run

from xtrain.models.loading import load_tuned
from xtrain.recipe import Train
from xtrain.train.backends.contract import TrainResult
from xtrain.train.run import train_metrics

pytestmark = pytest.mark.slow


def plain_loop_loss(model, prepared: Path) -> float:
    """Held-out loss one row at a time, with no padding: the reference for evaluate's batched loop."""
    from datasets import Dataset

    split = Dataset.from_parquet(str(prepared / "eval.parquet"))
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, mask in zip(split["input_ids"], split["assistant_masks"]):
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
            log_probs = torch.log_softmax(logits, dim=-1)
            for t in range(1, len(ids)):
                if mask[t]:
                    total -= log_probs[t - 1, ids[t]].item()
                    count += 1
    return total / count


@pytest.fixture(scope="module")
def lora_run(tiny_model, tmp_path_factory):
    train = Train(method="lora", global_batch_size=4, max_steps=12, learning_rate=5e-3, logging_steps=2)
    return build_run(tmp_path_factory.mktemp("lora"), tiny_model, train)


def test_lora_checkpoint_contract(lora_run, tiny_model):
    checkpoint = lora_run["checkpoint"]
    metrics = assert_checkpoint_contract(checkpoint, tiny_model, "trl_cpu")
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert metrics["steps"] == 12
    assert [entry["step"] for entry in metrics["loss"]] == [1, 2, 4, 6, 8, 10, 12]
    assert metrics["tokens_per_second"] > 0
    assert metrics["peak_gpu_memory_bytes"] is None, "no GPU here"
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    prepared = json.loads((lora_run["prepared"] / "manifest.json").read_text())
    assert manifest["data_fingerprint"] == prepared["fingerprint"]
    assert manifest["packages"]["torch"].startswith("2.13.0")
    assert manifest["seed"] == 0 and manifest["backend"] == "trl_cpu"
    template = (checkpoint / "chat_template.jinja").read_text()
    assert template == (lora_run["prepared"] / "chat_template.jinja").read_text(), "the template trained with"
    assert sorted(path.name for path in lora_run["runs"].iterdir()) == ["last_run.json", "tensorboard"], (
        "trainer checkpoints are removed once the final checkpoint is written; the TensorBoard events stay")
    assert not list(checkpoint.parent.glob(".checkpoint.partial-*"))


def test_tensorboard_events_hold_the_training_metrics(lora_run):
    """The default train.report_to (tensorboard) leaves event files that TensorBoard's own reader reads back: the
    loss of each logged step as train_metrics.json has it, and the learning rate, grad norm, tokens/s and memory."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (folder,) = (lora_run["runs"] / "tensorboard").iterdir()  # runs/<recipe>/tensorboard/<run key>/
    events = EventAccumulator(str(folder))
    events.Reload()
    scalars = {tag: events.Scalars(tag) for tag in events.Tags()["scalars"]}
    for tag in ("train/loss", "train/learning_rate", "train/grad_norm", "train/tokens_per_second",
                "train/peak_host_memory_mib"):
        assert tag in scalars, f"{tag} not among {sorted(scalars)}"
        assert all(math.isfinite(event.value) for event in scalars[tag])
    metrics = json.loads((lora_run["checkpoint"] / "train_metrics.json").read_text())
    assert [(event.step, pytest.approx(event.value, rel=1e-6)) for event in scalars["train/loss"]] == [
        (entry["step"], entry["loss"]) for entry in metrics["loss"]]
    assert all(event.value > 0 for event in scalars["train/tokens_per_second"])
    assert min(event.value for event in scalars["train/peak_host_memory_mib"]) > 100  # a trainer's process, in MiB
    # The run's readable name, its settings in the HParams view, and evaluate's metrics in the same run.
    assert folder.name.startswith("runs-") and metrics["tensorboard_run"] == str(folder)
    assert "train.learning_rate" in events.PluginTagToContent("hparams")["_hparams_/session_start_info"].decode(
        "utf-8", "replace")
    report = json.loads(lora_run["report"].read_text())
    assert [(e.step, pytest.approx(e.value)) for e in scalars["eval/tuned_loss"]] == [(12, report["tuned_loss"])]
    machine = metrics["machine"]
    assert machine["cpus"] >= 1 and len(machine["load_average_start"]) == len(machine["load_average_end"]) == 3


def test_evaluate_matches_an_independent_plain_loop(lora_run, tiny_model):
    from transformers import AutoModelForCausalLM

    report = json.loads(lora_run["report"].read_text())
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    tuned = load_tuned(tiny_model, lora_run["checkpoint"]).eval()
    assert report["base_loss"] == pytest.approx(plain_loop_loss(base, lora_run["prepared"]), rel=1e-4)
    assert report["tuned_loss"] == pytest.approx(plain_loop_loss(tuned, lora_run["prepared"]), rel=1e-4)
    assert report["tuned_perplexity"] == pytest.approx(math.exp(report["tuned_loss"]))
    assert report["tuned_loss"] < report["base_loss"]
    manifest = json.loads((lora_run["prepared"] / "manifest.json").read_text())
    assert report["eval_rows"] == manifest["splits"]["eval"]["rows"]


def test_full_fine_tune_writes_a_loadable_model(tiny_model, tmp_path):
    run = build_run(tmp_path, tiny_model, Train(method="full", global_batch_size=4, max_steps=3, learning_rate=1e-3))
    assert_checkpoint_contract(run["checkpoint"], tiny_model, "trl_cpu")
    assert (run["checkpoint"] / "model.safetensors").is_file()
    report = json.loads(run["report"].read_text())
    assert report["tuned_loss"] < report["base_loss"]


def test_same_seed_gives_the_same_adapter(lora_run, tiny_model, tmp_path):
    from safetensors.torch import load_file

    train = Train(method="lora", global_batch_size=4, max_steps=12, learning_rate=5e-3, logging_steps=2)
    again = build_run(tmp_path, tiny_model, train)
    first = load_file(lora_run["checkpoint"] / "adapter_model.safetensors")
    second = load_file(again["checkpoint"] / "adapter_model.safetensors")
    assert first.keys() == second.keys()
    for key in first:
        torch.testing.assert_close(first[key], second[key], rtol=0, atol=1e-6)


def test_the_peak_gpu_memory_is_the_largest_any_logged_step_recorded():
    history = [{"step": 1, "loss": 2.0, "peak_gpu_memory_mib": 1024.5},
               {"step": 2, "loss": 1.5, "peak_gpu_memory_mib": 3072.0}, {"step": 2, "train_runtime": 1.0}]
    metrics = train_metrics(TrainResult(history, tokens_seen=100, train_seconds=1.0))
    assert metrics["peak_gpu_memory_bytes"] == 3072 * 2**20


def test_a_compiled_plan_trains_under_torch_compile(tiny_model, tmp_path, monkeypatch, caplog):
    """trl_cpu honours plan.compile: the step runs as inductor graphs (one per shape, then a symbolic one) on batches
    padded to the bucket, and the checkpoint is the same contract."""
    import logging

    from torch._dynamo.utils import counters

    from xtrain.plan import compile as compilation
    from xtrain.plan import read_plan

    monkeypatch.setattr(compilation, "SPEEDUP", {(device, precision, allocator): 3.0  # make it pay
                                                 for device, precision, allocator in compilation.SPEEDUP})
    monkeypatch.setattr("xtrain.plan.planner.allocator.for_train_job", lambda: "glibc")
    monkeypatch.setattr(compilation, "SECONDS_PER_OP", 1e-9)
    counters.clear()
    train = Train(method="lora", global_batch_size=4, max_steps=3, learning_rate=5e-3, logging_steps=1)
    with caplog.at_level(logging.INFO, logger="xtrain"):
        run = build_run(tmp_path, tiny_model, train)
    plan = read_plan(run["plan"])
    assert plan.compile.mode == "default" and plan.compile.pad_to_multiple_of == compilation.LENGTH_BUCKET
    assert counters["stats"]["unique_graphs"] >= 1, "no graph was compiled"
    assert "model wrapped as OptimizedModule" in caplog.text
    metrics = assert_checkpoint_contract(run["checkpoint"], tiny_model, "trl_cpu")
    assert metrics["steps"] == 3 and math.isfinite(metrics["final_loss"])


def test_an_eager_attention_plan_trains_with_eager_attention(tiny_model, tmp_path, monkeypatch):
    """trl_cpu honours plan.attention: the model it trains is loaded with eager attention, and the checkpoint is the
    same contract (its config.json names no attention)."""
    from transformers import AutoModelForCausalLM

    from xtrain.plan import read_plan

    monkeypatch.setenv("XTRAIN_CPU_ATTENTION", "0.010,0.020,0.004,0.008")  # eager measured faster
    loaded, load = [], AutoModelForCausalLM.from_pretrained

    def recording(*args, **kwargs):
        model = load(*args, **kwargs)
        loaded.append(model.config._attn_implementation)
        return model

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", recording)
    train = Train(method="lora", global_batch_size=4, max_steps=2, learning_rate=5e-3, logging_steps=1)
    run = build_run(tmp_path, tiny_model, train)
    assert read_plan(run["plan"]).attention.implementation == "eager"
    assert loaded[0] == "eager", "the train job's load"
    metrics = assert_checkpoint_contract(run["checkpoint"], tiny_model, "trl_cpu")
    assert metrics["steps"] == 2 and math.isfinite(metrics["final_loss"])
    assert "attn_implementation" not in (run["checkpoint"] / "adapter_config.json").read_text()


def test_evaluate_runs_where_its_job_plan_says_in_bf16_on_one_loaded_base(lora_run, tiny_model, tmp_path,
                                                                          monkeypatch):
    """The evaluate job in the plan's placement for real: bf16 weights, the base loaded once for base and tuned
    (the adapter put on it), losses close to the float32 run's."""
    from xtrain.artifacts import read_json
    from xtrain.evaluate import evaluate
    from xtrain.evaluate import run as evaluate_stage
    from xtrain.plan import read_plan
    from xtrain.plan.jobs import plan_evaluate
    from xtrain.recipe import Eval, Hardware

    settings = Eval(batch_size=5)
    job = plan_evaluate(read_plan(lora_run["plan"]), read_json(lora_run["prepared"] / "manifest.json"), settings,
                        Hardware(), tiny_model)
    loads = []
    real_load = evaluate_stage.load_model
    monkeypatch.setattr(evaluate_stage, "load_model", lambda *args: loads.append(args) or real_load(*args))
    metrics = evaluate(tiny_model, lora_run["checkpoint"], lora_run["prepared"], settings, tmp_path / "eval.json",
                       job=job.model_copy(update={"precision": "bf16"}))
    assert [(folder, dtype) for folder, dtype, *_ in loads] == [(tiny_model, "bfloat16")]
    float32 = read_json(lora_run["report"])
    for name in ("base_loss", "tuned_loss"):
        assert metrics[name] == pytest.approx(float32[name], rel=0.02)
