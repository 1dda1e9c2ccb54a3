"""Turning rows of any supported format into one chat form, and deciding which chats can be trained on.

The chat form is `{"messages": [{"role", "content"}, ...], "tools": str | None}` with roles system, user,
assistant, tool, or one `text` turn for a plain document (trained on every token, no chat template).
A row the format cannot read (missing column, wrong type, unknown role) is an error naming the row and
the field; a readable row that cannot be trained on (empty turn, wrong role order, no assistant turn)
is dropped with its reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..recipe import SOURCE_COLUMNS, DataSource

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
# Which turn may follow which; a chat starts with user (after an optional system turn).
NEXT_ROLES = {"user": {"assistant"}, "assistant": {"user", "tool"}, "tool": {"tool", "assistant"}}
# The column whose presence in the first row tells the format, tried in this order.
DETECTED_BY = (("messages", "messages"), ("conversations", "sharegpt"), ("instruction", "alpaca"),
               ("prompt", "prompt_completion"), ("text", "text"))


class RowError(ValueError):
    """A row that does not fit its format: `field` names the column (or turn key) at fault."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"field `{field}`: {problem}")


def detect_format(row: dict[str, Any]) -> str | None:
    return next((fmt for column, fmt in DETECTED_BY if column in row), None)


class Normaliser:
    """Reads rows of one source (its format, column names and role names) into chats."""

    def __init__(self, source: DataSource, fmt: str):
        self.fmt = fmt
        self.col = {name: source.columns.get(name, name) for name in SOURCE_COLUMNS[fmt]}
        self.roles = {**DEFAULT_ROLES.get(fmt, DEFAULT_ROLES["messages"]), **source.roles}
        self.read: Callable[[dict[str, Any]], Chat] = getattr(self, f"read_{fmt}")

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

    def turns(self, turns: list, field: str, role_key: str, content_key: str) -> list[dict[str, str]]:
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
            if not isinstance(content, str):
                raise RowError(f"{where}.{content_key}", f"must be a string, got {type(content).__name__}")
            out.append({"role": self.roles[name], "content": content})
        return out

    def tools(self, row: dict[str, Any]) -> str | None:
        tools = self.column(row, "tools", (str, list), required=False)
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
    if any(not t["content"].strip() for t in turns):
        return "empty turn"
    roles = [t["role"] for t in turns]
    if roles[0] != "user" or any(b not in NEXT_ROLES.get(a, ()) for a, b in zip(roles, roles[1:])):
        return "wrong role order"
    return None
