"""Prepare reads what users bring: every file type, every row format (on the real public files), column and
role remapping, and several sources mixed by weight."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xtrain.data import SPLITS, prepare
from xtrain.data.formats import Normaliser
from xtrain.errors import XtrainError
from xtrain.recipe import Data, DataSource, content_hash

REAL = Path(__file__).parents[1] / "data/real"
ALPACA, GLAIVE, C4 = REAL / "alpaca_en_demo.json", REAL / "glaive_toolcall_en_demo.json", REAL / "c4_demo.jsonl"


def run(model_dir: Path, out: Path, *sources: DataSource, **settings) -> dict:
    data = Data(sources=list(sources), **{"seq_len": 1024, "eval_fraction": 0.1, **settings})
    return prepare([Path(s.path) for s in sources if s.path], model_dir, data, out)


def examples(out: Path, name: str = "train") -> list[dict]:
    return pq.read_table(out / f"{name}.parquet").to_pylist()


def decoded(tokenizer, row: dict, trained: bool) -> str:
    return tokenizer.decode([t for t, m in zip(row["input_ids"], row["assistant_masks"]) if m == trained])


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


# --- the real files, each in its own format --------------------------------------------------------


def test_real_alpaca_rows_become_user_and_assistant_turns():
    rows = json.loads(ALPACA.read_text())
    read = Normaliser(DataSource(path=str(ALPACA), format="alpaca"), "alpaca").read
    with_input = next(row for row in rows if row["input"])
    assert read(with_input)["messages"] == [
        {"role": "user", "content": f"{with_input['instruction']}\n{with_input['input']}"},
        {"role": "assistant", "content": with_input["output"]},
    ]
    without_input = next(row for row in rows if not row["input"])
    assert read(without_input)["messages"][0] == {"role": "user", "content": without_input["instruction"]}


def test_real_alpaca_file_prepares_with_only_the_answers_trained(tiny_model, tokenizer, tmp_path):
    manifest = run(tiny_model, tmp_path / "out", DataSource(path=str(ALPACA)))
    stats = manifest["sources"][str(ALPACA)]
    assert stats["format"] == "alpaca" and stats["rows"] == 999
    assert stats["kept"] + sum(stats["dropped"].values()) == 999
    assert set(stats["dropped"]) <= {"duplicate", "over seq_len"}
    outputs = {row["output"] for row in json.loads(ALPACA.read_text())}
    for row in examples(tmp_path / "out")[:50]:
        answer = decoded(tokenizer, row, trained=True)
        assert answer.endswith("<|im_end|>") and answer.removesuffix("<|im_end|>") in outputs
        assert decoded(tokenizer, row, trained=False).startswith("<|im_start|>user\n")


def inline_call(value: str) -> str:
    """A sharegpt function_call turn as data.tool_calls: inline writes it."""
    return f"<tool_call>\n{json.dumps(json.loads(value), ensure_ascii=False)}\n</tool_call>"


def renders_as(conversation: dict, context: str, trained: str) -> bool:
    """Whether a prepared row is this conversation: calls and answers trained, tool results context only."""
    # The demo template has no tool support: with data.tool_calls: inline the tool list is in the system turn.
    if not context.startswith(f"<|im_start|>system\nYou can call these tools:\n{conversation['tools']}<|im_end|>"):
        return False
    for turn in conversation["conversations"]:
        answer = inline_call(turn["value"]) if turn["from"] == "function_call" else turn["value"]
        if turn["from"] in ("gpt", "function_call") and answer + "<|im_end|>" not in trained:
            return False
        if turn["from"] in ("human", "observation"):
            role = "user" if turn["from"] == "human" else "tool"
            if f"<|im_start|>{role}\n{turn['value']}<|im_end|>" not in context:
                return False
        if turn["from"] == "observation" and turn["value"] in trained:
            return False
    return True


def test_real_sharegpt_tool_calls_are_trained_and_tool_answers_are_context(tiny_model, tokenizer, tmp_path):
    conversations = json.loads(GLAIVE.read_text())
    with pytest.raises(XtrainError, match="does not render tool calls or a tool list.*data.tool_calls: inline"):
        run(tiny_model, tmp_path / "refused", DataSource(path=str(GLAIVE)), over_length="truncate")
    assert not (tmp_path / "refused").exists()
    manifest = run(tiny_model, tmp_path / "out", DataSource(path=str(GLAIVE)), over_length="truncate",
                   tool_calls="inline")
    stats = manifest["sources"][str(GLAIVE)]
    assert stats["format"] == "sharegpt" and stats["rows"] == len(conversations)
    assert stats["kept"] > 200 and stats["truncated"] > 0
    complete = [row for row in examples(tmp_path / "out") if len(row["input_ids"]) < 1024]  # not truncated
    assert len(complete) > 100
    for row in complete:
        context, trained = decoded(tokenizer, row, False), decoded(tokenizer, row, True)
        assert any(renders_as(c, context, trained) for c in conversations), context[:300]


def test_real_sharegpt_function_call_turns_are_tool_calls_the_template_renders(tiny_model):
    conversations = json.loads(GLAIVE.read_text())
    read = Normaliser(DataSource(path=str(GLAIVE)), "sharegpt").read
    row = next(r for r in conversations if any(t["from"] == "function_call" for t in r["conversations"]))
    turn = next(t for t in read(row)["messages"] if t.get("tool_calls"))
    call = json.loads(next(t["value"] for t in row["conversations"] if t["from"] == "function_call"))
    assert turn == {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]}
    # Mapped by the source itself, the turn is plain text, trained as it is.
    mapped = Normaliser(DataSource(path=str(GLAIVE), roles={"function_call": "assistant"}), "sharegpt").read(row)
    assert not any(t.get("tool_calls") for t in mapped["messages"])


def test_real_text_documents_are_trained_on_every_token_and_end_with_eos(tiny_model, tokenizer, tmp_path):
    manifest = run(tiny_model, tmp_path / "out", DataSource(path=str(C4)), seq_len=1024, eval_fraction=0.2)
    assert manifest["sources"][str(C4)]["format"] == "text"
    assert all(manifest["splits"][s]["supervised_fraction"] == 1.0 for s in SPLITS)
    texts = {json.loads(line)["text"] for line in C4.read_text().splitlines()}
    assert manifest["sources"][str(C4)]["blocks"] > 0, "documents over seq_len are split into blocks, not dropped"
    for row in examples(tmp_path / "out")[:40]:
        ids = row["input_ids"]
        if len(ids) == 1024 and ids[-1] != tokenizer.eos_token_id:
            continue  # a block inside a long document
        assert ids[-1] == tokenizer.eos_token_id
        text = tokenizer.decode(ids[:-1])
        assert text in texts or any(t.endswith(text) for t in texts), "a whole document, or a long one's last block"


def test_batched_tokens_and_masks_equal_apply_chat_template_row_by_row(tokenizer):
    from xtrain.data.chats import apply_tool_calls
    from xtrain.data.templates import ChatTemplate
    from xtrain.data.tokenize import encode_chats

    alpaca = Normaliser(DataSource(path=str(ALPACA)), "alpaca")
    glaive = Normaliser(DataSource(path=str(GLAIVE)), "sharegpt")
    chats = [alpaca.read(row) for row in json.loads(ALPACA.read_text())[:100]]
    template = ChatTemplate(tokenizer.chat_template, tokenizer.chat_template, "generation blocks", "the demo's")
    chats += [apply_tool_calls(glaive.read(row), "inline", template) for row in json.loads(GLAIVE.read_text())[:100]]
    batched = encode_chats(tokenizer, template, [c["messages"] for c in chats], [None] * len(chats))
    for chat, (ids, mask) in zip(chats, batched, strict=True):
        one = tokenizer.apply_chat_template(chat["messages"], tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        assert (ids, mask) == (one["input_ids"], one["assistant_masks"])


# --- every file type gives the same result ---------------------------------------------------------

FIRST_ALPACA = json.loads(ALPACA.read_text())[:60]


def write_as(kind: str, folder: Path) -> Path:
    if kind == "json":
        path = folder / "rows.json"
        path.write_text(json.dumps(FIRST_ALPACA))
    elif kind == "jsonl":
        path = folder / "rows.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in FIRST_ALPACA))
    elif kind == "csv":
        path = folder / "rows.csv"
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=["instruction", "input", "output"])
            writer.writeheader()
            writer.writerows(FIRST_ALPACA)
    elif kind == "parquet":
        path = folder / "rows.parquet"
        pq.write_table(pa.Table.from_pylist(FIRST_ALPACA), path)
    else:
        from datasets import Dataset, DatasetDict

        path = folder / "saved"
        DatasetDict({"train": Dataset.from_list(FIRST_ALPACA)}).save_to_disk(str(path))
    return path


def test_every_file_type_prepares_to_the_same_data(tiny_model, tmp_path):
    fingerprints = {}
    for kind in ("json", "jsonl", "csv", "parquet", "saved"):
        path = write_as(kind, tmp_path)
        manifest = run(tiny_model, tmp_path / f"out-{kind}", DataSource(path=str(path)), eval_fraction=0.2)
        assert manifest["sources"][str(path)]["format"] == "alpaca"
        fingerprints[kind] = manifest["fingerprint"]
    assert len(set(fingerprints.values())) == 1, fingerprints


def test_a_hub_id_offline_fails_with_the_id_and_how_to_use_a_local_copy(tiny_model, tmp_path, monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    # No network here either way; offline mode only skips the retries.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(XtrainError) as info:
        run(tiny_model, tmp_path / "prepared" / "x", DataSource(hub="xtrain-tests/no-such-dataset"))
    message = str(info.value)
    assert "hub:xtrain-tests/no-such-dataset" in message and "save_to_disk" in message and "data.sources[].path" in message
    assert not (tmp_path / "prepared").exists() or not list((tmp_path / "prepared").iterdir())


# --- remapping, other formats, mixing -------------------------------------------------------------


def test_columns_and_roles_are_remapped(tiny_model, tokenizer, tmp_path):
    path = tmp_path / "odd.jsonl"
    rows = [
        {"dialog": [{"speaker": "person", "text": f"Question {i}?"}, {"speaker": "bot", "text": f"Answer {i}."}]}
        for i in range(30)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = DataSource(path=str(path), format="messages", columns={"messages": "dialog", "role": "speaker",
                        "content": "text"}, roles={"person": "user", "bot": "assistant"})
    manifest = run(tiny_model, tmp_path / "out", source, eval_fraction=0.2)
    assert manifest["sources"][str(path)]["kept"] == 30
    row = examples(tmp_path / "out")[0]
    assert decoded(tokenizer, row, True).startswith("Answer ")
    assert decoded(tokenizer, row, False).startswith("<|im_start|>user\nQuestion ")


def test_prompt_completion_plain_and_conversational(tiny_model, tokenizer, tmp_path):
    path = tmp_path / "pc.jsonl"
    plain = [{"prompt": f"Count to {i}.", "completion": f"Up to {i}."} for i in range(20)]
    chatty = [{"prompt": [{"role": "user", "content": f"Name {i}."}],
               "completion": [{"role": "assistant", "content": f"Name is {i}."}]} for i in range(20)]
    path.write_text("".join(json.dumps(r) + "\n" for r in plain + chatty))
    manifest = run(tiny_model, tmp_path / "out", DataSource(path=str(path)), eval_fraction=0.2)
    assert manifest["sources"][str(path)]["format"] == "prompt_completion"
    assert manifest["sources"][str(path)]["kept"] == 40
    trained = {decoded(tokenizer, row, True) for name in SPLITS for row in examples(tmp_path / "out", name)}
    assert "Up to 3.<|im_end|>" in trained and "Name is 3.<|im_end|>" in trained


def test_sources_are_mixed_by_weight_in_the_train_split_only(tiny_model, tmp_path):
    def source(name: str, n: int, weight: float) -> tuple[DataSource, set[str]]:
        rows = [{"instruction": f"{name} task {i}", "output": f"{name} answer {i}"} for i in range(n)]
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        hashes = {content_hash({"messages": [{"role": "user", "content": r["instruction"]},
                                             {"role": "assistant", "content": r["output"]}], "tools": None})
                  for r in rows}
        return DataSource(path=str(path), weight=weight), hashes

    (heavy, heavy_hashes), (light, light_hashes) = source("heavy", 100, 2.0), source("light", 400, 0.25)
    out = tmp_path / "out"
    manifest = run(tiny_model, out, heavy, light, eval_fraction=0.2)
    copies = Counter(row["row_hash"] for row in examples(out, "train"))
    evaluation = [row["row_hash"] for row in examples(out, "eval")]
    assert len(set(evaluation)) == len(evaluation) and not set(evaluation) & set(copies)
    assert {copies[h] for h in heavy_hashes - set(evaluation)} == {2}
    light_train = light_hashes - set(evaluation)
    assert {copies[h] for h in light_train} == {0, 1}
    assert 0.15 < sum(copies[h] for h in light_train) / len(light_train) < 0.35
    assert manifest["splits"]["train"]["rows"] == sum(copies.values())


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_preflight_reads_only_the_first_rows_of_a_file(tiny_model, tmp_path, suffix):
    """A damaged row far into the file is prepare's to report; preflight parses the first rows only."""
    from xtrain.data.pipeline import check_first_rows

    rows = [{"instruction": f"Say {i}.", "output": f"{i}"} for i in range(3000)]
    path = tmp_path / f"rows{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(rows, indent=1)[:-3] + "{broken\n]")
    else:
        path.write_text("instruction,output\n" + "".join(f'"{r["instruction"]}",{r["output"]}\n' for r in rows)
                        + "a,b,c,d\n")
    assert check_first_rows(DataSource(path=str(path)), path) == "alpaca"
    with pytest.raises(XtrainError, match=f"rows{suffix}"):
        prepare([path], tiny_model, Data(sources=[DataSource(path=str(path))]), tmp_path / "out")
