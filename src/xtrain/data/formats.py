"""Turning rows of any supported format into one chat form, and deciding which chats can be trained on.

The chat form is `{"messages": [{"role", "content"}, ...], "tools": str | None}` with roles system, user,
assistant, tool, or one `text` turn for a plain document (trained on every token, no chat template). A message
may also carry, as the chat templates read them: `tool_calls` (OpenAI's shape, arguments as an object) and
`reasoning_content` on assistant turns, `tool_call_id` and `name` on tool turns, and `train` (false: an
assistant turn given as context, not supervised). Content given as typed parts (OpenAI's `{"type": "text",
"text"}`, LLaMA-Factory's `{"type": "text", "value"}`, with `reasoning`/`thinking` and `tool_call` parts) is
read into these; a row with image, audio or video parts is dropped ("non-text content (image)").
A row the format cannot read (missing column, wrong type, unknown role) is an error naming the row and
the field; a readable row that cannot be trained on (empty turn, wrong role order, no assistant turn)
is dropped with its reason.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..errors import XtrainError
from ..recipe import SOURCE_COLUMNS, DataSource
from .sources import SourceRows

Chat = dict[str, Any]
TEXT_ROLE = "text"
# Role names each format knows without help; a source's `roles` adds to or overrides them.
DEFAULT_ROLES = {
    "messages": {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool"},
    "sharegpt": {
        "system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
        # Tool use as LLaMA-Factory writes it: the model's call is trained on, the tool's answer is context.
        "function_call": "assistant", "observation": "tool", "tool": "tool",
    },
}
# sharegpt turn names whose content is the assistant's tool call(s) as JSON text ({"name", "arguments"}, or a list
# of them), read into the message's tool calls so that the chat template renders them in its own format (unless
# the source maps the name itself in `roles`: then the text is trained as it is).
CALL_TURNS = ("function_call",)
# Which turn may follow which; a chat starts with user (after an optional system turn).
NEXT_ROLES = {"user": {"assistant"}, "assistant": {"user", "tool"}, "tool": {"tool", "assistant"}}
# The column whose presence in the first row tells the format, tried in this order.
DETECTED_BY = (("messages", "messages"), ("conversations", "sharegpt"), ("instruction", "alpaca"),
               ("prompt", "prompt_completion"), ("text", "text"))


# Typed content parts: which part types are text, reasoning, a tool call, or media (a row with media is dropped).
TEXT_PARTS, REASONING_PARTS, TOOL_CALL_PARTS = ("text", "input_text", "output_text"), ("reasoning", "thinking"), ("tool_call",)
MEDIA_PARTS = {"image": "image", "image_url": "image", "input_image": "image", "audio": "audio",
               "input_audio": "audio", "video": "video", "video_url": "video"}
# Columns that make a row something other than supervised chat data, and what that data is.
OTHER_KINDS = (
    (("chosen", "rejected"), "preference pairs (DPO/ORPO: `chosen` / `rejected`)", "train.objective: dpo or orpo"),
    (("chosen_messages", "rejected_messages"), "preference pairs (DPO/ORPO: `chosen_messages` / `rejected_messages`)",
     "train.objective: dpo or orpo"),
    (("label",), "unpaired preference rows (KTO: a boolean `label`)", "train.objective: kto"),
    (("kto_tag",), "unpaired preference rows (KTO: `kto_tag`)", "train.objective: kto"),
    (("images",), "multimodal rows (`images`)", "a vision-language model and recipe"),
    (("videos",), "multimodal rows (`videos`)", "a vision-language model and recipe"),
    (("audios",), "multimodal rows (`audios`)", "an audio model and recipe"),
)


def other_kind(row: dict[str, Any]) -> tuple[str, str] | None:
    """(what the data is, the setting it needs) when a row's columns make it other than SFT data."""
    for columns, kind, setting in OTHER_KINDS:
        if all(column in row for column in columns) and (columns != ("label",) or is_kto_label(row["label"])):
            return kind, setting
    return None


def is_kto_label(value: Any) -> bool:
    """A KTO row's desirability label: a boolean, or its text (CSV files hold "true"/"false")."""
    return isinstance(value, bool) or (isinstance(value, str) and value.strip().lower() in ("true", "false"))


class DropRow(Exception):
    """A readable row that cannot be trained on (non-text content); the message is the drop reason."""


class RowError(ValueError):
    """A row that does not fit its format: `field` names the column (or turn key) at fault."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"field `{field}`: {problem}")


def read_rows(found: SourceRows, read: Callable[[dict[str, Any]], Any], dropped: Counter):
    """(index, what `read` makes of the row) for each row of a source: a row that does not fit its format is an
    error naming the row and the field; a readable one that cannot be trained on is counted in `dropped`."""
    for index, row in enumerate(found.rows):
        try:
            yield index, read(row)
        except RowError as exc:
            raise XtrainError(f"{found.where(index)}: {exc}") from None
        except KeyError as exc:
            raise XtrainError(f"{found.where(index)}: field `{exc.args[0]}`: missing column; this row has "
                              f"{sorted(row)}") from None
        except DropRow as exc:
            dropped[str(exc)] += 1


def detect_format(row: dict[str, Any]) -> str | None:
    return next((fmt for column, fmt in DETECTED_BY if column in row), None)


def source_format(source: DataSource, found: SourceRows) -> str:
    """The row format of a source (detected from its first row unless set), once its rows are known to be
    supervised chat data rather than preference or multimodal data."""
    if kind := other_kind(found.rows[0]):
        raise XtrainError(
            f"{found.where(0)}: this source holds {kind[0]}, not supervised chat data: an SFT recipe would train on "
            f"part of each row and drop what makes it {kind[0].split(' (')[0]}. Set {kind[1]}, or remove the source "
            "from data.sources"
        )
    fmt = source.format if source.format != "auto" else detect_format(found.rows[0])
    if fmt is None:
        raise XtrainError(
            f"{found.where(0)}: cannot tell the format from the columns {sorted(found.rows[0])}; set "
            "data.sources[].format (messages, sharegpt, alpaca, prompt_completion, text) and map names in `columns`"
        )
    return fmt


class Normaliser:
    """Reads rows of one source (its format, column names and role names) into chats."""

    def __init__(self, source: DataSource, fmt: str):
        self.fmt = fmt
        self.col = {name: source.columns.get(name, name) for name in SOURCE_COLUMNS[fmt]}
        self.roles = {**DEFAULT_ROLES.get(fmt, DEFAULT_ROLES["messages"]), **source.roles}
        self.call_turns = {name for name in CALL_TURNS if fmt == "sharegpt" and name not in source.roles}
        self.read: Callable[[dict[str, Any]], Chat] = getattr(self, f"read_{fmt}")
        self.source_tools = source.tools

    def column(self, row: dict[str, Any], name: str, kind: type | tuple[type, ...] = str, required: bool = True):
        key = self.col[name]
        value = row.get(key)
        if value is None:
            if required:
                raise RowError(key, f"missing column; this row has {sorted(row)} (rename with data.sources[].columns)")
            return None
        if not isinstance(value, kind):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise RowError(key, f"must be a {names}, got {type(value).__name__}")
        return value

    def turns(self, turns: list, field: str, role_key: str, content_key: str) -> list[dict[str, Any]]:
        out = []
        for i, turn in enumerate(turns):
            where = f"{field}[{i}]"
            if not isinstance(turn, dict):
                raise RowError(where, f"a turn is an object with `{role_key}` and `{content_key}`")
            name, content = turn.get(role_key), turn.get(content_key)
            if name not in self.roles:
                raise RowError(
                    f"{where}.{role_key}",
                    f"unknown role {name!r}; known roles are {', '.join(sorted(self.roles))} "
                    "(map others with data.sources[].roles)",
                )
            message = {"role": self.roles[name]}
            if name in self.call_turns and isinstance(content, str):
                message |= {"content": "", "tool_calls": tool_calls_text(content, f"{where}.{content_key}")}
            elif isinstance(content, list):
                message |= content_parts(content, f"{where}.{content_key}")
            elif isinstance(content, str) or (content is None and turn.get("tool_calls")):
                message["content"] = content or ""
            else:
                raise RowError(f"{where}.{content_key}", "must be a string or a list of typed parts, got "
                               f"{type(content).__name__}")
            out.append(message | turn_extras(turn, where, message))
        return out

    def tools(self, row: dict[str, Any]) -> str | None:
        """The row's tool schemas as JSON text, else the source's (data.sources[].tools)."""
        tools = self.column(row, "tools", (str, list), required=False) or self.source_tools
        if isinstance(tools, list):
            return json.dumps(tools, ensure_ascii=False)
        return tools or None

    def read_messages(self, row: dict[str, Any]) -> Chat:
        turns = self.column(row, "messages", list)
        messages = self.turns(turns, self.col["messages"], self.col["role"], self.col["content"])
        return {"messages": messages, "tools": self.tools(row)}

    def read_sharegpt(self, row: dict[str, Any]) -> Chat:
        turns = self.column(row, "conversations", list)
        messages = self.turns(turns, self.col["conversations"], self.col["from"], self.col["value"])
        system = self.column(row, "system", required=False)
        if system:
            messages.insert(0, {"role": "system", "content": system})
        return {"messages": messages, "tools": self.tools(row)}

    def read_alpaca(self, row: dict[str, Any]) -> Chat:
        instruction, answer = self.column(row, "instruction"), self.column(row, "output")
        extra = self.column(row, "input", required=False)
        system = self.column(row, "system", required=False)
        messages = [{"role": "system", "content": system}] if system else []
        for i, pair in enumerate(self.column(row, "history", list, required=False) or []):
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
                raise RowError(f"{self.col['history']}[{i}]", "history is a list of [instruction, answer] pairs")
            messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
        prompt = f"{instruction}\n{extra}" if extra else instruction
        messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
        return {"messages": messages, "tools": None}

    def read_prompt_completion(self, row: dict[str, Any]) -> Chat:
        parts = []
        for name, role in (("prompt", "user"), ("completion", "assistant")):
            value = self.column(row, name, (str, list))
            # TRL's conversational prompt-completion rows hold message lists; plain ones hold strings.
            parts += self.turns(value, self.col[name], "role", "content") if isinstance(value, list) else [
                {"role": role, "content": value}
            ]
        return {"messages": parts, "tools": None}

    def read_text(self, row: dict[str, Any]) -> Chat:
        return {"messages": [{"role": TEXT_ROLE, "content": self.column(row, "text")}], "tools": None}


def drop_reason(chat: Chat) -> str | None:
    """Why a chat cannot be trained on, or None when it can."""
    messages = chat["messages"]
    if messages and messages[0]["role"] == TEXT_ROLE:
        return "empty text" if not messages[0]["content"].strip() else None
    turns = messages[1:] if messages and messages[0]["role"] == "system" else messages
    if not any(t["role"] == "assistant" for t in turns):
        return "no assistant turn"
    if any(not t["content"].strip() and not t.get("tool_calls") for t in turns):
        return "empty turn"
    if not any(t["role"] == "assistant" and t.get("train", True) for t in turns):
        return "no supervised assistant turn"
    roles = [t["role"] for t in turns]
    if roles[0] != "user" or any(b not in NEXT_ROLES.get(a, ()) for a, b in zip(roles, roles[1:])):
        return "wrong role order"
    return None


def content_parts(parts: list, where: str) -> dict[str, Any]:
    """A message's content given as typed parts: text joined in order, reasoning and tool-call parts kept apart."""
    text, reasoning, calls = [], [], []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        value = part.get("text", part.get("value")) if isinstance(part, dict) else None
        if kind in MEDIA_PARTS:
            raise DropRow(f"non-text content ({MEDIA_PARTS[kind]})")
        if kind in TEXT_PARTS and isinstance(value, str):
            text.append(value)
        elif kind in REASONING_PARTS and isinstance(value := part.get(kind, value), str):
            reasoning.append(value)
        elif kind in TOOL_CALL_PARTS and value is not None:
            calls.append(tool_call(value, f"{where}[{j}]"))
        else:
            raise RowError(f"{where}[{j}]", f"a content part is {{\"type\": text|reasoning|thinking|tool_call|image|audio|"
                           f"video, \"text\" or \"value\": ...}}, got {json.dumps(part, ensure_ascii=False)[:80]}")
    message: dict[str, Any] = {"content": "".join(text)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def tool_calls_text(text: str, where: str) -> list[dict[str, Any]]:
    """A `function_call` turn's calls: JSON text of one call or of a list of them."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise RowError(where, "a function_call turn holds JSON {\"name\": ..., \"arguments\": {...}} (or a list of "
                       "them); to train its text as it is, map the role in data.sources[].roles (function_call: "
                       "assistant)") from None
    calls = value if isinstance(value, list) else [value]
    return [tool_call(call, f"{where}[{k}]" if isinstance(value, list) else where) for k, call in enumerate(calls)]


def tool_call(value: Any, where: str) -> dict[str, Any]:
    """One call as chat templates read it: {"type": "function", "function": {"name", "arguments": {...}}}; from
    OpenAI's shape (arguments as a JSON string or object), or a bare {"name", "arguments"} (as JSON text too)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise RowError(where, "a tool call is JSON {\"name\": ..., \"arguments\": {...}}") from None
    function = value.get("function", value) if isinstance(value, dict) else None
    name, arguments = (function.get("name"), function.get("arguments", {})) if isinstance(function, dict) else (None, None)
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise RowError(f"{where}.arguments", "arguments are a JSON object (or its text)") from None
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        raise RowError(where, "a tool call has a `name` (text) and `arguments` (an object)")
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def turn_extras(turn: dict[str, Any], where: str, message: dict[str, Any]) -> dict[str, Any]:
    """What a turn says besides role and content: tool calls, reasoning, tool-call ids, and whether it is trained."""
    extras: dict[str, Any] = {}
    if turn.get("tool_calls"):
        calls = turn["tool_calls"]
        if not isinstance(calls, list):
            raise RowError(f"{where}.tool_calls", "a list of tool calls")
        extras["tool_calls"] = message.get("tool_calls", []) + [tool_call(c, f"{where}.tool_calls[{k}]")
                                                                for k, c in enumerate(calls)]
    for key in ("reasoning_content", "reasoning", "thinking"):
        if isinstance(turn.get(key), str) and turn[key]:
            extras["reasoning_content"] = turn[key]
    for key in ("tool_call_id", "name"):
        if isinstance(turn.get(key), str) and message["role"] == "tool":
            extras[key] = turn[key]
    if "loss_weight" in turn:  # LLaMA-Factory: 0 or 1 per turn
        weight = turn["loss_weight"]
        if weight not in (0, 1) or isinstance(weight, bool):
            raise RowError(f"{where}.loss_weight", f"{weight!r}: xtrain supervises a turn or not (0 or 1); a "
                           "weighted loss is not supported, so use 0 or 1")
        if message["role"] == "assistant" and weight == 0:
            extras["train"] = False
    if "train" in turn:  # Axolotl: true or false per turn
        if not isinstance(turn["train"], bool):
            raise RowError(f"{where}.train", f"true or false, got {turn['train']!r}")
        if message["role"] == "assistant" and not turn["train"]:
            extras["train"] = False
    return extras
