"""`unsloth`: Unsloth's FastLanguageModel (+ its LoRA) trained by TRL's SFTTrainer, in the lane's own environment.

The lane writes a JSON job (model, prepared train split, LoRA settings, and the `SFTConfig` arguments it shares
with trl_cpu, so both lanes train with the same settings on the same tokens) and launches
`unsloth_runner.py` with the interpreter of envs/unsloth.yaml; the runner leaves the adapter (or full model) and
tokenizer in `job.out` and its log history in a result file.
"""

from __future__ import annotations

from pathlib import Path

from ..artifacts import read_json, write_json
from ..envs import lane_python
from ..errors import XtrainError
from ..launch import run_command
from ..recipe import Hardware, Train
from . import TrainJob, TrainResult, require_one_cpu_process
from .trl import cpu_placement, sft_arguments

RUNNER = Path(__file__).with_name("unsloth_runner.py")


class Unsloth:
    name = "unsloth"

    def check(self, train: Train, hardware: Hardware) -> None:
        require_one_cpu_process(
            self.name, hardware, "yet (its environment, envs/unsloth.yaml,"
            " is built and tested with the CPU torch only)"
        )
        if train.method == "lora" and train.lora.target_modules == ["all-linear"]:
            raise XtrainError(
                "train.backend unsloth: train.lora.target_modules ['all-linear'] is not understood by Unsloth's "
                "get_peft_model; list the module names (e.g. [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                "down_proj])"
            )

    def run(self, job: TrainJob) -> TrainResult:
        import pyarrow.parquet as pq

        train, plan = job.train, job.plan
        train_parquet = job.prepared_dir / "train.parquet"
        columns = pq.read_schema(train_parquet).names
        # Prepare packs with TRL's packer: `seq_lengths` marks the sequences inside each row.
        packed = "seq_lengths" in columns
        job.work_dir.mkdir(parents=True, exist_ok=True)
        description, result = job.work_dir / "unsloth_job.json", job.work_dir / "unsloth_result.json"
        result.unlink(missing_ok=True)
        write_json(description, {
            "model_dir": str(job.model_dir.resolve()),
            "train_parquet": str(train_parquet.resolve()),
            "columns": ["input_ids", "assistant_masks"] + (["seq_lengths"] if packed else []),
            "seq_len": plan["data"]["seq_len"],
            "method": train.method,
            "lora": train.lora.peft_kwargs() if train.method == "lora" else None,
            "gradient_checkpointing": plan["gradient_checkpointing"],
            "seed": train.seed,
            "trust_remote_code": job.trust_remote_code,
            "sft": sft_arguments(job, cpu_placement(plan), packed) | {"output_dir": str(job.work_dir.resolve())},
            "checkpoint_seconds": train.checkpoint_minutes * 60,
            "resume_from": str(Path(job.resume_from).resolve()) if job.resume_from else None,
            "out": str(job.out.resolve()),
            "result": str(result.resolve()),
        })
        # -I: the runner's own folder (which holds this module, named like the package) stays off sys.path.
        python = lane_python(self.name, "unsloth")
        run_command([python, "-I", str(RUNNER), str(description)], env={"HF_HUB_OFFLINE": "1"})
        if not result.is_file():
            raise XtrainError(f"the unsloth runner exited without writing {result}; see the log above")
        outcome = read_json(result)
        return TrainResult(outcome["log_history"], outcome["tokens_seen"], outcome["train_seconds"])
