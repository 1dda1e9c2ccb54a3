"""The plan's attention on a CPU (xtrain.plan.attention): measured per shape, eager where it is faster and fits."""

from __future__ import annotations

import pytest
from test_plan import manifest

from xtrain.plan import attention, generation, make_plan
from xtrain.recipe import Hardware, Train

# Seconds per layer: sdpa's forward and backward, then eager's.
EAGER_FASTER = "0.010,0.020,0.004,0.008"
EAGER_SLOWER = "0.010,0.020,0.020,0.040"


def test_the_probe_times_both_attentions_once_per_shape_and_records_them(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    shape = attention.Shape(rows=2, heads=4, kv_heads=2, head_dim=16, length=64, precision="fp32")
    first = attention.cached_seconds(shape, 1)
    assert set(first) == {"sdpa", "eager"}
    assert all(forward > 0 and backward >= 0 for forward, backward in first.values())
    assert (tmp_path / "xtrain" / attention.CACHE).is_file()
    monkeypatch.setattr(attention, "measured", lambda *args: pytest.fail("measured again: the record was not read"))
    assert attention.cached_seconds(shape, 1) == first


def test_the_difference_counts_every_layer_and_the_forward_again_under_checkpointing(monkeypatch):
    monkeypatch.setenv(attention.FIXED_ATTENTION, EAGER_FASTER)
    shape = attention.Shape(4, 8, 8, 64, 512, "bf16")
    chosen, delta = attention.decide([shape], layers=6, checkpointing=True, cpus=2)
    assert chosen.implementation == "eager"
    assert chosen.default_seconds == pytest.approx(6 * (2 * 0.010 + 0.020))
    assert chosen.eager_seconds == pytest.approx(6 * (2 * 0.004 + 0.008))
    assert delta == pytest.approx(chosen.eager_seconds - chosen.default_seconds)
    monkeypatch.setenv(attention.FIXED_ATTENTION, EAGER_SLOWER)
    kept, delta = attention.decide([shape], layers=6, checkpointing=False, cpus=2)
    assert kept.implementation is None and delta == 0 and "sdpa 0.180 s against eager's 0.360 s" in kept.reason
    monkeypatch.setenv(attention.FIXED_ATTENTION, "0.01,0.02")
    with pytest.raises(SystemExit, match="XTRAIN_CPU_ATTENTION='0.01,0.02': give"):
        attention.decide([shape], layers=6, checkpointing=False, cpus=2)


def test_eager_attention_is_planned_where_it_is_faster_with_its_memory_and_measured_time(tiny_model, monkeypatch):
    monkeypatch.setattr("xtrain.plan.planner.precisions", lambda hardware, backend: ["fp32"])  # one to compare
    data = manifest(rows=400, mean_len=90, seq_len=128)
    monkeypatch.setenv(attention.FIXED_ATTENTION, EAGER_SLOWER)
    default = make_plan(tiny_model, data, Train(global_batch_size=8), Hardware())
    monkeypatch.setenv(attention.FIXED_ATTENTION, EAGER_FASTER)
    eager = make_plan(tiny_model, data, Train(global_batch_size=8), Hardware())
    assert default.attention.implementation is None
    assert eager.attention.implementation == "eager" and eager.attention.reason.startswith("eager: ")
    assert eager.layout == default.layout
    # Time: the default's traced step, plus the measured difference on every micro-step.
    difference = eager.attention.eager_seconds - eager.attention.default_seconds
    accumulation = eager.layout.gradient_accumulation_steps
    assert eager.time.seconds_per_step == pytest.approx(
        default.time.seconds_per_step + accumulation * difference, abs=2e-4)
    assert eager.time.flops_per_token == default.time.flops_per_token
    # Memory: the eager step's own trace, which holds each layer's attention probabilities for the backward.
    assert eager.memory.breakdown_bytes["activations"] > default.memory.breakdown_bytes["activations"]

    # Where the eager step does not fit and the default's does, the default is planned, saying why.
    budget = (default.memory.peak_bytes_per_device + eager.memory.peak_bytes_per_device) // 2
    tight = Hardware(host_memory_gb=(budget + 680 * 2**20) / 0.9 / 2**30)
    squeezed = make_plan(tiny_model, data, Train(global_batch_size=8), tight)
    assert squeezed.attention.implementation is None and "eager's step would not fit" in squeezed.attention.reason
    assert squeezed.layout == default.layout


@pytest.mark.parametrize("change, reason", [
    ({"hardware": Hardware(accelerator="cuda", gpus=1)}, "a GPU runs torch's fused attention kernels"),
    ({"train": Train(global_batch_size=8, backend="axolotl")}, "train.backend axolotl loads the model itself"),
    ({"env": None}, "XTRAIN_CPU_PROBE gives fixed probe figures and XTRAIN_CPU_ATTENTION none"),
])
def test_the_default_stays_where_the_choice_is_ruled_out_with_the_reason(tiny_model, monkeypatch, change, reason):
    if "env" not in change:
        monkeypatch.setenv(attention.FIXED_ATTENTION, EAGER_FASTER)
    plan = make_plan(tiny_model, manifest(), change.get("train", Train(global_batch_size=8)),
                     change.get("hardware", Hardware()))
    assert plan.attention.implementation is None and reason in plan.attention.reason


def test_packed_rows_keep_the_default(tiny_model, monkeypatch):
    monkeypatch.setenv(attention.FIXED_ATTENTION, EAGER_FASTER)
    plan = make_plan(tiny_model, {**manifest(), "packing": True}, Train(global_batch_size=8), Hardware())
    assert plan.attention.implementation is None and "packed micro-batches" in plan.attention.reason



def test_length_grouped_rows_are_measured_at_each_share_s_length_and_the_long_share_can_decide(monkeypatch):
    """Eager is faster on short rows and slower on long ones, as on this project's CPU. A split of mostly short rows
    and a long tail averages a length where eager wins, but its longest share of rows loses more than the other
    shares gain: measured share by share, the default stays."""
    from xtrain.plan.planner import trained_lengths

    lengths = [50] * 60 + [150] * 30 + [900] * 10  # 100 rows, mean 165
    data = {"length_histogram": {"bin_edges": list(range(0, 1001, 100)),
                                 "counts": [sum(low <= n < low + 100 for n in lengths) for low in range(0, 1000, 100)]}}
    shares = trained_lengths(Train(), False, data, trained_len=165, longest=900)
    assert len(shares) == attention.LENGTH_SHARES and shares[0] < 165 < shares[-1]
    # The shares' mean square is the rows' (the bins' midpoints, the last one's at the longest row, average 165).
    assert sum(share ** 2 for share in shares) / 3 == pytest.approx(sum(n ** 2 for n in lengths) / 100)
    assert trained_lengths(Train(), True, data, trained_len=165, longest=900) == (165,)  # packed: not grouped

    def per_layer(shape, cpus):  # eager saves 10 ms a layer on rows of 200 tokens or fewer and costs 100 ms above
        return {"sdpa": [0.05, 0.05], "eager": [0.045, 0.045] if shape.length <= 200 else [0.1, 0.1]}

    monkeypatch.setattr(attention, "cached_seconds", per_layer)
    monkeypatch.delenv(attention.FIXED, raising=False)
    monkeypatch.delenv(attention.FIXED_ATTENTION, raising=False)
    at_mean, _ = attention.decide([attention.Shape(4, 8, 8, 64, 165, "bf16")], layers=6, checkpointing=False, cpus=2)
    assert at_mean.implementation == "eager"
    shapes = [attention.shape(generation.Heads(6, 8, 8, 64), 4, length, "bf16") for length in shares]
    by_share, delta = attention.decide(shapes, layers=6, checkpointing=False, cpus=2)
    assert by_share.implementation is None and delta == 0
    assert by_share.default_seconds == pytest.approx(6 * 0.1)
    assert by_share.eager_seconds == pytest.approx(6 * (0.09 * 2 + 0.2) / 3)
    assert "a share of the steps each" in by_share.reason
