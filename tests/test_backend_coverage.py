"""Every field of the recipe's `train` and `hardware` sections is decided by every backend: mapped into its
native config or launch (shown here by changing the field and finding the change where the backend says it
lands), turned into settings by the plan, refused through the declared capabilities, or said in the log.
A new recipe field fails these tests until each backend's `fields` names it."""

from __future__ import annotations

import inspect

import pytest
from pydantic import BaseModel

from xtrain.artifacts import read_json
from xtrain.plan import make_plan
from xtrain.recipe import Hardware, Lora, Preference, Quantization, Recipe, Reward, Rl, Train, stage_params
from xtrain.train.backends.capabilities import refusal
from xtrain.train.backends.contract import TrainJob
from xtrain.train.backends.registry import REGISTRY

CPU, CUDA, ROCM = Hardware(), Hardware(accelerator="cuda", gpus=1), Hardware(accelerator="rocm", gpus=8)
# A value other than the default for each field a backend maps into its native config or launch.
TRAIN_CHANGES = {
    "method": {"method": "full", "lora": None},
    "lora.r": {"lora": Lora(r=4)},
    "lora.alpha": {"lora": Lora(alpha=8)},
    "lora.dropout": {"lora": Lora(dropout=0.2)},
    "lora.target_modules": {"lora": Lora(target_modules=["q_proj", "k_proj", "v_proj"])},
    "lora.use_dora": {"lora": Lora(use_dora=True)},
    "lora.use_rslora": {"lora": Lora(use_rslora=True)},
    "lora.modules_to_save": {"lora": Lora(modules_to_save=["lm_head"])},
    "quantization.bits": {"method": "qlora", "quantization": Quantization()},
    "quantization.quant_type": {"method": "qlora", "quantization": Quantization(quant_type="fp4")},
    "quantization.double_quant": {"method": "qlora", "quantization": Quantization(double_quant=False)},
    "neftune_noise_alpha": {"neftune_noise_alpha": 5.0},
    "epochs": {"epochs": 3},
    "max_steps": {"max_steps": 7},
    "learning_rate": {"learning_rate": 1e-3},
    "lr_scheduler": {"lr_scheduler": "linear"},
    "warmup_ratio": {"warmup_ratio": 0.25},
    "weight_decay": {"weight_decay": 0.01},
    "max_grad_norm": {"max_grad_norm": 0.5},
    "logging_steps": {"logging_steps": 2},
    "checkpoint_minutes": {"checkpoint_minutes": 1e-4},
    "seed": {"seed": 5},
    "objective": {"objective": "dpo", "preference": Preference()},
    "preference.beta": {"objective": "dpo", "preference": Preference(beta=0.5)},
    "preference.loss_type": {"objective": "dpo", "preference": Preference(loss_type="hinge")},
    "preference.desirable_weight": {"objective": "kto", "preference": Preference(desirable_weight=2.0)},
    "preference.undesirable_weight": {"objective": "kto", "preference": Preference(undesirable_weight=2.0)},
    "report_to": {"report_to": ["mlflow"]},
    **{f"rl.{name}": {"rl": Rl(**{name: value})} for name, value in (
        ("generations", 8), ("max_completion_length", 32), ("temperature", 0.7), ("top_p", 0.9), ("kl_weight", 0.04),
        ("clip_epsilon", 0.3), ("loss_type", "grpo"), ("steps_per_generation", 2))},
    **{f"rewards.{name}": {"rewards": [reward]} for name, reward in (
        ("type", Reward(type="format", pattern="x")), ("weight", Reward(type="answer", weight=2.0)),
        ("column", Reward(type="answer", column="solution")), ("pattern", Reward(type="format", pattern="y")),
        ("max_tokens", Reward(type="length", max_tokens=9)),
        ("file", Reward(type="python", file="rewards/other.py", function="score")),
        ("function", Reward(type="python", file="rewards/a.py", function="other")))},
    "mlflow_tracking_uri": {"report_to": ["mlflow"], "mlflow_tracking_uri": "file:/tmp/mlruns"},
}
# The settings a train field is changed from, where the default recipe's would not show its mapping: the
# quantization's settings against a QLoRA run's defaults.
TRAIN_BASES = {key: {"method": "qlora", "quantization": Quantization()} for key in
               ("quantization.quant_type", "quantization.double_quant")}
# GRPO's settings against a GRPO run's defaults (a python reward's file and function against another python reward's).
GRPO_BASE = {"objective": "grpo", "rl": Rl(), "rewards": [Reward(type="answer")]}
TRAIN_BASES |= {key: GRPO_BASE for key in TRAIN_CHANGES if key.startswith(("rl.", "rewards."))}
TRAIN_BASES |= {key: {**GRPO_BASE, "rewards": [Reward(type="python", file="rewards/a.py", function="score")]}
                for key in ("rewards.file", "rewards.function")}
# (base, changed) hardware for each hardware field a backend maps into its launch.
HARDWARE_CHANGES = {
    "accelerator": (CPU, CUDA),
    "gpus": (CUDA, Hardware(accelerator="cuda", gpus=2)),
    "nodes": (ROCM, Hardware(accelerator="rocm", gpus=8, nodes=2)),
    "processes": (CPU, Hardware(processes=2)),
}
# Settings each capability-refused field is tried with: at least one must be refused, naming the field.
REFUSABLE = {
    "accelerator": [CPU, CUDA, ROCM],
    "gpus": [Hardware(accelerator=kind, gpus=n) for kind in ("cuda", "rocm") for n in (1, 2, 8)],
    "nodes": [Hardware(nodes=2), Hardware(accelerator="cuda", gpus=1, nodes=2), Hardware(accelerator="rocm", gpus=1, nodes=2)],
    "processes": [Hardware(processes=2)],
}


def field_paths(model: type[BaseModel], prefix: str) -> list[str]:
    paths = []
    for name, field in model.model_fields.items():
        nested = [a for a in getattr(field.annotation, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)]
        paths += field_paths(nested[0], f"{prefix}{name}.") if nested else [f"{prefix}{name}"]
    return paths


FIELDS = field_paths(Train, "train.") + field_paths(Hardware, "hardware.")
MISSING = object()


def at(value, path: str):
    for key in path.split("."):
        value = value.get(key, MISSING) if isinstance(value, dict) else MISSING
    return value


@pytest.fixture(scope="module")
def plans(tiny_model, prepared) -> dict[str, dict]:
    manifest = read_json(prepared / "manifest.json")
    # Eight steps: within one torchtune epoch, and enough that a quarter of the run is more than one step.
    return {kind: make_plan(tiny_model, manifest, Train(backend=backend, global_batch_size=16, max_steps=8), hardware)
            for kind, backend, hardware in (("cpu", "trl_cpu", CPU), ("rocm", "primus", ROCM))}


def native(backend, tiny_model, prepared, plans, tmp_path, train: Train, hardware: Hardware) -> dict:
    plan = plans["rocm" if hardware.accelerator == "rocm" else "cpu"]
    job = TrainJob(tiny_model, prepared, plan, train, hardware, tmp_path / "out", tmp_path / "work", None)
    return backend.native(job)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_train_and_hardware_field_is_decided(name):
    undecided = sorted(set(FIELDS) - set(REGISTRY[name].fields))
    assert not undecided, f"backend {name} does not say where {undecided} land (its `fields`)"
    unknown = sorted(set(REGISTRY[name].fields) - set(FIELDS))
    assert not unknown, f"backend {name} maps fields the recipe does not have: {unknown}"


@pytest.mark.parametrize("name", list(REGISTRY))
def test_each_mapping_is_where_the_field_lands(name, tiny_model, prepared, plans, tmp_path):
    backend = REGISTRY[name]
    base_hardware = ROCM if backend.capabilities.accelerators == ("rocm",) else CPU
    base_train = Train(backend=name, global_batch_size=16)
    plan_reads = stage_params(Recipe(model={"path": "m"}, data={"sources": [{"path": "d"}]}), "plan")
    for field, where in backend.fields.items():
        section, key = field.split(".", 1)
        if where == "registry":
            assert field == "train.backend"
        elif where == "plan":
            slice_ = plan_reads[section]
            assert key.split(".")[0] in slice_, f"{name}: {field} is said to reach it through the plan, which does not read it"
        elif where == "capabilities" and section == "train":
            changed = base_train.model_copy(update={**TRAIN_BASES.get(key, {}), **TRAIN_CHANGES[key]})
            reason = refusal(name, backend.capabilities, changed, base_hardware, packed=False)
            # A tracker's or an objective's settings are refused with it; a quantization's with the method qlora
            # where that is what the backend refuses.
            refused = ("train.report_to" if key == "mlflow_tracking_uri" else
                       "train.objective" if key.startswith(("preference.", "rl.", "rewards.")) or key == "objective" else
                       "train.method" if key.startswith("quantization.") and "qlora" not in backend.capabilities.methods
                       else field)
            assert reason and refused in reason, f"{name}: nothing refuses {field} ({reason})"
        elif where == "capabilities":
            reasons = [refusal(name, backend.capabilities, base_train, hardware, packed=False)
                       for hardware in REFUSABLE[key]]
            # The schema ties gpus and processes to the accelerator (GPUs need cuda/rocm, processes the CPU): a
            # backend may refuse them through the accelerator.
            names = (field, "hardware.accelerator") if key in ("gpus", "processes") else (field,)
            assert any(reason and any(n in reason for n in names) for reason in reasons), f"{name}: nothing refuses {field}"
        elif where.startswith("log:"):
            assert field in inspect.getsource(inspect.getmodule(type(backend))), f"{name}: no log line names {field}"
        else:
            if section == "train":
                before_hw = after_hw = base_hardware
                base = base_train.model_copy(update=TRAIN_BASES.get(key, {}))
                changed = base.model_copy(update=TRAIN_CHANGES[key])
            else:
                (before_hw, after_hw), base, changed = HARDWARE_CHANGES[key], base_train, base_train
            before = at(native(backend, tiny_model, prepared, plans, tmp_path, base, before_hw), where)
            after = at(native(backend, tiny_model, prepared, plans, tmp_path, changed, after_hw), where)
            assert before is not MISSING or after is not MISSING, f"{name}: {field} -> {where}, which it does not write"
            assert before != after, f"{name}: changing {field} does not change {where} ({before!r})"
