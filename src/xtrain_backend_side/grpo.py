"""TRL's GRPOTrainer on the prompts prepare rendered (xtrain_backend_side.rewards scores the completions).

Shared by the TRL backends and the unsloth runner in its own interpreter: standard library at load time, TRL when
called.
"""

from __future__ import annotations


def grpo_trainer():
    """GRPOTrainer generating from the prepared prompt text, which the recipe's chat template already rendered with
    its generation prompt (and the BOS token where the template writes one): tokenized as it is, with no special
    tokens added a second time."""
    from trl import GRPOTrainer

    class XtrainGRPOTrainer(GRPOTrainer):
        def _tokenize_prompts(self, prompts: list):
            if not all(isinstance(prompt, str) for prompt in prompts):
                return super()._tokenize_prompts(prompts)
            return self.processing_class(text=prompts, add_special_tokens=False)["input_ids"], None, {}

    return XtrainGRPOTrainer
