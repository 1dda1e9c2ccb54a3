"""The plan's memory decisions: FSDP when replicas do not fit, the "does not fit" advice, estimators, caching."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import xtrain.plan.planner as plan_module
import xtrain.plan.probe as probe
from xtrain.errors import XtrainError
from xtrain.plan import make_plan, write_plan
from xtrain.plan.memory import Step, TrainableMemTracker, traced
from xtrain.plan.model import count_parameters
from xtrain.plan.planner import Planner, first_step
from xtrain.recipe import Hardware, Train


@pytest.fixture(scope="module")
def tiny(tiny_model) -> Path:
    return tiny_model


@pytest.fixture(scope="module")
def weighty(tmp_path_factory) -> Path:
    """A config-only 84M Llama whose memory is mostly weights and optimizer states: the plan reads no weights."""
    from transformers import LlamaConfig

    out = tmp_path_factory.mktemp("llama-84m")
    LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                num_attention_heads=8, num_key_value_heads=8).save_pretrained(out)
    return out


def manifest(seq_len: int = 128, rows: int = 64) -> dict:
    split = {"rows": rows, "tokens": rows * seq_len // 2, "supervised_tokens": rows * seq_len // 6, "max_len": seq_len}
    return {"seq_len": seq_len, "splits": {"train": split, "eval": split}, "fingerprint": "0" * 64}


def need(model_dir: Path, method: str, seq_len: int, *, gpus: int = 1, strategy: str = "single",
         checkpointing: bool = True) -> int:
    """Bytes a GPU must offer for micro-batch 1 of this run."""
    train = Train(method=method)
    planner = Planner(model_dir, train, Hardware(accelerator="cuda", gpus=gpus), count_parameters(model_dir, train))
    step = first_step(planner, "bf16", 1, seq_len, checkpointing)
    return planner.reserved(sum(planner.breakdown(step, strategy).values()))


def gpu(memory_bytes: float, gpus: int = 1) -> Hardware:
    return Hardware(accelerator="cuda", gpus=gpus, gpu_memory_gb=memory_bytes / 2**30)


def refusal(model_dir: Path, data: dict, train: Train, hardware: Hardware) -> str:
    with pytest.raises(XtrainError) as info:
        make_plan(model_dir, data, train, hardware)
    assert "does not fit" in str(info.value)
    return str(info.value)


# --- "does not fit": each advised change really fits ---------------------------------------------------


def test_advises_the_longest_seq_len_that_fits(tiny):
    hardware = gpu((need(tiny, "lora", 256) + need(tiny, "lora", 512)) / 2)
    train = Train(method="lora", global_batch_size=1)
    message = refusal(tiny, manifest(seq_len=512), train, hardware)
    assert "data.seq_len: 256" in message
    assert "train.method: lora" not in message  # it already is
    assert make_plan(tiny, manifest(seq_len=256), train, hardware).data.seq_len == 256


def test_advises_lora_when_it_fits_where_full_does_not(weighty):
    hardware = gpu((need(weighty, "lora", 128) + need(weighty, "full", 128)) / 2)
    message = refusal(weighty, manifest(), Train(method="full", global_batch_size=1), hardware)
    assert "train.method: lora" in message
    assert make_plan(weighty, manifest(), Train(method="lora", global_batch_size=1), hardware).layout.strategy == "single"


def test_advises_how_many_gpus_fsdp_needs_and_that_many_fit(weighty):
    single, sharded = need(weighty, "full", 128), need(weighty, "full", 128, gpus=4, strategy="fsdp")
    assert sharded < single
    memory = (single + sharded) / 2
    message = refusal(weighty, manifest(), Train(method="full", global_batch_size=1), gpu(memory))
    devices = int(re.search(r"(\d+) GPUs in all, with FSDP", message).group(1))
    assert 2 <= devices <= 4
    plan = make_plan(weighty, manifest(), Train(method="full", global_batch_size=devices), gpu(memory, devices))
    assert plan.layout.strategy == "fsdp"
    if devices > 2:  # the advice is the smallest count: one GPU fewer still does not fit
        refusal(weighty, manifest(), Train(method="full", global_batch_size=devices - 1), gpu(memory, devices - 1))


def test_advises_the_smallest_larger_gpu_model(tiny):
    message = refusal(tiny, manifest(), Train(global_batch_size=1), Hardware(accelerator="cuda", gpus=1, gpu_memory_gb=0.5))
    assert "hardware.gpu_model: t4 (15 GiB) and no hardware.gpu_memory_gb" in message


def test_fsdp_only_when_a_replica_does_not_fit(weighty):
    replica = need(weighty, "full", 128, gpus=2, checkpointing=False)
    shard = need(weighty, "full", 128, gpus=2, strategy="fsdp", checkpointing=False)
    train = Train(method="full", global_batch_size=2)
    assert make_plan(weighty, manifest(), train, gpu(replica * 1.01, 2)).layout.strategy == "ddp"
    plan = make_plan(weighty, manifest(), train, gpu((replica + shard) / 2, 2))
    assert plan.layout.strategy == "fsdp"
    assert plan.gradient_checkpointing is False  # sharding is preferred to recomputation


# --- estimators ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["full", "lora"])
def test_trace_on_fake_tensors_matches_the_same_step_on_real_tensors(tiny, method):
    """The traced peak equals MemTracker's on a real CPU step: the fake trace allocates like the real run."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    step = Step(micro_batch=4, seq_len=64, precision="fp32", weights_dtype="fp32", checkpointing=False)
    train = Train(method=method, lora={"dropout": 0.0} if method == "lora" else None)
    predicted = sum(traced(tiny, train, step).breakdown.values())

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    if method == "lora":
        model = get_peft_model(model, LoraConfig(**train.lora.peft_kwargs()))
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (4, 64))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], fused=True)
    tracker = TrainableMemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        for _ in range(2):
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            tracker.reset_mod_stats()
    measured = next(iter(tracker.get_tracker_snapshot("peak").values()))["Total"]
    assert predicted == pytest.approx(measured, rel=0.01)


def test_a_model_the_trace_cannot_run_falls_back_to_the_analytical_estimator(tiny, monkeypatch):
    def unsupported(*args):
        raise NotImplementedError("no fake kernel for this op")

    monkeypatch.setattr(plan_module, "traced", unsupported)
    plan = make_plan(tiny, manifest(), Train(), Hardware(accelerator="cuda", gpus=1))
    assert plan.memory.estimator == "analytical"
    assert "no fake kernel" in plan.memory.trace_error
    assert plan.memory.peak_bytes_per_device == plan.memory.analytical_peak_bytes_per_device
    assert plan.time.flops_source == "analytical"


def test_traced_flops_are_six_n_per_token_for_a_full_fine_tune(weighty):
    step = Step(1, 128, "bf16", "fp32", False)
    params = count_parameters(weighty, Train(method="full"))
    flops = traced(weighty, Train(method="full"), step).flops / 128
    # 6·N for the weights that do matmuls (the embedding lookup does none), plus causal attention.
    matmul_weights = params["total"] - params["vocab_size"] * params["hidden_size"]
    attention = 12 * params["layers"] * params["hidden_size"] * 128
    assert flops == pytest.approx(6 * matmul_weights + attention, rel=0.02)


# --- determinism ---------------------------------------------------------------------------------------


def test_a_rerun_reads_the_recorded_probe_and_writes_the_same_plan(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("XTRAIN_CPU_PROBE")
    measured = iter([{"matmul_flops": 1.234e9, "op_seconds": 4.321e-5}] * 2 + [{"matmul_flops": 9e9, "op_seconds": 1e-6}] * 9)
    monkeypatch.setattr(probe, "probe_cpu", lambda *args: next(measured))
    first = make_plan(tiny, manifest(), Train(), Hardware())
    again = make_plan(tiny, manifest(), Train(), Hardware())
    assert first == again
    assert first.time.cpu_probe.matmul_flops == 1.2e9, "the plan shows the figures it rests on, rounded"
    cached = json.loads((tmp_path / "xtrain/cpu-probe.json").read_text())
    assert all(float(f"{v:.1e}") == v for entry in cached.values() for v in entry.values())


def test_a_plan_does_not_change_with_the_load(tiny, tmp_path, monkeypatch):
    """Planned twice, the second time with the machine looking idle after a busy first probe: the same bytes."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("XTRAIN_CPU_PROBE")
    measured = iter([{"matmul_flops": 1.0e9, "op_seconds": 4.0e-5}] * 2 + [{"matmul_flops": 9.0e9, "op_seconds": 1e-5}] * 9)
    monkeypatch.setattr(probe, "probe_cpu", lambda *args: next(measured))
    loads = {"now": 3.0}
    monkeypatch.setattr(probe, "load_per_core", lambda: loads["now"])
    write_plan(tmp_path / "busy.json", make_plan(tiny, manifest(), Train(), Hardware()))
    loads["now"] = 0.1
    write_plan(tmp_path / "quiet.json", make_plan(tiny, manifest(), Train(), Hardware()))
    assert (tmp_path / "busy.json").read_bytes() == (tmp_path / "quiet.json").read_bytes()


def test_only_an_explicit_refresh_measures_again_and_keeps_the_faster(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("XTRAIN_CPU_PROBE")
    measured = iter([{"matmul_flops": 1.0e9, "op_seconds": 4.0e-5}, {"matmul_flops": 9.0e9, "op_seconds": 1.0e-5},
                     {"matmul_flops": 5.0e9, "op_seconds": 2.0e-5}])
    monkeypatch.setattr(probe, "probe_cpu", lambda *args: next(measured))
    loads = {"now": 3.0}
    monkeypatch.setattr(probe, "load_per_core", lambda: loads["now"])
    assert probe.cached_cpu_probe("fp32", 64, 2)["matmul_flops"] == 1.0e9  # measured while busy
    loads["now"] = 0.1
    assert probe.cached_cpu_probe("fp32", 64, 2)["matmul_flops"] == 1.0e9  # quiet now, but the record stands
    report = probe.refresh()
    assert "looks quiet" in report[0] and "kept the new" in report[1]
    assert probe.cached_cpu_probe("fp32", 64, 2) == {"matmul_flops": 9.0e9, "op_seconds": 1.0e-5, "load_per_core": 0.1}
    loads["now"] = 2.0
    report = probe.refresh()  # slower while busy: the faster record is kept
    assert "looks busy" in report[0] and "kept the recorded" in report[1]
    assert probe.cached_cpu_probe("fp32", 64, 2)["matmul_flops"] == 9.0e9


def test_the_cpu_is_named_with_its_family_model_and_stepping(monkeypatch):
    """Two host generations that both call themselves "AMD EPYC" (bf16 probes 2x apart) keep separate records."""
    from types import SimpleNamespace

    def cpuinfo(family: int) -> str:
        core = f"vendor_id\t: AuthenticAMD\ncpu family\t: {family}\nmodel\t\t: 2\nmodel name\t: AMD EPYC\nstepping\t: 1\n"
        return f"processor\t: 0\n{core}\nprocessor\t: 1\n{core}"

    names = []
    for family in (25, 26):
        text = cpuinfo(family)
        monkeypatch.setattr(probe, "Path", lambda path: SimpleNamespace(read_text=lambda: text))
        names.append(probe.cpu_name())
    assert names == ["AMD EPYC (cpu family 25, model 2, stepping 1)", "AMD EPYC (cpu family 26, model 2, stepping 1)"]
