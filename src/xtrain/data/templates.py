"""Which chat template renders a recipe's chats, and how its assistant tokens are found for the loss mask.

A model family's stock template (Llama 3, Qwen2.5, Gemma 3, Phi-3, Mistral's `[INST]`, ...) rarely marks the
assistant's tokens. The stock text is what the model is trained on and what the checkpoint ships for
inference; the assistant spans come from the first of these that applies:

1. `generation blocks`: the template marks assistant output with `{% generation %}` itself;
2. `TRL training variant`: TRL ships a `{% generation %}`-marked copy of this exact stock template, checked here
   to render byte-identical text on single- and multi-turn chats, with and without a system turn. Where it does
   not (Qwen3's stock template drops earlier turns' reasoning blocks, which breaks prefix-preservation; TRL's
   variant keeps them), the chats are rendered as the variant does, said in a warning and in the manifest;
3. `incremental rendering`: the template is prefix-preserving (rendering a chat up to an assistant turn with
   the generation prompt, then with that turn, only appends), so each assistant span is the text the turn
   appends, up to its end-of-turn token.

A template none of these can mask is refused, naming it and what to do.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import XtrainError
from ..models.tiny import CHATML_TEMPLATE
from ..recipe import CHAT_TEMPLATE_FAMILIES as FAMILIES
from ..recipe import CHAT_TEMPLATES as TEMPLATE_NAMES

log = logging.getLogger(__name__)
GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")
# Conversations every template is checked on: the shapes a training set holds.
PROBES = (
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "And now?"},
     {"role": "assistant", "content": "Still here"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
     {"role": "user", "content": "Again"}, {"role": "assistant", "content": "Hello again"}],
)


@dataclass(frozen=True)
class ChatTemplate:
    stock: str  # what chats are rendered with, and what the checkpoint ships for inference
    masking: str | None  # a {% generation %}-marked template rendering the same text; None: incremental rendering
    method: str  # how assistant spans are found: "generation blocks", "TRL training variant", "incremental rendering"
    label: str  # how messages name the template


def trl_template(name: str) -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text()


def resolve(tokenizer, name: str, model_dir: Path, masked: bool = True) -> ChatTemplate:
    """The recipe's chat template (data.chat_template) and the way its assistant spans are found (`masked`:
    unless data.train_on_inputs, which trains on every token and needs no spans)."""
    if name == "tokenizer":
        stock = tokenizer.chat_template
        stock = stock.get("default") if isinstance(stock, dict) else stock
        if not stock:
            raise XtrainError(f"{model_dir}: the tokenizer has no chat template; name one in data.chat_template "
                              f"({', '.join(TEMPLATE_NAMES[1:])})")
        held_in = next((Path(model_dir, name) for name in ("chat_template.jinja", "tokenizer_config.json")
                        if Path(model_dir, name).is_file()), model_dir)
        label = f"{held_in}: the tokenizer's chat template"
    else:
        stock, label = (CHATML_TEMPLATE if name == "chatml" else trl_template(name)), f"data.chat_template {name!r}"
        label += "" if name == "chatml" else f" (TRL's chat_templates/{name}.jinja)"
    if GENERATION_BLOCK.search(stock):
        return ChatTemplate(stock, stock, "generation blocks", label)
    if not masked:
        return ChatTemplate(stock, stock, "every token (data.train_on_inputs)", label)
    variant = training_variant(tokenizer, stock)
    if variant is not None:
        differs = next((chat for chat in renderable(tokenizer, stock)
                        if render(tokenizer, stock, chat) != render(tokenizer, variant, chat)), None)
        if differs is None:
            return ChatTemplate(stock, variant, "TRL training variant", label)
        log.warning("%s: TRL's training variant of it renders some chats (e.g. %d turns) unlike the stock template "
                    "(it keeps what the stock one drops from earlier turns, so that rendering is prefix-preserving); "
                    "the chats are rendered as TRL's variant does, and the checkpoint ships the stock template",
                    label, len(differs))
        return ChatTemplate(stock, variant, "TRL training variant (its own rendering of multi-turn chats)", label)
    broken = prefix_broken(tokenizer, stock)
    if broken is None:
        return ChatTemplate(stock, None, "incremental rendering", label)
    raise XtrainError(
        f"{label} cannot be masked to train on the assistant's answers only: it has no {{% generation %}} block, TRL "
        f"has no training variant of it, and it is not prefix-preserving ({broken}). Use the stock template of the "
        f"model's family (data.chat_template: one of {', '.join(FAMILIES)}), add {{% generation %}} / "
        "{% endgeneration %} around the assistant's output in the template, or set data.train_on_inputs: true"
    )


def training_variant(tokenizer, stock: str) -> str | None:
    """TRL's {% generation %}-marked copy of `stock`, when it has one."""
    from trl.chat_template_utils import get_training_chat_template

    original = tokenizer.chat_template
    tokenizer.chat_template = stock
    try:
        variant = get_training_chat_template(tokenizer)
    except ValueError:  # TRL does not know this template
        return None
    finally:
        tokenizer.chat_template = original
    return variant


def prefix_broken(tokenizer, template: str) -> str | None:
    """Why `template` is not prefix-preserving on the probe chats; None when it is."""
    for chat in renderable(tokenizer, template):
        try:
            assistant_spans(tokenizer, template, chat, None)
        except XtrainError as exc:
            return str(exc)
    return None


def renderable(tokenizer, template: str) -> list[list[dict]]:
    """The probe chats the template renders (Mistral's refuses a system turn, say)."""
    from jinja2.exceptions import TemplateError

    chats = []
    for chat in PROBES:
        try:
            render(tokenizer, template, chat)
        except TemplateError:
            continue
        chats.append(chat)
    if not chats:
        raise XtrainError(f"the chat template renders none of the probe chats (user/assistant turns): {PROBES[0]}")
    return chats


def render(tokenizer, template: str, messages: list[dict], tools=None, add_generation_prompt: bool = False) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    (text,), _ = render_jinja_template(
        conversations=[messages], tools=tools, chat_template=template, add_generation_prompt=add_generation_prompt,
        **tokenizer.special_tokens_map,
    )
    return text


def assistant_spans(tokenizer, template: str, messages: list[dict], tools) -> tuple[str, list[tuple[int, int]]]:
    """The chat's text and, for each assistant turn, the characters it appends to the chat before it (with the
    generation prompt), trailing whitespace left out: its answer and end-of-turn token."""
    text = render(tokenizer, template, messages, tools)
    spans = []
    for turn, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(tokenizer, template, messages[:turn], tools, add_generation_prompt=True)
        upto = render(tokenizer, template, messages[: turn + 1], tools)
        if not upto.startswith(before) or not text.startswith(upto):
            raise XtrainError(f"rendering assistant turn {turn + 1} changes the text rendered before it")
        end = len(upto.rstrip())
        if end <= len(before):
            raise XtrainError(f"assistant turn {turn + 1} renders no text of its own")
        answer = str(message.get("content") or "").strip()[:32]
        if answer and not upto[len(before):].lstrip().startswith(answer):
            raise XtrainError(
                f"assistant turn {turn + 1} renders text before its answer that the generation prompt does not (its "
                "role header, when the template ignores add_generation_prompt), which would be trained as the answer"
            )
        spans.append((len(before), end))
    return text, spans
