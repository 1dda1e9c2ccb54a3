"""`unsloth`: Unsloth's FastLanguageModel (+ its LoRA) trained by TRL's SFTTrainer, or its DPO, KTO, ORPO or GRPO
trainer (GRPO: TRL's GRPOTrainer, generating with transformers' `generate`, which Unsloth patches on a GPU and
leaves as it is on the CPU), in the backend's own environment.

The backend writes a JSON job (model, prepared train split, LoRA settings, the objective and the TRL config arguments
it shares with trl_cpu, so both backends train with the same settings on the same tokens) and launches
`xtrain_backend_side.unsloth_runner` with the interpreter of envs/unsloth.yaml; the runner leaves the adapter (or full model) and
tokenizer in `job.out` and its log history in a result file.
"""

from __future__ import annotations

from pathlib import Path

from xtrain_backend_side import BACKEND_SIDE_PATH
from xtrain_backend_side.prepared import split_file, train_split_is_packed

from ...artifacts import read_json, write_json
from ...errors import XtrainError
from ...project.envs import backend_python
from ...recipe import Hardware, Train
from ...stage import run_command
from .. import tracking
from .capabilities import CAPABILITIES
from .contract import TrainJob, TrainResult
from .distributed import found_device
from .trl import TRL_FIELDS, Placement, cpu_placement, trained_columns, trainer_arguments
from .trl_grpo import prompt_columns, reward_specs
from .validation import device_probe, validated

RUNNER = "xtrain_backend_side.unsloth_runner"


class Unsloth:
    name = "unsloth"
    capabilities = CAPABILITIES[name]
    # The runner hands the shared TRL config arguments to TRL, the model and LoRA settings to Unsloth's loader, and
    # GRPO's rewards to xtrain_backend_side.rewards in its interpreter.
    fields = {**{field: "job.rewards" if where == "rewards" else
                 where.replace("peft.", "job.lora.").replace("config.", "job.trainer.")
                 for field, where in TRL_FIELDS.items()},
              "train.objective": "job.objective",
              "train.method": "job.method",
              "train.checkpoint_minutes": "job.checkpoint_seconds",
              # Unsloth's 4-bit loader quantizes to nf4 with double quantization, its own choice (capabilities).
              "train.quantization.bits": "job.load_in_4bit",
              **{field: "capabilities" for field in ("train.lora.use_dora", "train.quantization.quant_type",
                                                     "train.quantization.double_quant")},
              "hardware.accelerator": "job.trainer.use_cpu",
              **{field: "capabilities" for field in ("hardware.gpus", "hardware.nodes", "hardware.processes")}}

    def check(self, train: Train, hardware: Hardware) -> None:
        if train.adapters and train.lora.target_modules == ["all-linear"]:
            raise XtrainError(
                "train.backend unsloth: train.lora.target_modules ['all-linear'] is not understood by Unsloth's "
                "get_peft_model; list the module names (e.g. [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                "down_proj])"
            )

    def native(self, job: TrainJob) -> dict:
        """The runner's job description (model, prepared rows, LoRA, objective, the shared TRL config arguments) and
        launch."""
        train, plan, accelerator = job.train, job.plan, job.hardware.accelerator
        packed = train_split_is_packed(job.prepared_dir)
        # On the GPU the plan's autocast dtype, and a LoRA base held in the plan's 16-bit weights dtype (as trl_local).
        where = cpu_placement(plan) if accelerator == "cpu" else Placement(accelerator, plan.precision)
        description, result = job.work_dir / "unsloth_job.json", job.work_dir / "unsloth_result.json"
        return {
            "job": {
                "model_dir": str(job.model_dir.resolve()),
                "train_parquet": str(split_file(job.prepared_dir).resolve()),
                "columns": (prompt_columns(job.prepared_dir) if train.objective == "grpo"
                            else trained_columns(train.objective, packed)),
                "seq_len": plan.data.seq_len,
                "method": train.method,
                "load_in_4bit": train.method == "qlora",
                "weights_dtype": plan.weights_dtype if accelerator != "cpu" else "fp32",
                "lora": train.lora.peft_kwargs() if train.adapters else None,
                "gradient_checkpointing": plan.gradient_checkpointing,
                "seed": train.seed,
                "trust_remote_code": job.trust_remote_code,
                "objective": train.objective,
                # GRPO: the rewards the runner builds (xtrain_backend_side.rewards.terms), user files read from the
                # project (the train job's working folder, as trl_cpu reads them).
                **({"rewards": reward_specs(train), "project": str(Path.cwd().resolve())}
                   if train.objective == "grpo" else {}),
                "trainer": trainer_arguments(job, where, packed)
                | {"output_dir": str(job.work_dir.resolve())},
                "checkpoint_seconds": train.checkpoint_minutes * 60,
                "resume_from": str(Path(job.resume_from).resolve()) if job.resume_from else None,
                "out": str(job.out.resolve()),
                "result": str(result.resolve()),
            },
            "job_file": description,
            "argv": [backend_python(self.name, "unsloth", must_exist=False, accelerator=accelerator), "-m", RUNNER,
                     str(description)],
            "env": {"HF_HUB_OFFLINE": "1", "PYTHONPATH": BACKEND_SIDE_PATH, **tracking.environment(job)},
        }

    def validate(self, job: TrainJob, native: dict, scratch: Path) -> dict:
        """The shared TRL arguments through the runner's translation into this environment's TRL config."""
        description = native["job"]
        request = {"framework": "unsloth", "objective": description["objective"],
                   "arguments": description["trainer"], "peft": description["lora"], **device_probe(job.hardware)}
        return {"validator": f"the unsloth runner's {job.train.objective.upper()}Config and peft's LoraConfig",
                "read_back": validated(backend_python(self.name, "unsloth"), [request], scratch)[0]}

    def run(self, job: TrainJob) -> TrainResult:
        found_device(job.hardware)
        tracking.require_packages(job.train, backend_python(self.name, "unsloth", accelerator=job.hardware.accelerator),
                                  "envs/unsloth.yaml")
        launch = self.native(job)
        job.work_dir.mkdir(parents=True, exist_ok=True)
        result = Path(launch["job"]["result"])
        result.unlink(missing_ok=True)
        write_json(launch["job_file"], launch["job"])
        run_command(launch["argv"], env=launch["env"])
        if not result.is_file():
            raise XtrainError(f"the unsloth runner exited without writing {result}; see the log above")
        outcome = read_json(result)
        return TrainResult(outcome["log_history"], outcome["tokens_seen"], outcome["train_seconds"])
