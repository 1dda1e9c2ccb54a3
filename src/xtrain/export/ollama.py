"""An Ollama `Modelfile` for a GGUF file: the chat template as a Go template, and a stop for each end-of-turn token.

Ollama renders prompts with Go templates, not Jinja, so the template is chosen by family (ChatML, Llama 3) and
checked against the model's own Jinja template: both must render the same text for chats with and without a
system turn. A default system prompt the Jinja template adds on its own becomes the Modelfile's `SYSTEM`. A
template of another family, or one that renders differently, is refused with its name.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import XtrainError
from .gguf_file import adds_bos


@dataclass(frozen=True)
class Family:
    marker: str  # a string only this family's templates contain
    turn: str  # one message, as the Jinja template renders it
    prompt: str  # what opens the assistant's answer (add_generation_prompt)
    go: str  # the same in Ollama's Go template language


FAMILIES = {
    "ChatML": Family(
        "<|im_start|>", "<|im_start|>{role}\n{content}<|im_end|>\n", "<|im_start|>assistant\n",
        "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n",
    ),
    "Llama 3": Family(
        "<|start_header_id|>", "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}<|eot_id|>{{ end }}"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
}
PROBES = (
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "And now?"}],
)


def rendered(tokenizer, messages: list[dict]) -> str:
    """The Jinja template's prompt for `messages`, without the BOS token the runtime adds itself (only where the
    tokenizer adds one: a BOS that is also the family's turn marker is part of the turn)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return text.removeprefix(tokenizer.bos_token) if adds_bos(tokenizer) else text


def as_family(family: Family, messages: list[dict]) -> str:
    return "".join(family.turn.format(**message) for message in messages) + family.prompt


def default_system(tokenizer, family: Family) -> str | None:
    """The system prompt the template adds to a chat that has none (SmolLM2, Qwen2.5, Llama 3.1 do)."""
    chat = [{"role": "user", "content": "Hi"}]
    text, plain = rendered(tokenizer, chat), as_family(family, chat)
    if text == plain:
        return None
    before, after = family.turn.format(role="system", content="\0").split("\0")
    head = text.removesuffix(plain)
    if head != text and head.startswith(before) and head.endswith(after):
        return head[len(before):len(head) - len(after)]
    raise XtrainError("export.ollama: the chat template renders a chat without a system turn in a way the "
                      "Modelfile template cannot; remove export.ollama")


def modelfile(tokenizer, gguf_name: str, stops: list[str]) -> str:
    """The Modelfile text for the GGUF file `gguf_name` (beside it) and the tokenizer's chat template."""
    template = tokenizer.chat_template or ""
    family = next((name for name, f in FAMILIES.items() if f.marker in template), None)
    if family is None:
        raise XtrainError(f"export.ollama: the chat template is none of {', '.join(FAMILIES)}, the families with a "
                          "Go template here; remove export.ollama (the GGUF file embeds the template for llama.cpp)")
    spec = FAMILIES[family]
    for chat in PROBES:
        if rendered(tokenizer, chat) != as_family(spec, chat):
            raise XtrainError(f"export.ollama: the chat template renders {len(chat)}-message chats unlike the {family} "
                              "Go template; remove export.ollama")
    system = default_system(tokenizer, spec)
    lines = [f"FROM ./{gguf_name}", f'TEMPLATE """{spec.go}"""']
    lines += [f'SYSTEM """{system}"""'] if system else []
    lines += [f'PARAMETER stop "{stop}"' for stop in stops]
    return "\n".join(lines) + "\n"
