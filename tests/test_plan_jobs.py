"""The jobs after training, planned like the train job: evaluate and export placed on the recipe's hardware, sized,
with the resources their rules ask for (src/xtrain/plan/jobs.py)."""

from __future__ import annotations

import json

import pytest
from conftest import sample_plan
from test_smoke import LLAMA_3_1_8B

from xtrain.artifacts import read_json
from xtrain.errors import XtrainError
from xtrain.plan.jobs import plan_evaluate, plan_export
from xtrain.recipe import Eval, Export, Hardware, LmEval

GIB = 2**30
H100_NODE = Hardware(accelerator="cuda", gpus=8, gpu_model="h100")
# What plan.json says of Llama-3.1-8B under LoRA (r 16 on q and v) trained in bf16 on H100s.
LLAMA_8B = {"total": 8_030_000_000 + 6_800_000, "trainable": 6_800_000, "largest_layer": 218_112_000, "layers": 32,
            "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256}
GPU_TIME = {"device_flops": 989e12 * 0.4, "op_seconds": 8e-6, "ops_per_micro_step": 6000,
            "throughput_source": "peak table: h100 x MFU 0.4"}
# 500 held-out rows of up to 2,048 tokens.
EVAL_SPLIT = {"seq_len": 2048, "splits": {"eval": {"rows": 500, "tokens": 400_000, "supervised_tokens": 100_000,
                                                   "max_len": 2048}}}


@pytest.fixture
def llama(tmp_path):
    """A model folder with Llama-3.1-8B's config.json (all the jobs' plans read of the folder)."""
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_1_8B))
    return tmp_path


def gpu_plan(**model):
    return sample_plan(model={**LLAMA_8B, **model}, precision="bf16", weights_dtype="bf16", time=GPU_TIME)


def test_the_demo_evaluates_on_the_cpu_in_float32_at_its_batch(tiny_model, prepared):
    job = plan_evaluate(sample_plan(), read_json(prepared / "manifest.json"), Eval(batch_size=16), Hardware(),
                        tiny_model)
    assert (job.job, job.accelerator, job.device_map, job.precision, job.devices) == ("evaluate", "cpu", "cpu",
                                                                                      "fp32", 0)
    assert job.batch_size == 16 and job.lm_eval_batch_size is None and "CPU" in job.reason
    assert job.memory.weights_bytes == sample_plan().model.total * 4
    assert job.memory.peak_bytes_per_device < job.memory.budget_bytes_per_device
    assert job.resources.gpus == 0 and job.resources.mem_mb * 2**20 >= job.memory.host_bytes
    assert job.time.seconds == pytest.approx(sum(job.time.terms.values()), abs=0.2)


def test_an_8b_model_evaluates_on_one_gpu_in_the_training_precision(llama):
    job = plan_evaluate(gpu_plan(), EVAL_SPLIT, Eval(batch_size=8, lm_eval=LmEval(tasks=["arc_easy"])), H100_NODE,
                        llama)
    assert (job.accelerator, job.device, job.devices, job.device_map, job.precision) == ("cuda", "h100", 1, "cuda",
                                                                                       "bf16")
    assert 14.5 * GIB < job.memory.weights_bytes < 15.5 * GIB  # one bf16 copy: LoRA scores base and tuned on one load
    assert job.memory.peak_bytes_per_device < job.memory.budget_bytes_per_device == int(79.2 * GIB)
    # The KV cache of a generation batch: 8 rows x (2,048 + 64) tokens x 32 layers x 2 x 8 heads x 128 x 2 bytes.
    assert job.memory.breakdown_bytes["generation"] > 8 * 2112 * 32 * 2 * 8 * 128 * 2
    assert job.batch_size == 8 and 1 <= job.lm_eval_batch_size <= 8
    resources = job.resources
    assert resources.gpus == 1 and resources.cpus == 8 and resources.mem_mb * 2**20 > job.memory.weights_bytes
    assert job.time.lm_eval_allowance_minutes == 40 and resources.runtime >= 40 + 10


def test_a_model_larger_than_one_gpu_is_spread_over_the_nodes_gpus(llama):
    job = plan_evaluate(gpu_plan(total=70_600_000_000), EVAL_SPLIT, Eval(), H100_NODE, llama)
    assert job.devices == 2 and job.device_map == "auto" and "spreads it" in job.reason
    assert job.memory.peak_bytes_per_device < job.memory.budget_bytes_per_device
    assert job.resources.gpus == 2
    with pytest.raises(XtrainError, match=r"more than the node.s 1 x 79 GiB: lower eval.batch_size, or raise "
                                          r"hardware.gpus"):
        plan_evaluate(gpu_plan(total=70_600_000_000), EVAL_SPLIT, Eval(), H100_NODE.model_copy(update={"gpus": 1}),
                      llama)


def test_a_batch_that_does_not_fit_is_halved_and_the_plan_says_so(llama):
    small = Hardware(accelerator="cuda", gpus=1, gpu_model="rtx4090")
    job = plan_evaluate(gpu_plan(), EVAL_SPLIT, Eval(batch_size=64), small, llama)
    assert job.batch_size < 64 and f"batch {job.batch_size}, the largest of eval.batch_size 64 that fits" in job.reason
    assert job.memory.peak_bytes_per_device <= job.memory.budget_bytes_per_device


def test_a_grpo_recipes_evaluation_answers_every_held_out_prompt_and_scores_none(llama):
    """GRPO's eval split is prompts: each is answered by base and tuned (its rewards are the evaluation) with a KV
    cache up to the longest prompt + eval.max_new_tokens, and nothing is scored (a prompt has no reference)."""
    prompts = {"data_kind": "prompts", "seq_len": 512,
               "splits": {"eval": {"rows": 131, "sequences_per_row": 1, "tokens": 131 * 100, "supervised_tokens": 0,
                                   "max_len": 120}}}
    settings = Eval(batch_size=16, generations=8, max_new_tokens=96)
    job = plan_evaluate(gpu_plan(), prompts, settings, H100_NODE, llama)
    assert job.memory.breakdown_bytes["scoring"] == 0 and job.time.terms["scoring"] == 0
    # 16 rows x (120 + 96) tokens x 32 layers x 2 x 8 key-value heads x 128 x 2 bytes, beside the last logits
    assert job.memory.breakdown_bytes["generation"] > 16 * 216 * 32 * 2 * 8 * 128 * 2
    as_chats = plan_evaluate(gpu_plan(), {**prompts, "data_kind": "chats"}, settings, H100_NODE, llama)
    # All 131 prompts, not eval.generations' 8: ceil(131 / 16) = 9 batches of 96 decode steps for each model,
    # where chats answer one batch.
    per_decode_step = GPU_TIME["ops_per_micro_step"] // 3 * GPU_TIME["op_seconds"]
    assert job.time.terms["generation"] >= 2 * 9 * 96 * per_decode_step
    assert as_chats.time.terms["generation"] < 2 * 2 * 96 * per_decode_step


def test_the_export_runs_on_the_cpu_in_the_bases_dtype(llama):
    job = plan_export(gpu_plan(), Export(gguf=["q8_0"]), H100_NODE, llama)
    size = LLAMA_8B["total"] * 2
    assert (job.job, job.accelerator, job.devices, job.precision) == ("export", "cpu", 0, "bf16")  # config: bfloat16
    assert "on the CPU" in job.reason and job.resources.gpus == 0
    assert job.memory.host_bytes >= 1.3 * size and set(job.time.terms) == {"merge", "gguf_q8_0"}
    as_fp32 = plan_export(gpu_plan(), Export(gguf=[], dtype="float32"), H100_NODE, llama)
    assert as_fp32.precision == "fp32" and as_fp32.memory.weights_bytes == 2 * size
