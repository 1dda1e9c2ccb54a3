"""Preference training (train.objective dpo / kto): the formats users bring become the prompt's tokens once and
each answer's tokens, rendered with the recipe's chat template; DPO trains through TRL from ln 2 and learns the
pairs; evaluation ranks the answers; data of the wrong kind is refused naming the objective to set."""

from __future__ import annotations

import html
import json
import math
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import REPO

from xtrain.data import prepare
from xtrain.errors import XtrainError
from xtrain.plan import make_plan
from xtrain.recipe import DATA_KINDS, Data, DataSource, Hardware, Train
from xtrain.train.backends.contract import TrainJob
from xtrain.train.backends.registry import get_backend
from xtrain.train.run import train_metrics

REAL = REPO / "data/real"
PAIRS = REPO / "data/pref/colours_sums.jsonl"


def run(model: Path, rows: list[dict] | Path, folder: Path, objective: str = "dpo", **settings) -> tuple[dict, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(rows, Path):
        source = rows
    else:
        source = folder / "rows.jsonl"
        source.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    data = Data(sources=[DataSource(path=str(source))], **{"seq_len": 1024, "eval_fraction": 0.2, **settings})
    return prepare([source], model, data, folder / "prepared", kind=DATA_KINDS[objective]), folder / "prepared"


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def rows_of(prepared: Path) -> list[dict]:
    return [row for split in ("train", "eval") for row in pq.read_table(prepared / f"{split}.parquet").to_pylist()]


def test_llamafactory_typed_pairs_keep_the_prompt_once_and_each_answer_whole(tiny_model, tokenizer, tmp_path):
    source = [json.loads(line) for line in (REAL / "v1_dpo_demo.jsonl").read_text().splitlines()]
    manifest, prepared = run(tiny_model, REAL / "v1_dpo_demo.jsonl", tmp_path, seq_len=1024)
    stats = manifest["sources"][str(REAL / "v1_dpo_demo.jsonl")]
    assert stats["format"] == "message_pairs" and stats["kept"] + sum(stats["dropped"].values()) == len(source)
    answers = {(r["chosen_messages"][-1]["content"][0]["value"], r["rejected_messages"][-1]["content"][0]["value"])
               for r in source}
    for row in rows_of(prepared):
        chosen, rejected = (tokenizer.decode(row[key]) for key in ("chosen_ids", "rejected_ids"))
        assert (chosen.removesuffix("<|im_end|>"), rejected.removesuffix("<|im_end|>")) in answers
        assert tokenizer.decode(row["prompt_ids"]).endswith("<|im_start|>assistant\n"), "the prompt is context"
    assert manifest["splits"]["train"]["sequences_per_row"] == 2


def test_sharegpt_pairs_from_llamafactory(tiny_model, tokenizer, tmp_path):
    source = json.loads((REAL / "dpo_zh_demo.json").read_text())
    manifest, prepared = run(tiny_model, REAL / "dpo_zh_demo.json", tmp_path, seq_len=1024)
    stats = manifest["sources"][str(REAL / "dpo_zh_demo.json")]
    assert stats["format"] == "sharegpt_pairs" and stats["rows"] == 300
    assert set(stats["dropped"]) <= {"over seq_len", "duplicate"} and stats["kept"] > 0
    chosen = {r["chosen"]["value"] for r in source}
    for row in rows_of(prepared)[:20]:
        assert tokenizer.decode(row["chosen_ids"]).removesuffix("<|im_end|>") in chosen


@pytest.mark.parametrize("shape", ["alpaca", "trl_text", "trl_messages", "implicit_prompt"])
def test_each_pair_shape_gives_the_same_tokens(tiny_model, tmp_path, shape):
    def row(i: int) -> dict:
        question, good, bad = f"What is {i} plus {i}?", f"{2 * i}.", f"{2 * i + 1}."
        return {
            "alpaca": {"instruction": question, "input": "", "chosen": good, "rejected": bad},
            "trl_text": {"prompt": question, "chosen": good, "rejected": bad},
            "trl_messages": {"prompt": [{"role": "user", "content": question}],
                             "chosen": [{"role": "assistant", "content": good}],
                             "rejected": [{"role": "assistant", "content": bad}]},
            "implicit_prompt": {"chosen": [{"role": "user", "content": question}, {"role": "assistant", "content": good}],
                                "rejected": [{"role": "user", "content": question},
                                             {"role": "assistant", "content": bad}]},
        }[shape]

    _, prepared = run(tiny_model, [row(i) for i in range(30)], tmp_path / shape)
    _, reference = run(tiny_model, [row(i) for i in range(30)] if shape == "trl_messages" else [
        {"prompt": [{"role": "user", "content": f"What is {i} plus {i}?"}],
         "chosen": [{"role": "assistant", "content": f"{2 * i}."}],
         "rejected": [{"role": "assistant", "content": f"{2 * i + 1}."}]} for i in range(30)], tmp_path / "reference")
    assert rows_of(prepared) == rows_of(reference)


def test_unusable_pairs_are_dropped_with_their_reason(tiny_model, tmp_path):
    rows = [{"prompt": f"Q{i}?", "chosen": f"A{i}.", "rejected": f"B{i}."} for i in range(30)]
    rows += [{"prompt": "Same?", "chosen": "Yes.", "rejected": "Yes."}, {"prompt": "Empty?", "chosen": " ", "rejected": "No."},
             dict(rows[0]), {"prompt": "Long? " + "word " * 400, "chosen": "A.", "rejected": "B."}]
    manifest, _ = run(tiny_model, rows, tmp_path, seq_len=256, drop_warning=0.1)
    stats = next(iter(manifest["sources"].values()))
    assert stats["dropped"] == {"chosen identical to rejected": 1, "empty answer": 1, "duplicate": 1, "over seq_len": 1}
    assert stats["kept"] == 30
    warning, = manifest["warnings"]
    assert "4 of 34 rows (12%) dropped" in warning
    advised = int(re.search(r"data.seq_len: (\d+) keeps them all", warning)[1])
    assert 256 < advised <= 1024, "the longest pair's length, within the model's 1024 positions"


def hh(*turns: str) -> str:
    """An HH-RLHF transcript of alternating Human / Assistant turns."""
    return "".join(f"\n\n{'Human' if i % 2 == 0 else 'Assistant'}: {text}" for i, text in enumerate(turns))


def test_hh_rlhf_transcripts_split_into_prompt_and_answers_as_trl_splits_them(tiny_model, tokenizer, tmp_path):
    rows = [{"chosen": hh(f"What is {i} plus {i}?", f"It is {2 * i}."),
             "rejected": hh(f"What is {i} plus {i}?", f"It is {2 * i + 1}, I think.")} for i in range(20)]
    rows += [{"chosen": hh("Hi", "Hello!", f"Which colour is sky {i}?", "Blue."),
              "rejected": hh("Hi", "Hello!", f"Which colour is sky {i}?", "Green.")} for i in range(10)]
    # TRL's hh-rlhf script: the common text up to the last shared "\n\nAssistant: " is the prompt, its earlier turns
    # the chat (an answer starting like the other stays whole), and the rest of each transcript is its answer.
    from xtrain.data.preference import PreferenceReader

    reader = PreferenceReader(DataSource(path="hh.jsonl"), "hh_pairs")
    assert reader.read(rows[3]) == {"prompt": [{"role": "user", "content": "What is 3 plus 3?"}],
                                    "chosen": {"role": "assistant", "content": "It is 6."},
                                    "rejected": {"role": "assistant", "content": "It is 7, I think."}, "tools": None}
    assert reader.read(rows[20])["prompt"] == [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", "train": False},
        {"role": "user", "content": "Which colour is sky 0?"}]
    manifest, prepared = run(tiny_model, rows, tmp_path)
    stats = next(iter(manifest["sources"].values()))
    assert (stats["format"], stats["kept"], stats["dropped"]) == ("hh_pairs", 30, {}), "every row kept"
    for row in rows_of(prepared):
        prompt, chosen = tokenizer.decode(row["prompt_ids"]), tokenizer.decode(row["chosen_ids"])
        assert prompt.endswith("<|im_start|>assistant\n") and "Human:" not in prompt + chosen
        assert chosen in ("Blue.<|im_end|>", *(f"It is {2 * i}.<|im_end|>" for i in range(20)))
    # Text with no prompt to split off is refused, naming the format and the conversions.
    plain = [{"chosen": f"It is {2 * i}.", "rejected": f"It is {2 * i + 1}."} for i in range(10)]
    with pytest.raises(XtrainError, match=r"rows.jsonl.*format message_pairs .*no prompt to split off: give the "
                                          r"prompt in a `prompt` column .* HH-RLHF transcript"):
        run(tiny_model, plain, tmp_path / "plain")


def test_unread_columns_are_listed_and_sft_column_maps_are_refused(tiny_model, tmp_path):
    rows = [{"id": i, "prompt": f"Q{i}?", "chosen": f"A{i}.", "rejected": f"B{i}.", "source": "web"} for i in range(30)]
    manifest, _ = run(tiny_model, rows, tmp_path / "listed")
    assert next(iter(manifest["sources"].values()))["ignored_columns"] == ["id", "source"]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = Data(sources=[DataSource(path=str(source), format="alpaca", columns={"output": "chosen"})],
                eval_fraction=0.2)
    with pytest.raises(XtrainError, match="preference data is read by its own column names"):
        prepare([source], tiny_model, data, tmp_path / "mapped", kind="pairs")


def test_pairs_sharing_a_prompt_stay_in_one_split(tiny_model, tmp_path):
    rows = [{"prompt": f"Q{i % 10}?", "chosen": f"A{i}.", "rejected": f"B{i}."} for i in range(60)]
    _, prepared = run(tiny_model, rows, tmp_path, eval_fraction=0.3)
    prompts = [{tuple(r["prompt_ids"]) for r in pq.read_table(prepared / f"{s}.parquet").to_pylist()}
               for s in ("train", "eval")]
    assert prompts[0] and prompts[1] and not prompts[0] & prompts[1]


def test_kto_rows_keep_their_label(tiny_model, tokenizer, tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"Q{i}?"}, {"role": "assistant", "content": f"A{i}."}],
             "label": i % 3 != 0 if i % 2 else str(i % 3 != 0).lower()} for i in range(40)]
    manifest, prepared = run(tiny_model, rows, tmp_path, objective="kto")
    for row in rows_of(prepared):
        i = int(tokenizer.decode(row["completion_ids"]).removeprefix("A").removesuffix(".<|im_end|>"))
        assert row["label"] == (i % 3 != 0)
    assert manifest["splits"]["train"]["desirable"] + manifest["splits"]["eval"]["desirable"] == 26


@pytest.mark.parametrize(("rows", "objective", "setting"), [
    ([{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}] * 3, "dpo",
     "train.objective: sft"),
    ([{"prompt": "Hi", "chosen": "Hello", "rejected": "Go"}] * 3, "kto", "train.objective: dpo"),
    ([{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "label": True}] * 3,
     "dpo", "train.objective: kto"),
], ids=["sft-data-in-dpo", "pairs-in-kto", "labelled-in-dpo"])
def test_data_of_another_kind_is_refused_naming_the_objective(tiny_model, tmp_path, rows, objective, setting):
    with pytest.raises(XtrainError, match=r"rows.jsonl:1: this source holds") as info:
        run(tiny_model, rows, tmp_path, objective=objective)
    assert setting in str(info.value) and not (tmp_path / "prepared").exists()


@pytest.fixture(scope="module")
def dpo_run(tiny_model, tmp_path_factory):
    """The demo pairs trained for 12 DPO steps on trl_cpu (LoRA, the reference is the adapter disabled)."""
    folder = tmp_path_factory.mktemp("dpo")
    manifest, prepared = run(tiny_model, PAIRS, folder, seq_len=128)
    train = Train(objective="dpo", global_batch_size=8, max_steps=12, learning_rate=5e-3, logging_steps=1,
                  lora={"dropout": 0.1}, lr_scheduler="constant")
    plan = make_plan(tiny_model, manifest, train, Hardware())
    job = TrainJob(tiny_model, prepared, plan, train, Hardware(), folder / "checkpoint", folder / "work", None)
    shutil.rmtree(job.out, ignore_errors=True)
    job.out.mkdir()
    result = get_backend("trl_cpu").run(job)
    return job, plan, result


def test_the_first_dpo_loss_is_ln2_and_the_pairs_are_learned(dpo_run):
    _, plan, result = dpo_run
    steps = [entry for entry in result.log_history if "loss" in entry and "rewards/accuracies" in entry]
    assert abs(steps[0]["loss"] - math.log(2)) < 1e-4, "at step 0 the policy equals the reference"
    assert min(entry["rewards/accuracies"] for entry in steps[-3:]) >= 0.9
    assert plan.time.tokens_per_step > 0 and plan.layout.micro_batch_size >= 1


def test_evaluation_ranks_held_out_pairs(dpo_run, tiny_model):
    from xtrain.evaluate import evaluate
    from xtrain.recipe import Eval

    job, _, _ = dpo_run
    metrics = evaluate(tiny_model, job.out, job.prepared_dir, Eval(generations=0), job.out.parent / "eval.json")
    assert metrics["eval_pairs"] == metrics["eval_rows"] > 0
    assert metrics["reward_accuracy"] >= 0.8 and metrics["reward_margin"] > 0
    assert metrics["tuned_rejected_logp_per_token"] < metrics["base_rejected_logp_per_token"]


def test_a_backend_without_the_objective_refuses_it_by_name():
    from xtrain.train.backends.registry import check

    with pytest.raises(XtrainError, match=r"train.backend axolotl does not train objective 'orpo'.*trl_cpu"):
        check("axolotl", Train(backend="axolotl", objective="orpo"), Hardware())


@pytest.mark.slow
def test_the_dpo_demo_runs_through_snakemake_and_reruns_only_what_an_edit_changes(tmp_path):
    """The DPO demo is the second stage of a chain: DPO on the SFT demo's adapter merged into its base."""
    from conftest import copy_workflow, scheduled_jobs, snakemake

    from xtrain.artifacts import read_json

    recipe = (REPO / "recipes/demo_dpo.yaml").read_text()
    project = copy_workflow(tmp_path, {"demo": (REPO / "recipes/demo.yaml").read_text(), "demo_dpo": recipe})
    built = snakemake(project, "--cores", "2", "reports/demo_dpo/gate.json")
    assert ("merge_base", "demo") in scheduled_jobs(built.stdout + built.stderr)
    assert read_json(project / "checkpoints/demo_dpo/manifest.json")["lineage"][1]["base_model"] == "bases/demo"
    metrics = read_json(project / "reports/demo_dpo/eval.json")
    assert metrics["reward_accuracy"] >= 0.6 and metrics["eval_pairs"] > 0
    assert metrics["root_loss"] != metrics["base_loss"], "the direct base is the SFT model, not the tiny model"
    progress = [line for line in (project / "logs/demo_dpo/train.log").read_text().splitlines() if " ETA " in line]
    assert progress and "step 1/14 (7%) loss 0.6931" in progress[0], "each logged step is one line in the log"
    for stage, what in (("prepare", "tokenize: chats"), ("evaluate", "evaluate: rows scored and answers generated")):
        lines = (project / f"logs/demo_dpo/{stage}.log").read_text()
        assert re.search(rf"{what} (\d+)/\1 \(100%\); \d+ s so far, ETA 00:00:00", lines), lines
    page = (project / "reports/demo_dpo/report.html").read_text()
    assert "<h2>Preference</h2>" in page and "reward margins" in page
    pairs = read_json(project / "reports/demo_dpo/pairs.json")
    assert len(pairs) == metrics["eval_pairs"] and all("reward_margin" in row for row in pairs)
    assert sum(row["reward_margin"] > 0 for row in pairs) / len(pairs) == metrics["reward_accuracy"]
    shown = [row for row in pairs if "prompt" in row]
    assert shown and all(html.escape(answer["text"]) in page for row in shown for answer in row["answers"])
    path = project / "recipes/demo_dpo.yaml"
    path.write_text(recipe.replace("beta: 0.1", "beta: 0.2"))
    jobs = scheduled_jobs(snakemake(project, "-n", "reports/demo_dpo/gate.json").stdout)
    assert {job for job, _ in jobs} == {"train", "evaluate", "report", "gate"}, "beta does not change data or plan"
    path.write_text(recipe.replace("objective: dpo", "objective: kto"))
    refused = snakemake(project, "-n", "reports/demo_dpo/gate.json", check=False)
    assert refused.returncode != 0 and "set train.objective: dpo" in refused.stdout + refused.stderr


def test_orpo_trains_on_the_pairs_without_a_reference_model(tiny_model, tmp_path):
    manifest, prepared = run(tiny_model, PAIRS, tmp_path, seq_len=128)
    train = Train(objective="orpo", global_batch_size=8, max_steps=6, learning_rate=5e-3, logging_steps=1,
                  lr_scheduler="constant")
    plan = make_plan(tiny_model, manifest, train, Hardware())
    job = TrainJob(tiny_model, prepared, plan, train, Hardware(), tmp_path / "checkpoint", tmp_path / "work", None)
    job.out.mkdir()
    result = get_backend("trl_cpu").run(job)
    steps = [e for e in result.log_history if "nll_loss" in e]
    # Both sequences of each pair (prompt + answer) count as tokens seen, so train_metrics.json has a rate.
    assert result.tokens_seen >= 6 * 8 * 2 and train_metrics(result)["tokens_per_second"] > 0
    # ORPO's loss is the answers' NLL plus beta times the odds-ratio term, which is positive.
    assert all(e["loss"] > e["nll_loss"] for e in steps)
    assert steps[-1]["nll_loss"] < steps[0]["nll_loss"], "the chosen answers are learned (the SFT part)"
    assert (job.out / "adapter_config.json").is_file()


def test_kto_plans_at_least_two_rows_per_forward_pass_and_refuses_fewer(tiny_model, tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"Q{i}?"}, {"role": "assistant", "content": f"A{i}."}],
             "label": i % 2 == 0} for i in range(40)]
    manifest, _ = run(tiny_model, rows, tmp_path, objective="kto")
    with pytest.raises(XtrainError, match="kto estimates its KL term.*at least 2 rows"):
        make_plan(tiny_model, manifest, Train(objective="kto", global_batch_size=1), Hardware())
    plan = make_plan(tiny_model, manifest, Train(objective="kto", global_batch_size=4), Hardware())
    assert plan.layout.micro_batch_size >= 2


def test_trl_local_trains_dpo_over_two_processes_from_the_same_first_loss(dpo_run, tiny_model, tmp_path):
    """The same pairs on trl_local with two CPU processes (torchrun, DDP over gloo): the first loss equals trl_cpu's."""
    job, _, result = dpo_run
    hardware = Hardware(processes=2)
    train = job.train.model_copy(update={"backend": "trl_local", "max_steps": 2})
    plan = make_plan(tiny_model, json.loads((job.prepared_dir / "manifest.json").read_text()), train, hardware)
    local = TrainJob(tiny_model, job.prepared_dir, plan, train, hardware, tmp_path / "out", tmp_path / "work", None)
    local.out.mkdir()
    first = [e for e in get_backend("trl_local").run(local).log_history if "loss" in e][0]["loss"]
    cpu_first = [e for e in result.log_history if "loss" in e][0]["loss"]
    assert abs(first - cpu_first) < 1e-3 and abs(first - math.log(2)) < 1e-4


def test_a_full_dpo_run_whose_reference_copy_does_not_fit_precomputes_the_reference_and_trains_the_same(
        tiny_model, tmp_path, monkeypatch):
    manifest, prepared = run(tiny_model, PAIRS, tmp_path, seq_len=128)
    train = Train(objective="dpo", method="full", lora=None, global_batch_size=4, micro_batch_size=4, max_steps=2,
                  learning_rate=5e-4, logging_steps=1, lr_scheduler="constant")
    monkeypatch.setattr("xtrain.plan.planner.cpu_supports_bf16", lambda: False)  # fp32 only: memory is cut by checkpointing
    with_copy = make_plan(tiny_model, manifest, train, Hardware())
    assert (with_copy.reference, with_copy.time.reference_precompute_seconds) == ("copy", None)
    copy_bytes = with_copy.model.total * 4  # fp32 weights on the CPU

    def device_of(size: int) -> None:
        monkeypatch.setattr("xtrain.plan.planner.Planner.budget", lambda self, gpu=None: size)

    # Just too small for the plain step: the copy stays, with activation checkpointing (the least a step can take).
    device_of(with_copy.memory.peak_bytes_per_device - 1)
    checkpointed = make_plan(tiny_model, manifest, train, Hardware())
    assert (checkpointed.reference, checkpointed.gradient_checkpointing) == ("copy", True)
    # Too small for that too: the plan drops the copy, not the run.
    device_of(checkpointed.memory.peak_bytes_per_device - 1)
    precomputed = make_plan(tiny_model, manifest, train, Hardware())
    assert precomputed.reference == "precomputed"
    assert precomputed.memory.breakdown_bytes["weights"] == with_copy.memory.breakdown_bytes["weights"] - copy_bytes
    assert precomputed.time.seconds_per_step < with_copy.time.seconds_per_step, "no reference forward in a step"
    assert precomputed.time.reference_precompute_seconds > 0
    monkeypatch.undo()

    from trl import DPOTrainer

    precomputes, precompute = [], DPOTrainer._precompute_ref_logps
    monkeypatch.setattr(DPOTrainer, "_precompute_ref_logps",
                        lambda self, *args: precomputes.append(self.ref_model) or precompute(self, *args))
    losses = {}
    for plan in (with_copy, precomputed):
        job = TrainJob(tiny_model, prepared, plan, train, Hardware(), tmp_path / plan.reference / "out",
                       tmp_path / plan.reference / "work", None)
        job.out.mkdir(parents=True)
        losses[plan.reference] = [e["loss"] for e in get_backend("trl_cpu").run(job).log_history if "loss" in e]
    assert precomputes == [None], "TRL precomputed once, holding no reference copy; the copy run did not precompute"
    assert abs(losses["precomputed"][0] - math.log(2)) < 1e-4
    # The same reference log-probs, once computed up front and once in each step: the same training.
    assert losses["precomputed"] == pytest.approx(losses["copy"], abs=1e-5)
