"""The evaluate stage (rule `evaluate`, then `gate`): base model against tuned one on the held-out split.

`run` writes eval.json and generations.json; `loss` scores the supervised tokens; `generations` answers the eval
prompts and scores the answers; `preferences` ranks held-out preference pairs; `harness` runs lm-evaluation-harness
tasks; `gate` checks the recipe's `eval.gate` bounds against eval.json.
"""

from .run import evaluate

__all__ = ["evaluate"]
