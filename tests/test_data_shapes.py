"""Data as users bring it: typed content parts, tool calls, per-turn supervision, reasoning, placeholders, drops
you cannot miss, and other kinds of data refused in an SFT recipe. Fixture rows are written for this repo in
each public format's own shape; the supervised text is compared through two real chat templates."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import REPO, supervised_runs

from xtrain.data import prepare
from xtrain.data.templates import trl_template
from xtrain.errors import XtrainError
from xtrain.recipe import Data, DataSource

WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                 "parameters": {"type": "object",
                                                                "properties": {"city": {"type": "string"}}}}}


def llamafactory_row(i: int) -> dict:
    """LLaMA-Factory's newer format: typed parts with `value`, a reasoning part, per-turn loss_weight."""
    return {"messages": [
        {"role": "user", "content": [{"type": "text", "value": f"Add {i} and {i}."}], "loss_weight": 0.0},
        {"role": "assistant", "content": [{"type": "text", "value": f"First try {i}."}], "loss_weight": 0.0},
        {"role": "user", "content": [{"type": "text", "value": "Again, carefully."}], "loss_weight": 0.0},
        {"role": "assistant", "content": [{"type": "reasoning", "value": f"{i}+{i} is {2 * i}."},
                                          {"type": "text", "value": "It is "}, {"type": "text", "value": f"{2 * i}."}],
         "loss_weight": 1.0},
    ]}


def openai_row(i: int) -> dict:
    """OpenAI's chat format: typed `text` parts, an assistant tool call with JSON-text arguments, the tool's result."""
    return {"messages": [
        {"role": "user", "content": [{"type": "text", "text": f"Weather in city {i}?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": f"c{i}"})}}]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": f"Sunny in c{i}"},
        {"role": "assistant", "content": [{"type": "text", "text": f"It is sunny in c{i}."}]},
    ], "tools": [WEATHER_TOOL]}


def family(tiny_model: Path, folder: Path, name: str, tokens: list[str]) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = folder / name
    shutil.copytree(tiny_model, out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = trl_template(name)
    model = AutoModelForCausalLM.from_pretrained(out)
    model.config.max_position_embeddings = 32768  # the family's context; the tiny model's RoPE places any position
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def models(tiny_model, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("shapes")
    chatml = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"]
    return {"qwen2_5": family(tiny_model, folder, "qwen2_5", chatml),
            "qwen3": family(tiny_model, folder, "qwen3", chatml + ["<think>", "</think>"])}


def run(model: Path, rows: list[dict], folder: Path, suffix: str = ".jsonl", **settings) -> tuple[dict, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"rows{suffix}"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = Data(sources=[DataSource(path=str(source), **settings.pop("source", {}))],
                seq_len=settings.pop("seq_len", 2048), eval_fraction=0.1, **settings)
    return prepare([source], model, data, folder / "prepared"), folder / "prepared"


def supervised_texts(model: Path, prepared: Path) -> list[list[str]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = pq.read_table(prepared / "train.parquet").to_pylist()
    return [[tokenizer.decode(run) for run in supervised_runs(row["input_ids"], row["assistant_masks"])] for row in rows]


def test_llamafactory_typed_parts_with_reasoning_and_loss_weight(models, tmp_path):
    manifest, prepared = run(models["qwen3"], [llamafactory_row(i) for i in range(30)], tmp_path)
    texts = supervised_texts(models["qwen3"], prepared)
    # Only the loss_weight 1 turn trains: its reasoning (rendered by Qwen3's template), then the joined text parts.
    assert all(len(row) == 1 and "<think>" in row[0] and row[0].strip().endswith(".<|im_end|>") for row in texts)
    assert all("First try" not in "".join(row) for row in texts)
    assert manifest["sources"][next(iter(manifest["sources"]))]["kept"] == 30


def test_reasoning_a_template_cannot_render_is_refused_or_dropped_or_inlined(models, tmp_path):
    rows = [llamafactory_row(i) for i in range(30)]
    with pytest.raises(XtrainError, match="does not render assistant reasoning.*data.reasoning: drop"):
        run(models["qwen2_5"], rows, tmp_path / "keep")
    _, dropped = run(models["qwen2_5"], rows, tmp_path / "drop", reasoning="drop")
    assert all("<think>" not in text for row in supervised_texts(models["qwen2_5"], dropped) for text in row)
    _, inlined = run(models["qwen2_5"], rows, tmp_path / "inline", reasoning="inline")
    assert all(row[0].startswith("<think>\n") for row in supervised_texts(models["qwen2_5"], inlined))


@pytest.mark.parametrize("template", ["qwen2_5", "qwen3"])
def test_openai_tool_calls_are_rendered_by_the_template_and_tool_results_never_trained(models, tmp_path, template):
    manifest, prepared = run(models[template], [openai_row(i) for i in range(30)], tmp_path)
    for row in supervised_texts(models[template], prepared):
        assert len(row) == 2, row
        call, answer = row
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "c' in call and call.endswith("<|im_end|>")
        assert "It is sunny in" in answer and "Sunny in" not in "".join(row), "the tool's result is context"
    assert manifest["sources"][next(iter(manifest["sources"]))]["kept"] == 30


def test_media_parts_drop_the_row_with_the_reason(models, tmp_path):
    rows = [openai_row(i) for i in range(30)]
    for row in rows[:5]:
        row["messages"][0]["content"].append({"type": "image_url", "image_url": {"url": "x.png"}})
    manifest, _ = run(models["qwen2_5"], rows, tmp_path)
    stats = next(iter(manifest["sources"].values()))
    assert stats["dropped"] == {"non-text content (image)": 5} and stats["kept"] == 25


def test_a_weight_other_than_0_or_1_is_refused_by_name(models, tmp_path):
    rows = [llamafactory_row(i) for i in range(30)]
    rows[3]["messages"][3]["loss_weight"] = 0.5
    with pytest.raises(XtrainError, match=r"rows.jsonl:4: field `messages\[3\].loss_weight`: 0.5"):
        run(models["qwen3"], rows, tmp_path)


def test_placeholders_warn_with_names_and_counts_or_are_filled(models, tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"Who are you? ({i})"},
                          {"role": "assistant", "content": "I am {{name}}, made by {{author}}."}]} for i in range(30)]
    manifest, _ = run(models["qwen2_5"], rows, tmp_path / "warned")
    assert any("{{author}} x30, {{name}} x30" in w for w in manifest["warnings"])
    _, filled = run(models["qwen2_5"], rows, tmp_path / "filled", source={"replace": {"name": "Ada", "author": "Lab"}})
    assert all(row == ["I am Ada, made by Lab.<|im_end|>"] for row in supervised_texts(models["qwen2_5"], filled))
    with pytest.raises(XtrainError, match=r"placeholder \{\{author\}\} has no value in data.sources\[\].replace"):
        run(models["qwen2_5"], rows, tmp_path / "half", source={"replace": {"name": "Ada"}})


def test_heavy_drops_warn_with_the_reason_and_the_setting_that_keeps_them(models, tiny_model, tmp_path):
    def rows(long: int, every: int) -> list[dict]:
        return [{"messages": [{"role": "user", "content": "word " * (long if i % every == 0 else 10)},
                              {"role": "assistant", "content": f"Answer {i}."}]} for i in range(40)]

    manifest, _ = run(models["qwen2_5"], rows(700, 2), tmp_path, seq_len=512)
    warning, = manifest["warnings"]
    assert "20 of 40 rows (50%) dropped (20 over seq_len)" in warning
    assert "95th-percentile length" in warning and "data.over_length: truncate" in warning
    p95 = int(warning.split("data.seq_len: ")[1].split(" ")[0])
    assert 512 < p95 <= 1024, "the advised seq_len is above the one that dropped them, within the model's positions"
    manifest, _ = run(models["qwen2_5"], rows(700, 40), tmp_path / "one-outlier", seq_len=512, drop_warning=0.02)
    longest = int(manifest["warnings"][0].split("data.seq_len: ")[1].split(" ")[0])
    assert 512 < longest <= 1024 and "keeps them all" in manifest["warnings"][0]
    # Rows longer than the demo model's 1024 positions: the advice stops at them.
    manifest, _ = run(tiny_model, rows(1500, 2), tmp_path / "beyond", seq_len=512)
    assert re.search(r"data.seq_len: 1024, the model's positions, keeps the most \(keeping 95% of them needs 1\d{3}\)",
                     manifest["warnings"][0]), manifest["warnings"][0]


@pytest.mark.parametrize(("rows", "kind", "setting"), [
    ([json.loads(line) for line in (REPO / "data/real/v1_dpo_demo.jsonl").read_text().splitlines()],
     "preference pairs (DPO/ORPO: `chosen_messages`", "train.objective: dpo or orpo"),
    ([{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Go away"}], "label": False}],
     "unpaired preference rows (KTO", "train.objective: kto"),
    ([{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Go away"}], "label": "false"}],
     "unpaired preference rows (KTO", "train.objective: kto"),
], ids=["dpo-file", "kto-file", "kto-label-as-text"])
def test_other_kinds_of_data_are_refused_in_an_sft_recipe(models, tmp_path, rows, kind, setting):
    with pytest.raises(XtrainError, match="not supervised chat data") as info:
        run(models["qwen2_5"], rows, tmp_path)
    assert kind in str(info.value) and setting in str(info.value)


def test_unused_columns_are_listed_as_ignored(models, tmp_path):
    rows = [{**openai_row(i), "id": i, "source": "web"} for i in range(30)]
    manifest, _ = run(models["qwen2_5"], rows, tmp_path)
    assert next(iter(manifest["sources"].values()))["ignored_columns"] == ["id", "source"]


def test_a_plain_text_corpus_is_split_into_blocks_never_cut(models, tmp_path):
    """A .txt corpus, one document per line, many longer than seq_len: ≥ 99% of its tokens are kept."""
    from transformers import AutoTokenizer

    lines = [" ".join(f"word{(i * 7 + j) % 50}" for j in range(40 + 30 * (i % 9))) for i in range(60)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(lines) + "\n")  # blank lines between documents are not documents
    data = Data(sources=[DataSource(path=str(corpus))], seq_len=128, eval_fraction=0.1, block_stride=128)
    manifest = prepare([corpus], models["qwen2_5"], data, tmp_path / "prepared")
    tokenizer = AutoTokenizer.from_pretrained(models["qwen2_5"])
    total = sum(len(tokenizer(line)["input_ids"]) + 1 for line in lines)  # + the end-of-sequence token
    kept = sum(split["tokens"] for split in manifest["splits"].values())
    stats = next(iter(manifest["sources"].values()))
    assert stats["rows"] == 60 and stats["kept"] == 60
    block_rows = sum(len(tokenizer(line)["input_ids"]) + 1 > 128 for line in lines)
    assert stats["blocks"] == sum(-(-(len(tokenizer(line)["input_ids"]) + 1) // 128) for line in lines
                                  if len(tokenizer(line)["input_ids"]) + 1 > 128) and block_rows > 0
    assert kept / total >= 0.99 and max(split["max_len"] for split in manifest["splits"].values()) <= 128
    whole = tmp_path / "whole.md"
    whole.write_text("# Title\n\nA paragraph.\n")
    data = Data(sources=[DataSource(path=str(whole), split="file")], seq_len=128, eval_fraction=0.5)
    with pytest.raises(XtrainError, match="split is empty"):  # one document: it cannot fill two splits
        prepare([whole], models["qwen2_5"], data, tmp_path / "whole")


def test_a_tools_list_given_per_source_serves_rows_without_their_own(models, tmp_path):
    rows = [openai_row(i) for i in range(30)]
    for row in rows:
        del row["tools"]
    _, prepared = run(models["qwen2_5"], rows, tmp_path / "per-source", source={"tools": [WEATHER_TOOL]})
    _, per_row = run(models["qwen2_5"], [openai_row(i) for i in range(30)], tmp_path / "per-row")
    read = [pq.read_table(folder / "train.parquet").column("input_ids").to_pylist() for folder in (prepared, per_row)]
    assert read[0] == read[1], "the same tokens as when every row lists the tool"


def test_real_sharegpt_function_calls_render_through_the_templates_tool_format(models, tmp_path):
    """glaive's function_call turns become tool calls that Qwen2.5's template writes as <tool_call> JSON (trained),
    its `tools` column the template's tool list (context), observations the tool's turn (context)."""
    rows = [r for r in json.loads((REPO / "data/real/glaive_toolcall_en_demo.json").read_text())
            if any(t["from"] == "function_call" for t in r["conversations"])][:40]
    manifest, prepared = run(models["qwen2_5"], rows, tmp_path)
    calls = {json.dumps(json.loads(t["value"]), ensure_ascii=False) for r in rows for t in r["conversations"]
             if t["from"] == "function_call"}
    observations = [t["value"] for r in rows for t in r["conversations"] if t["from"] == "observation"]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(models["qwen2_5"])
    for row in pq.read_table(prepared / "train.parquet").to_pylist():
        trained = [tokenizer.decode(run) for run in supervised_runs(row["input_ids"], row["assistant_masks"])]
        context = tokenizer.decode(row["input_ids"])
        written = [t.removeprefix("<tool_call>\n").removesuffix("\n</tool_call><|im_end|>") for t in trained
                   if t.startswith("<tool_call>")]
        assert written and all(call in calls for call in written), trained
        assert "# Tools" in context and "<tools>" in context, "the tool list is in the template's system turn"
        assert not any(o in "".join(trained) for o in observations), "tool results are context, never trained"
    assert next(iter(manifest["sources"].values()))["kept"] == 40


def test_reasoning_is_given_under_the_key_the_template_reads(tiny_model):
    """GPT-OSS's template reads an assistant turn's reasoning as `thinking`, Qwen3's as `reasoning_content`."""
    from transformers import AutoTokenizer

    from xtrain.data.chats import apply_reasoning
    from xtrain.data.templates import ChatTemplate, render

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    chat = {"messages": [{"role": "user", "content": "2+2?"},
                         {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."}],
            "tools": None}
    for name, key in (("gptoss", "thinking"), ("qwen3", "reasoning_content")):
        template = ChatTemplate(trl_template(name), None, "incremental rendering", name)
        kept = apply_reasoning(chat, "keep", template)
        assert kept["messages"][1][key] == "Two and two make four.", name
        assert "Two and two make four." in render(tokenizer, template.stock, kept["messages"]), name
    deepseek = ChatTemplate(trl_template("deepseekv3"), None, "incremental rendering", "deepseekv3")
    with pytest.raises(XtrainError, match="does not render assistant reasoning"):
        apply_reasoning(chat, "keep", deepseek)


def test_placeholders_are_filled_in_reasoning_and_tool_arguments_too(models, tmp_path):
    rows = [{"messages": [
        {"role": "user", "content": f"Weather for {{{{name}}}}'s city {i}?"},
        {"role": "assistant", "content": "", "reasoning_content": "{{name}} asked.",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "{{city}}"}}}]},
        {"role": "tool", "content": "Sunny"},
        {"role": "assistant", "content": "Sunny, {{name}}."}], "tools": [WEATHER_TOOL]} for i in range(30)]
    _, prepared = run(models["qwen3"], rows, tmp_path, source={"replace": {"name": "Ada", "city": "Paris"}})
    texts = "".join("".join(row) for row in supervised_texts(models["qwen3"], prepared))
    assert "{{" not in texts and '"city": "Paris"' in texts and "Sunny, Ada." in texts


def test_a_chat_the_template_refuses_is_an_error_naming_the_chat(tiny_model):
    from transformers import AutoTokenizer

    from xtrain.data.templates import ChatTemplate
    from xtrain.data.tokenize import encode_chats

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    strict = ("{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('Tool turns are not supported') }}"
              "{% endif %}{{ m.role + ': ' + m.content + '\\n' }}{% endfor %}")
    template = ChatTemplate(strict, None, "incremental rendering", "data.chat_template 'strict'")
    chat = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Asking."},
            {"role": "tool", "content": "Sunny"}, {"role": "assistant", "content": "Sunny."}]
    with pytest.raises(XtrainError, match="'strict' cannot render the chat that begins 'Weather\\?': Tool turns"):
        encode_chats(tokenizer, template, [chat], [None])
