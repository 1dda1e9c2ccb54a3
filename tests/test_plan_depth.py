"""The plan traces a deep model's step at two shallow depths and extrapolates in the layer count (plan.memory
`depth_traced`): its figures must equal a trace of every layer, and models whose layers differ must be traced whole."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from test_model_families import published_config

from xtrain.plan import memory
from xtrain.plan.memory import SHALLOW, Step, _traced, depth_traced, extrapolated, traced
from xtrain.plan.model import count_parameters, layer_stack
from xtrain.recipe import Train

LORA = Train(method="lora").lora.model_dump_json()


def deepened(config: dict, layers: int, out: Path) -> str:
    """A config-only model folder: `config` with `layers` decoder layers."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
    return str(out)


def assert_same_step(model_dir: str, method: str, lora: str | None, step: Step, depth: int) -> None:
    """The step extrapolated from SHALLOW equals the whole model's trace: memory by kind within 0.5%, ops and
    FLOPs exactly."""
    whole = _traced(model_dir, method, lora, step, False).trace
    guess = extrapolated([_traced(model_dir, method, lora, step, False, layers) for layers in SHALLOW], depth)
    assert guess is not None, f"{model_dir} {step}: the shallow steps' segments do not match"
    assert (guess.flops, guess.ops) == (whole.flops, whole.ops)
    assert guess.breakdown == pytest.approx(whole.breakdown, rel=0.005), step
    assert sum(guess.breakdown.values()) == pytest.approx(sum(whole.breakdown.values()), rel=0.005)


TINY_STEPS = [  # (method, step): full fine-tune and LoRA, with and without checkpointing, on the CPU and GPU paths
    ("full", Step(2, 64, "fp32", "fp32", False)),
    ("full", Step(2, 64, "bf16", "fp32", True)),
    ("lora", Step(2, 64, "bf16", "bf16", False)),
    ("lora", Step(1, 64, "fp32", "fp32", True, sequences=2)),  # a DPO pair
    ("lora", Step(2, 64, "bf16", "bf16", True, packed=True)),
]


@pytest.mark.parametrize(("method", "step"), TINY_STEPS)
def test_the_tiny_models_step_extrapolates_to_the_trace_of_every_layer(tiny_model, tmp_path, method, step):
    """The demo model's config at 12 layers (its embeddings tied: the head's gradient lands on the embedding's): the
    peak moves between phases and segments (optimizer step, logits, the first layer's backward) with depth."""
    model_dir = deepened(json.loads((tiny_model / "config.json").read_text()), 12, tmp_path / "deep")
    assert_same_step(model_dir, method, LORA if method == "lora" else None, step, 12)


@pytest.mark.slow
@pytest.mark.parametrize("layers", [4, 6])
def test_a_truncated_llama_8b_extrapolates_to_the_trace_of_every_layer(tmp_path, layers):
    """Llama-3.1-8B's published config cut to 4 and 6 layers (its 128k vocabulary's logits set the peak against a
    few layers), as the GPU recipes plan it: LoRA in bf16, a full fine-tune with checkpointing."""
    model_dir = deepened(published_config("Llama-3.1-8B-Instruct"), layers, tmp_path / "llama")
    assert_same_step(model_dir, "lora", LORA, Step(1, 512, "bf16", "bf16", False), layers)
    assert_same_step(model_dir, "full", None, Step(1, 512, "bf16", "fp32", True), layers)


def test_the_plan_extrapolates_a_deep_model_and_traces_a_shallow_one_whole(tiny_model, tmp_path, monkeypatch):
    """`traced` (what the planner calls) traces only the shallow copies of a model deeper than the SHALLOW depths
    together, and a shallower model whole; QLoRA's 4-bit accounting applies to the extrapolated LoRA step."""
    config = json.loads((tiny_model / "config.json").read_text())
    step = Step(2, 64, "bf16", "bf16", False)
    depths = []

    def spy(*args):
        depths.append(args[5] if len(args) > 5 else None)
        return _traced(*args)

    monkeypatch.setattr(memory, "_traced", spy)
    deep = Path(deepened(config, sum(SHALLOW) + 1, tmp_path / "deep"))
    qlora = Train(method="qlora")
    params = count_parameters(deep, qlora)
    lora = qlora.lora.model_dump_json()
    whole = _traced(str(deep), "lora", lora, step, False).trace.breakdown
    assert traced(deep, qlora, step, params=params).breakdown == pytest.approx(
        memory.quantized(whole, params, qlora, step), rel=0.005)
    assert depths == list(SHALLOW)
    shallow = deepened(config, sum(SHALLOW), tmp_path / "shallow")
    assert depth_traced(shallow, "lora", LORA, step, False) == _traced(shallow, "lora", LORA, step, False).trace
    assert depths == [*SHALLOW, None]


@pytest.mark.parametrize(("change", "reason"), [
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 32, "max_window_layers": 3},
     "config.layer_types differs between layers"),
    ({"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
      "mlp_only_layers": [0]}, "decoder layers differ in modules or parameters"),
])
def test_a_model_whose_layers_differ_is_traced_whole_and_says_so(tiny_model, tmp_path, caplog, change, reason):
    """Sliding-window layers among full-attention ones, a dense layer before MoE ones: no layer is the others' copy,
    so the step is traced whole, with a log line saying why."""
    config = {**json.loads((tiny_model / "config.json").read_text()), **change}
    model_dir = deepened(config, 8, tmp_path / change["model_type"])
    assert reason in layer_stack(model_dir, "lora", LORA, False).differs
    if change["model_type"] == "qwen2":  # (MoE routing is data-dependent: fake tensors cannot trace it at all)
        step = Step(1, 64, "fp32", "fp32", False)
        with caplog.at_level(logging.INFO, logger="xtrain.plan.memory"):
            assert depth_traced(model_dir, "lora", LORA, step, False) == _traced(model_dir, "lora", LORA, step,
                                                                                  False).trace
        assert "tracing every decoder layer" in caplog.text and reason in caplog.text
