"""TRL's GRPOTrainer on the prompts prepare rendered (xtrain_backend_side.rewards scores the completions).

Shared by the TRL backends, the unsloth runner and Axolotl's GRPO (`axolotl_grpo`) in their own interpreters: standard
library at load time, TRL when called.
"""

from __future__ import annotations


def grpo_trainer(base=None):
    """`base` (TRL's GRPOTrainer, or a lane's subclass of it such as Axolotl's) generating from the prepared prompt
    text, which the recipe's chat template already rendered with its generation prompt (and the BOS token where the
    template writes one): tokenized as it is, with no special tokens added a second time."""
    if base is None:
        from trl import GRPOTrainer as base

    class XtrainGRPOTrainer(base):
        def _tokenize_prompts(self, prompts: list):
            if not all(isinstance(prompt, str) for prompt in prompts):
                return super()._tokenize_prompts(prompts)
            return self.processing_class(text=prompts, add_special_tokens=False)["input_ids"], None, {}

    return XtrainGRPOTrainer
