"""Bad input is refused before any job runs: a table of bad recipes and data files, each with the message
that names the file and the field and says what to do.

Recipes go through `xtrain.preflight` (what the workflow runs on every recipe as it starts), in-process;
data files through `prepare`. tests/test_recipe.py holds the schema's own table (unknown fields, wrong
types, zero sizes, batch not divisible by the devices...); these are the rows it does not have.
tests/test_robustness.py drives a few of them through real `snakemake`.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import yaml

from xtrain.errors import XtrainError
from xtrain.preflight import preflight
from xtrain.recipe import Data, DataSource, RecipeError

GOOD = {
    "model": {"path": "models/base"},
    "data": {"sources": [{"path": "data/chat.jsonl"}], "seq_len": 128},
    "train": {"method": "lora", "global_batch_size": 8},
    "hardware": {"accelerator": "cpu", "gpus": 0},
}
CHAT = '{"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]}\n'
PLAIN_TASK = "task: t\ndataset_path: json\noutput_type: generate_until\ndoc_to_text: '{{question}}'\n"
EVIL_TASK = PLAIN_TASK + "process_docs: !function evil.process_docs\n"


def merged(base: dict, changes: dict) -> dict:
    """`base` with `changes` merged in section by section; a None value removes the key."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A project with a model folder, a data file, and, beside it, a model and data outside the project."""
    root = tmp_path_factory.mktemp("project")
    for name in ("base", "no-tokenizer", "pickled", "custom", "linked"):
        (root / "models" / name).mkdir(parents=True)
        (root / "models" / name / "config.json").write_text("{}")
        if name != "no-tokenizer":
            (root / "models" / name / "tokenizer.json").write_text("{}")
    (root / "models/pickled/pytorch_model.bin").write_bytes(b"pickle")
    (root / "models/custom/config.json").write_text(json.dumps(
        {"model_type": "xtrain_custom", "auto_map": {"AutoModelForCausalLM": "custom.CustomForCausalLM"}}))
    (root / "data").mkdir()
    (root / "data/chat.jsonl").write_text(CHAT)
    (root / "data/unreadable.jsonl").write_text('{"messages": [{"role": "human", "content": "Hi"}]}\n')
    (root / "data/pairs.jsonl").write_text('{"prompt": "Hi", "chosen": "Hello", "rejected": "Go away"}\n')
    (root / "recipes").mkdir()
    outside = root.parent / f"{root.name}-outside"
    (outside / "model").mkdir(parents=True)
    (outside / "model/config.json").write_text("{}")
    (outside / "model/tokenizer.json").write_text("{}")
    (outside / "model/model.safetensors").write_bytes(b"weights")
    (outside / "chat.jsonl").write_text(CHAT)
    (root / "data/linked.jsonl").symlink_to(outside / "chat.jsonl")
    # Folders inside the project whose files link outside it: a model's weights, a saved dataset's rows.
    (root / "models/linked/model.safetensors").symlink_to(outside / "model/model.safetensors")
    (root / "data/saved").mkdir()
    (root / "data/saved/dataset_info.json").write_text("{}")
    (root / "data/saved/data-00000-of-00001.arrow").symlink_to(outside / "chat.jsonl")
    # lm-eval task folders: one that imports Python (which leaves a mark), one of plain data, and the first's twin
    # outside the project.
    for tasks in (root / "tasks/evil", root / "tasks/plain", outside / "tasks"):
        tasks.mkdir(parents=True)
        (tasks / "t.yaml").write_text(EVIL_TASK if "plain" not in str(tasks) else PLAIN_TASK)
        (tasks / "evil.py").write_text(f"open({str(root / 'pwned')!r}, 'w').write('ran')\n"
                                       "def process_docs(docs):\n    return docs\n")
    # GRPO: prompt rows, one without the `answer` the answer reward reads; a reward file that leaves a mark if it
    # runs, with functions right and wrong, one that does not parse, and one linking out of rewards/.
    (root / "data/prompts.jsonl").write_text('{"question": "What is 2 + 2?", "answer": "4"}\n')
    (root / "data/questions.jsonl").write_text('{"question": "What is 2 + 2?"}\n')
    (root / "rewards").mkdir()
    (root / "rewards/mine.py").write_text(
        f"open({str(root / 'pwned')!r}, 'w').write('ran')\n"
        "def score(completions, answer, **kwargs):\n    return [float(answer in c) for c in completions]\n"
        "def solved(completions, solution, hint=None, **kwargs):\n    return [1.0] * len(completions)\n"
        "def strict(completions, answer):\n    return [1.0] * len(completions)\n"
        "async def judged(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    (root / "rewards/broken.py").write_text("def score(completions, **kwargs)\n    return []\n")
    (root / "data/reward.py").write_text("def score(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    (root / "rewards/linked.py").symlink_to(root / "data/reward.py")
    return root


def tree(root: Path) -> dict[str, int]:
    """Every file under `root` with its modification time."""
    return {str(p.relative_to(root)): p.lstat().st_mtime_ns for p in root.rglob("*") if not p.is_dir()}


def grpo(*rewards: dict, data: str = "data/prompts.jsonl") -> dict:
    """Changes to GOOD for a GRPO recipe on `data` with these rewards."""
    return {"data": {"sources": [{"path": data}]},
            "train": {"objective": "grpo", "rl": {"max_completion_length": 32}, "rewards": list(rewards)}}


# (id, recipe file name, changes to GOOD or raw YAML text, text naming the field or place, the fix it gives)
BAD_RECIPES = [
    ("huge-seq-len", "r", {"data": {"seq_len": 10_000_000}}, "data.seq_len", "less than or equal to 131072"),
    ("zero-epochs", "r", {"train": {"epochs": 0}}, "train.epochs", "greater than 0"),
    ("negative-max-steps", "r", {"train": {"max_steps": -3}}, "train.max_steps", "greater than 0"),
    ("zero-eval-batch", "r", {"eval": {"batch_size": 0}}, "eval.batch_size", "greater than 0"),
    ("eval-fraction-one", "r", {"data": {"eval_fraction": 1.0}}, "data.eval_fraction", "less than 1"),
    ("lora-dropout-one", "r", {"train": {"lora": {"dropout": 1.0}}}, "train.lora.dropout", "less than 1"),
    ("empty-lora-targets", "r", {"train": {"lora": {"target_modules": []}}}, "train.lora.target_modules",
     "at least 1 item"),
    ("lora-alpha-text", "r", {"train": {"lora": {"alpha": "high"}}}, "train.lora.alpha", "valid number"),
    ("infinite-learning-rate", "r", "model: {path: models/base}\ndata: {sources: [{path: data/chat.jsonl}]}\n"
     "train: {learning_rate: .inf}\n", "train.learning_rate", "finite number"),
    ("nan-weight-decay", "r", "model: {path: models/base}\ndata: {sources: [{path: data/chat.jsonl}]}\n"
     "train: {weight_decay: .nan}\n", "train.weight_decay", "finite number"),
    ("negative-seed", "r", {"train": {"seed": -1}}, "train.seed", "greater than or equal to 0"),
    ("warmup-ratio-one", "r", {"train": {"warmup_ratio": 1}}, "train.warmup_ratio", "less than 1"),
    ("unknown-format", "r", {"data": {"sources": [{"path": "data/chat.jsonl", "format": "xml"}]}},
     "data.sources[0].format", "'messages'"),
    ("columns-without-format", "r", {"data": {"sources": [{"path": "data/chat.jsonl", "columns": {"messages": "d"}}]}},
     "data.sources[0]", "set `format` too"),
    ("role-mapped-to-nothing", "r", {"data": {"sources": [{"path": "data/chat.jsonl", "roles": {"bot": "robot"}}]}},
     "data.sources[0]", "map each to one of"),
    ("path-and-hub", "r", {"data": {"sources": [{"path": "data/chat.jsonl", "hub": "org/set"}]}},
     "data.sources[0]", "give exactly one of `path`"),
    ("source-listed-twice", "r", {"data": {"sources": [{"path": "data/chat.jsonl"}, {"path": "data/chat.jsonl"}]}},
     "data", "list each once and use `weight`"),
    ("gpu-model-of-other-vendor", "r", {"hardware": {"accelerator": "rocm", "gpus": 1, "gpu_model": "h100"}},
     "hardware", "fix one of them"),
    ("micro-batch-does-not-divide", "r", {"train": {"micro_batch_size": 3}}, "train.micro_batch_size",
     "choose a divisor"),
    ("backend-cannot-train-on-gpus", "r", {"hardware": {"accelerator": "cuda", "gpus": 1}}, "hardware.accelerator",
     "set hardware.accelerator: cpu"),
    ("backend-runs-one-node", "r", {"hardware": {"nodes": 2}}, "hardware.nodes", "set hardware.nodes: 1"),
    ("gate-on-unknown-metric", "r", {"eval": {"gate": {"tuned_accuracy": {"min": 0.5}}}}, "eval.gate",
     "known metrics: "),
    ("backend-cannot-honour-the-device", "r", {"train": {"backend": "primus"}}, "hardware.accelerator",
     "set hardware.accelerator: rocm"),
    ("backend-is-translate-only", "r", {"train": {"backend": "primus"}, "hardware": {"accelerator": "rocm", "gpus": 8}},
     "train.backend primus", "translate-only"),
    ("trust-remote-code-as-text", "r", {"model": {"trust_remote_code": "yes"}}, "model.trust_remote_code",
     "valid boolean"),
    ("model-path-missing", "r", {"model": {"path": "models/nosuch"}}, "model.path", "not a model folder"),
    ("model-path-not-a-model", "r", {"model": {"path": "recipes"}}, "model.path", "no config.json there"),
    ("model-path-escapes-with-dotdot", "r", {"model": {"path": "../{outside}/model"}}, "model.path",
     "add its folder to `allowed_paths`"),
    ("model-path-absolute-outside", "r", {"model": {"path": "{outside_abs}/model"}}, "model.path",
     "outside the project"),
    ("data-path-escapes-with-dotdot", "r", {"data": {"sources": [{"path": "data/../../{outside}/chat.jsonl"}]}},
     "data.sources[0].path", "add its folder to `allowed_paths`"),
    ("data-path-symlink-outside", "r", {"data": {"sources": [{"path": "data/linked.jsonl"}]}},
     "data.sources[0].path", "outside the project"),
    ("model-file-links-outside", "r", {"model": {"path": "models/linked"}}, "model.path 'models/linked' holds "
     "model.safetensors", "outside the project"),
    ("saved-dataset-file-links-outside", "r", {"data": {"sources": [{"path": "data/saved"}]}},
     "data.sources[0].path 'data/saved' holds data-00000-of-00001.arrow", "outside the project"),
    ("lm-eval-tasks-outside", "r", {"eval": {"lm_eval": {"tasks": ["t"], "include_path": "{outside_abs}/tasks"}}},
     "eval.lm_eval.include_path", "outside the project"),
    ("lm-eval-task-imports-python", "r", {"eval": {"lm_eval": {"tasks": ["t"], "include_path": "tasks/evil"}}},
     "eval.lm_eval.include_path 'tasks/evil'", "(t.yaml:5: tag !function): remove that, or set "
     "eval.lm_eval.trust_code: true"),
    ("lm-eval-trust-code-as-text", "r", {"eval": {"lm_eval": {"tasks": ["t"], "trust_code": "yes"}}},
     "eval.lm_eval.trust_code", "valid boolean"),
    ("model-without-tokenizer", "r", {"model": {"path": "models/no-tokenizer"}}, "model.path: "
     "{project}/models/no-tokenizer has no tokenizer files", "copy the base model's tokenizer"),
    ("model-pickle-only", "r", {"model": {"path": "models/pickled"}}, "models/pickled/pytorch_model.bin holds pickled",
     "writes model.safetensors"),
    ("model-custom-architecture", "r", {"model": {"path": "models/custom"}}, "model.trust_remote_code: ",
     "set model.trust_remote_code: true"),
    ("data-rows-do-not-parse", "r", {"data": {"sources": [{"path": "data/unreadable.jsonl"}]}},
     "data/unreadable.jsonl:1: field `messages[0].role`", "map others with data.sources[].roles"),
    ("preference-data-in-sft-recipe", "r", {"data": {"sources": [{"path": "data/pairs.jsonl"}]}},
     "data/pairs.jsonl:1: this source holds preference pairs", "train.objective: dpo"),
    ("data-path-missing", "r", {"data": {"sources": [{"path": "data/nosuch.jsonl"}]}}, "data.sources[0].path",
     "fix the path or create the file"),
    ("grpo-rows-lack-a-reward-column", "r", grpo({"type": "answer"}, data="data/questions.jsonl"),
     "data/questions.jsonl:1: the rewards read `answer` (reward answer), which this row lacks",
     "add the column, or name the right one in train.rewards[].column"),
    ("grpo-python-reward-reads-a-missing-column", "r", grpo({"type": "python", "file": "rewards/mine.py",
                                                             "function": "solved"}),
     "the rewards read `solution` (reward rewards/mine.py:solved)", "add the column"),
    ("grpo-reward-function-missing", "r", grpo({"type": "python", "file": "rewards/mine.py", "function": "scor"}),
     "train.rewards[0].function: rewards/mine.py defines no function 'scor' at its top level (it defines "
     "['judged', 'score', 'solved', 'strict'])", "fix train.rewards[].function or define it"),
    ("grpo-reward-without-kwargs", "r", grpo({"type": "python", "file": "rewards/mine.py", "function": "strict"}),
     "train.rewards[0].function: strict (rewards/mine.py line 6) takes no **kwargs", "add **kwargs"),
    ("grpo-reward-async", "r", grpo({"type": "python", "file": "rewards/mine.py", "function": "judged"}),
     "train.rewards[0].function: judged (rewards/mine.py line 8) is async", "define it with `def`"),
    ("grpo-reward-file-does-not-parse", "r", grpo({"type": "python", "file": "rewards/broken.py",
                                                   "function": "score"}),
     "train.rewards[0].file: rewards/broken.py line 1", "fix the file"),
    ("grpo-reward-file-links-out-of-rewards", "r", grpo({"type": "python", "file": "rewards/linked.py",
                                                         "function": "score"}),
     "train.rewards[0].file: rewards/linked.py resolves to {project}/data/reward.py, outside {project}/rewards",
     "copy the file there"),
    ("grpo-reward-file-outside-rewards", "r", grpo({"type": "python", "file": "data/reward.py", "function": "score"}),
     "train.rewards[0]", "reward code lives in the project's rewards/ folder"),
    ("grpo-reward-file-outside-the-project", "r", grpo({"type": "python", "file": "rewards/../../{outside}/x.py",
                                                        "function": "score"}),
     "train.rewards[0]", "reward code lives in the project's rewards/ folder"),
    ("sft-data-in-grpo-recipe", "r", grpo({"type": "answer"}, data="data/chat.jsonl"),
     "data/chat.jsonl:1: field `messages`: a prompt ends with the user's turn, this one with assistant",
     "set train.objective: sft"),
    ("preference-data-in-grpo-recipe", "r", grpo({"type": "format", "pattern": "^A"}, data="data/pairs.jsonl"),
     "data/pairs.jsonl:1: this source holds preference pairs", "set train.objective: dpo or orpo"),
    ("recipe-name-with-dotdot", "..up", {}, "'..up'", "rename the file"),
    ("recipe-name-with-dots", "a..b", {}, "'a..b'", "rename the file"),
    ("key-given-twice", "r", "model: {path: models/base}\ndata: {sources: [{path: data/chat.jsonl}]}\n"
     "train: {learning_rate: 1.0e-3}\ntrain: {learning_rate: 1.0e-2}\n", "line 4", "given twice in one mapping"),
    ("python-object-tag", "r", "model: !!python/object/apply:os.system ['touch pwned']\n", "line 1",
     "could not determine a constructor"),
]


@pytest.mark.parametrize(("name", "content", "field", "fix"), [c[1:] for c in BAD_RECIPES],
                         ids=[c[0] for c in BAD_RECIPES])
def test_bad_recipe_is_refused_before_any_job(project, name, content, field, fix):
    outside = f"{project.name}-outside"
    subst = {"{outside}": outside, "{outside_abs}": str(project.parent / outside), "{project}": str(project)}
    text = content if isinstance(content, str) else yaml.safe_dump(merged(GOOD, content), sort_keys=False)
    for key, value in subst.items():
        text = text.replace(key, value)
    before = tree(project)
    path = project / "recipes" / f"{name}.yaml"
    path.write_text(text)
    try:
        with pytest.raises(RecipeError) as info:
            preflight(path, project)
    finally:
        path.unlink()
    message = str(info.value)
    assert str(path) in message, message
    for key, value in subst.items():
        field = field.replace(key, value)
    assert field in message, message
    assert fix in message, message
    assert not (project / "pwned").exists() and not Path("pwned").exists()
    assert tree(project) == before, "nothing written"


def test_a_grpo_recipe_passes_preflight_without_running_its_reward_file(project):
    path = project / "recipes" / "grpo.yaml"
    path.write_text(yaml.safe_dump(merged(GOOD, grpo({"type": "answer"}, {"type": "python", "file": "rewards/mine.py",
                                                                          "function": "score"}))))
    try:
        assert [reward.name for reward in preflight(path, project).train.rewards] == ["answer", "rewards/mine.py:score"]
    finally:
        path.unlink()
    assert not (project / "pwned").exists(), "preflight reads a reward file, never runs it"


def test_allowed_paths_admit_a_folder_outside_the_project(project):
    outside = project.parent / f"{project.name}-outside"
    path = project / "recipes" / "shared.yaml"
    path.write_text(yaml.safe_dump(merged(GOOD, {"model": {"path": str(outside / "model")},
                                                 "data": {"sources": [{"path": "data/linked.jsonl"}]}})))
    try:
        with pytest.raises(RecipeError, match="outside the project"):
            preflight(path, project)
        recipe = preflight(path, project, allowed=[str(outside)])
        assert recipe.model.path == str(outside / "model")
        # Relative allowlist entries are relative to the project.
        preflight(path, project, allowed=[f"../{outside.name}"])
    finally:
        path.unlink()


def test_a_folder_a_rule_builds_may_be_missing(project):
    path = project / "recipes" / "built.yaml"
    path.write_text(yaml.safe_dump(merged(GOOD, {"model": {"path": "models/to-build"}})))
    try:
        with pytest.raises(RecipeError, match="not a model folder"):
            preflight(path, project)
        assert preflight(path, project, built=["models/to-build"]).model.path == "models/to-build"
    finally:
        path.unlink()


# (id, data file name, its content, text naming the place in the file, what is wrong)
BAD_DATA = [
    ("invalid-json-line", "broken.jsonl", CHAT + '{"messages": [\n', "broken.jsonl:2", "malformed JSON"),
    ("no-messages-column", "nocol.jsonl", '{"dialog": []}\n', "nocol.jsonl", "set data.sources[].format"),
    ("unknown-role", "role.jsonl", '{"messages": [{"role": "robot", "content": "x"}]}\n', "role.jsonl", "robot"),
    ("empty-file", "empty.jsonl", "", "empty.jsonl", "no rows"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "content", "where", "what"), [c[1:] for c in BAD_DATA], ids=[c[0] for c in BAD_DATA])
def test_bad_data_file_is_refused_naming_file_and_line_with_no_output(tiny_model, tmp_path, name, content, where, what):
    from xtrain.data import prepare

    source = tmp_path / name
    source.write_text(content)
    out = tmp_path / "prepared" / "r"
    with pytest.raises(XtrainError) as info:
        prepare([source], tiny_model, Data(sources=[DataSource(path=str(source))], seq_len=128), out)
    message = str(info.value)
    assert str(source) in message and where in message and what in message, message
    assert not out.exists() and not list(out.parent.glob(".r.*")), "no partial output"


@pytest.mark.slow
def test_lora_target_matching_no_module_stops_at_the_plan_naming_the_field(tiny_model):
    """The one recipe check that needs the model's module names: the plan makes it, before training."""
    from xtrain.plan.model import count_parameters
    from xtrain.recipe import Lora, Train

    with pytest.raises(XtrainError) as info:
        count_parameters(tiny_model, Train(method="lora", lora=Lora(target_modules=["q_proj", "qkv"])))
    message = str(info.value)
    assert "train.lora.target_modules: ['qkv'] match no module of the model" in message
    assert "q_proj" in message, "it lists the module names the model has"


def test_a_batch_larger_than_the_training_rows_stops_at_the_plan(tiny_model):
    from xtrain.plan import make_plan
    from xtrain.recipe import Hardware, Train

    manifest = {"splits": {"train": {"rows": 352, "tokens": 352 * 40, "max_len": 100}}, "seq_len": 128}
    with pytest.raises(XtrainError, match=r"train.global_batch_size 100000 is larger than the 352 training rows: .*"
                                          r"set it to at most 352"):
        make_plan(tiny_model, manifest, Train(global_batch_size=100000), Hardware())


@pytest.mark.parametrize(("config_change", "field", "what"), [
    ({"architectures": ["MixtralForCausalLM"]}, "export.gguf", "MixtralForCausalLM"),
    ({"vocab_size": 10}, "export.gguf", "tokens, more than the model's 10 embedding rows"),
], ids=["architecture-gguf-cannot-write", "tokenizer-larger-than-embedding"])
def test_what_a_gguf_export_needs_is_checked_at_preflight(tiny_model, tmp_path, config_change, field, what):
    shutil.copytree(tiny_model, tmp_path / "models/base")
    (tmp_path / "data").mkdir()
    (tmp_path / "data/chat.jsonl").write_text(CHAT)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(merged(GOOD, {"export": {"gguf": ["q8_0"]}})))
    preflight(path, tmp_path)
    config = tmp_path / "models/base/config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **config_change}))
    with pytest.raises(RecipeError) as info:
        preflight(path, tmp_path)
    message = str(info.value)
    assert str(path) in message and field in message and what in message, message


def test_a_reward_raising_on_a_held_out_answer_stops_evaluation_naming_the_reward_and_row(tiny_model, tmp_path):
    """Evaluation scores GRPO's held-out answers with the training rewards, under the same guard: a reward that
    raises on a row it never met in training stops the job naming the reward and the row, and writes no eval.json."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from xtrain.evaluate import evaluate
    from xtrain.recipe import Eval
    from xtrain_backend_side.rewards import RewardError

    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards/mine.py").write_text(
        "def score(completions, answer, **kwargs):\n    return [float(int(a)) for a in answer]\n")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    prompts = ["<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\nSpell four.<|im_end|>\n<|im_start|>assistant\n"]
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    pq.write_table(pa.Table.from_pylist([
        {"prompt": text, "prompt_ids": tokenizer(text, add_special_tokens=False).input_ids, "row_hash": row_hash,
         "answer": answer} for text, row_hash, answer in zip(prompts, ("aa11", "bb22"), ("4", "four"))]),
        prepared / "eval.parquet")
    (prepared / "manifest.json").write_text(json.dumps(
        {"data_kind": "prompts", "end_of_turn": {"token": "<|im_end|>", "id": tokenizer.convert_tokens_to_ids(
            "<|im_end|>")}}))
    rewards = [{"type": "python", "file": "rewards/mine.py", "function": "score", "weight": 1.0}]
    with pytest.raises(RewardError, match=r"reward rewards/mine.py:score raised ValueError: .*'four'.* "
                                          r"\(on row bb22, completion 1 of the batch, prompt ending .*Spell four"):
        evaluate(tiny_model, tiny_model, prepared, Eval(max_new_tokens=2), tmp_path / "eval.json", rewards=rewards,
                 project=tmp_path)
    assert not (tmp_path / "eval.json").exists()
