"""GRPO rewards (train.rewards): the built-in checks, the user's own functions in the project's rewards/ folder, and
the guard every reward runs under.

A reward is called as TRL calls one, `(prompts, completions, completion_ids, **columns) -> list[float]`, where
`columns` are the prompt rows' other columns (`answer`, `tools`, `row_hash`, ...), one value per completion. Each
term of the recipe becomes one `Term`, named for logs and metrics (`answer`, `format`, `rewards/x.py:score`) and
weighted by TRL. A reward that raises, returns the wrong count or NaN stops the job with a `RewardError` naming the
reward and the row (its `row_hash` and the start of its prompt).

This module runs in every lane's interpreter (axolotl's and unsloth's too): standard library only.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from fractions import Fraction
from pathlib import Path
from typing import Any

REWARDS_FOLDER = "rewards"  # recipe.REWARDS_FOLDER: user reward files live here, inside the project
ROW_ID = "row_hash"  # the prepared column that names a row
# The row column each built-in reward reads unless the recipe names another (train.rewards[].column).
DEFAULT_COLUMNS = {"answer": "answer", "tool_call": "tools"}


class RewardError(RuntimeError):
    """A reward failed on a row: the job stops, naming the reward and the row."""


# --- reading answers -------------------------------------------------------------------------------------------

NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
GSM8K_ANSWER = re.compile(r"####\s*(.+)")


def text_of(completion: Any) -> str:
    """A completion's text: TRL passes a string (text prompts) or a list of messages (conversational prompts)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(message.get("content") or "") for message in completion if isinstance(message, dict))
    raise TypeError(f"a completion is text or a list of messages, got {type(completion).__name__}")


def boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (braces inside it balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None  # unclosed: no answer


def marked_answer(text: str) -> str | None:
    """The answer a text marks: after GSM8K's `####`, or inside the last `\\boxed{}`; None when unmarked."""
    if match := GSM8K_ANSWER.search(text):
        return match[1].strip().splitlines()[0].strip() if match[1].strip() else ""
    return boxed(text)


def final_answer(text: str) -> str | None:
    """The final answer a completion gives: the marked one, else its last number, else its whole text."""
    marked = marked_answer(text)
    if marked is not None:
        return marked or None
    numbers = NUMBER.findall(text)
    return numbers[-1] if numbers else (text.strip() or None)


def as_number(text: str) -> Fraction | None:
    """`text` as an exact number (1,000 / $5 / 2.50 / 3/4 / 50%), or None when it is not one."""
    cleaned = text.strip().rstrip(".").replace(",", "").replace("$", "").replace(" ", "")
    cleaned = cleaned.removeprefix("\\(").removesuffix("\\)")
    if cleaned.endswith("%"):
        cleaned = cleaned[:-1]
    frac = re.fullmatch(r"\\d?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}", cleaned)
    if frac:
        cleaned = f"{frac[1]}/{frac[2]}"
    try:
        if "/" in cleaned:
            numerator, denominator = cleaned.split("/", 1)
            return Fraction(numerator) / Fraction(denominator)
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(completion: str, reference: Any) -> bool:
    """Whether the completion's final answer equals the reference's (a row's answer: a number, or a text holding a
    final answer as GSM8K's solutions do); numbers compare as numbers (72 = 72.0 = 72.00 = $72), other answers as
    text without case or surrounding space."""
    given = final_answer(completion)
    if given is None:
        return False
    if isinstance(reference, bool) or reference is None:
        raise TypeError(f"the reference answer is {reference!r}, not a number or text")
    if isinstance(reference, int | float):
        expected_text = repr(reference)
    else:
        expected_text = marked_answer(str(reference)) or str(reference)  # GSM8K's solution, or the answer itself
    given_number, expected_number = as_number(given), as_number(expected_text)
    if given_number is not None and expected_number is not None:
        return given_number == expected_number
    return given.strip().lower() == expected_text.strip().lower()


# --- tool calls ------------------------------------------------------------------------------------------------

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def tool_names(tools: Any) -> set[str]:
    """The names of a row's tools: OpenAI's `{"type": "function", "function": {"name"}}` or `{"name"}` entries,
    as a list or its JSON text."""
    if isinstance(tools, str):
        tools = json.loads(tools) if tools.strip() else []
    if tools is None:
        return set()
    if not isinstance(tools, list):
        raise TypeError(f"a row's tools are a list of tool schemas, got {type(tools).__name__}")
    names = set()
    for tool in tools:
        schema = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(schema, dict) or not isinstance(schema.get("name"), str):
            raise TypeError(f"a tool schema names its function (`name`), got {tool!r}")
        names.add(schema["name"])
    return names


def tool_call_ok(completion: str, tools: Any) -> bool:
    """Whether the completion calls a tool of the row's list: a `<tool_call>` JSON (or the whole completion as
    JSON) that parses, with a `name` of a listed tool and object `arguments` (or JSON text of one)."""
    names = tool_names(tools)
    found = TOOL_CALL.findall(completion) or [completion.strip()]
    for candidate in found:
        try:
            call = json.loads(candidate)
        except json.JSONDecodeError:
            return False
        if not isinstance(call, dict) or call.get("name") not in names:
            return False
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return False
        if not isinstance(arguments, dict):
            return False
    return True


# --- the terms -------------------------------------------------------------------------------------------------

def score_answer(column: str) -> Callable[..., list[float]]:
    def answer(completions, **row) -> list[float]:
        return [float(answers_match(text_of(c), reference)) for c, reference in zip(completions, row[column], strict=True)]

    return answer


def score_format(pattern: str) -> Callable[..., list[float]]:
    compiled = re.compile(pattern, re.DOTALL)

    def format(completions, **row) -> list[float]:  # noqa: A001 (the reward's name)
        return [float(compiled.search(text_of(c)) is not None) for c in completions]

    return format


def score_length(max_tokens: int) -> Callable[..., list[float]]:
    def length(completions, completion_ids, **row) -> list[float]:
        return [-min(1.0, max(0, len(ids) - max_tokens) / max_tokens) for ids in completion_ids]

    return length


def score_tool_call(column: str) -> Callable[..., list[float]]:
    def tool_call(completions, **row) -> list[float]:
        return [float(tool_call_ok(text_of(c), tools)) for c, tools in zip(completions, row[column], strict=True)]

    return tool_call


def user_function(project: Path, file: str, function: str) -> Callable[..., list[float]]:
    """`function` of the project's reward file `file` (confined to `<project>/rewards/`, links resolved)."""
    folder = (project / REWARDS_FOLDER).resolve()
    path = (project / file).resolve()
    if not path.is_relative_to(folder) or path.suffix != ".py":
        raise RewardError(f"train.rewards: {file} resolves to {path}, outside {folder}: reward code lives in the "
                          f"project's {REWARDS_FOLDER}/ folder")
    if not path.is_file():
        raise RewardError(f"train.rewards: {file} does not exist; create it or fix the path")
    name = "xtrain_reward_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's module failed to import: say which file
        raise RewardError(f"train.rewards: importing {file} failed: {type(exc).__name__}: {exc}") from exc
    found = getattr(module, function, None)
    if not callable(found):
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise RewardError(f"train.rewards: {file} defines no function {function!r} (it defines {defined})")
    return found


def reward_files(rewards: Iterable[dict[str, Any]]) -> list[str]:
    """The project's reward files train.rewards runs (as dumped: dicts), each once, in order."""
    return list(dict.fromkeys(reward["file"] for reward in rewards if reward["type"] == "python"))


def file_hashes(project: Path, rewards: Iterable[dict[str, Any]]) -> dict[str, str]:
    """sha256 of each reward file train.rewards runs: the train rule's params hold them, so an edit to one reruns
    training (and nothing before it)."""
    return {file: hashlib.sha256((project / file).read_bytes()).hexdigest() for file in reward_files(rewards)}


class Term:
    """One reward of the recipe, guarded: a raise, a wrong count or a NaN names the reward and the row."""

    def __init__(self, name: str, score: Callable[..., list[float]]):
        self.name, self.score = name, score
        self.__name__ = name  # TRL names the reward's metrics (rewards/<name>/mean) by it

    def __call__(self, prompts=None, completions=None, completion_ids=None, **row) -> list[float]:
        columns = {k: v for k, v in row.items() if isinstance(v, list) and len(v) == len(completions)}
        extra = {k: v for k, v in row.items() if k not in columns}  # TRL's trainer_state, log_metric, ...
        try:
            rewards = list(self.score(prompts=prompts, completions=completions, completion_ids=completion_ids,
                                      **columns, **extra))
        except Exception as exc:  # noqa: BLE001 (re-raised with the row that caused it)
            index = self.failing_row(prompts, completions, completion_ids, columns, extra)
            raise RewardError(f"reward {self.name} raised {type(exc).__name__}: {exc} "
                              f"({self.where(index, prompts, columns)})") from exc
        if len(rewards) != len(completions):
            raise RewardError(f"reward {self.name} returned {len(rewards)} values for {len(completions)} completions: "
                              "return one float per completion")
        for index, value in enumerate(rewards):
            if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value) or math.isinf(value):
                raise RewardError(f"reward {self.name} returned {value!r}, not a finite number "
                                  f"({self.where(index, prompts, columns)})")
        return [float(value) for value in rewards]

    def failing_row(self, prompts, completions, completion_ids, columns, extra) -> int | None:
        """The first completion the reward raises on alone (the batch's row for the error), or None."""
        for i in range(len(completions)):
            try:
                self.score(prompts=prompts[i:i + 1] if prompts else prompts, completions=completions[i:i + 1],
                           completion_ids=completion_ids[i:i + 1] if completion_ids else completion_ids,
                           **{k: v[i:i + 1] for k, v in columns.items()}, **extra)
            except Exception:  # noqa: BLE001
                return i
        return None

    @staticmethod
    def where(index: int | None, prompts, columns) -> str:
        if index is None:
            return "on the batch, though on no single row"
        row = columns.get(ROW_ID, [None] * (index + 1))[index]
        prompt = str(prompts[index])[-80:] if prompts else ""
        return f"on row {row}, completion {index} of the batch, prompt ending {prompt!r}"


def terms(rewards: Iterable[dict[str, Any]], project: Path) -> list[Term]:
    """Each reward of train.rewards (as dumped: dicts) as a guarded callable, in order."""
    made = []
    for reward in rewards:
        kind, column = reward["type"], reward.get("column")
        if kind == "answer":
            made.append(Term("answer", score_answer(column or DEFAULT_COLUMNS[kind])))
        elif kind == "format":
            made.append(Term("format", score_format(reward["pattern"])))
        elif kind == "length":
            made.append(Term("length", score_length(reward["max_tokens"])))
        elif kind == "tool_call":
            made.append(Term("tool_call", score_tool_call(column or DEFAULT_COLUMNS[kind])))
        elif kind == "python":
            made.append(Term(f"{reward['file']}:{reward['function']}",
                             user_function(project, reward["file"], reward["function"])))
        else:
            raise ValueError(f"unknown reward type {kind!r}")
    return made


# The best score of each built-in reward: it passes on a completion that reaches it (evaluation's accuracy).
BEST_SCORES = {"answer": 1.0, "format": 1.0, "tool_call": 1.0, "length": 0.0}


def passed(kind: str, value: float) -> bool:
    """Whether a reward of type `kind` passed with this score: a built-in at its best score (1 for answer, format
    and tool_call; 0, no penalty, for length), the user's own function above 0 (its range is the user's to choose:
    write a pass/fail reward as 1 or 0)."""
    best = BEST_SCORES.get(kind)
    return value > 0 if best is None else value >= best


def reward_keys(names: list[str]) -> list[str]:
    """eval.json's name of each reward: its own (`answer`, `format`, `rewards/x.py:score`), numbered from its second
    use when the recipe lists one twice (`format#2`)."""
    seen: Counter = Counter()
    keys = []
    for name in names:
        seen[name] += 1
        keys.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return keys


def weights(rewards: Iterable[dict[str, Any]]) -> list[float]:
    return [float(reward.get("weight", 1.0)) for reward in rewards]


def needed_columns(rewards: Iterable[dict[str, Any]]) -> dict[str, str]:
    """Column -> the reward that reads it, for the built-in rewards that read a row's column."""
    return {reward.get("column") or DEFAULT_COLUMNS[reward["type"]]: reward["type"]
            for reward in rewards if reward["type"] in DEFAULT_COLUMNS}
