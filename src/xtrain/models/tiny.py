"""The embedded demo model: a byte-level BPE tokenizer and a random-init Llama, built offline.

Nothing can be downloaded, so the demo and the tests build their own model from text shipped in the
repo. The build is deterministic: the same corpus and settings give byte-identical files.
"""

from __future__ import annotations

from pathlib import Path

# ChatML with {% generation %} marks around what the assistant says, so that
# `return_assistant_tokens_mask` (and TRL's assistant_only_loss) can find the trained tokens.
# The end-of-turn token is inside the generation block: the model must learn to stop.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]


def build_tokenizer(corpus: Path, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = corpus.read_text(encoding="utf-8").splitlines()
    tokenizer.train_from_iterator(lines, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
    )
    wrapped.chat_template = CHATML_TEMPLATE
    return wrapped


def build_tiny_model(
    corpus: Path,
    out: Path,
    *,
    vocab_size: int = 1024,
    hidden_size: int = 96,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 1024,
    seed: int = 0,
) -> None:
    """Write tokenizer + random-init LlamaForCausalLM into the existing folder `out`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer(corpus, vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 8 // 3 // 16 * 16 + 16,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
