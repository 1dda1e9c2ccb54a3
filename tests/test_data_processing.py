"""What prepare does between reading and writing: dedupe, loss masking options, the chat template checks,
over-length rows, packing (and that packed sequences stay apart in the model), and preview.txt."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from test_data import chat, leftovers, model_with_template, qa, write_jsonl

from xtrain.data import prepare
from xtrain.data.lengths import model_positions
from xtrain.errors import XtrainError
from xtrain.models.tiny import CHATML_TEMPLATE
from xtrain.recipe import Data, DataSource

ALPACA = Path(__file__).parents[1] / "data/real/alpaca_en_demo.json"


def run(model_dir: Path, out: Path, *paths: Path, **settings) -> dict:
    data = Data(sources=[DataSource(path=str(p)) for p in paths], **{"seq_len": 128, "eval_fraction": 0.2, **settings})
    return prepare(list(paths), model_dir, data, out)


def rows(out: Path, name: str = "train") -> list[dict]:
    return pq.read_table(out / f"{name}.parquet").to_pylist()


# --- dedupe ---------------------------------------------------------------------------------------

STORY = ("The little red fox ran across the snowy field at dawn, looking for the warm den it had left the night "
         "before, while the crows watched quietly from the old oak tree near the frozen river bank.")


def test_exact_dedupe_ignores_case_and_spacing(tiny_model, tmp_path):
    rows_in = [qa(i) for i in range(20)] + [chat(("user", "WHAT is cat   number 0?"), ("assistant", "It is cat 0."))]
    manifest = run(tiny_model, tmp_path / "out", write_jsonl(tmp_path / "c.jsonl", rows_in))
    assert next(iter(manifest["sources"].values()))["dropped"] == {"duplicate": 1}


def test_near_duplicates_are_dropped_only_when_asked(tiny_model, tmp_path):
    near = chat(("user", "Tell me a story."), ("assistant", STORY.replace("little", "small")))
    original = chat(("user", "Tell me a story."), ("assistant", STORY))
    source = write_jsonl(tmp_path / "c.jsonl", [original] + [qa(i) for i in range(20)] + [near])
    on = run(tiny_model, tmp_path / "on", source, near_dedupe_threshold=0.7)
    off = run(tiny_model, tmp_path / "off", source)
    assert on["sources"][str(source)]["dropped"] == {"near duplicate": 1}
    assert off["sources"][str(source)]["dropped"] == {}


# --- masking options and template checks ----------------------------------------------------------


def test_train_on_inputs_supervises_every_token(tiny_model, tmp_path):
    manifest = run(tiny_model, tmp_path / "out", write_jsonl(tmp_path / "c.jsonl", [qa(i) for i in range(20)]),
                   train_on_inputs=True)
    assert manifest["splits"]["train"]["supervised_fraction"] == 1.0
    assert all(set(row["assistant_masks"]) == {1} for row in rows(tmp_path / "out"))


def test_a_template_named_in_the_recipe_replaces_the_tokenizers(tiny_model, tmp_path):
    # Without generation blocks or a generation prompt, the tokenizer's template cannot be masked.
    unmaskable = CHATML_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "").replace(
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}", "")
    plain = model_with_template(tiny_model, tmp_path, unmaskable)
    source = write_jsonl(tmp_path / "c.jsonl", [qa(i) for i in range(20)])
    with pytest.raises(XtrainError, match="no {% generation %} block"):
        run(plain, tmp_path / "refused", source)
    manifest = run(plain, tmp_path / "out", source, chat_template="chatml")
    assert 0 < manifest["splits"]["train"]["supervised_fraction"] < 1


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        pytest.param(CHATML_TEMPLATE.replace("+ '<|im_end|>' }}{% endgeneration %}", "}}{% endgeneration %}"
                                             "{{ '<|im_end|>' }}"),
                     "does not train on the end-of-turn token '<|im_end|>'", id="end-of-turn-outside-block"),
        pytest.param(CHATML_TEMPLATE.replace("{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}",
                                             "{% generation %}{% endgeneration %}{{ message['content'] + '<|im_end|>' }}"),
                     "masks every token", id="empty-generation-block"),
    ],
)
def test_templates_that_would_train_badly_are_refused(tiny_model, tmp_path, template, expected):
    assert template != CHATML_TEMPLATE
    model = model_with_template(tiny_model, tmp_path, template)
    with pytest.raises(XtrainError, match=expected):
        run(model, tmp_path / "prepared" / "x", write_jsonl(tmp_path / "c.jsonl", [qa(i) for i in range(20)]))
    assert leftovers(tmp_path / "prepared") == []


# --- length handling ------------------------------------------------------------------------------


def test_over_length_rows_are_truncated_or_dropped_with_counts(tiny_model, tmp_path, caplog):
    long_answer = chat(("user", "Count."), ("assistant", " ".join(f"n{i}" for i in range(300))))
    long_prompt = chat(("user", " ".join(f"w{i}" for i in range(300))), ("assistant", "Done."))
    source = write_jsonl(tmp_path / "c.jsonl", [qa(i) for i in range(20)] + [long_answer, long_prompt])
    dropped = run(tiny_model, tmp_path / "drop", source, seq_len=64)
    with caplog.at_level(logging.WARNING, logger="xtrain.data.pipeline"):
        truncated = run(tiny_model, tmp_path / "cut", source, seq_len=64, over_length="truncate", drop_warning=0.04)
    assert dropped["sources"][str(source)]["dropped"] == {"over seq_len": 2}
    stats = truncated["sources"][str(source)]
    # The long prompt leaves nothing to train on once cut; the long answer keeps its first tokens.
    assert (stats["kept"], stats["truncated"], stats["dropped"]) == (21, 1, {"no supervised tokens": 1})
    lengths = [len(r["input_ids"]) for name in ("train", "eval") for r in rows(tmp_path / "cut", name)]
    assert max(lengths) == 64
    # Cutting answers is said on the console with its count, as drops are, and with the seq_len that keeps them.
    cut = next(w for w in truncated["warnings"] if "truncated" in w)
    assert cut in caplog.messages
    assert re.search(r"1 of 22 rows \(5%\) truncated to data.seq_len 64 .*end-of-turn token.*not trained; "
                     r".*data.seq_len: \d+ keeps .*, or data.over_length: drop leaves them out", cut), cut


def test_a_seq_len_beyond_the_models_positions_is_refused_naming_both(tiny_model, tmp_path):
    source = write_jsonl(tmp_path / "c.jsonl", [qa(i) for i in range(20)])
    with pytest.raises(XtrainError, match=r"data.seq_len 2048 is longer than the model's 1024 positions "
                                          r"\(max_position_embeddings and rope_scaling in .*config.json\)"):
        run(tiny_model, tmp_path / "out", source, seq_len=2048)
    assert not (tmp_path / "out").exists()
    # RoPE scaling that stretches the trained positions counts; Llama 3's already counts in max_position_embeddings.
    assert model_positions({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4}}) == 16384
    assert model_positions({"max_position_embeddings": 32768, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}) == 131072
    assert model_positions({"max_position_embeddings": 131072, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}}) == 131072
    assert model_positions({"n_positions": 1024}) == 1024 and model_positions({}) is None


# --- packing --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def packed_alpaca(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("packed")
    settings = {"seq_len": 1024, "eval_fraction": 0.1}
    return {
        "packed": (run(tiny_model, folder / "packed", ALPACA, packing=True, **settings), folder / "packed"),
        "plain": (run(tiny_model, folder / "plain", ALPACA, **settings), folder / "plain"),
    }


def test_packing_keeps_every_sequence_whole_and_fills_bins(packed_alpaca):
    (packed, packed_dir), (plain, plain_dir) = packed_alpaca["packed"], packed_alpaca["plain"]
    sequences = []
    for row in rows(packed_dir):
        assert sum(row["seq_lengths"]) == len(row["input_ids"]) == len(row["assistant_masks"]) <= 1024
        start = 0
        for n in row["seq_lengths"]:
            sequences.append((tuple(row["input_ids"][start:start + n]), tuple(row["assistant_masks"][start:start + n])))
            start += n
    unpacked = [(tuple(r["input_ids"]), tuple(r["assistant_masks"])) for r in rows(plain_dir)]
    assert sorted(sequences) == sorted(unpacked)
    stats = packed["splits"]["train"]
    assert stats["examples"] == plain["splits"]["train"]["rows"] and stats["rows"] < stats["examples"] / 2
    assert stats["packing_efficiency"] >= 0.97  # the target for this file at seq_len 1024
    assert stats["packing_efficiency"] == round(stats["tokens"] / (stats["rows"] * 1024), 4)
    assert rows(packed_dir, "eval") == rows(plain_dir, "eval"), "the eval split is never packed"


def sequence_losses(model, ids: torch.Tensor, labels: torch.Tensor, lengths: list[int], position_ids=None):
    """Mean next-token loss of each sequence (of `lengths`) laid end to end in one row."""
    logits = model(input_ids=ids, position_ids=position_ids, use_cache=False).logits[0]
    nll = torch.nn.functional.cross_entropy(logits[:-1], labels[0, 1:], ignore_index=-100, reduction="none")
    losses, start = [], 0
    for n in lengths:
        targets = labels[0, start + 1:start + n] != -100
        losses.append((nll[start:start + n - 1][targets].sum() / targets.sum()).item())
        start += n
    return losses


def test_packed_batch_gives_each_sequence_its_own_loss(tiny_model, packed_alpaca):
    from transformers import AutoModelForCausalLM
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    model.config.use_cache = False  # as the trl_cpu backend sets it
    row = next(r for r in rows(packed_alpaca["packed"][1]) if len(r["seq_lengths"]) >= 3)
    lengths = row["seq_lengths"]
    labels = [t if m else -100 for t, m in zip(row["input_ids"], row["assistant_masks"])]
    # The batch exactly as SFTTrainer builds it for padding-free training from prepare's columns.
    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(
        [{"input_ids": row["input_ids"], "labels": labels, "seq_lengths": lengths}]
    )
    assert batch["position_ids"][0].tolist() == [i for n in lengths for i in range(n)]
    with torch.no_grad():
        packed = sequence_losses(model, batch["input_ids"], batch["labels"], lengths, batch["position_ids"])
        alone, start = [], 0
        for n in lengths:
            piece = slice(start, start + n)
            alone += sequence_losses(model, torch.tensor([row["input_ids"][piece]]), torch.tensor([labels[piece]]), [n])
            start += n
        # The same row without restarting positions lets later sequences see earlier ones: the check can tell.
        leaky = sequence_losses(model, batch["input_ids"], batch["labels"], lengths)
    assert packed == pytest.approx(alone, abs=1e-5)
    assert all(abs(a - b) > 1e-4 for a, b in zip(leaky[1:], alone[1:]))


# --- preview --------------------------------------------------------------------------------------


def test_preview_marks_exactly_the_trained_tokens(tiny_model, tmp_path):
    run(tiny_model, tmp_path / "out", write_jsonl(tmp_path / "c.jsonl", [qa(i) for i in range(20)]))
    text = (tmp_path / "out" / "preview.txt").read_text()
    first = rows(tmp_path / "out")[0]
    assert "=== example 1:" in text
    assert f"{len(first['input_ids'])} tokens, {sum(first['assistant_masks'])} trained" in text
    assert "<|im_start|>assistant\n⟪It is " in text and "<|im_end|>⟫" in text
    assert "⟪" not in text.split("<|im_start|>assistant")[0].split("===")[-1]


# --- packed data really trains --------------------------------------------------------------------


@pytest.mark.slow
def test_packed_data_trains_through_trl_cpu_and_evaluates(tiny_model, tmp_path):
    from xtrain.evaluate import evaluate
    from xtrain.plan import make_plan, write_plan
    from xtrain.recipe import Eval, Hardware, Train
    from xtrain.train.run import run_training

    demo = Path(__file__).parents[1] / "data/demo/chat.jsonl"
    prepared = tmp_path / "prepared"
    manifest = run(tiny_model, prepared, demo, seq_len=128, eval_fraction=0.1, packing=True)
    train = Train(method="lora", global_batch_size=4, max_steps=10, learning_rate=5e-3, logging_steps=2)
    write_plan(tmp_path / "plan.json", make_plan(tiny_model, manifest, train, Hardware()))
    metrics = run_training(model_dir=tiny_model, prepared_dir=prepared, plan_path=tmp_path / "plan.json",
                           train=train, hardware=Hardware(), out=tmp_path / "ckpt", work_dir=tmp_path / "runs")
    assert metrics["steps"] == 10
    # Every packed row is fed whole (padding-free: no pad tokens are counted).
    rows_seen = 10 * 4
    packed_rows = rows(prepared)
    assert metrics["tokens_seen"] <= rows_seen * 128 and metrics["tokens_seen"] > rows_seen * 128 * 0.9
    assert manifest["splits"]["train"]["rows"] == len(packed_rows)
    report = evaluate(tiny_model, tmp_path / "ckpt", prepared, Eval(batch_size=8), tmp_path / "eval.json")
    assert report["tuned_loss"] < report["base_loss"]
