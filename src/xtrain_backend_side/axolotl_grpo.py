"""What an Axolotl GRPO config (`rl: grpo`) names by dotted path, importable in Axolotl's own process (the axolotl
backend puts this package on its PYTHONPATH):

- `Trainer` (the config's `trainer_cls`): Axolotl's GRPO trainer tokenizing the prepared prompt text as it is
  (`grpo.grpo_trainer`), as every other lane does;
- `reward_<i>` (`trl.reward_funcs`): the recipe's i-th reward of train.rewards, guarded as on every lane
  (`rewards.terms`), built from the JSON file the environment variable REWARDS_JOB names: `{"rewards": [...],
  "project": folder}`, the user's reward files read from the project's rewards/ folder only.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from . import rewards
from .grpo import grpo_trainer

REWARDS_JOB = "XTRAIN_GRPO_REWARDS"
REWARD_PREFIX = "reward_"


@functools.cache
def trainer_class():
    from axolotl.core.trainers.grpo.trainer import AxolotlGRPOTrainer

    return grpo_trainer(AxolotlGRPOTrainer)


@functools.cache
def terms() -> list[rewards.Term]:
    if REWARDS_JOB not in os.environ:
        raise RuntimeError(f"{REWARDS_JOB} is not set: the axolotl backend names the rewards' job file there")
    job = json.loads(Path(os.environ[REWARDS_JOB]).read_text())
    return rewards.terms(job["rewards"], Path(job["project"]))


def __getattr__(name: str):
    """`Trainer` and `reward_<i>`, made when Axolotl imports them (so that importing this module needs neither
    Axolotl nor the job file)."""
    if name == "Trainer":
        return trainer_class()
    if name.startswith(REWARD_PREFIX) and name[len(REWARD_PREFIX):].isdigit():
        return terms()[int(name[len(REWARD_PREFIX):])]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
