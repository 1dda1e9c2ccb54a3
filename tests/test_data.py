"""The prepare stage: masking, manifest counts, a stable split, drops, and clear errors that leave no output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from xtrain.data import SPLITS, prepare
from xtrain.errors import XtrainError
from xtrain.models.tiny import CHATML_TEMPLATE
from xtrain.recipe import Data, DataSource, RecipeError, content_hash, parse_recipe

ROOT = Path(__file__).parents[1]
DEMO = ROOT / "data/demo/chat.jsonl"

SUBJECTS = ["cat", "dog", "bird", "fish", "tree", "book", "lamp", "door", "milk", "snow", "rain", "sun", "moon"]


@pytest.fixture(scope="module")
def model_dir(tiny_model) -> Path:
    return tiny_model


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def chat(*turns: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in turns]


def qa(i: int) -> list[dict[str, str]]:
    """A distinct, valid chat row."""
    subject = SUBJECTS[i % len(SUBJECTS)]
    return chat(("user", f"What is {subject} number {i}?"), ("assistant", f"It is {subject} {i}."))


def write_jsonl(path: Path, rows: list) -> Path:
    lines = [row if isinstance(row, str) else json.dumps({"messages": row}) for row in rows]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def data_settings(*paths: Path, seq_len: int = 128, eval_fraction: float = 0.3, **settings) -> Data:
    return Data(sources=[DataSource(path=str(p)) for p in paths], seq_len=seq_len, eval_fraction=eval_fraction,
                **settings)


def run_prepare(model_dir: Path, out: Path, *paths: Path, **settings) -> dict:
    return prepare(list(paths), model_dir, data_settings(*paths, **settings), out)


def chat_hash(messages: list[dict[str, str]]) -> str:
    """The row hash prepare gives a chat row without tools."""
    return content_hash({"messages": messages, "tools": None})


def read_split(out: Path, name: str) -> dict[str, list]:
    return pq.read_table(out / f"{name}.parquet").to_pydict()


def leftovers(parent: Path) -> list[str]:
    """Everything in the output's parent folder (the output itself or a hidden `.partial` sibling)."""
    return sorted(p.name for p in parent.iterdir()) if parent.exists() else []


# --- masking ---------------------------------------------------------------------------------------

MASKING_ROWS = [
    chat(("user", "What colour is snow?"), ("assistant", "Snow is white.")),
    chat(("system", "Zebra system rule."), ("user", "Name a bird."), ("assistant", "A crow is a bird.")),
    chat(
        ("system", "Answer in one short sentence."),
        ("user", "What is the plural of cat?"),
        ("assistant", "The plural of cat is cats."),
        ("user", "And of book?"),
        ("assistant", "The plural of book is books."),
    ),
] + [qa(i) for i in range(20)]


@pytest.fixture(scope="module")
def masked(model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("masking")
    source = write_jsonl(folder / "chat.jsonl", MASKING_ROWS)
    out = folder / "prepared"
    manifest = run_prepare(model_dir, out, source, eval_fraction=0.3)
    return out, manifest


def test_only_assistant_turns_and_their_end_of_turn_token_are_supervised(masked, tokenizer):
    out, _ = masked
    by_hash = {chat_hash(row): row for row in MASKING_ROWS}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    seen = 0
    for name in SPLITS:
        split = read_split(out, name)
        for ids, mask, row_hash in zip(split["input_ids"], split["assistant_masks"], split["row_hash"], strict=True):
            messages = by_hash[row_hash]
            assert len(ids) == len(mask)
            supervised = [t for t, m in zip(ids, mask) if m]
            unsupervised = [t for t, m in zip(ids, mask) if not m]
            assistant = [t["content"] for t in messages if t["role"] == "assistant"]
            assert tokenizer.decode(supervised) == "".join(text + "<|im_end|>" for text in assistant)
            # Each assistant turn's end-of-turn token is trained on; the others are not.
            assert supervised.count(im_end) == len(assistant)
            assert unsupervised.count(im_end) == len(messages) - len(assistant)
            context = tokenizer.decode(unsupervised)
            for turn in messages:
                if turn["role"] != "assistant":
                    assert turn["content"] in context
                    assert turn["content"] not in tokenizer.decode(supervised)
            seen += 1
    assert seen == len(MASKING_ROWS)


def test_manifest_counts_match_the_parquet_files(masked):
    out, manifest = masked
    assert json.loads((out / "manifest.json").read_text()) == manifest
    for name in SPLITS:
        split = read_split(out, name)
        lengths = [len(ids) for ids in split["input_ids"]]
        supervised = sum(sum(mask) for mask in split["assistant_masks"])
        stats = manifest["splits"][name]
        assert {k: stats[k] for k in ("rows", "examples", "tokens", "supervised_tokens", "max_len")} == {
            "rows": len(lengths),
            "examples": len(lengths),
            "tokens": sum(lengths),
            "supervised_tokens": supervised,
            "max_len": max(lengths),
        }
        assert stats["supervised_fraction"] == round(supervised / sum(lengths), 4)
        assert sum(stats["length_histogram"]["counts"]) == len(lengths)
        assert stats["padding_fraction_unpacked"] == round(1 - sum(lengths) / (len(lengths) * 128), 4)
    assert sum(manifest["splits"][s]["rows"] for s in SPLITS) == len(MASKING_ROWS)
    assert manifest["seq_len"] == 128
    (source_stats,) = manifest["sources"].values()
    assert source_stats == {
        "format": "messages", "rows": len(MASKING_ROWS), "kept": len(MASKING_ROWS), "dropped": {}, "truncated": 0,
        "weight": 1.0,
    }


def test_prepare_leaves_only_the_output_folder(masked):
    out, _ = masked
    assert sorted(p.name for p in out.iterdir()) == [
        "chat_template.jinja", "eval.parquet", "manifest.json", "preview.txt", "train.parquet"]
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(".")]


# --- split ----------------------------------------------------------------------------------------


def split_of(out: Path) -> dict[str, str]:
    return {h: name for name in SPLITS for h in read_split(out, name)["row_hash"]}


def test_split_is_deterministic(model_dir, tmp_path):
    source = write_jsonl(tmp_path / "chat.jsonl", [qa(i) for i in range(40)])
    first = run_prepare(model_dir, tmp_path / "a", source)
    second = run_prepare(model_dir, tmp_path / "b", source)
    assert first == second
    assert split_of(tmp_path / "a") == split_of(tmp_path / "b")
    for name in SPLITS:
        assert (tmp_path / "a" / f"{name}.parquet").read_bytes() == (tmp_path / "b" / f"{name}.parquet").read_bytes()


def test_adding_rows_never_moves_an_existing_row_between_splits(model_dir, tmp_path):
    old_rows = [qa(i) for i in range(40)]
    new_rows = [qa(i) for i in range(40, 80)]
    before = write_jsonl(tmp_path / "before.jsonl", old_rows)
    # New rows both before and after the old ones: position in the file must not matter.
    after = write_jsonl(tmp_path / "after.jsonl", new_rows[:20] + old_rows + new_rows[20:])
    run_prepare(model_dir, tmp_path / "before", before)
    run_prepare(model_dir, tmp_path / "after", after)
    old_split, new_split = split_of(tmp_path / "before"), split_of(tmp_path / "after")
    assert len(old_split) == 40 and len(new_split) == 80
    assert set(old_split.values()) == {"train", "eval"}
    assert {h: new_split[h] for h in old_split} == old_split


def test_eval_fraction_is_roughly_respected(model_dir, tmp_path):
    source = write_jsonl(tmp_path / "chat.jsonl", [qa(i) for i in range(200)])
    manifest = run_prepare(model_dir, tmp_path / "out", source, eval_fraction=0.25)
    assert 25 <= manifest["splits"]["eval"]["rows"] <= 75


# --- drops ----------------------------------------------------------------------------------------


def test_rows_are_dropped_and_counted_by_reason(model_dir, tmp_path):
    good = [qa(i) for i in range(30)]
    long_answer = " ".join(f"word{i}" for i in range(200))
    rows = good + [
        good[0],  # exact duplicate
        good[5],  # exact duplicate
        chat(("user", "Tell me a long story."), ("assistant", long_answer)),  # over seq_len
        chat(("user", "Anyone there?")),  # no assistant turn
        chat(("system", "Be brief."), ("user", "Hello?")),  # no assistant turn
        chat(("assistant", "I speak first."), ("user", "Odd.")),  # wrong role order
        chat(("user", "One."), ("user", "Two."), ("assistant", "Three.")),  # wrong role order
        chat(("user", "Hi"), ("assistant", "Hello"), ("system", "Late system prompt.")),  # wrong role order
        chat(("user", "   "), ("assistant", "Nothing to answer.")),  # empty turn
    ]
    source = write_jsonl(tmp_path / "chat.jsonl", rows)
    manifest = run_prepare(model_dir, tmp_path / "out", source, seq_len=64)
    stats = manifest["sources"][str(source)]
    assert (stats["rows"], stats["kept"]) == (len(rows), 30)
    assert stats["dropped"] == {
        "duplicate": 2, "over seq_len": 1, "no assistant turn": 2, "wrong role order": 3, "empty turn": 1
    }
    assert sum(manifest["splits"][s]["rows"] for s in SPLITS) == 30
    assert max(manifest["splits"][s]["max_len"] for s in SPLITS) <= 64
    kept = {h for name in SPLITS for h in read_split(tmp_path / "out", name)["row_hash"]}
    assert kept == {chat_hash(row) for row in good}


def test_duplicates_across_sources_are_dropped_from_the_later_source(model_dir, tmp_path):
    first = write_jsonl(tmp_path / "first.jsonl", [qa(i) for i in range(20)])
    second = write_jsonl(tmp_path / "second.jsonl", [qa(i) for i in range(15, 30)])
    manifest = run_prepare(model_dir, tmp_path / "out", first, second)
    assert (manifest["sources"][str(first)]["kept"], manifest["sources"][str(first)]["dropped"]) == (20, {})
    assert (manifest["sources"][str(second)]["kept"], manifest["sources"][str(second)]["dropped"]) == (
        10, {"duplicate": 5}
    )


def test_demo_data_prepares(model_dir, tmp_path):
    manifest = run_prepare(model_dir, tmp_path / "out", DEMO, seq_len=128, eval_fraction=0.1)
    stats = manifest["sources"][str(DEMO)]
    assert stats["rows"] == len(DEMO.read_text().splitlines())
    assert stats["kept"] + sum(stats["dropped"].values()) == stats["rows"]
    assert all(manifest["splits"][s]["supervised_tokens"] > 0 for s in SPLITS)


# --- errors ---------------------------------------------------------------------------------------

VALID_LINES = [json.dumps({"messages": qa(i)}) for i in range(10)]


def bad_source(tmp_path: Path, case: str) -> tuple[Path, str]:
    """Write a bad data file; return it and a fragment the error message must contain."""
    path = tmp_path / "chat.jsonl"
    if case == "malformed-json":
        path.write_text("\n".join(VALID_LINES[:2] + ['{"messages": [}'] + VALID_LINES[2:]) + "\n")
        return path, f"{path}:3: malformed JSON"
    if case == "unknown-role":
        bad = json.dumps({"messages": chat(("user", "Hi"), ("bot", "Hello"))})
        path.write_text("\n".join(VALID_LINES[:4] + [bad] + VALID_LINES[4:]) + "\n")
        return path, f"{path}:5: field `messages[1].role`: unknown role 'bot'"
    if case == "not-messages":
        path.write_text("\n".join(VALID_LINES[:1] + [json.dumps({"text": "hi"})]) + "\n")
        return path, f"{path}:2: field `messages`: missing column"
    if case == "content-not-string":
        bad = json.dumps({"messages": [{"role": "user", "content": ["a"]}]})
        path.write_text("\n".join(VALID_LINES[:1] + [bad]) + "\n")
        return path, f"{path}:2: field `messages[0].content[0]`: a content part is {{\"type\": text"
    if case == "empty-file":
        path.write_text("")
        return path, f"{path}: no rows"
    if case == "blank-lines-only":
        path.write_text("\n\n  \n")
        return path, f"{path}: no rows"
    if case == "non-utf8":
        path.write_bytes(("\n".join(VALID_LINES[:1]) + "\n").encode() + b'{"messages": "caf\xe9"}\n')
        return path, f"{path}:2: not UTF-8"
    if case == "missing-file":
        return tmp_path / "absent.jsonl", f"{tmp_path / 'absent.jsonl'}: data source not found"
    if case == "unknown-format":
        path.write_text(json.dumps({"question": "Hi?", "reply": "Hello."}) + "\n")
        return path, f"{path}:1: cannot tell the format from the columns ['question', 'reply']; set data.sources[].format"
    if case == "alpaca-missing-column":
        path = tmp_path / "rows.json"
        path.write_text(json.dumps([{"instruction": "Hi", "output": "Hello"}, {"instruction": "Bye"}]))
        return path, f"{path} row 2: field `output`: missing column"
    if case == "sharegpt-unknown-role":
        path = tmp_path / "rows.json"
        turns = [{"from": "human", "value": "Hi"}, {"from": "robot", "value": "Hello"}]
        path.write_text(json.dumps([{"conversations": turns}]))
        return path, f"{path} row 1: field `conversations[1].from`: unknown role 'robot'"
    if case == "malformed-json-array":
        path = tmp_path / "rows.json"
        path.write_text('[\n  {"instruction": "Hi", "output": "Hello"},\n  {"instruction": }\n]\n')
        return path, f"{path}:3: malformed JSON"
    if case == "json-not-an-array":
        path = tmp_path / "rows.json"
        path.write_text(json.dumps({"instruction": "Hi", "output": "Hello"}))
        return path, f"{path}: a .json source is one array of row objects, got a dict"
    if case == "empty-json-array":
        path = tmp_path / "rows.json"
        path.write_text("[]")
        return path, f"{path}: no rows"
    if case == "csv-ragged-row":
        path = tmp_path / "rows.csv"
        path.write_text("instruction,output\nHi,Hello\nBye,See you,extra\n")
        return path, f"{path}:3: more fields than the header has columns"
    if case == "csv-non-utf8":
        path = tmp_path / "rows.csv"
        path.write_bytes(b"instruction,output\nHi,Hello\nCaf\xe9,Yes\n")
        return path, f"{path}:3: not UTF-8"
    if case == "unknown-file-type":
        path = tmp_path / "rows.xml"
        path.write_text("<rows/>\n")
        return path, f"{path}: unknown file type '.xml'"
    if case == "one-row-empty-split":
        path.write_text(VALID_LINES[0] + "\n")
        return path, f"split is empty (1 usable rows; {path}: read 1, kept 1, dropped none); add data or change data.eval_fraction"
    raise AssertionError(case)


ERROR_CASES = [
    "malformed-json",
    "unknown-role",
    "not-messages",
    "content-not-string",
    "empty-file",
    "blank-lines-only",
    "non-utf8",
    "missing-file",
    "one-row-empty-split",
    "unknown-format",
    "alpaca-missing-column",
    "sharegpt-unknown-role",
    "malformed-json-array",
    "json-not-an-array",
    "empty-json-array",
    "csv-ragged-row",
    "csv-non-utf8",
    "unknown-file-type",
]


@pytest.mark.parametrize("case", ERROR_CASES)
def test_bad_data_is_an_error_that_leaves_no_output(model_dir, tmp_path, case):
    source, expected = bad_source(tmp_path, case)
    parent = tmp_path / "prepared"
    with pytest.raises(XtrainError) as info:
        run_prepare(model_dir, parent / "demo", source)
    assert expected in str(info.value)
    assert leftovers(parent) == []


def test_an_unknown_format_in_the_recipe_names_the_field():
    recipe = {"model": {"path": "m"}, "data": {"sources": [{"path": "a.jsonl", "format": "chatml"}]}}
    with pytest.raises(RecipeError, match=r"data.sources\[0\].format: Input should be 'auto', 'messages'"):
        parse_recipe(recipe, "recipes/x.yaml")


def test_error_in_a_later_source_names_that_source(model_dir, tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", [qa(i) for i in range(10)])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(VALID_LINES[0] + "\nnot json\n")
    with pytest.raises(XtrainError, match=rf"{bad}:2: malformed JSON"):
        run_prepare(model_dir, tmp_path / "prepared" / "demo", good, bad)
    assert leftovers(tmp_path / "prepared") == []


def test_a_failed_prepare_keeps_the_previous_output(model_dir, tmp_path):
    out = tmp_path / "prepared" / "demo"
    good = write_jsonl(tmp_path / "good.jsonl", [qa(i) for i in range(20)])
    manifest = run_prepare(model_dir, out, good)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    with pytest.raises(XtrainError):
        run_prepare(model_dir, out, bad)
    assert leftovers(tmp_path / "prepared") == ["demo"]
    assert json.loads((out / "manifest.json").read_text()) == manifest


PLAIN_TEMPLATE = CHATML_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
BARE_TEMPLATE = PLAIN_TEMPLATE.replace("{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}", "")


def model_with_template(model_dir: Path, folder: Path, template: str) -> Path:
    from transformers import AutoTokenizer

    copy = folder / "plain-model"
    shutil.copytree(model_dir, copy)
    tokenizer = AutoTokenizer.from_pretrained(copy)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(copy)
    assert AutoTokenizer.from_pretrained(copy).chat_template == template
    return copy


def test_template_that_cannot_be_masked_is_refused_by_name(model_dir, tmp_path):
    """No {% generation %} block, no TRL training variant, and the assistant's role header comes with its answer
    (the template ignores add_generation_prompt): neither way can find the answer alone."""
    assert "{% generation %}" not in BARE_TEMPLATE
    plain = model_with_template(model_dir, tmp_path, BARE_TEMPLATE)
    source = write_jsonl(tmp_path / "chat.jsonl", [qa(i) for i in range(20)])
    with pytest.raises(XtrainError) as info:
        run_prepare(plain, tmp_path / "prepared" / "demo", source)
    assert str(plain) in str(info.value)
    assert "{% generation %}" in str(info.value) and "data.train_on_inputs: true" in str(info.value)
    assert leftovers(tmp_path / "prepared") == []


def test_a_prefix_preserving_template_without_generation_block_is_masked_by_incremental_rendering(model_dir, tmp_path):
    from transformers import AutoTokenizer

    plain = model_with_template(model_dir, tmp_path, PLAIN_TEMPLATE)
    source = write_jsonl(tmp_path / "chat.jsonl", [qa(i) for i in range(20)])
    manifest = run_prepare(plain, tmp_path / "prepared" / "demo", source)
    assert manifest["masking"] == "incremental rendering"
    assert manifest["end_of_turn"]["token"] == "<|im_end|>"
    tokenizer = AutoTokenizer.from_pretrained(plain)
    rows = pq.read_table(tmp_path / "prepared" / "demo" / "train.parquet").to_pylist()
    for row in rows:
        supervised = tokenizer.decode([t for t, m in zip(row["input_ids"], row["assistant_masks"]) if m])
        answer = tokenizer.decode(row["input_ids"]).split("<|im_start|>assistant\n")[1]
        assert supervised == answer.rstrip("\n"), "exactly the answer and its end-of-turn token"
    assert (tmp_path / "prepared" / "demo" / "chat_template.jinja").read_text() == PLAIN_TEMPLATE
