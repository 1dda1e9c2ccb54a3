"""Chats made ready for the chat template, per the recipe's data.* policies: `{{name}}` placeholders filled
(data.sources[].replace), assistant reasoning kept, dropped or inlined (data.reasoning), and tool calls left to the
template or written as text (data.tool_calls). Shared by chats (sft) and preference examples (dpo, orpo, kto)."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from ..errors import XtrainError
from ..recipe import Data
from .formats import Chat
from .templates import ChatTemplate

PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
FILLED_KEYS = ("content", "reasoning_content", "tool_calls")  # where a message's placeholders are filled
# How templates read an assistant turn's reasoning: Qwen3, GLM-4.5 and others `reasoning_content`, GPT-OSS `thinking`.
REASONING_KEYS = {"reasoning_content": re.compile(r"reasoning_content"),
                  "thinking": re.compile(r"message(\.|\[['\"])thinking\b")}


def fill_placeholders(chat: Chat, values: dict[str, str], unfilled: Counter) -> Chat:
    """`{{name}}` placeholders filled from the source's `replace` map, in each message's text, reasoning and tool-call
    arguments; any left are counted in `unfilled` (an error when the source has a map: the user meant to fill them
    all)."""
    def fill(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: fill(item) for key, item in value.items()}
        if isinstance(value, list):
            return [fill(item) for item in value]
        if not isinstance(value, str):
            return value
        filled = PLACEHOLDER.sub(lambda m: values.get(m[1], m[0]), value) if values else value
        for name in PLACEHOLDER.findall(filled):
            if values:
                raise XtrainError(f"placeholder {{{{{name}}}}} has no value in data.sources[].replace "
                                  f"({', '.join(sorted(values))}); add `{name}` to it")
            unfilled[name] += 1
        return filled

    messages = [{**m, **{key: fill(m[key]) for key in FILLED_KEYS if key in m}} for m in chat["messages"]]
    return {**chat, "messages": messages}


def apply_reasoning(chat: Chat, policy: str, template: ChatTemplate) -> Chat:
    """Assistant reasoning per data.reasoning: rendered by the template (`keep`, under the key it reads), removed,
    or written inline."""
    if not any("reasoning_content" in m for m in chat["messages"]):
        return chat
    key = next((key for key, pattern in REASONING_KEYS.items() if pattern.search(template.stock)), None)
    if policy == "keep" and key is None:
        raise XtrainError(
            f"{template.label} does not render assistant reasoning (reasoning/thinking parts, `reasoning_content`), "
            "so it would be dropped: set data.reasoning: drop (train without it) or inline (write it before the "
            "answer as <think>...</think>), or use a template that renders it (data.chat_template: qwen3, glm4moe "
            "or gptoss)"
        )
    messages = []
    for message in chat["messages"]:
        message = dict(message)
        reasoning = message.pop("reasoning_content", None)
        if reasoning and policy == "keep":
            message[key] = reasoning
        elif reasoning and policy == "inline":
            message["content"] = f"<think>\n{reasoning}\n</think>\n\n{message['content']}"
        messages.append(message)
    return {**chat, "messages": messages}


def apply_tool_calls(chat: Chat, policy: str, template: ChatTemplate) -> Chat:
    """Tool calls and the tool list per data.tool_calls: rendered by the template's own tool support (`template`,
    refused when it has none), or written as text (`inline`): each call as <tool_call>JSON</tool_call> after the
    assistant's text, the tool list in the system turn."""
    calls = any(m.get("tool_calls") for m in chat["messages"])
    if not calls and chat["tools"] is None:
        return chat
    if policy == "template":
        missing = [what for what, present, key in (("tool calls", calls, "tool_calls"),
                                                    ("a tool list", chat["tools"] is not None, "tools"))
                   if present and key not in template.stock]
        if missing:
            raise XtrainError(
                f"{template.label} does not render {' or '.join(missing)} (assistant `tool_calls`, sharegpt "
                "`function_call` turns, a `tools` column), so they would be lost from the text trained on: use a "
                "template with tool support (data.chat_template: qwen2_5, qwen3 or llama3_1), or set data.tool_calls: "
                "inline (each call written as <tool_call>JSON</tool_call> in the assistant's turn, the tool list in "
                "the system turn)"
            )
        return chat
    messages = [dict(m) for m in chat["messages"]]
    for message in messages:
        written = [json.dumps(call["function"], ensure_ascii=False) for call in message.pop("tool_calls", [])]
        if written:
            text = "\n".join(f"<tool_call>\n{call}\n</tool_call>" for call in written)
            message["content"] = f"{message['content']}\n{text}" if message["content"] else text
    if chat["tools"] is not None:
        note = f"You can call these tools:\n{chat['tools']}"
        if messages[0]["role"] == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{note}"
        else:
            messages.insert(0, {"role": "system", "content": note})
    return {"messages": messages, "tools": None}


def apply_policies(chat: Chat, data: Data, template: ChatTemplate) -> Chat:
    """A chat's reasoning (data.reasoning), then its tool calls (data.tool_calls), made ready for `template`."""
    return apply_tool_calls(apply_reasoning(chat, data.reasoning, template), data.tool_calls, template)
