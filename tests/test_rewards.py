"""GRPO rewards (xtrain_backend_side.rewards) on real-looking completions: GSM8K solutions, boxed answers, malformed
ones, tool calls; the guard naming the reward and the row; user reward files confined to rewards/."""

from pathlib import Path

import pytest

from xtrain_backend_side.rewards import (
    RewardError, answers_match, final_answer, terms, tool_call_ok, user_function, weights,
)

# GSM8K's first train row: its solution is the row's `answer` column.
GSM8K_SOLUTION = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
                  "altogether in April and May.\n#### 72")


@pytest.mark.parametrize("completion, expected", [
    ("She sold 24 in May, so 48 + 24 = 72 clips in all.\n#### 72", True),
    ("In May: 48 / 2 = 24. Total: 48 + 24 = 72.", True),  # the last number
    ("The total is \\boxed{72}.", True),
    ("Total = 72.00 clips. #### 72.00", True),  # numbers compare as numbers
    ("#### 72 clips", False),  # "72 clips" is not the number 72
    ("She sold 48 + 24 = 72... no wait, 70.", False),  # the final answer is 70
    ("\\boxed{71}", False),
    ("I am not sure how many clips she sold.", False),
    ("#### ", False),
    ("", False),
])
def test_answer_against_a_gsm8k_solution(completion, expected):
    assert answers_match(completion, GSM8K_SOLUTION) is expected


@pytest.mark.parametrize("completion, reference, expected", [
    ("The answer is $1,000.", "1000", True),
    ("\\boxed{\\frac{3}{4}}", "0.75", True),
    ("\\boxed{3/4}", 0.75, True),
    ("\\boxed{x + \\frac{1}{2}}", "x + \\frac{1}{2}", True),  # not a number: compared as text
    ("\\boxed{12", "12", True),  # unclosed box: the last number still answers
    ("It is 50%.", "50", True),
    ("-3 degrees", -3, True),
    ("Paris", "paris", True),
])
def test_answer_forms(completion, reference, expected):
    assert answers_match(completion, reference) is expected


def test_final_answer_prefers_gsm8k_then_boxed_then_last_number():
    assert final_answer("so \\boxed{5} #### 6") == "6"
    assert final_answer("7 then \\boxed{\\frac{1}{2}} and 9") == "\\frac{1}{2}"
    assert final_answer("1, 2 and finally 3.") == "3"
    assert final_answer("Paris.") == "Paris."
    assert final_answer("#### ") is None


WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("completion, expected", [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>', True),
    ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}', True),  # arguments as JSON text
    ('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>', False),  # not a listed tool
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"</tool_call>', False),  # does not parse
    ('<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>', False),
    ("The weather in Oslo is sunny.", False),
])
def test_tool_call(completion, expected):
    assert tool_call_ok(completion, WEATHER) is expected
    assert tool_call_ok(completion, __import__("json").dumps(WEATHER)) is expected  # the row's tools as JSON text


def built_ins():
    return terms([{"type": "answer", "weight": 1.0}, {"type": "format", "pattern": r"####\s*\S+$", "weight": 0.5},
                  {"type": "length", "max_tokens": 4, "weight": 0.2}], Path("."))


def test_built_in_terms_score_a_batch_with_their_names_and_weights():
    answer, fmt, length = built_ins()
    assert [answer.__name__, fmt.__name__, length.__name__] == ["answer", "format", "length"]
    completions = ["48 + 24 = 72\n#### 72", "I think 70"]
    batch = {"prompts": ["p", "p"], "completions": completions, "completion_ids": [[1] * 4, [1] * 8],
             "answer": [GSM8K_SOLUTION] * 2, "row_hash": ["r1", "r1"], "trainer_state": object()}
    assert answer(**batch) == [1.0, 0.0]
    assert fmt(**batch) == [1.0, 0.0]
    assert length(**batch) == [0.0, -1.0]
    assert weights([{"type": "answer"}, {"type": "length", "weight": 0.2}]) == [1.0, 0.2]


def rewards_file(project: Path, body: str) -> None:
    (project / "rewards").mkdir(exist_ok=True)
    (project / "rewards" / "mine.py").write_text(body)


def test_a_raising_reward_names_the_function_and_the_row(tmp_path):
    rewards_file(tmp_path, "def score(completions, answer, **kw):\n    return [1 / len(c) for c in completions]\n")
    (term,) = terms([{"type": "python", "file": "rewards/mine.py", "function": "score"}], tmp_path)
    with pytest.raises(RewardError, match=r"reward rewards/mine.py:score raised ZeroDivisionError.*row rB, "
                                          r"completion 1 of the batch, prompt ending 'q: how many\?'"):
        term(prompts=["q: 2+2?", "q: how many?"], completions=["4", ""], completion_ids=[[1], []],
             answer=["4", "3"], row_hash=["rA", "rB"])


def test_a_nan_reward_names_the_function_and_the_row(tmp_path):
    rewards_file(tmp_path, "def score(completions, **kw):\n    return [0.5, float('nan')]\n")
    (term,) = terms([{"type": "python", "file": "rewards/mine.py", "function": "score"}], tmp_path)
    with pytest.raises(RewardError, match=r"rewards/mine.py:score returned nan, not a finite number.*row rB"):
        term(prompts=["a", "b"], completions=["x", "y"], completion_ids=[[1], [2]], row_hash=["rA", "rB"])


def test_user_reward_files_are_confined_to_the_projects_rewards_folder(tmp_path):
    project = tmp_path / "project"
    (project / "rewards").mkdir(parents=True)
    (tmp_path / "outside.py").write_text("def score(completions, **kw):\n    return [1.0] * len(completions)\n")
    (project / "rewards" / "linked.py").symlink_to(tmp_path / "outside.py")
    with pytest.raises(RewardError, match="outside .*rewards: reward code lives in the project's rewards/"):
        user_function(project, "rewards/linked.py", "score")
    rewards_file(project, "def score(completions, **kw):\n    return [1.0] * len(completions)\n")
    with pytest.raises(RewardError, match=r"defines no function 'scor' \(it defines \['score'\]\)"):
        user_function(project, "rewards/mine.py", "scor")
