"""eval.gate in the recipe schema, gate verdicts, and the pieces of generation scoring (no model needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from xtrain.errors import XtrainError
from xtrain.evaluate.gate import check, describe, run_gate
from xtrain.evaluate.generations import pick_prompts, split_row, token_f1
from xtrain.recipe import EVAL_METRICS, Eval, Gate, RecipeError, parse_recipe, stage_params

RECIPE = {"model": {"path": "m"}, "data": {"sources": [{"path": "d.jsonl"}]}}


def recipe_with(eval_section: dict):
    return parse_recipe({**RECIPE, "eval": eval_section}, "recipes/r.yaml")


def test_gate_on_unknown_metric_names_the_field_and_lists_known_metrics():
    with pytest.raises(RecipeError) as error:
        recipe_with({"gate": {"tuned_los": {"max": 3}}})
    message = str(error.value)
    assert "recipes/r.yaml" in message and "eval.gate" in message and "tuned_los" in message
    assert all(metric in message for metric in EVAL_METRICS)


def test_gate_on_a_generation_metric_needs_generations():
    with pytest.raises(RecipeError, match=r"eval.gate: .*tuned_stop_rate.*eval.generations > 0"):
        recipe_with({"generations": 0, "gate": {"tuned_stop_rate": {"min": 0.5}}})
    assert recipe_with({"generations": 2, "gate": {"tuned_stop_rate": {"min": 0.5}}}).eval.gate


@pytest.mark.parametrize("bounds, words", [({}, "needs `min`, `max`"), ({"min": 2, "max": 1}, "no value can pass"),
                                           ({"min": 1, "below": 2}, "unknown field")])
def test_bad_bounds_are_recipe_errors(bounds, words):
    with pytest.raises(RecipeError, match=words):
        recipe_with({"gate": {"tuned_loss": bounds}})


def test_gates_are_their_own_params_so_a_gate_edit_does_not_rerun_evaluation():
    one = recipe_with({"gate": {"loss_improvement": {"min": 0}}})
    two = recipe_with({"gate": {"loss_improvement": {"min": 0.5}}})
    assert stage_params(one, "evaluate") == stage_params(two, "evaluate")
    assert stage_params(one, "gate") != stage_params(two, "gate")


def test_verdicts_say_by_how_much_a_bound_is_missed():
    metrics = {"tuned_loss": 2.5, "loss_improvement": -0.25, "tuned_stop_rate": 1.0}
    gates = {"tuned_loss": Gate(max=2.0), "loss_improvement": Gate(min=0), "tuned_stop_rate": Gate(min=0.9, max=1)}
    verdicts = {v["metric"]: v for v in check(metrics, gates)}
    assert verdicts["tuned_loss"]["missed_by"] == pytest.approx(0.5) and not verdicts["tuned_loss"]["passed"]
    assert verdicts["loss_improvement"]["missed_by"] == pytest.approx(0.25)
    assert verdicts["tuned_stop_rate"]["passed"] and verdicts["tuned_stop_rate"]["missed_by"] == 0
    assert describe(verdicts["tuned_loss"]) == "tuned_loss = 2.5 (must be at most 2): FAILS by 0.5"


def test_failing_gate_raises_naming_metric_and_writes_nothing(tmp_path):
    metrics = tmp_path / "eval.json"
    metrics.write_text('{"tuned_loss": 2.5, "loss_improvement": 0.1}')
    out = tmp_path / "gate.json"
    with pytest.raises(XtrainError, match=r"1 of 2 eval.gate checks failed\n  tuned_loss = 2.5 .* FAILS by 0.5"):
        run_gate(metrics, {"tuned_loss": Gate(max=2), "loss_improvement": Gate(min=0)}, out)
    assert not out.exists()
    run_gate(metrics, {"loss_improvement": Gate(min=0)}, out)
    assert out.is_file()


def test_prompt_is_everything_before_the_last_answer():
    ids, mask = [1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 1, 1, 0, 0, 1, 1]
    assert split_row(ids, mask) == ([1, 2, 3, 4, 5, 6], [7, 8])
    assert split_row(ids, [1] * 8) is None  # train_on_inputs / plain text: no prompt
    assert split_row(ids, [0] * 8) is None


def test_prompts_are_chosen_by_hash_and_need_a_complete_answer():
    rows = [([1, 2, 9], [0, 1, 1], "c"), ([1, 3, 9], [0, 1, 1], "a"), ([1, 4, 5], [0, 1, 1], "b")]
    ids, masks, hashes = zip(*rows)
    picked = pick_prompts(ids, masks, hashes, 2, special_ids={9})
    assert [p.row_hash for p in picked] == ["a", "c"]  # "b" ends without the end-of-turn token 9
    with pytest.raises(XtrainError, match="eval.generations: 0"):
        pick_prompts(ids, [[1, 1, 1]] * 3, hashes, 2, special_ids={9})


def test_token_f1():
    assert token_f1("The word is ekac", "the word is  EKAC") == 1.0
    assert token_f1("the word", "the word is ekac") == pytest.approx(2 * 1 * 0.5 / 1.5)
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0 and token_f1("a b", "c d") == 0.0


def test_eval_defaults_ask_for_generations():
    assert Eval().generations == 8 and Eval().max_new_tokens > 0 and Eval().gate == {}


def test_gates_may_name_metrics_of_listed_lm_eval_tasks_only():
    harness = {"tasks": ["demo_capitals"], "include_path": "tasks"}
    assert recipe_with({"lm_eval": harness, "gate": {"tuned_lm_demo_capitals_acc": {"min": 0.5}}}).eval.gate
    with pytest.raises(RecipeError, match=r"tuned_lm_other_acc.*tuned_lm_demo_capitals_<metric>"):
        recipe_with({"lm_eval": harness, "gate": {"tuned_lm_other_acc": {"min": 0.5}}})


def test_harness_results_become_flat_metrics():
    from xtrain.evaluate.harness import flatten, model_args

    results = {"capitals": {"alias": "capitals", "acc,none": 0.5, "acc_stderr,none": 0.1, "exact_match,strict": 1}}
    assert flatten(results, "tuned") == {"tuned_lm_capitals_acc": 0.5, "tuned_lm_capitals_exact_match_strict": 1.0}
    assert model_args(Path("m"), Path("c"), "base")["pretrained"] == "m"


def test_tuned_model_for_the_harness_is_base_plus_adapter_or_the_full_checkpoint(tmp_path):
    from xtrain.evaluate.harness import model_args

    full = model_args(Path("m"), tmp_path, "tuned")
    assert full["pretrained"] == str(tmp_path) and "peft" not in full
    (tmp_path / "adapter_config.json").write_text("{}")
    adapter = model_args(Path("m"), tmp_path, "tuned")
    assert adapter["pretrained"] == "m" and adapter["peft"] == str(tmp_path)


@pytest.mark.parametrize(("base_stop", "tuned_stop", "banner"), [
    (0.9, 0.5, "bad"),  # fine-tuning made the model stop less often: red
    (0.5, 0.75, "warn"),  # it stops more often than before, but still not always: amber
    (0.5, 1.0, None),  # every answer stopped: no stop banner
])
def test_report_flags_answers_that_do_not_stop_by_how_they_compare_with_the_base(base_stop, tuned_stop, banner):
    from xtrain.report.pages import verdict_banners

    metrics = {"base_loss": 2.0, "tuned_loss": 1.5, "loss_improvement": 0.5, "base_perplexity": 7.4,
               "tuned_perplexity": 4.5, "base_stop_rate": base_stop, "tuned_stop_rate": tuned_stop}
    stop_banners = [line for line in verdict_banners(metrics, []).split("</div>") if "did not stop" in line]
    assert [line.split('"')[1].split()[-1] for line in stop_banners] == ([banner] if banner else [])
