"""The end-of-run summary (xtrain.summary) from the jobs a run had and the files they left, in milliseconds; the
workflow's real handler is checked in tests/test_workflow.py."""

from __future__ import annotations

import json
from pathlib import Path

from xtrain.recipe import parse_recipe
from xtrain.summary import DONE, FAILED, NOT_RUN, Job, end_of_run

SFT = parse_recipe({"model": {"path": "m"}, "data": {"sources": [{"path": "d.jsonl"}]},
                    "eval": {"gate": {"tuned_loss": {"max": 2.0}, "loss_improvement": {"min": 0}}}}, "sft.yaml")
DPO = parse_recipe({"model": {"path": "m"}, "data": {"sources": [{"path": "p.jsonl"}]},
                    "train": {"objective": "dpo"}}, "dpo.yaml")


def evaluated(root: Path, name: str, metrics: dict) -> None:
    (root / "reports" / name).mkdir(parents=True)
    (root / "reports" / name / "eval.json").write_text(json.dumps(metrics))


def jobs(recipe: str, state: dict[str, str]) -> list[Job]:
    return [Job(recipe, rule, done, (f"logs/{recipe}/{rule}.log",)) for rule, done in state.items()]


def test_a_built_recipe_shows_its_report_its_figures_base_to_tuned_its_gate_and_its_export(tmp_path):
    evaluated(tmp_path, "sft", {"base_loss": 3.0, "tuned_loss": 1.5, "loss_improvement": 1.5,
                                "base_exact_match": 0.0, "tuned_exact_match": 0.25})
    (tmp_path / "exports/sft/merged").mkdir(parents=True)
    (tmp_path / "exports/sft/sft-f16.gguf").write_text("")
    text = end_of_run(jobs("sft", dict.fromkeys(("train", "evaluate", "report", "gate", "export"), DONE)),
                      {"sft": SFT}, tmp_path)
    assert text.splitlines()[1:] == [
        "xtrain: what this run built",
        "sft",
        "  built   train, evaluate, report, gate, export",
        "  report  reports/sft/report.html",
        "  loss    3.0000 -> 1.5000 held out, base -> tuned (-50.0%)",
        "  exact   0.0% -> 25.0% (of answers equal the reference)",
        "  gate    passes: loss_improvement = 1.5 (must be at least 0): passes; tuned_loss = 1.5 (must be at most 2): "
        "passes",
        "  export  exports/sft (merged, sft-f16.gguf)",
    ]


def test_a_failed_gate_names_the_bound_it_missed_and_a_failed_job_its_log(tmp_path):
    evaluated(tmp_path, "sft", {"base_loss": 3.0, "tuned_loss": 2.5, "loss_improvement": 0.5})
    text = end_of_run([*jobs("sft", {"evaluate": DONE, "report": DONE, "gate": FAILED}),
                       *jobs("dpo", {"prepare": DONE, "train": FAILED, "evaluate": NOT_RUN, "gate": NOT_RUN})],
                      {"sft": SFT, "dpo": DPO}, tmp_path)
    assert "  gate    FAILS 1 of 2 bounds: tuned_loss = 2.5 (must be at most 2): FAILS by 0.5" in text
    assert "  FAILED   train, see logs/dpo/train.log\n  not run  evaluate, gate\n  gate     not reached" in text


def test_a_preference_recipe_shows_how_often_the_chosen_answer_wins(tmp_path):
    evaluated(tmp_path, "dpo", {"base_loss": 2.0, "tuned_loss": 1.9, "base_preference_accuracy": 0.5,
                                "tuned_preference_accuracy": 0.75, "reward_accuracy": 0.75})
    text = end_of_run(jobs("dpo", {"evaluate": DONE, "report": DONE, "gate": DONE}), {"dpo": DPO}, tmp_path)
    assert "  chosen wins  50.0% -> 75.0% (of held-out pairs the chosen answer is the likelier)" in text
    assert "  reward       75.0% of held-out rows ranked right by the implicit reward" in text
    assert "  gate         no bounds set (eval.gate in the recipe)" in text


def test_an_evaluation_of_an_earlier_run_is_not_shown_and_no_recipe_job_says_nothing(tmp_path):
    evaluated(tmp_path, "sft", {"base_loss": 3.0, "tuned_loss": 1.5})
    text = end_of_run(jobs("sft", {"prepare": DONE, "plan": DONE}), {"sft": SFT}, tmp_path)
    assert text.splitlines()[2:] == ["sft", "  built  prepare, plan"]
    assert end_of_run([], {"sft": SFT}, tmp_path) == ""
