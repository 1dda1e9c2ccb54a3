"""The pages a person looks at: `reports/<recipe>/report.html` and the cross-recipe `reports/compare.html`.

Each page is one self-contained HTML file (no network: plots are matplotlib SVGs embedded as data URIs,
styles inline). The per-recipe page answers "did fine-tuning help, and did it break anything?": the
verdict and gates first, then base-vs-tuned metrics, sample answers side by side, training curves, the
plan's predictions against what training measured, the data's token lengths and the recipe itself.
The plots are also written as SVG files so Snakemake's `--report` can collect them.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml

from ..artifacts import read_json
from ..evaluate import gate
from ..plan.schema import Plan, read_plan
from ..recipe import EVAL_METRICS, REWARD_TERM_METRIC, Gate, Model

BASE_COLOUR, TUNED_COLOUR = "#8c8c8c", "#1f77b4"
STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ddd;padding:.3em .6em;vertical-align:top}
th{background:#f4f4f4;text-align:left} .scroll{overflow-x:auto} td.num{text-align:right;font-variant-numeric:tabular-nums}
.banner{padding:.7em 1em;border-radius:6px;margin:.6em 0;font-weight:600}
.good{background:#e6f4ea;color:#1e4620} .bad{background:#fdecea;color:#611a15} .warn{background:#fff4e5;color:#663c00}
pre{white-space:pre-wrap;margin:0;font-size:.85em} img{max-width:100%} .better{color:#1e7b34} .worse{color:#b3261e}
.ws{color:#b05f00;background:#fff4e5;border-radius:3px;padding:0 .15em;font-size:.9em} details>summary{cursor:pointer;color:#555}
"""
# Answers and prompts longer than this are cut there, the rest behind a <details> toggle.
SHOWN_LINES, SHOWN_CHARS = 12, 800
# Characters a reader cannot see, and the mark each is shown as ("\n" and " " only in runs, or around the text).
MARKS = {"\n": "↵", " ": "·", "\t": "→", "\r": "␍", "\u00a0": "⍽", "\u200b": "[ZWSP]", "\u200c": "[ZWNJ]",
         "\u200d": "[ZWJ]", "\u2060": "[WJ]", "\ufeff": "[BOM]", "\u00ad": "[SHY]"}
INVISIBLE_RUN = re.compile("|".join(f"{re.escape(c)}+" for c in MARKS if c not in "\n "))
WHITESPACE_RUN = re.compile(r"(\s)\1*")


# ---- plots ---------------------------------------------------------------------------------------------


def _svg(fig) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    # No date, and element ids from a fixed salt instead of a random one: the same input gives the same bytes.
    with plt.rc_context({"svg.hashsalt": "xtrain"}):
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return buffer.getvalue()


def _figure(columns: int = 1):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, columns, figsize=(5.2 * columns, 3.2), squeeze=False)


def training_plot(train_metrics: dict[str, Any]) -> bytes:
    """Training loss and learning rate against the optimizer step; for GRPO, its reward, KL and completion length."""
    if train_metrics.get("rl"):
        return rl_plot(train_metrics["rl"])
    fig, axes = _figure(2)
    curve = train_metrics["loss"]
    steps = [point["step"] for point in curve]
    axes[0][0].plot(steps, [point["loss"] for point in curve], color=TUNED_COLOUR, marker=".", label="train loss")
    evals = [point for point in curve if point.get("eval_loss") is not None]
    if evals:
        axes[0][0].plot([p["step"] for p in evals], [p["eval_loss"] for p in evals], color="#d62728", label="eval loss")
    axes[0][0].set(title="Loss", xlabel="step", ylabel="loss")
    axes[0][0].legend()
    rates = [(p["step"], p["learning_rate"]) for p in curve if p.get("learning_rate") is not None]
    axes[0][1].plot([s for s, _ in rates], [r for _, r in rates], color="#2ca02c", marker=".")
    axes[0][1].set(title="Learning rate", xlabel="step", ylabel="learning rate")
    axes[0][1].ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    return _svg(fig)


def rl_plot(steps: list[dict[str, Any]]) -> bytes:
    """GRPO's logged steps (train_metrics.json's `rl`): the reward (the weighted sum's mean, and each reward's mean),
    the KL to the reference model when it was measured, and the completions' mean length."""
    fig, axes = _figure(3)
    x = [step["step"] for step in steps]
    reward = axes[0][0]
    reward.plot(x, [step["reward"] for step in steps], color=TUNED_COLOUR, marker=".", label="reward (weighted sum)")
    for key in [k for k in steps[0] if k.startswith("rewards/") and k.endswith("/mean")]:
        reward.plot(x, [step.get(key) for step in steps], marker=".", linewidth=1, alpha=0.7,
                    label=key.removeprefix("rewards/").removesuffix("/mean"))
    reward.set(title="Reward (mean over each step's completions)", xlabel="step", ylabel="reward")
    reward.legend(fontsize="small")
    kl = [(step["step"], step["kl"]) for step in steps if step.get("kl") is not None]
    axes[0][1].plot([s for s, _ in kl], [v for _, v in kl], color="#d62728", marker=".")
    axes[0][1].set(title="KL to the reference model" if kl else "KL: not measured (train.rl.kl_weight 0)",
                   xlabel="step", ylabel="KL")
    axes[0][2].plot(x, [step.get("completions/mean_length") for step in steps], color="#2ca02c", marker=".")
    axes[0][2].set(title="Completion length (mean tokens)", xlabel="step", ylabel="tokens")
    return _svg(fig)


def lengths_plot(manifest: dict[str, Any]) -> bytes:
    """Token-length histogram of each split's examples, as prepare counted them."""
    fig, axes = _figure()
    ax = axes[0][0]
    for name, colour in (("train", TUNED_COLOUR), ("eval", "#ff7f0e")):
        histogram = manifest["splits"][name]["length_histogram"]
        edges, counts = histogram["bin_edges"], histogram["counts"]
        ax.stairs(counts, edges, fill=name == "train", alpha=0.6 if name == "train" else 1, color=colour,
                  label=f"{name} ({sum(counts)} examples)")
    ax.set(title=f"Token lengths (seq_len {manifest['seq_len']})", xlabel="tokens per example", ylabel="examples")
    ax.legend()
    return _svg(fig)


def margins_plot(pairs: list[dict[str, Any]]) -> bytes:
    """Held-out pairs' implicit reward margins (tuned - base log-prob gain of chosen minus rejected)."""
    fig, axes = _figure()
    ax = axes[0][0]
    margins = [row["reward_margin"] for row in pairs]
    ax.hist(margins, bins=min(20, max(len(margins), 1)), color=TUNED_COLOUR)
    ax.axvline(0, color="#555555", linewidth=1)
    ax.set(title="Reward margin per held-out pair (right of 0: the tuned model prefers the chosen answer)",
           xlabel="margin (nats)", ylabel="pairs")
    return _svg(fig)


def preference_section(metrics: dict[str, Any], pairs: list[dict[str, Any]]) -> str:
    """Report section of a preference recipe: how the models rank held-out answers, and a few of them."""
    if not pairs:
        return ""
    rows = [[html.escape(row["prompt"]).replace("\n", "<br>"), html.escape(a["answer"]) + (
        f" (label {row['label']})" if "label" in row else ""), html.escape(a["text"]).replace("\n", "<br>"),
             a["base_logp_per_token"], a["tuned_logp_per_token"]]
            for row in pairs if "prompt" in row for a in row["answers"]]
    plot = _img(margins_plot(pairs), "reward margins") if "reward_margin" in pairs[0] else ""
    return f"""
<h2>Preference</h2>
<p>Reward accuracy {_number(metrics.get("reward_accuracy"))}{
        f', mean reward margin {_number(metrics["reward_margin"])} nats' if "reward_margin" in metrics else ""}
over {metrics["eval_pairs"]} held-out rows (the implicit reward of an answer is the tuned model's log-probability
minus the base's).</p>
{plot}
{_table(["prompt (end, as templated)", "answer", "text", "base log-prob / token", "tuned log-prob / token"], rows)}
"""


def metrics_plot(metrics: dict[str, float]) -> bytes:
    """Base vs tuned: held-out loss, and the answer rates when generations ran; for GRPO, the mean rewards and each
    reward's accuracy."""
    rates = [name for name in ("exact_match", "token_f1", "stop_rate") if f"tuned_{name}" in metrics]
    if "tuned_reward_mean" in metrics:
        figures = reward_figures(metrics)
        groups = [(["reward_mean", *(f for f in figures if f.endswith("_mean"))], "mean reward (higher is better)"),
                  ([*(f for f in figures if f.endswith("_accuracy")), "stop_rate"],
                   "share of answers (higher is better)")]
    else:
        groups = [(["loss"], "held-out loss (lower is better)"), *([(rates, "answers (higher is better)")] if rates
                                                                     else [])]
    fig, axes = _figure(len(groups))
    for ax, (names, title) in zip(axes[0], groups):
        positions = range(len(names))
        for offset, (model, colour) in ((-0.2, ("base", BASE_COLOUR)), (0.2, ("tuned", TUNED_COLOUR))):
            ax.bar([p + offset for p in positions], [metrics[f"{model}_{n}"] for n in names], width=0.4,
                   color=colour, label=model)
        crowded = len(names) > 3
        ax.set_xticks(list(positions), names, rotation=20 if crowded else 0, ha="right" if crowded else "center")
        ax.set_title(title)
        ax.margins(y=0.3)  # headroom above the tallest bar, where the legend goes
        ax.legend(loc="upper right", ncols=2)
    return _svg(fig)


def compare_plot(rows: list[dict[str, Any]]) -> bytes:
    fig, axes = _figure()
    ax = axes[0][0]
    names = [row["recipe"] for row in rows]
    positions = range(len(names))
    ax.barh([p + 0.2 for p in positions], [row["base_loss"] for row in rows], height=0.4, color=BASE_COLOUR, label="base")
    ax.barh([p - 0.2 for p in positions], [row["tuned_loss"] for row in rows], height=0.4, color=TUNED_COLOUR,
            label="tuned")
    ax.set_yticks(list(positions), names)
    ax.invert_yaxis()
    ax.set(title="Held-out loss by recipe (best first)", xlabel="loss")
    ax.legend()
    return _svg(fig)


# ---- HTML pieces ---------------------------------------------------------------------------------------


def _img(svg: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/svg+xml;base64,{base64.b64encode(svg).decode()}">'


def _number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, int) or abs(value) >= 10_000:  # 13,410 rather than 1.341e+04
        return f"{value:,.0f}"
    return f"{value:.4g}" if not value.is_integer() else f"{value:g}"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    cells = "".join(
        "<tr>" + "".join(f'<td class="num">{_number(c)}</td>' if isinstance(c, int | float) and not isinstance(c, bool)
                         else f"<td>{c}</td>" for c in row) + "</tr>"
        for row in rows
    )
    # Long metric names may break after an underscore, so wide tables still fit the page.
    heads = "".join(f"<th>{html.escape(h).replace('_', '_<wbr>')}</th>" for h in header)
    return f'<div class="scroll"><table><tr>{heads}</tr>{cells}</table></div>'



def _mib(value: float | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)


def plan_rows(plan: Plan, train_metrics: dict[str, Any]) -> list[list[Any]]:
    """What the plan predicted next to what the training run measured."""
    time, memory = plan.time, plan.memory
    measured_seconds = train_metrics.get("trainer_runtime_seconds") or train_metrics["wall_seconds"]
    predicted_rate = time.tokens_per_step / time.seconds_per_step if time.seconds_per_step else None

    def ratio(measured, predicted):
        return f"{measured / predicted:.2f}×" if measured and predicted else "—"

    def timed(measured, predicted, slower: bool):
        """The ratio, and the machine's load when the run was slower than planned and the load explains it."""
        busy = busy_machine(train_metrics)
        return ratio(measured, predicted) + (f"; {busy}" if busy and slower else "")

    rate = train_metrics.get("tokens_per_second")
    rss, host_request = train_metrics.get("peak_host_memory_bytes"), plan.resources.mem_mb * 2**20
    return [
        ["optimizer steps", time.steps, train_metrics["steps"], ratio(train_metrics["steps"], time.steps)],
        ["training time (s)", time.seconds, measured_seconds,
         timed(measured_seconds, time.seconds, bool(time.seconds) and measured_seconds > 1.2 * time.seconds)],
        ["tokens / s", round(predicted_rate, 1) if predicted_rate else None, rate,
         timed(rate, predicted_rate, bool(rate and predicted_rate) and rate < predicted_rate / 1.2)],
        mfu_row(predicted_rate, time.flops_per_token, train_metrics),
        [f"peak training-step memory per {html.escape(memory.device)} device (MiB)",
         _mib(memory.peak_bytes_per_device), "—", "not measured separately"],
        [f"host memory (MiB): requested vs peak RSS of the training process (allocator: "
         f"{html.escape(train_metrics.get('allocator', 'not recorded'))})", _mib(host_request), _mib(rss),
         ratio(rss, host_request)],
    ]


def mfu_row(predicted_rate: float | None, flops_per_token: int, train_metrics: dict[str, Any]) -> list[Any]:
    """Model FLOPs utilisation (train_metrics.json's `mfu`): the plan's tokens/s and the measured, each × the plan's
    FLOPs per token over the device's peak, with the peak and where it came from."""
    peak = train_metrics.get("mfu_peak_flops")
    if "mfu" not in train_metrics:
        return ["model FLOPs utilisation", "—", "not recorded", "—"]
    predicted = predicted_rate * flops_per_token / peak if predicted_rate and peak else None
    measured = train_metrics["mfu"]
    label = (f"model FLOPs utilisation, of {peak / 1e9:,.0f} GFLOP/s: {html.escape(train_metrics['mfu_peak_source'])}"
             if peak else f"model FLOPs utilisation ({html.escape(train_metrics['mfu_peak_source'])})")
    return [label, f"{predicted * 100:.3g}%" if predicted else "—",
            f"{measured * 100:.3g}%" if measured is not None else "—",
            f"{measured / predicted:.2f}×" if measured and predicted else "—"]


def busy_machine(train_metrics: dict[str, Any]) -> str | None:
    """Words for a machine that was busier than its CPUs while training (train_metrics.json's `machine`): other
    work competed for the cores, which explains a run slower than planned. None when it was not, or not recorded."""
    machine = train_metrics.get("machine")
    if not machine:
        return None
    start, end, cpus = machine["load_average_start"][0], machine["load_average_end"][0], machine["cpus"]
    if max(start, end) <= cpus:
        return None
    return (f"the machine was busy: load average {start:g} at the start and {end:g} at the end of training on "
            f"{cpus} CPUs (above {cpus}, other work competed for the cores)")


def machine_note(train_metrics: dict[str, Any]) -> str:
    machine = train_metrics.get("machine")
    if not machine:
        return ""
    start, end = (" / ".join(f"{x:g}" for x in machine[key]) for key in ("load_average_start", "load_average_end"))
    return (f"<p>Machine load while training (1 / 5 / 15-minute load averages, {machine['cpus']} CPUs): {start} at the "
            f"start, {end} at the end.</p>")


def run_links(name: str, checkpoint_dir: Path, train_metrics: dict[str, Any], out: Path) -> str:
    """Links from the report (at `out`) to the checkpoint's model card, the TensorBoard run and the stages' logs."""
    def link(target: Path, text: str) -> str:
        return f'<a href="{html.escape(os.path.relpath(target, out.parent))}">{html.escape(text)}</a>'

    links = [link(checkpoint_dir / "README.md", "checkpoint's model card")]
    run = train_metrics.get("tensorboard_run")
    if run:
        links.append(link(Path(run), "TensorBoard run") + f" (<code>tensorboard --logdir {html.escape(str(Path(run).parent))}</code>)")
    logs = sorted(Path("logs", name).glob("*.log"))
    if logs:
        links.append("logs: " + ", ".join(link(log, log.stem) for log in logs))
    return "<p>" + " · ".join(links) + "</p>"


def reward_figures(metrics: dict[str, float]) -> list[str]:
    """The per-reward figures of a GRPO evaluation (`reward_<name>_mean`, `reward_<name>_accuracy`), in order."""
    return [key.removeprefix("tuned_") for key in metrics
            if key.startswith("tuned_") and REWARD_TERM_METRIC.match(key)]


def metrics_rows(metrics: dict[str, float]) -> list[list[Any]]:
    rows = []
    for name in ("loss", "perplexity", "reward_mean", *reward_figures(metrics), "exact_match", "token_f1",
                 "stop_rate", "preference_accuracy", "chosen_logp_per_token", "rejected_logp_per_token"):
        if metrics.get(f"tuned_{name}") is None or metrics.get(f"base_{name}") is None:
            continue
        base, tuned = metrics[f"base_{name}"], metrics[f"tuned_{name}"]
        lower_is_better = name in ("loss", "perplexity", "rejected_logp_per_token")
        better = tuned < base if lower_is_better else tuned > base
        change = "same" if tuned == base else (
            f'<span class="{"better" if better else "worse"}">{"better" if better else "worse"} '
            f"({tuned - base:+.4g})</span>")
        rows.append([html.escape(name), base, tuned, change])
    for key in sorted(k for k in metrics if k.startswith("base_lm_")):
        name = key.removeprefix("base_")
        tuned = metrics.get(f"tuned_{name}")
        change = "—" if tuned is None else f"{tuned - metrics[key]:+.4g}"  # the harness knows which way is better
        rows.append([html.escape(name), metrics[key], tuned, change])
    return rows


def _mark(run: str) -> str:
    """One run of a character a reader cannot see, as its mark (with its count when more than one)."""
    count = f"×{len(run)}" if len(run) > 1 else ""
    return f'<span class="ws" title="{len(run)} × U+{ord(run[0]):04X}">{MARKS.get(run[0], "·")}{count}</span>'


def visible(text: str) -> str:
    """`text` as HTML a reader can see all of: invisible characters (tabs, no-break and zero-width spaces, ...) as
    marks; whitespace before and after the text, runs of 3 or more newlines or spaces, and text that is only
    whitespace as marks with their count (48 newlines are one `↵×48`, not 48 blank lines)."""
    if not text.strip():
        return "".join(_mark(m.group()) for m in WHITESPACE_RUN.finditer(text))
    body = text.strip()
    lead, tail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()):]
    pieces = []
    for part in re.split(r"(\n{3,}| {3,})", body):
        if part and part.strip(" \n") == "" and len(part) >= 3:
            pieces.append(_mark(part) + ("\n" if part[0] == "\n" else ""))
        else:
            pieces.append(INVISIBLE_RUN.sub(lambda m: _mark(m.group()), html.escape(part)))
    around = [visible(side) if side else "" for side in (lead, tail)]
    return around[0] + "".join(pieces) + around[1]


def shown(text: str) -> str:
    """`visible(text)` in a <pre>, cut after SHOWN_LINES lines or SHOWN_CHARS characters with the rest behind a
    toggle."""
    # The line breaks as shown: a run of 3 or more newlines is one mark on one line.
    breaks = [(m.start(), m.end()) for m in re.finditer(r"\n{3,}|\n", text)]
    head, start = ((breaks[SHOWN_LINES - 1][1], breaks[SHOWN_LINES - 1][1])
                   if breaks[SHOWN_LINES - 1][1] - breaks[SHOWN_LINES - 1][0] >= 3 else breaks[SHOWN_LINES - 1]
                   ) if len(breaks) >= SHOWN_LINES else (len(text), len(text))
    if head > SHOWN_CHARS:
        head = start = SHOWN_CHARS
    rest = text[start:]
    if len(rest) < 40:  # not worth a toggle
        return f"<pre>{visible(text)}</pre>"
    return (f"<pre>{visible(text[:head])}</pre><details><summary>show the rest ({rest.count(chr(10)) + 1} more lines, "
            f"{len(rest):,} characters)</summary><pre>{visible(rest)}</pre></details>")


def _answer(result: dict[str, Any]) -> str:
    stop = "stopped" if result["stopped"] else "<b>did not stop</b>"
    if result["text"]:
        body = shown(result["text"])
    else:  # the scored text leaves out special tokens and surrounding whitespace: say which it was
        raw = result["raw"]
        what = ("nothing" if not raw else "only whitespace" if not raw.strip()
                else "only special tokens" + (" and whitespace" if re.search(r"\s", raw) else ""))
        body = f"<p><i>({what})</i></p>" + (shown(raw) if raw else "")
    return f"{body}<small>{result['new_tokens']} tokens, {stop}</small>"


def generation_rows(records: list[dict[str, Any]]) -> list[list[Any]]:
    return [[shown(r["prompt"]), shown(r["reference"]), _answer(r["base"]), _answer(r["tuned"])] for r in records]


def headline(metrics: dict[str, float]) -> tuple[str, str]:
    """The first banner: the held-out loss base -> tuned, or for GRPO the held-out prompts' mean reward."""
    if "tuned_reward_mean" in metrics:
        improvement = metrics["reward_improvement"]
        return ("good" if improvement > 0 else "bad",
                f"Held-out mean reward {metrics['base_reward_mean']:.4g} → {metrics['tuned_reward_mean']:.4g} "
                f"({'improved' if improvement > 0 else 'did not improve'} by {improvement:+.4g}, over "
                f"{metrics['eval_rows']} held-out prompts answered greedily)")
    improvement = metrics["loss_improvement"]
    return ("good" if improvement > 0 else "bad",
            f"Held-out loss {metrics['base_loss']:.4g} → {metrics['tuned_loss']:.4g} "
            f"({'improved' if improvement > 0 else 'did not improve'} by {improvement:+.4g}; perplexity "
            f"{metrics['base_perplexity']:.4g} → {metrics['tuned_perplexity']:.4g})")


def _scored(result: dict[str, Any]) -> str:
    """A GRPO answer with its reward and each reward's score."""
    scores = "".join(f"<br>{html.escape(key)}: {_number(value)}" for key, value in result["scores"].items())
    return f"{_answer(result)}<br><small><b>reward {_number(result['reward'])}</b>{scores}</small>"


def rl_step_rows(steps: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """train_metrics.json's `rl`, one row per logged step: the header and the rows."""
    keys = ["reward", "reward_std", *(k for k in steps[0] if k.startswith("rewards/") and k.endswith("/mean")),
            "kl", "completions/mean_length", "completions/clipped_ratio"]
    keys = [key for key in keys if any(step.get(key) is not None for step in steps)]
    return ["step", *keys], [[step["step"], *(step.get(key) for key in keys)] for step in steps]


def rl_section(metrics: dict[str, Any], records: list[dict[str, Any]], train_metrics: dict[str, Any]) -> str:
    """Report section of a GRPO recipe: each training step's reward, KL and completion length, and held-out prompts
    with base's and tuned's greedy answers and their scores."""
    header, rows = rl_step_rows(train_metrics["rl"])
    answers = (_table(["prompt (as templated)", "the row's columns", "base", "tuned"], [
        [shown(r["prompt"]), shown(json.dumps(r["columns"], ensure_ascii=False, indent=1)), _scored(r["base"]),
         _scored(r["tuned"])] for r in records]) if records else "<p>No prompts shown (eval.generations is 0).</p>")
    return f"""
<h2>Reinforcement learning (GRPO)</h2>
<p>Each of the {metrics["eval_rows"]} held-out prompts was answered greedily by base and tuned and scored by the
recipe's rewards as training scored its samples; a reward's accuracy is the share of prompts on which it passed (a
built-in at its best score: 1 for answer, format and tool_call, 0 for length; a python reward above 0).</p>
<details><summary>each training step: reward, each reward's mean, KL, completion length
({len(rows)} logged steps)</summary>{_table(header, rows)}</details>
<h3>Held-out prompts (the first {len(records)} by content hash)</h3>
{answers}
"""


def verdict_banners(metrics: dict[str, float], verdicts: list[dict[str, Any]]) -> str:
    banners = [headline(metrics)]
    if "tuned_stop_rate" in metrics and metrics["tuned_stop_rate"] < 1:
        # Red when fine-tuning made stopping worse; amber when it did not, but answers still run on.
        worse = metrics["tuned_stop_rate"] < metrics["base_stop_rate"]
        banners.append(("bad" if worse else "warn", f"The tuned model did not stop in {1 - metrics['tuned_stop_rate']:.0%} of its answers "
                               f"(base model: {1 - metrics['base_stop_rate']:.0%})"))
    for verdict in verdicts:
        banners.append(("good" if verdict["passed"] else "bad", "Gate: " + html.escape(gate.describe(verdict))))
    if not verdicts:
        example = "reward_improvement" if "reward_improvement" in metrics else "loss_improvement"
        banners.append(("warn", f"No regression gates: add eval.gate to the recipe, e.g. {{{example}: {{min: 0}}}}"))
    return "".join(f'<div class="banner {kind}">{text}</div>' for kind, text in banners)


def recipe_rows(recipe: dict[str, Any]) -> list[list[Any]]:
    train, data = recipe["train"], recipe["data"]
    lora = f" (r {train['lora']['r']}, alpha {train['lora']['alpha']})" if train.get("lora") else ""
    return [
        ["model", html.escape(Model.model_validate(recipe["model"]).name)],
        ["data", "<br>".join(html.escape(s["path"] or f"hub:{s['hub']}") for s in data["sources"])],
        ["method", html.escape(f"{train['method']}{lora} on {train['backend']}")],
        ["schedule", html.escape(f"{train['epochs']} epochs" if train["max_steps"] is None else f"{train['max_steps']} steps")
         + html.escape(f", global batch {train['global_batch_size']}, lr {train['learning_rate']:g} {train['lr_scheduler']}")],
        ["seq_len", data["seq_len"]],
        ["hardware", html.escape(f"{recipe['hardware']['accelerator']}, {recipe['hardware']['gpus']} GPUs × "
                                 f"{recipe['hardware']['nodes']} nodes")],
    ]


def stage_rows(metrics: dict[str, Any], lineage: list[dict[str, Any]]) -> list[list[Any]]:
    """One row per model of a chain (model.recipe), root first: what trained it (the checkpoint manifest's lineage)
    and its held-out loss on this recipe's eval split (eval.json's root_, upstream_<recipe>_, base_ and tuned_)."""
    names = ["root", *(f"upstream_{stage['recipe']}" for stage in lineage[:-2]), "base", "tuned"]
    stages = [None, *lineage]
    rows = []
    for name, stage in zip(names, stages, strict=True):
        model = lineage[0]["base_model"] if stage is None else f"recipe {stage['recipe']} ({stage['method']})"
        figures = ([metrics[f"{name}_reward_mean"]] if "tuned_reward_mean" in metrics
                   else [metrics[f"{name}_loss"], metrics[f"{name}_perplexity"]])
        rows.append([html.escape(model), "—" if stage is None else f"<code>{stage['recipe_hash'][:12]}</code>",
                     "—" if stage is None else f"<code>{stage['data_fingerprint'][:12]}</code>", *figures])
    return rows


def stage_section(metrics: dict[str, Any], manifest: dict[str, Any]) -> str:
    """The stages of a recipe built on others; nothing for a recipe on a model."""
    lineage = manifest.get("lineage", [])
    if len(lineage) < 2:
        return ""
    return ("<h2>Stages</h2><p>Each model of the chain, from the root model down, on this recipe's held-out split; "
            "base is the direct base, the upstream recipe's checkpoint.</p>"
            + _table(["model", "recipe hash", "data fingerprint", *(["held-out mean reward"] if "tuned_reward_mean" in
                                                                       metrics else ["held-out loss", "perplexity"])],
                     stage_rows(metrics, lineage)))


def data_rows(manifest: dict[str, Any]) -> list[list[Any]]:
    """Each split's examples (GRPO: prompts), tokens and supervised tokens, as prepare counted them."""
    splits = manifest["splits"]
    return [[name, splits[name]["examples"] if "examples" in splits[name] else splits[name]["rows"],
             splits[name]["tokens"], splits[name]["supervised_tokens"]] for name in ("train", "eval")]


def page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>{body}</body></html>\n")


# ---- the pages -----------------------------------------------------------------------------------------

PLOTS = ("metrics", "training", "lengths")


def write_report(name: str, recipe: dict[str, Any], plan_path: Path, checkpoint_dir: Path, prepared_dir: Path,
                 metrics_path: Path, generations_path: Path, pairs_path: Path, out: Path,
                 plot_paths: dict[str, Path]) -> None:
    """report.html for one recipe, and its plots as SVG files (`plot_paths`, keyed by PLOTS)."""
    metrics, records, pairs = read_json(metrics_path), read_json(generations_path), read_json(pairs_path)
    plan, train_metrics = read_plan(plan_path), read_json(checkpoint_dir / "train_metrics.json")
    manifest = read_json(prepared_dir / "manifest.json")
    plots = {"metrics": metrics_plot(metrics), "training": training_plot(train_metrics),
             "lengths": lengths_plot(manifest)}
    verdicts = gate.check(metrics, {m: Gate.model_validate(b) for m, b in recipe["eval"]["gate"].items()})
    grpo = "tuned_reward_mean" in metrics
    if grpo:
        samples = rl_section(metrics, records, train_metrics)
    else:
        answers = (_table(["prompt (as templated)", "reference", "base", "tuned"], generation_rows(records)) if records
                   else "<p>No generations (eval.generations is 0).</p>")
        samples = f"<h2>Sample answers (greedy, at most {recipe['eval']['max_new_tokens']} new tokens)</h2>\n{answers}"
    other = _table(["metric", "value", "meaning"], [[html.escape(k), v, html.escape(EVAL_METRICS[k])]
                                                     for k, v in metrics.items() if k in ("eval_rows", "eval_supervised_tokens", "generations",
                                                                                          "eval_pairs", "reward_accuracy", "reward_margin")])
    body = f"""
<h1>{html.escape(name)}</h1>
<p>{html.escape(Model.model_validate(recipe['model']).name)}, {html.escape(recipe['train']['method'])} fine-tune: did it help, and did it break anything?</p>
{run_links(name, checkpoint_dir, train_metrics, out)}
{verdict_banners(metrics, verdicts)}
<h2>Base vs tuned</h2>
{_table(["metric", "base", "tuned", "change"], metrics_rows(metrics))}
{stage_section(metrics, read_json(checkpoint_dir / "manifest.json"))}
{other}
{_img(plots["metrics"], "base vs tuned metrics")}
{preference_section(metrics, pairs)}
{samples}
<h2>Training</h2>
{_img(plots["training"], "reward, KL and completion length per step" if grpo else "training loss and learning rate")}
<h2>Plan: predicted vs measured</h2>
<p>Precision {html.escape(str(plan.precision))}, micro-batch {plan.layout.micro_batch_size} ×
accumulation {plan.layout.gradient_accumulation_steps} × {plan.layout.devices} device(s),
gradient checkpointing {'on' if plan.gradient_checkpointing else 'off'}, memory estimator
{html.escape(plan.memory.estimator)}.</p>
{_table(["", "predicted", "measured", "measured / predicted"], plan_rows(plan, train_metrics))}
{machine_note(train_metrics)}
<h2>Data</h2>
{_table(["split", "prompts" if grpo else "examples", "tokens", "supervised tokens"], data_rows(manifest))}
{_img(plots["lengths"], "token-length histogram")}
<h2>Recipe</h2>
{_table(["field", "value"], recipe_rows(recipe))}
<details><summary>full recipe</summary><pre>{html.escape(yaml.safe_dump(recipe, sort_keys=False))}</pre></details>
"""
    for key, path in plot_paths.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(plots[key])
    _write(out, page(f"xtrain report: {name}", body))


def eval_fingerprint(prepared_dir: Path) -> str:
    """What a recipe's held-out metrics were measured on: its eval split as prepared (the rows' tokens and masks, so
    the tokenizer, template and seq_len too). Losses compare only between recipes with the same one."""
    return hashlib.sha256((prepared_dir / "eval.parquet").read_bytes()).hexdigest()[:12]


def flat_fields(recipe: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A recipe as `section.field` -> value (lists and the sources as their JSON text)."""
    flat = {}
    for key, value in recipe.items():
        if isinstance(value, dict):
            flat |= flat_fields(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, list) else value
    return flat


def rank(row: dict[str, Any]) -> float:
    """A recipe's place in its group, best first: the lowest tuned held-out loss; a GRPO recipe (whose held-out rows
    are prompts, so its group holds GRPO recipes only) by the highest tuned mean reward."""
    value = row["tuned_loss"] if "tuned_loss" in row else -row["tuned_reward_mean"]
    return value if math.isfinite(value) else math.inf


def compare_rows(metrics_paths: dict[str, Path], fingerprints: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """The recipes grouped by the eval set they were measured on (its fingerprint), each group best (lowest tuned
    held-out loss) first; the groups with the most recipes first."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for name, path in metrics_paths.items():
        groups.setdefault(fingerprints[name], []).append({"recipe": name, **read_json(path)})
    for rows in groups.values():
        rows.sort(key=rank)
    return dict(sorted(groups.items(), key=lambda group: (-len(group[1]), group[1][0]["recipe"])))


def differing_fields(recipes: list[dict[str, Any]]) -> list[str]:
    """The recipe fields whose values are not the same in all of `recipes`."""
    flat = [flat_fields(recipe) for recipe in recipes]
    fields = sorted({key for one in flat for key in one})
    return [key for key in fields if len({json.dumps(one.get(key), sort_keys=True, default=str) for one in flat}) > 1]


def write_compare(metrics_paths: dict[str, Path], out: Path, prepared_dirs: dict[str, Path],
                  recipes: dict[str, dict[str, Any]]) -> None:
    """reports/compare.html: one table per eval set (recipes ranked only against those measured on the same held-out
    rows), with the recipe fields that differ between them as columns."""
    groups = compare_rows(metrics_paths, {name: eval_fingerprint(prepared_dirs[name]) for name in metrics_paths})
    sections = []
    for fingerprint, rows in groups.items():
        harness = sorted({k for row in rows for k in row if k.startswith(("base_lm_", "tuned_lm_"))})
        columns = [m for m in EVAL_METRICS if any(m in row for row in rows)] + harness
        fields = differing_fields([recipes[row["recipe"]] for row in rows])
        flat = {row["recipe"]: flat_fields(recipes[row["recipe"]]) for row in rows}
        table = _table(["rank", "recipe", *fields, *columns], [
            [rank, f'<a href="{html.escape(row["recipe"])}/report.html">{html.escape(row["recipe"])}</a>',
             *[html.escape(str(flat[row["recipe"]].get(field, "—"))) for field in fields],
             *[row.get(m) for m in columns]] for rank, row in enumerate(rows, 1)
        ])
        differ = (f"the fields that differ between them: {', '.join(f'<code>{html.escape(f)}</code>' for f in fields)}"
                  if fields else "their recipes are the same")
        grpo = "tuned_reward_mean" in rows[0]
        ranked = ("tuned mean reward over the held-out prompts (each recipe scored by its own train.rewards: compare "
                  "only recipes with the same rewards)" if grpo else "tuned held-out loss")
        sections.append(f"<h2>Eval set <code>{fingerprint}</code>: {len(rows)} recipe(s), {rows[0].get('eval_rows', '—')} "
                        f"held-out rows</h2><p>Ranked by {ranked}; {differ}.</p>{table}"
                        + ("" if grpo else f"{_img(compare_plot(rows), f'loss by recipe, eval set {fingerprint}')}"))
    apart = ("<p>Recipes evaluated on different held-out rows (another data set, tokenizer, template or seq_len) are "
             "in separate tables: their losses do not compare.</p>" if len(groups) > 1 else "")
    body = (f"<h1>Recipes ranked per eval set</h1>{apart}{''.join(sections)}"
            "<p>Each recipe's own page: <code>reports/&lt;recipe&gt;/report.html</code>.</p>")
    _write(out, page("xtrain: recipes compared", body))


def _write(out: Path, text: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(out)
