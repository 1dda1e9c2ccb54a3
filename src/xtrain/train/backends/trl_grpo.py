"""GRPO through TRL (train.objective grpo on trl_cpu and trl_local): train.rl -> `GRPOConfig`, train.rewards ->
the guarded reward functions of `xtrain_backend_side.rewards`, the prepared prompts -> `GRPOTrainer`.

Generation runs in the training processes with transformers' `generate` (KV cache on); vLLM is not used: it is
not in the lanes' environments, and on a CUDA node where it is installed it stays untested without a GPU here.
"""

from __future__ import annotations

from pathlib import Path

from xtrain_backend_side.rewards import terms, weights

from ...recipe import Reward, Rl

# Where each GRPO field lands in `native` (trl.TRL_FIELDS holds them).
GRPO_FIELDS = {
    "train.rl.generations": "config.num_generations",
    "train.rl.max_completion_length": "config.max_completion_length",
    "train.rl.temperature": "config.temperature",
    "train.rl.top_p": "config.top_p",
    "train.rl.kl_weight": "config.beta",
    "train.rl.clip_epsilon": "config.epsilon",
    "train.rl.loss_type": "config.loss_type",
    "train.rl.steps_per_generation": "config.steps_per_generation",
    **{f"train.rewards.{name}": "rewards" for name in Reward.model_fields if name != "weight"},
    "train.rewards.weight": "config.reward_weights",
}
# SFTConfig arguments GRPOConfig does not take: GRPO's sequences are the sampled completions after each prompt.
SFT_ONLY_ARGUMENTS = ("max_length", "packing", "padding_free", "train_sampling_strategy", "pad_to_multiple_of")
assert {f"train.rl.{name}" for name in Rl.model_fields} <= set(GRPO_FIELDS)


def sampling_and_loss(train) -> dict:
    """train.rl's sampling and loss as TRL's `GRPOConfig` names them (Axolotl's `trl:` section takes the same keys),
    with the rewards' weights; no vLLM."""
    rl = train.rl
    return {
        "num_generations": rl.generations,
        "max_completion_length": rl.max_completion_length,
        "temperature": rl.temperature,
        "top_p": rl.top_p,
        "beta": rl.kl_weight,
        "epsilon": rl.clip_epsilon,
        "loss_type": rl.loss_type,
        "reward_weights": weights(reward.model_dump() for reward in train.rewards),
        "use_vllm": False,
    }


def grpo_arguments(train, sft: dict) -> dict:
    """`GRPOConfig` keyword arguments: the SFT ones less those of supervised sequences, and train.rl's."""
    arguments = {key: value for key, value in sft.items() if key not in SFT_ONLY_ARGUMENTS}
    return arguments | sampling_and_loss(train) | {
        "steps_per_generation": train.rl.steps_per_generation,
        # The recipe's LoRA dropout is kept, as for the preference objectives; vLLM is not used (module docstring).
        "disable_dropout": False,
        # Rows are sampled by TRL's own sampler, each prompt repeated for its generations.
        "shuffle_dataset": True,
        # GRPOTrainer counts the prompt and completion tokens of each generation itself (state.num_input_tokens_seen,
        # which tokens_per_second reads); the Trainer's own count would look for input_ids its batches do not have.
        "include_num_input_tokens_seen": "no",
    }


def reward_specs(train) -> list[dict]:
    """Each reward's settings as `xtrain_backend_side.rewards.terms` reads them (the weights go to the config): what
    a lane in its own interpreter builds its guarded rewards from."""
    return [reward.model_dump(exclude_none=True, exclude={"weight"}) for reward in train.rewards]


def reward_functions(train, project: Path) -> list:
    """The recipe's rewards as the guarded callables GRPOTrainer calls (user files loaded from `project`)."""
    return terms(reward_specs(train), project)


def prompt_columns(prepared_dir: Path) -> list[str]:
    """The prepared prompt columns GRPOTrainer reads: the prompt text and every column the rewards may read (the
    prompt's tokens are TRL's to make from the text)."""
    import pyarrow.parquet as pq

    from xtrain_backend_side.prepared import PROMPT_IDS, split_file

    return [name for name in pq.read_schema(split_file(prepared_dir)).names if name != PROMPT_IDS]
