"""The export stage: merged model, GGUF files read back by transformers (and llama.cpp where it is installed),
the Ollama Modelfile, the chat command in a terminal, and the export rule in real Snakemake."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import HANG_SECONDS, REPO, copy_workflow, scheduled_jobs, snakemake

from xtrain.data import prepare
from xtrain.errors import RecipeError, XtrainError
from xtrain.evaluate import evaluate
from xtrain.export import export
from xtrain.export.gguf_file import adds_bos, gguf_architecture, permute_for_rope, write_gguf
from xtrain.export.ollama import modelfile
from xtrain.plan import make_plan, write_plan
from xtrain.recipe import Data, DataSource, Eval, Export, Hardware, Lora, Train, parse_recipe
from xtrain.train.run import run_training

pytestmark = pytest.mark.slow

# Documented in docs/export.md: q8_0 keeps each weight to 1/254 of its block's largest value; on the demo
# model the largest per-token log-prob difference from the merged fp32 model is ~3e-3.
Q8_0_LOGPROB_TOLERANCE = 0.05
PROMPTS = ("What is the capital of France?", "What colour is the sky?", "Name a fruit.")
TMUX = "/usr/bin/tmux"


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory) -> dict[str, Path]:
    """The demo data and a LoRA adapter on every linear layer, trained long enough to answer and stop."""
    root = tmp_path_factory.mktemp("export-run")
    data = Data(sources=[DataSource(path=str(REPO / "data/demo/chat.jsonl"))], seq_len=128, eval_fraction=0.1)
    train = Train(epochs=3, global_batch_size=8, learning_rate=5e-3, lora=Lora(dropout=0, target_modules=["all-linear"]))
    manifest = prepare([REPO / "data/demo/chat.jsonl"], tiny_model, data, root / "prepared")
    write_plan(root / "plan.json", make_plan(tiny_model, manifest, train, Hardware()))
    run_training(model_dir=tiny_model, prepared_dir=root / "prepared", plan_path=root / "plan.json", train=train,
                 hardware=Hardware(), out=root / "checkpoint", work_dir=root / "runs")
    evaluation = evaluate(tiny_model, root / "checkpoint", root / "prepared", Eval(generations=0), root / "eval.json")
    out = root / "exports" / "demo"
    export(model_dir=tiny_model, checkpoint_dir=root / "checkpoint", prepared_dir=root / "prepared",
           evaluation=evaluation, settings=Export(gguf=["f16", "bf16", "q8_0"], ollama=True), train=train,
           hardware=Hardware(), out=out)
    return {"model": tiny_model, "checkpoint": root / "checkpoint", "prepared": root / "prepared", "export": out,
            "evaluation": evaluation, "train": train}


def test_export_folder_holds_every_file(trained):
    out = trained["export"]
    files = json.loads((out / "export.json").read_text())["files"]
    assert {"demo-f16.gguf", "demo-bf16.gguf", "demo-q8_0.gguf", "Modelfile", "merged/model.safetensors",
            "merged/config.json", "merged/tokenizer.json", "merged/chat_template.jinja",
            "merged/generation_config.json", "merged/README.md"} <= set(files)
    assert all((out / name).stat().st_size == size for name, size in files.items())
    assert not (out / "merged/adapter_config.json").exists()
    card = (out / "merged/README.md").read_text()
    assert "library_name: transformers" in card and "LoRA adapter merged into the base weights" in card
    assert 'AutoModelForCausalLM.from_pretrained("<this folder>")' in card and "llama-cli" not in card
    eos = json.loads((out / "merged/generation_config.json").read_text())["eos_token_id"]
    assert eos == json.loads((trained["checkpoint"] / "generation_config.json").read_text())["eos_token_id"]
    assert (out / "merged/chat_template.jinja").read_text() == (trained["checkpoint"] / "chat_template.jinja").read_text()


def test_the_export_card_carries_the_evaluation(trained):
    """exports/<recipe>/README.md: the model card of what was exported, with eval.json's figures in its text and
    in Hugging Face's `model-index` header."""
    import yaml

    card = (trained["export"] / "README.md").read_text()
    header = yaml.safe_load(card.split("---")[1])
    assert header["tags"] == ["xtrain", "trl_cpu", "lora", "sft", "merged", "gguf"]
    results = header["model-index"][0]["results"][0]["metrics"]
    tuned_loss = trained["evaluation"]["tuned_loss"]
    assert {"type": "loss", "value": round(tuned_loss, 6), "name": "tuned loss"} in results
    assert f"| loss | {trained['evaluation']['base_loss']:.4g} | {tuned_loss:.4g} |" in card
    assert 'from_pretrained("merged")' in card and "llama-cli -m demo-q8_0.gguf -cnv" in card
    assert "ollama create <name> -f Modelfile" in card


def test_gguf_streamed_from_the_merged_shards_holds_the_merged_tensors(trained, tmp_path):
    """An f32 file written from merged/ one tensor at a time holds every merged tensor under its GGUF name, the
    q/k projections in llama.cpp's rope layout, and nothing else."""
    import gguf
    import numpy as np
    from safetensors.torch import load_file
    from transformers import AutoConfig

    merged = trained["export"] / "merged"
    write_gguf(merged, trained["checkpoint"], tmp_path / "demo-f32.gguf", "f32", "demo", None)
    config = AutoConfig.from_pretrained(merged)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    expected = {}
    for hf_name, tensor in load_file(merged / "model.safetensors").items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        role = name.split(".")[-2]
        expected[name] = permute_for_rope(tensor.numpy(), heads[role]) if role in heads else tensor.numpy()
    written = {tensor.name: tensor.data for tensor in gguf.GGUFReader(tmp_path / "demo-f32.gguf").tensors}
    assert written.keys() == expected.keys()
    for name, array in expected.items():
        np.testing.assert_array_equal(written[name], array, err_msg=name)


def test_an_export_without_merged_leaves_no_merged_shards(trained, tmp_path, monkeypatch):
    """The GGUF file is streamed from scratch shards in the staging folder (several here: 1 MB each), which are gone
    once the folder is published; it holds the same tensors and metadata as the one written beside merged/."""
    import gguf

    import xtrain.export.run as run

    shard_counts = []
    write_gguf = run.write_gguf
    monkeypatch.setattr(run, "write_gguf", lambda merged, *args: shard_counts.append(
        len(list(merged.glob("*.safetensors")))) or write_gguf(merged, *args))
    exports = tmp_path / "exports"
    summary = export(model_dir=trained["model"], checkpoint_dir=trained["checkpoint"], prepared_dir=trained["prepared"],
                     evaluation=trained["evaluation"], settings=Export(merged=False, gguf=["q8_0"], shard_gb=0.001),
                     train=trained["train"], hardware=Hardware(), out=exports / "demo")
    assert shard_counts[0] > 1
    assert set(summary["files"]) == {"demo-q8_0.gguf", "README.md"}
    assert set(summary["seconds"]) == {"merge", "gguf_q8_0"}
    assert sorted(path.relative_to(exports).as_posix() for path in exports.rglob("*")) == [
        "demo", "demo/README.md", "demo/demo-q8_0.gguf", "demo/export.json"]
    streamed, beside_merged = (gguf.GGUFReader(folder / "demo-q8_0.gguf") for folder in (exports / "demo",
                                                                                          trained["export"]))
    assert {t.name: t.data.tobytes() for t in streamed.tensors} == {t.name: t.data.tobytes()
                                                                    for t in beside_merged.tensors}
    assert {key: field.contents() for key, field in streamed.fields.items() if not key.startswith("GGUF.")} == {
        key: field.contents() for key, field in beside_merged.fields.items() if not key.startswith("GGUF.")}


def test_a_bf16_base_is_merged_in_bf16_and_exported_as_before(trained, tmp_path, monkeypatch):
    """No float32 pass: the adapter is merged into the base loaded in bfloat16, merged/ holds bfloat16 weights, and
    the export's files, export.json keys, card and Modelfile are those of the float32 export but for the dtype."""
    import shutil

    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    import xtrain.export.merge as merge

    base = tmp_path / "base-bf16"
    shutil.copytree(trained["model"], base)
    AutoModelForCausalLM.from_pretrained(trained["model"], dtype=torch.bfloat16).save_pretrained(base)
    loaded_in = []
    load_tuned = merge.load_tuned
    monkeypatch.setattr(merge, "load_tuned", lambda *args, **kwargs: loaded_in.append(kwargs["dtype"]) or load_tuned(
        *args, **kwargs))
    out = tmp_path / "exports" / "demo"
    summary = export(model_dir=base, checkpoint_dir=trained["checkpoint"], prepared_dir=trained["prepared"],
                     evaluation=trained["evaluation"], settings=Export(gguf=["f16", "bf16", "q8_0"], ollama=True),
                     train=trained["train"], hardware=Hardware(), out=out)
    assert loaded_in == ["bfloat16"]
    with safe_open(out / "merged/model.safetensors", "pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {"BF16"}
    assert json.loads((out / "merged/config.json").read_text())["dtype"] == "bfloat16"
    before = json.loads((trained["export"] / "export.json").read_text())
    assert summary["files"].keys() == before["files"].keys() and summary["seconds"].keys() == before["seconds"].keys()
    for card in ("README.md", "merged/README.md"):
        text = (out / card).read_text()
        assert "bfloat16 weights" in text
        assert text.replace("bfloat16 weights", "float32 weights") == (trained["export"] / card).read_text()
    assert (out / "Modelfile").read_text() == (trained["export"] / "Modelfile").read_text()


MERGED_VS_ADAPTER = """
import json, sys, torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer
base_dir, checkpoint, merged_dir, prompts = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
tokenizer = AutoTokenizer.from_pretrained(checkpoint)
tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), checkpoint).eval()
merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
diffs = []
with torch.no_grad():
    for prompt in prompts:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, return_tensors="pt").input_ids
        diffs.append((tuned(ids).logits - merged(ids).logits).abs().max().item())
print(json.dumps({"max_abs_diff": max(diffs), "merged_class": type(merged).__name__}))
"""


def test_merged_logits_equal_base_plus_adapter_in_a_fresh_interpreter(trained):
    result = subprocess.run(
        [sys.executable, "-c", MERGED_VS_ADAPTER, str(trained["model"]), str(trained["checkpoint"]),
         str(trained["export"] / "merged"), json.dumps(PROMPTS)],
        capture_output=True, text=True, timeout=HANG_SECONDS, check=True,
    )
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["merged_class"] == "LlamaForCausalLM"
    assert measured["max_abs_diff"] < 1e-4


def load_merged(trained):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    merged = trained["export"] / "merged"
    return AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(merged)


def load_gguf(trained, kind: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = trained["export"], f"demo-{kind}.gguf"
    return (AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(folder, gguf_file=name))


def prompt_text(tokenizer, prompt: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)


def greedy16(model, ids):
    """The first 16 greedy tokens (past any end-of-turn token, so all 16 are compared)."""
    return model.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False)[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_gguf_read_back_by_transformers_gives_the_same_greedy_tokens(trained, kind):
    merged, tokenizer = load_merged(trained)
    model, gguf_tokenizer = load_gguf(trained, kind)
    assert gguf_tokenizer.chat_template == tokenizer.chat_template
    for prompt in PROMPTS:
        text = prompt_text(tokenizer, prompt)
        assert gguf_tokenizer(text).input_ids == tokenizer(text).input_ids
        ids = tokenizer(text, return_tensors="pt").input_ids
        assert greedy16(model, ids) == greedy16(merged, ids), prompt


def continuation_logprobs(model, ids, continuation):
    import torch

    full = torch.cat([ids, torch.tensor([continuation])], dim=1)
    with torch.no_grad():
        logprobs = torch.log_softmax(model(full).logits[0, :-1].float(), dim=-1)
    return logprobs[ids.shape[1] - 1:].gather(-1, full[0, ids.shape[1]:, None])[:, 0]


def test_gguf_q8_0_log_probs_within_the_documented_tolerance(trained):
    merged, tokenizer = load_merged(trained)
    model, _ = load_gguf(trained, "q8_0")
    worst = 0.0
    for prompt in PROMPTS:
        ids = tokenizer(prompt_text(tokenizer, prompt), return_tensors="pt").input_ids
        continuation = greedy16(merged, ids)
        diff = (continuation_logprobs(model, ids, continuation) - continuation_logprobs(merged, ids, continuation))
        worst = max(worst, diff.abs().max().item())
    assert 0 < worst < Q8_0_LOGPROB_TOLERANCE


def test_gguf_read_back_by_llama_cpp_where_installed(trained):
    """llama.cpp's own runtime: same prompt tokens, same greedy answer up to 16 tokens or its end of turn."""
    import torch

    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (it builds from source)")
    merged, tokenizer = load_merged(trained)
    for kind in ("f16", "bf16"):
        runtime = llama_cpp.Llama(str(trained["export"] / f"demo-{kind}.gguf"), n_ctx=256, verbose=False, seed=0)
        for prompt in PROMPTS:
            text = prompt_text(tokenizer, prompt)
            ids = tokenizer(text).input_ids
            assert runtime.tokenize(text.encode(), add_bos=True, special=True) == ids
            runtime.reset()
            tokens = []
            for token in runtime.generate(ids, temp=0.0, top_k=1):
                tokens.append(token)
                if len(tokens) == 16 or runtime.token_eos() == token:
                    break
            expected = merged.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids):]
            assert tokens == expected.tolist(), (kind, prompt)


def test_tuned_answer_ends_at_the_end_of_turn_token(trained):
    merged, tokenizer = load_merged(trained)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = tokenizer(prompt_text(tokenizer, "What is the capital of Japan?"), return_tensors="pt").input_ids
    answer = merged.generate(ids, max_new_tokens=48, do_sample=False)[0, ids.shape[1]:].tolist()
    assert answer[-1] == eot and len(answer) < 48, tokenizer.decode(answer)


def test_modelfile_template_and_stop_tokens(trained):
    text = (trained["export"] / "Modelfile").read_text()
    assert text.startswith("FROM ./demo-f16.gguf\n")
    assert "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}" in text
    assert 'PARAMETER stop "<|im_end|>"' in text
    assert "SYSTEM" not in text  # the demo template adds no default system prompt


def test_modelfile_carries_a_template_default_system_prompt_and_refuses_unknown_templates(trained):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained["checkpoint"])
    default = "You are a helpful AI assistant named Demo."
    tokenizer.chat_template = (
        "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n" + default + "<|im_end|>\\n' }}{% endif %}"
        + tokenizer.chat_template)
    assert f'SYSTEM """{default}"""' in modelfile(tokenizer, "m.gguf", ["<|im_end|>"])
    tokenizer.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(XtrainError, match="export.ollama: the chat template is none of ChatML, Llama 3"):
        modelfile(tokenizer, "m.gguf", ["<|im_end|>"])


def test_a_bos_token_that_is_chatmls_turn_marker_stays_part_of_the_turn(trained):
    """SmolLM2's tokenizer as shipped: bos_token `<|im_start|>` (never added on encoding) and its stock template,
    which adds a default system prompt; the Go template renders the same prompts, the default becomes SYSTEM."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained["checkpoint"])
    tokenizer.bos_token = "<|im_start|>"
    tokenizer.chat_template = (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    assert not adds_bos(tokenizer)
    text = modelfile(tokenizer, "m.gguf", ["<|im_end|>"])
    assert 'SYSTEM """You are a helpful AI assistant named SmolLM, trained by Hugging Face"""' in text


def test_unsupported_architecture_is_refused_by_name():
    from transformers import GPT2Config

    config = GPT2Config()
    config.architectures = ["GPT2LMHeadModel"]
    with pytest.raises(XtrainError, match="architecture GPT2LMHeadModel cannot be written as GGUF here; supported: "
                                          "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM"):
        gguf_architecture(config)


@pytest.mark.parametrize(("section", "message"), [
    ({"gguf": ["q4_k_m"]}, r"export.gguf\[0\]: Input should be 'f32', 'f16', 'bf16' or 'q8_0' \(got 'q4_k_m'\)"),
    ({"merged": True, "ollama": True}, "ollama: true needs a GGUF file"),
    ({"merged": False}, "export asks for nothing"),
    ({"gguf": ["f16", "f16"]}, "gguf lists a type twice"),
    ({"merged": True, "format": "x"}, "export.format: unknown field"),
])
def test_bad_export_sections_are_refused_naming_the_field(section, message):
    with pytest.raises(RecipeError, match=message):
        parse_recipe({"model": {"path": "m"}, "data": {"sources": [{"path": "d"}]}, "export": section}, "r.yaml")


class Terminal:
    """A tmux session on its own server socket, driven like a person at a terminal."""

    def __init__(self, command: list[str], cwd: Path):
        self.socket, self.name = f"xtrain-{uuid.uuid4().hex[:8]}", "chat"
        self.tmux("new-session", "-d", "-s", self.name, "-x", "200", "-y", "50", "-c", str(cwd),
                  " ".join(command) + "; echo CHAT-EXITED $?; sleep 30")

    def tmux(self, *args: str) -> str:
        return subprocess.run([TMUX, "-L", self.socket, *args], capture_output=True, text=True, check=True).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", self.name)

    def send(self, text: str) -> None:
        self.tmux("send-keys", "-t", self.name, "-l", text)
        self.tmux("send-keys", "-t", self.name, "Enter")

    def wait_for(self, predicate, timeout: float = HANG_SECONDS) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if predicate(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"timed out; the terminal shows:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run([TMUX, "-L", self.socket, "kill-server"], capture_output=True)


@pytest.mark.parametrize("folder", ["checkpoint", "export"])
def test_chat_in_a_terminal_answers_streams_resets_and_exits(trained, folder):
    terminal = Terminal([sys.executable, "-m", "xtrain.chat", str(trained[folder]), "--max-new-tokens", "48"],
                        trained["checkpoint"].parent)
    try:
        terminal.wait_for(lambda s: s.rstrip().endswith("you>"))
        terminal.send("What is the capital of Japan?")
        screen = terminal.wait_for(lambda s: s.count("you>") == 2)
        answer = screen.split("model> ")[1].split("\n")[0].strip()
        # The tuned model's own greedy answer, which stops at the end-of-turn token (a tiny model knows no capitals).
        merged, tokenizer = load_merged(trained)
        ids = tokenizer(prompt_text(tokenizer, "What is the capital of Japan?"), return_tensors="pt").input_ids
        expected = tokenizer.decode(merged.generate(ids, max_new_tokens=48, do_sample=False)[0, ids.shape[1]:],
                                    skip_special_tokens=True)
        assert answer and answer == expected.strip(), screen
        assert "on cpu in fp32" in screen  # no GPU here: the CPU, in float32
        terminal.send("/reset")
        terminal.wait_for(lambda s: "(new conversation)" in s and s.count("you>") == 3)
        if folder == "checkpoint":
            terminal.send("/exit")
        else:  # Ctrl-C at the prompt quits as cleanly
            terminal.tmux("send-keys", "-t", terminal.name, "C-c")
        screen = terminal.wait_for(lambda s: "CHAT-EXITED" in s)
        assert "CHAT-EXITED 0" in screen and "Traceback" not in screen
    finally:
        terminal.close()


def test_chat_streams_tokens_as_they_are_generated(trained):
    """TextStreamer writes each piece as soon as it decodes: the answer reaches stdout in several writes."""
    script = ("import sys, xtrain.chat as c\n"
              "writes = []\n"
              "real = sys.stdout.write\n"
              "sys.stdout.write = lambda s: (writes.append(s), real(s))[1]\n"
              "c.main([sys.argv[1], '--max-new-tokens', '16'])\n"
              "print('WRITES', sum(1 for w in writes if w.strip() and 'you>' not in w and 'model>' not in w))\n")
    result = subprocess.run([sys.executable, "-c", script, str(trained["checkpoint"])], input="Name a fruit.\n",
                            capture_output=True, text=True, timeout=HANG_SECONDS, check=True)
    assert int(result.stdout.rsplit("WRITES", 1)[1]) > 2, result.stdout


EXPORTED = (REPO / "recipes/demo.yaml").read_text().replace("epochs: 3", "max_steps: 4").replace(
    "  generations: 8", "  generations: 2") + "export:\n  gguf: [q8_0]\n  ollama: true\n"
PLAIN = EXPORTED.split("export:")[0]


def test_export_rule_in_snakemake_is_stale_only_when_checkpoint_evaluation_or_export_changes(tmp_path):
    project = copy_workflow(tmp_path, {"demo": EXPORTED, "plain": PLAIN})
    result = snakemake(project, "-n")
    jobs = scheduled_jobs(result.stdout + result.stderr)
    assert {("export", "demo"), ("plan_export", "demo")} <= jobs and ("export", "plain") not in jobs
    assert ("plan_export", "plain") not in jobs
    snakemake(project, "--cores", "2", "exports/demo")
    assert {"demo-q8_0.gguf", "Modelfile", "merged", "export.json", "README.md"} <= {
        p.name for p in (project / "exports/demo").iterdir()}
    assert (project / "logs/demo/export.log").is_file() and (project / "benchmarks/demo/export.tsv").is_file()
    assert scheduled_jobs(snakemake(project, "-n", "exports/demo").stdout) == set()
    recipe = project / "recipes/demo.yaml"
    recipe.write_text(EXPORTED.replace("gguf: [q8_0]", "gguf: [q8_0, f16]"))  # re-planned: one more GGUF file
    assert scheduled_jobs(snakemake(project, "-n", "exports/demo").stdout) == {("plan_export", "demo"),
                                                                                ("export", "demo")}
    recipe.write_text(EXPORTED.replace("max_new_tokens: 48", "max_new_tokens: 40"))  # the card's figures change
    assert scheduled_jobs(snakemake(project, "-n", "exports/demo").stdout) == {
        ("plan_evaluate", "demo"), ("evaluate", "demo"), ("export", "demo")}
    recipe.write_text(EXPORTED.replace("loss_improvement: {min: 0}", "loss_improvement: {min: -1}"))  # gate only
    assert scheduled_jobs(snakemake(project, "-n", "exports/demo").stdout) == set()
    recipe.write_text(EXPORTED.replace("learning_rate: 5.0e-3", "learning_rate: 2.0e-3"))
    assert scheduled_jobs(snakemake(project, "-n", "exports/demo").stdout) == {
        ("train", "demo"), ("evaluate", "demo"), ("export", "demo")}
    recipe.write_text(EXPORTED)
    missing = snakemake(project, "-n", "exports/plain", check=False)
    assert missing.returncode != 0
    assert "recipes/plain.yaml has no `export:` section" in missing.stdout + missing.stderr
