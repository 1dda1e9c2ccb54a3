"""The demo recipe's evaluation outputs, checked against independent computations, and its report in Chromium.

One build of the demo (snakemake up to the gate) serves every test here. eval.json is recomputed with
plain per-row loops that share no code with `xtrain.evaluate`; report.html is opened in headless Chromium
(Debian's `chromium`, installed when missing and running as root, as CI does).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from conftest import HANG_SECONDS, REPO, copy_workflow, scheduled_jobs, snakemake
from debian import ensure_installed

from xtrain.train import allocator

pytestmark = pytest.mark.slow

# The demo recipe plus a local lm-evaluation-harness task (tests/data/lm_eval, copied into the project).
DEMO = (REPO / "recipes" / "demo.yaml").read_text() + "  lm_eval: {tasks: [demo_capitals], include_path: lm_eval_tasks}\n"
TASKS = REPO / "tests/data/lm_eval"
# Reports the status of every image into the DOM once the page has loaded (added to a copy of the page).
IMAGE_PROBE = """<script>window.addEventListener('load', () => {
  const images = [...document.images].map(i => i.complete && i.naturalWidth > 0 && i.naturalHeight > 0);
  document.body.setAttribute('data-images', JSON.stringify(images));
});</script>"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    root = copy_workflow(tmp_path_factory.mktemp("report"), {"demo": DEMO})
    shutil.copytree(TASKS, root / "lm_eval_tasks")
    snakemake(root, "--cores", "2")
    return root


@pytest.fixture(scope="module")
def chromium() -> str:
    if not ensure_installed(["chromium"], ["chromium"]):
        pytest.skip("Debian's chromium is not installed and installing it needs root")
    return shutil.which("chromium")


def plain_loss(model, rows) -> tuple[float, int]:
    """Summed NLL of every supervised token given the ones before it, one row at a time."""
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for ids, mask in rows:
            log_probs = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
            for t in range(1, len(ids)):
                if mask[t]:
                    total -= log_probs[t - 1, ids[t]].item()
                    count += 1
    return total, count


def plain_greedy(model, prompt: list[int], stops: set[int], limit: int) -> tuple[list[int], bool]:
    """Greedy decoding by re-running the whole sequence for each new token (no cache, no padding)."""
    import torch

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(limit):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)
            if token in stops:
                return ids[len(prompt):], True
    return ids[len(prompt):], False


def words_f1(answer: str, reference: str) -> float:
    a, r = answer.lower().split(), reference.lower().split()
    if not a or not r:
        return float(a == r)
    same = sum((Counter(a) & Counter(r)).values())
    return 0.0 if same == 0 else 2 * same / (len(a) + len(r))


def choice_accuracy(model, tokenizer) -> float:
    """The harness's multiple-choice `acc`: the choice with the highest log-likelihood after " " wins."""
    import torch

    docs = [json.loads(line) for line in (TASKS / "capitals.jsonl").read_text().splitlines()]
    right = 0
    with torch.no_grad():
        for doc in docs:
            context = tokenizer(doc["question"], add_special_tokens=False)["input_ids"]
            scores = []
            for choice in doc["choices"]:
                whole = tokenizer(doc["question"] + " " + choice, add_special_tokens=False)["input_ids"]
                log_probs = torch.log_softmax(model(torch.tensor([whole])).logits[0].double(), dim=-1)
                scores.append(sum(log_probs[t - 1, whole[t]].item() for t in range(len(context), len(whole))))
            right += max(range(len(scores)), key=scores.__getitem__) == doc["answer"]
    return right / len(docs)


def test_every_eval_metric_matches_an_independent_computation(demo):
    import pyarrow.parquet as pq
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from xtrain.recipe import GENERATION_METRICS, LOSS_METRICS

    metrics = json.loads((demo / "reports/demo/eval.json").read_text())
    records = json.loads((demo / "reports/demo/generations.json").read_text())
    assert set(metrics) == {*LOSS_METRICS, *GENERATION_METRICS, "base_lm_demo_capitals_acc", "tuned_lm_demo_capitals_acc"}
    assert all(isinstance(value, int | float) for value in metrics.values())  # flat, for dvc metrics

    split = pq.read_table(demo / "prepared/demo/eval.parquet").to_pylist()
    rows = [(r["input_ids"], r["assistant_masks"]) for r in split]
    tokenizer = AutoTokenizer.from_pretrained(demo / "checkpoints/demo")
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    stops = {end_of_turn, tokenizer.eos_token_id}
    # The 8 eval rows first by content hash whose last assistant answer ends with <|im_end|>.
    asked = []
    for row in sorted(split, key=lambda r: r["row_hash"]):
        ids, mask = row["input_ids"], row["assistant_masks"]
        last = max(i for i, bit in enumerate(mask) if bit)
        first = last
        while mask[first - 1]:
            first -= 1
        if ids[last] == end_of_turn and first > 0:
            asked.append((row["row_hash"], ids[:first], ids[first:last]))
    asked = asked[:8]
    assert metrics["eval_rows"] == len(split) == 48
    assert [r["row_hash"] for r in records] == [h for h, _, _ in asked]

    models = {
        "base": AutoModelForCausalLM.from_pretrained(demo / "models/tiny-llama", dtype=torch.float32),
        "tuned": PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(demo / "models/tiny-llama", dtype=torch.float32),
            demo / "checkpoints/demo"),
    }
    for name, model in models.items():
        model.eval()
        total, count = plain_loss(model, rows)
        assert metrics["eval_supervised_tokens"] == count
        assert metrics[f"{name}_loss"] == pytest.approx(total / count, rel=1e-4)
        assert metrics[f"{name}_perplexity"] == pytest.approx(math.exp(total / count), rel=1e-4)
        exact, f1, stopped = 0, 0.0, 0
        for record, (_, prompt, reference) in zip(records, asked):
            new, stop = plain_greedy(model, prompt, stops, 48)
            text = tokenizer.decode(new, skip_special_tokens=True).strip()
            want = tokenizer.decode(reference).strip()
            assert record["reference"] == want
            assert record[name]["text"] == text and record[name]["stopped"] == stop
            exact += " ".join(text.lower().split()) == " ".join(want.lower().split())
            f1 += words_f1(text, want)
            stopped += stop
        assert metrics["generations"] == len(asked)
        assert metrics[f"{name}_exact_match"] == pytest.approx(exact / len(asked))
        assert metrics[f"{name}_token_f1"] == pytest.approx(f1 / len(asked))
        assert metrics[f"{name}_stop_rate"] == pytest.approx(stopped / len(asked))
        assert metrics[f"{name}_lm_demo_capitals_acc"] == pytest.approx(choice_accuracy(model, tokenizer))
    assert metrics["loss_improvement"] == pytest.approx(metrics["base_loss"] - metrics["tuned_loss"])


def render(chromium: str, page: Path, tmp_path: Path) -> tuple[dict, str, Path]:
    """Load a copy of `page` (with the image probe) headless: the images' status, the console log, a screenshot."""
    probed = tmp_path / page.name
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", IMAGE_PROBE + "</body>"), encoding="utf-8")
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
            "--window-size=1200,2400", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*base, "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=HANG_SECONDS)
    shot = tmp_path / "shot.png"
    subprocess.run([*base, f"--screenshot={shot}", probed.as_uri()], capture_output=True, timeout=HANG_SECONDS, check=True)
    start = dom.stdout.index("data-images=")
    images = json.loads(dom.stdout[start:].split('"', 2)[1].replace("&quot;", '"'))
    console = "\n".join(line for line in dom.stderr.splitlines() if "CONSOLE" in line)
    return {"images": images}, console, shot


def test_render_check_catches_broken_images_and_console_errors(chromium, tmp_path):
    """The check below can fail: a page with a broken image and a script error is caught."""
    page = tmp_path / "broken.html"
    page.write_text('<html><body><img src="data:image/png;base64,AAAA"><script>console.error("boom")</script></body></html>')
    status, console, _ = render(chromium, page, tmp_path)
    assert status["images"] == [False]
    assert "boom" in console


def test_report_renders_in_chromium_with_every_plot_loaded(demo, chromium, tmp_path):
    from PIL import Image

    page = demo / "reports/demo/report.html"
    text = page.read_text(encoding="utf-8")
    assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text  # nothing fetched
    status, console, shot = render(chromium, page, tmp_path)
    assert status["images"] == [True, True, True]  # metrics, training curves, token lengths
    assert console == ""
    with Image.open(shot) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert image.size == (1200, 2400) and colours is not None and len(colours) > 50  # not a blank page
    for heading in ("Base vs tuned", "Sample answers", "Training", "Plan: predicted vs measured", "Data", "Recipe"):
        assert f"<h2>{heading}" in text
    assert "Gate: loss_improvement" in text
    assert f"(allocator: {allocator.for_train_job()})" in text  # the one the Snakemake train job ran under
    for plot in ("metrics", "training", "lengths"):
        assert (demo / f"reports/demo/plots/{plot}.svg").read_bytes().startswith(b"<?xml")


def test_snakemake_report_and_compare_page(demo, tmp_path):
    snakemake(demo, "--report", str(tmp_path / "snakemake.html"))
    assert (tmp_path / "snakemake.html").stat().st_size > 10_000
    snakemake(demo, "compare", "--cores", "1")
    compare = (demo / "reports/compare.html").read_text().replace("<wbr>", "")  # header line-break hints
    tuned_loss = json.loads((demo / "reports/demo/eval.json").read_text())["tuned_loss"]
    assert 'href="demo/report.html"' in compare and "tuned_loss" in compare and f"{tuned_loss:.4g}" in compare


def test_failing_gate_fails_the_job_and_keeps_the_report(demo):
    recipe = demo / "recipes/demo.yaml"
    recipe.write_text(DEMO.replace("loss_improvement: {min: 0}", "tuned_loss: {max: 0.5}"))
    result = snakemake(demo, "--cores", "2", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert scheduled_jobs(output) == {("report", "demo"), ("gate", "demo")}
    assert "tuned_loss = " in output and "must be at most 0.5): FAILS by" in output
    assert (demo / "reports/demo/eval.json").is_file() and (demo / "reports/demo/generations.json").is_file()
    assert "Gate: tuned_loss" in (demo / "reports/demo/report.html").read_text()
    assert not (demo / "reports/demo/gate.json").exists()


def test_plots_are_the_same_bytes_for_the_same_input():
    import matplotlib.pyplot as plt

    from xtrain.report import pages as report

    def plot() -> bytes:
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3])
        return report._svg(fig)

    assert plot() == plot()


# --- what the page shows, on inputs written for it (no training) ---------------------------------------------------

LONG_ANSWER = "\n".join(f"Step {i}: add {i} to the total." for i in range(40))


def written_report(root: Path) -> Path:
    """reports/demo/report.html from inputs written here: a base model that answered 48 newlines, a tuned one that
    answered at length, and a run 30× slower than planned on a machine loaded past its CPUs."""
    from conftest import sample_plan

    from xtrain.artifacts import write_json
    from xtrain.plan.schema import write_plan
    from xtrain.recipe import load_recipe
    from xtrain.report import PLOTS, write_report

    checkpoint, prepared, reports = root / "checkpoints/demo", root / "prepared/demo", root / "reports/demo"
    for folder in (checkpoint, prepared, reports):
        folder.mkdir(parents=True)
    write_plan(root / "plan.json", sample_plan())
    write_json(checkpoint / "manifest.json", {"backend": "trl_cpu", "method": "lora"})
    write_json(checkpoint / "train_metrics.json", {
        "loss": [{"step": s, "loss": 3 - s / 20, "learning_rate": 1e-3} for s in range(1, 45)], "steps": 44,
        "tokens_per_second": 260.0, "wall_seconds": 45.4, "trainer_runtime_seconds": 45.4,
        "peak_host_memory_bytes": 900 * 2**20, "allocator": "glibc",
        "mfu": 0.0014, "mfu_flops_per_token": 1324032, "mfu_peak_flops": 2.4e11,
        "mfu_peak_source": "this CPU's fp32 matmul peak on 2 threads (measured, 2048² matmuls, load 0.1 per core)",
        "machine": {"cpus": 2, "load_average_start": [1.9, 1.5, 1.2], "load_average_end": [5.2, 3.1, 2.0]},
        "tensorboard_run": str(root / "runs/demo/tensorboard/demo-3f9a1c")})
    histogram = {"bin_edges": list(range(0, 136, 8)), "counts": [0, 2, 9, 20] + [1] * 12}
    write_json(prepared / "manifest.json", {"seq_len": 128, "splits": {
        split: {"examples": 40, "tokens": 1300, "supervised_tokens": 400, "length_histogram": histogram}
        for split in ("train", "eval")}})
    write_json(reports / "eval.json", {"eval_rows": 40, "base_loss": 2.5, "tuned_loss": 1.9, "loss_improvement": 0.6,
                                       "base_perplexity": 12.2, "tuned_perplexity": 6.7})
    answer = {"stopped": True, "new_tokens": 48}
    write_json(reports / "generations.json", [{
        "prompt": "<|im_start|>user\nWhat is 2 plus 2?<|im_end|>\n<|im_start|>assistant\n", "reference": "4",
        "base": answer | {"text": "", "raw": "\n" * 48},
        "tuned": answer | {"text": LONG_ANSWER, "raw": LONG_ANSWER + "<|im_end|>"}}])
    write_json(reports / "pairs.json", [])
    write_report("demo", load_recipe(REPO / "recipes/demo.yaml").model_dump(mode="json"), root / "plan.json",
                 checkpoint, prepared, reports / "eval.json", reports / "generations.json", reports / "pairs.json",
                 reports / "report.html", {key: reports / f"plots/{key}.svg" for key in PLOTS})
    return reports / "report.html"


def test_whitespace_is_marked_long_answers_fold_and_a_busy_machine_explains_a_slow_run(tmp_path):
    from xtrain.report.pages import visible

    text = written_report(tmp_path).read_text(encoding="utf-8")
    assert "(only whitespace)" in text and "(only special tokens)" not in text
    assert '↵×48</span>' in text and "\n\n\n" not in text, "48 newlines are one mark, not 48 blank lines"
    assert visible("a\u200bb\tc") == ('a<span class="ws" title="1 × U+200B">[ZWSP]</span>b'
                                      '<span class="ws" title="1 × U+0009">→</span>c')
    shown, folded = text.split("Step 11: add 11 to the total.")[0], text.split("<summary>show the rest (28 more lines")
    assert "Step 0:" in shown and len(folded) == 2 and "Step 39:" in folded[1], "12 lines shown, the rest folded"
    assert ("30.27×; the machine was busy: load average 1.9 at the start and 5.2 at the end of training on 2 CPUs"
            in text)
    assert "Machine load while training (1 / 5 / 15-minute load averages, 2 CPUs): 1.9 / 1.5 / 1.2 at the start" in text
    assert '<a href="../../checkpoints/demo/README.md">' in text
    assert '<a href="../../runs/demo/tensorboard/demo-3f9a1c">TensorBoard run</a>' in text


def test_a_whitespace_answer_renders_short_in_chromium(chromium, tmp_path):
    """The page of a base model that answered 48 newlines stays the height of its content (it was 7,930 px)."""
    page = written_report(tmp_path / "project")
    probed = tmp_path / "height.html"
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", (
        "<script>window.addEventListener('load', () => document.body.setAttribute('data-height', "
        "document.documentElement.scrollHeight));</script></body>")), encoding="utf-8")
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,2400",
            f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*base, "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=HANG_SECONDS)
    height = int(dom.stdout.split('data-height="')[1].split('"')[0])
    assert height < 4000, height
    _, console, shot = render(chromium, page, tmp_path)
    assert console == "" and shot.stat().st_size > 10_000


def test_compare_ranks_recipes_only_within_their_eval_set_and_shows_the_fields_that_differ(tmp_path):
    from xtrain.artifacts import write_json
    from xtrain.recipe import load_recipe
    from xtrain.report import write_compare

    demo = load_recipe(REPO / "recipes/demo.yaml").model_dump(mode="json")
    recipes, losses = {}, {"slow": 1.5, "fast": 1.2, "other_data": 0.5}
    for name, rate, split in (("slow", 1e-4, b"rows A"), ("fast", 1e-3, b"rows A"), ("other_data", 1e-3, b"rows B")):
        recipes[name] = demo | {"train": demo["train"] | {"learning_rate": rate}}
        (tmp_path / "prepared" / name).mkdir(parents=True)
        (tmp_path / "prepared" / name / "eval.parquet").write_bytes(split)
        write_json(tmp_path / "reports" / name / "eval.json", {"eval_rows": 40, "base_loss": 2.0,
                                                               "tuned_loss": losses[name], "loss_improvement": 0.5})
    write_compare({name: tmp_path / "reports" / name / "eval.json" for name in recipes}, tmp_path / "compare.html",
                  {name: tmp_path / "prepared" / name for name in recipes}, recipes)
    page = (tmp_path / "compare.html").read_text().replace("<wbr>", "")
    first, second = page.split("<h2>Eval set ")[1:]
    assert "2 recipe(s)" in first and "1 recipe(s)" in second, "the 0.5 loss on other rows is not ranked above them"
    assert first.index('href="fast/report.html"') < first.index('href="slow/report.html"')
    assert "the fields that differ between them: <code>train.learning_rate</code>" in first
    assert "<th>train.learning_rate</th>" in first and "<td>0.0001</td>" in first
    assert "their losses do not compare" in page
