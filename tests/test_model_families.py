"""Models as users bring them: tokenizers carrying a family's stock chat template (TRL's bundled copies, and
Mistral's `[INST]` template as its checkpoints ship it) and the family's special tokens, on the demo's tiny
model. Each trains on exactly the assistant's answers plus the end-of-turn token, and its checkpoint stops
there in plain transformers `generate()`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import REPO, supervised_runs

from xtrain.artifacts import read_json
from xtrain.data import prepare
from xtrain.data.templates import trl_template
from xtrain.plan import make_plan, write_plan
from xtrain.recipe import Data, DataSource, Hardware, Train
from xtrain.train.run import run_training

MISTRAL = (  # mistralai/Mistral-7B-Instruct-v0.1's tokenizer_config.json chat_template
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
# family -> (stock template, special tokens, bos, eos as the tokenizer config names it, end of turn, masking method,
# whether it renders a system turn). Llama 3.1's base tokenizer ends sequences with <|end_of_text|>; the chat
# turn ends with <|eot_id|>, which the checkpoint's generation config must add.
FAMILIES = {
    "qwen2_5": (trl_template("qwen2_5"), ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"],
                None, "<|im_end|>", "<|im_end|>", "TRL training variant", True),
    "qwen3": (trl_template("qwen3"), ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
                                      "<tool_call>", "</tool_call>"], None, "<|im_end|>", "<|im_end|>",
              "TRL training variant (its own rendering of multi-turn chats)", True),
    "llama3_1": (trl_template("llama3_1"), ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                            "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
                 "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "incremental rendering", True),
    "gemma3": (trl_template("gemma3"), ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"], "<bos>", "<eos>",
               "<end_of_turn>", "TRL training variant", True),
    "phi3": (trl_template("phi3"), ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>"], None,
             "<|endoftext|>", "<|end|>", "TRL training variant", True),
    "mistral": (MISTRAL, ["<s>", "</s>"], "<s>", "</s>", "</s>", "incremental rendering", False),
}
ANSWER = "Sure thing."
# What precedes the answer in an assistant turn: Qwen3 answers after its (here empty) reasoning block.
REASONING = {"qwen3": "<think>\n\n</think>\n\n"}


def rows(system: bool) -> list[dict]:
    """Single- and multi-turn chats, with a system turn where the template renders one; one short answer that a
    tiny model learns, so that generation can show where it stops."""
    out = []
    for i in range(48):
        messages = [{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"},
                    {"role": "assistant", "content": ANSWER}]
        if i % 3 == 1:
            messages += [{"role": "user", "content": f"And {i} times two?"}, {"role": "assistant", "content": ANSWER}]
        if system and i % 3 == 2:
            messages = [{"role": "system", "content": "Answer briefly."}, *messages]
        out.append({"messages": messages})
    return out


def family_tokenizer(base: Path, family: str, eos: str | None = None):
    """The tiny model's tokenizer with the family's special tokens and stock template; `eos`: the end-of-sequence
    token where a checkpoint's differs from the family's (an instruct tokenizer's is its end of turn)."""
    from transformers import AutoTokenizer

    template, tokens, bos, family_eos, *_ = FAMILIES[family]
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    tokenizer.bos_token, tokenizer.eos_token = bos or tokenizer.bos_token, eos or family_eos
    tokenizer.chat_template = template
    return tokenizer


def published_config(name: str) -> dict:
    """A model's config.json as its hub repository publishes it (tests/data/model_configs/)."""
    return json.loads((REPO / "tests/data/model_configs" / f"{name}.json").read_text())


def config_only_model(base: Path, out: Path, family: str, config: dict, eos: str | None = None,
                      template: str | None = None) -> Path:
    """A model folder as `xtrain smoke` may meet it before the weights are downloaded: `config` as config.json and
    the family's tokenizer (family_tokenizer; `template` in place of its stock one), no weights."""
    tokenizer = family_tokenizer(base, family, eos)
    tokenizer.chat_template = template or tokenizer.chat_template
    tokenizer.save_pretrained(out)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def family_model(base: Path, folder: Path, family: str) -> Path:
    """The tiny model with the family's special tokens (embeddings resized) and its stock template."""
    from transformers import AutoModelForCausalLM

    out = folder / family
    shutil.copytree(base, out)
    tokenizer = family_tokenizer(out, family)
    model = AutoModelForCausalLM.from_pretrained(out)
    model.resize_token_embeddings(len(tokenizer))
    model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def families(tiny_model, tmp_path_factory) -> dict[str, dict]:
    """Each family's model prepared, planned and trained (full fine-tune, 60 steps: enough to learn the answer)."""
    built = {}
    for family, (*_, system) in FAMILIES.items():
        folder = tmp_path_factory.mktemp(family)
        model = family_model(tiny_model, folder, family)
        source = folder / "chat.jsonl"
        source.write_text("".join(json.dumps(row) + "\n" for row in rows(system)))
        data = Data(sources=[DataSource(path=str(source))], seq_len=256, eval_fraction=0.1)
        manifest = prepare([source], model, data, folder / "prepared")
        train = Train(method="full", global_batch_size=8, max_steps=60, learning_rate=3e-3, lr_scheduler="constant")
        write_plan(folder / "plan.json", make_plan(model, manifest, train, Hardware()))
        run_training(model_dir=model, prepared_dir=folder / "prepared", plan_path=folder / "plan.json", train=train,
                     hardware=Hardware(), out=folder / "checkpoint", work_dir=folder / "runs")
        built[family] = {"model": model, "prepared": folder / "prepared", "checkpoint": folder / "checkpoint",
                         "manifest": manifest}
    return built


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_only_each_answer_and_its_end_of_turn_token_are_trained(families, family):
    from transformers import AutoTokenizer

    *_, end_of_turn, method, system = FAMILIES[family]
    built = families[family]
    assert built["manifest"]["masking"] == method
    assert built["manifest"]["end_of_turn"]["token"] == end_of_turn
    tokenizer = AutoTokenizer.from_pretrained(built["model"])
    table = pq.read_table(built["prepared"] / "train.parquet").to_pylist()
    for row in table:
        texts = [tokenizer.decode(run) for run in supervised_runs(row["input_ids"], row["assistant_masks"])]
        assert texts and all(text.strip() == REASONING.get(family, "") + ANSWER + end_of_turn for text in texts), texts
        assert len(texts) == tokenizer.decode(row["input_ids"]).count(ANSWER)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_checkpoint_ships_the_stock_template_and_stops_at_the_end_of_turn(families, family):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    template, *_, end_of_turn, _, _ = FAMILIES[family]
    checkpoint = families[family]["checkpoint"]
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert tokenizer.chat_template == template, "the stock template, not TRL's training variant"
    config = GenerationConfig.from_pretrained(checkpoint)
    eot = tokenizer.convert_tokens_to_ids(end_of_turn)
    assert eot in ([config.eos_token_id] if isinstance(config.eos_token_id, int) else config.eos_token_id)
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Question 99: what is 99 plus 99?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    output = model.generate(**prompt, max_new_tokens=24, do_sample=False)[0, prompt["input_ids"].shape[1]:].tolist()
    assert output[-1] == eot and len(output) < 24, f"generation ran on: {tokenizer.decode(output)!r}"
    assert tokenizer.decode(output[:-1]).strip() == (REASONING.get(family, "") + ANSWER).strip()


@pytest.mark.slow
def test_the_checkpoint_has_a_model_card(families):
    card = (families["llama3_1"]["checkpoint"] / "README.md").read_text()
    header = card.split("---")[1]
    assert "base_model:" in header and "library_name: transformers" in header
    manifest = read_json(families["llama3_1"]["prepared"] / "manifest.json")
    assert manifest["fingerprint"] in card and "incremental rendering" in card


def test_family_names_are_templates_trl_ships():
    from xtrain.recipe import CHAT_TEMPLATE_FAMILIES

    for family in CHAT_TEMPLATE_FAMILIES:
        assert trl_template(family)
    assert (REPO / "docs" / "recipe.md").read_text().count("llama3_1") >= 1
