"""Does the plan hold for GRPO? A GRPO step's predicted time (generation and training) and memory against a real run.

    .venv/bin/python bench/bench_grpo_plan.py ops [--model models/tiny-llama]
    .venv/bin/python bench/bench_grpo_plan.py run --config lora-kl0 [--model models/tiny-llama] [--steps 6]

`ops`: the aten ops transformers' `generate` dispatches per new token besides the model's forward (sampling, stopping
criteria, cache bookkeeping), counted on real tensors: (ops of generating N tokens - ops of generating 1) / (N - 1)
minus one decode forward's ops (as the plan traces it). The plan's `generation.GENERATE_LOOP_OPS` comes from here.

`run`: recipes/demo_grpo.yaml (data/demo/prompts.jsonl, its rewards) with each configuration's method (LoRA: r 16
on the seven linear layers), KL weight, completion length and batch, prepared and planned for this machine as the plan stage does (`make_plan`, the recorded
CPU probe), then trained by the real train stage (`run_training`, trl_cpu) in a fresh process under the train job's
allocator. Measured: the trainer's runtime per step (train_metrics.json `trainer_runtime_seconds`, every step's
generation, scoring and training), the time inside `generate` per step (a timer around GenerationMixin.generate),
and the process's peak RSS (the child's ru_maxrss); predicted: `time.seconds_per_step`,
`generation.seconds_per_step`, and the host memory the plan asks for before its 1.25 margin
(680 MiB + `memory.peak_bytes_per_device` × the allocator's retention). One configuration per invocation (ru_maxrss).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
RECIPE = ROOT / "recipes/demo_grpo.yaml"
CONFIGS = {  # name: (method, kl_weight, max_completion_length, global batch (completions), generations)
    "lora-kl0": ("lora", 0.0, 8, 16, 4),
    "lora-kl0.05": ("lora", 0.05, 8, 16, 4),
    "lora-kl0-c32": ("lora", 0.0, 32, 16, 4),
    "full-kl0.05": ("full", 0.05, 8, 16, 4),
}
LORA = {"r": 16, "alpha": 32, "dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
TRAIN = """
import json, sys, time
from pathlib import Path
import transformers.generation.utils as generation
from xtrain.recipe import Train, Hardware
from xtrain.train.run import run_training

spent = {"seconds": 0.0, "calls": 0}
original = generation.GenerationMixin.generate
def timed(self, *args, **kwargs):
    started = time.perf_counter()
    try:
        return original(self, *args, **kwargs)
    finally:
        spent["seconds"] += time.perf_counter() - started
        spent["calls"] += 1
generation.GenerationMixin.generate = timed
model, prepared, plan, train, out = sys.argv[1:6]
run_training(model_dir=Path(model), prepared_dir=Path(prepared), plan_path=Path(plan),
             train=Train.model_validate_json(train), hardware=Hardware(), out=Path(out) / "checkpoint",
             work_dir=Path(out) / "runs")
Path(out, "generate.json").write_text(json.dumps(spent))
"""
MIB = 2**20


def count_loop_ops(model_dir: Path, tokens: int = 16, rows: int = 2) -> dict:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import AutoModelForCausalLM

    from xtrain.plan.generation import forward_trace
    from xtrain.recipe import Train

    class Counter(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.randint(4, model.config.vocab_size, (rows, 12))

    def ops(new: int) -> int:
        counter = Counter()
        with counter, torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=new,
                           min_new_tokens=new, pad_token_id=model.config.pad_token_id)
        return counter.ops

    per_token = (ops(tokens) - ops(1)) / (tokens - 1)
    forward = forward_trace(model_dir, Train(method="full"), "fp32", False).ops
    return {"ops_per_new_token": per_token, "forward_ops": forward, "loop_ops": per_token - forward}


def recipe_for(name: str):
    from xtrain.recipe import Recipe

    method, kl, completion, batch, generations = CONFIGS[name]
    data = yaml.safe_load(RECIPE.read_text())
    data["train"] |= {"method": method, "global_batch_size": batch, "report_to": [],
                      "rl": {**data["train"]["rl"], "kl_weight": kl, "max_completion_length": completion,
                             "generations": generations}}
    data["train"].pop("lora", None)
    if method == "lora":  # as recipes/demo_grpo.yaml trained before it became a full fine-tune (26458ec)
        data["train"]["lora"] = LORA
    return Recipe.model_validate(data)


def run(name: str, model: Path, steps: int, work: Path) -> str:
    from xtrain.artifacts import read_json
    from xtrain.data.pipeline import prepare
    from xtrain.plan import make_plan, write_plan
    from xtrain.plan.planner import HOST_REQUEST_MARGIN
    from xtrain.recipe import Hardware, stage_params
    from xtrain.train import allocator

    recipe = recipe_for(name)
    train = recipe.train.model_copy(update={"max_steps": steps})
    manifest = prepare([ROOT / source.path for source in recipe.data.sources], model, recipe.data, work / "prepared",
                       kind="prompts", prompt_settings=stage_params(recipe, "prepare")["prompts"])
    plan = make_plan(model, manifest, train, Hardware())
    write_plan(work / "plan.json", plan)
    env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    if allocator.available():
        env["LD_PRELOAD"] = allocator.available()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    trained = subprocess.run([sys.executable, "-c", TRAIN, str(model), str(work / "prepared"), str(work / "plan.json"),
                              train.model_dump_json(), str(work)], cwd=ROOT, env=env, capture_output=True, text=True)
    if trained.returncode:
        raise SystemExit(f"the train stage failed:\n{trained.stderr[-3000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if peak <= before * 1024:
        raise SystemExit("an earlier run's peak hides this one's: run one configuration per invocation")
    metrics = read_json(work / "checkpoint/train_metrics.json")
    generate = json.loads((work / "generate.json").read_text())
    phase = plan.generation
    # The peak RSS the plan predicts: its host-memory request without the request's margin (as bench_plan_real).
    predicted_host = plan.resources.mem_mb * MIB / HOST_REQUEST_MARGIN
    step_seconds = metrics["trainer_runtime_seconds"] / steps
    lengths = [entry["completions/mean_length"] for entry in metrics["rl"]]
    return (f"| {name} | {plan.precision}, micro {plan.layout.micro_batch_size} x {plan.layout.gradient_accumulation_steps}"
            f" | {sum(lengths) / len(lengths):.1f} of {phase.completion_tokens} | {phase.seconds_per_step:.2f} | "
            f"{generate['seconds'] / steps:.2f} | {plan.time.seconds_per_step:.2f} | {step_seconds:.2f} | "
            f"**{plan.time.seconds_per_step / step_seconds:.2f}** | {phase.peak_bytes_per_device / MIB:.1f} / "
            f"{phase.training_peak_bytes_per_device / MIB:.1f} | {predicted_host / MIB:.0f} | {peak / MIB:.0f} | "
            f"**{predicted_host / peak:.2f}** | {generate['calls']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("ops", "run"))
    parser.add_argument("--config", choices=sorted(CONFIGS), default="lora-kl0")
    parser.add_argument("--model", type=Path, default=ROOT / "models/tiny-llama")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--probe-now", action="store_true", help="plan with the CPU probe measured now, under the "
                        "machine's present load, rather than the recorded one (XTRAIN_CPU_PROBE)")
    args = parser.parse_args()
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"{args.model}: no model there; build it with `snakemake models/tiny-llama` (or pass --model)")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    if args.what == "ops":
        print(json.dumps(count_loop_ops(args.model)))
        return
    if args.probe_now:  # the figures of this moment's load, for the plan and nothing else
        from xtrain.plan.probe import measure

        figures = measure("fp32", json.loads((args.model / "config.json").read_text())["hidden_size"], os.cpu_count())
        os.environ["XTRAIN_CPU_PROBE"] = f"{figures['matmul_flops']},{figures['op_seconds']}"
        print(f"probe now: {os.environ['XTRAIN_CPU_PROBE']}")
    with tempfile.TemporaryDirectory() as work:
        print("| config | plan | completion tokens (mean of max) | generation s/step predicted | measured | "
              "step s predicted | measured | ratio | plan peak MiB (generation / training) | host MiB predicted | "
              "peak RSS MiB | ratio | generate calls |")
        print(run(args.config, args.model.resolve(), args.steps, Path(work)))
    print(f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
