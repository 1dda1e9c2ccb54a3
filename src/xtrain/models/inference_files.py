"""The files that make a checkpoint behave where people run it: `generation_config.json`, which stops at the
chat template's end-of-turn token, and the model card `README.md` (Hugging Face's format: a YAML header, then
what was trained on what, how, and with which result).

A model fine-tuned to end its answers with `<|eot_id|>` runs on in transformers or vLLM when its generation
config stops only at `<|end_of_text|>`: the end-of-turn token that prepare supervised (prepared manifest's
`end_of_turn`) joins the base model's `eos_token_id`s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def write_generation_config(model_dir: Path, out: Path, end_of_turn: dict | None, trust_remote_code: bool) -> list[int]:
    """The base model's generation config with the end-of-turn token among its eos ids; the ids written."""
    from transformers import AutoConfig, GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(model_dir)
    except OSError:  # no generation_config.json: the model config's defaults
        config = GenerationConfig.from_model_config(AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code))
    eos = config.eos_token_id
    ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if end_of_turn and end_of_turn["id"] not in ids:
        ids.append(end_of_turn["id"])
    config.eos_token_id = ids[0] if len(ids) == 1 else ids
    config.save_pretrained(out)
    return ids


def base_license(model_dir: Path) -> str | None:
    """The license a base model's own card declares, if it has one."""
    card = model_dir / "README.md"
    if not card.is_file():
        return None
    parts = card.read_text(encoding="utf-8", errors="replace").split("---")
    try:
        header = yaml.safe_load(parts[1]) if len(parts) > 2 and not parts[0].strip() else None
    except yaml.YAMLError:
        return None
    return header.get("license") if isinstance(header, dict) else None


def figure(value: Any) -> str:
    """A number as a card shows it: four significant digits; anything else (a missing base figure) blank."""
    return f"{value:.4g}" if isinstance(value, (int, float)) else ""


def evaluation_section(recipe: str, evaluation: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """The card's `model-index` header entry (the tuned model's held-out figures, Hugging Face's format) and its
    Evaluation section: each eval.json metric for base and tuned side by side. Without an evaluation (a
    checkpoint's card is written before the evaluate stage runs), a pointer to where it will be."""
    if evaluation is None:
        return {}, [f"Base vs tuned on the held-out split: `reports/{recipe}/eval.json` and `reports/{recipe}/report.html` "
                    "(written after this checkpoint, by the evaluate stage; with an `export:` section, the export's card "
                    "carries them)."]
    names = sorted({key.removeprefix("tuned_") for key in evaluation if key.startswith("tuned_")})
    rows = [f"| {name} | {figure(evaluation.get(f'base_{name}'))} | {figure(evaluation[f'tuned_{name}'])} |"
            for name in names]
    others = [f"{key} {figure(value)}" for key, value in sorted(evaluation.items())
              if not key.startswith(("base_", "tuned_"))]
    index = {"model-index": [{"name": recipe, "results": [{
        "task": {"type": "text-generation", "name": "held-out split"},
        "dataset": {"type": "xtrain-prepared", "name": f"prepared/{recipe} eval split"},
        "metrics": [{"type": name, "value": round(float(evaluation[f"tuned_{name}"]), 6), "name": f"tuned {name}"}
                    for name in names],
    }]}]}
    return index, ["Base model vs this one on the held-out split (`reports/" + recipe + "/eval.json`):", "",
                   "| metric | base | tuned |", "| --- | --- | --- |", *rows, "", "; ".join(others) + "."]


def usage_lines(plain: bool, folder: str | None, gguf_files: list[str], ollama: bool) -> list[str]:
    """How to run what the card's folder holds: the transformers model in `folder` (PEFT's class for an adapter),
    the GGUF files with llama.cpp, the Modelfile with Ollama."""
    model_class = "AutoModelForCausalLM" if plain else "AutoPeftModelForCausalLM"
    lines = ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer" if plain else
             "from peft import AutoPeftModelForCausalLM\nfrom transformers import AutoTokenizer",
             f"model = {model_class}.from_pretrained(\"{folder}\")",
             f"tokenizer = AutoTokenizer.from_pretrained(\"{folder}\")  # its chat template is the base model's",
             "```"] if folder else []
    if gguf_files:
        lines += ["```sh", *(f"llama-cli -m {name} -cnv" for name in gguf_files),
                  *(["ollama create <name> -f Modelfile && ollama run <name>"] if ollama else []), "```"]
    return lines


def quantized_lines(train: dict[str, Any], merged_dtype: str | None) -> list[str]:
    """What the card says of a QLoRA run: the base was trained quantized, the adapter is for the unquantized base."""
    if train["method"] != "qlora":
        return []
    settings = train["quantization"]
    merged = (f" It is merged here into the base loaded unquantized in {merged_dtype}, never into 4-bit weights."
              if merged_dtype else "")
    return [f"Trained quantized (QLoRA): the adapter learned on the base's linear layers stored in {settings['bits']} "
            f"bits ({settings['quant_type']}{', double-quantized' if settings['double_quant'] else ''}, bitsandbytes) "
            f"and applies to the unquantized base.{merged}", ""]


def model_card(*, recipe: str, base_model: str, backend: str, train: dict[str, Any], hardware: dict[str, Any],
               data: dict[str, Any], metrics: dict[str, Any], license_: str | None,
               evaluation: dict[str, Any] | None = None, merged_dtype: str | None = None,
               model_folder: str | None = "<this folder>", gguf_files: list[str] = (), ollama: bool = False,
               lineage: list[dict[str, Any]] = ()) -> str:
    """README.md in the Hugging Face model-card format: of a checkpoint; or of an export (`exports/<recipe>/`:
    a merged model in `merged_dtype` in `model_folder` (None: none), GGUF files, a Modelfile) with the
    evaluation results."""
    method, objective = train["method"], train.get("objective", "sft")
    plain = method == "full" or merged_dtype is not None
    index, evaluation_lines = evaluation_section(recipe, evaluation)
    header = {"base_model": base_model,
              "library_name": "transformers" if plain else "gguf" if gguf_files else "peft",
              "tags": ["xtrain", backend, method, objective, *(["merged"] if merged_dtype else []),
                       *(["gguf"] if gguf_files else [])],
              **({"license": license_} if license_ else {}), **index}
    form = "full fine-tune" if method == "full" else "LoRA adapter merged into the base weights" \
        if merged_dtype or gguf_files else "LoRA adapter"
    form += f", {merged_dtype} weights" if merged_dtype else ""
    form += f"; GGUF {', '.join(gguf_files)}" if gguf_files else ""
    sources = "\n".join(f"| `{name}` | {stats.get('format', '')} | {stats['rows']} | {stats['kept']} | "
                        f"{', '.join(f'{reason} {count}' for reason, count in stats['dropped'].items()) or 'none'} |"
                        for name, stats in data["sources"].items())
    train_split, eval_split = data["splits"]["train"], data["splits"]["eval"]
    per_row = train_split.get("sequences_per_row", 1)
    examples = f"{train_split['rows']} pairs ({train_split['rows'] * per_row} sequences)" if per_row == 2 else \
        f"{train_split['rows']} sequences"
    lines = [
        "---", yaml.safe_dump(header, sort_keys=False).strip(), "---", "",
        f"# {recipe}", "",
        f"`{base_model}` fine-tuned with xtrain ({objective}, {form}, backend `{backend}`), recipe "
        f"`recipes/{recipe}.yaml`.", "",
        "## Use", "", *usage_lines(plain, model_folder, list(gguf_files), ollama), "",
        "`generation_config.json` stops at the chat template's end-of-turn token"
        + (f" `{data['end_of_turn']['token']}`" if data.get("end_of_turn") else "") + ".", "",
        "## Data", "",
        f"Chat template: `{data['chat_template']}`; assistant tokens found by {data.get('masking', 'n/a')}"
        + ("; every token trained (data.train_on_inputs)" if data.get("train_on_inputs") else "") + ".",
        f"Train split: {examples}, {train_split['tokens']} tokens ({train_split['supervised_tokens']} supervised); "
        f"eval split: {eval_split['rows']} rows. Fingerprint `{data['fingerprint']}`.", "",
        "| source | format | rows | kept | dropped |", "| --- | --- | --- | --- | --- |", sources, "",
        "## Training", "",
        f"{metrics['steps']} optimizer steps, {metrics['tokens_seen']} tokens, final loss "
        f"{figure(metrics['final_loss']) or 'n/a'} (time and speed: `train_metrics.json`; the card holds only what "
        "a rebuild reproduces).", "", *quantized_lines(train, merged_dtype),
        "```yaml", yaml.safe_dump({"train": train, "hardware": hardware}, sort_keys=False).strip(), "```", "",
        *stage_lines(lineage),
        "## Evaluation", "", *evaluation_lines, "",
    ]
    return "\n".join(lines)


def stage_lines(lineage: list[dict[str, Any]]) -> list[str]:
    """The card's "Stages" section for a recipe built on others (`model.recipe`): each stage from the root model
    down, with its recipe hash and data fingerprint (the checkpoint manifest's lineage); none for one stage."""
    if len(lineage) < 2:
        return []
    rows = [f"| {i} | `{stage['recipe']}` | {stage['method']} | `{stage['base_model']}` | `{stage['recipe_hash'][:12]}` "
            f"| `{stage['data_fingerprint'][:12]}` |" for i, stage in enumerate(lineage, 1)]
    return ["## Stages", "", f"Trained in {len(lineage)} stages from `{lineage[0]['base_model']}`, each on the one "
            "before it:", "", "| stage | recipe | method | trained on | recipe hash | data fingerprint |",
            "| --- | --- | --- | --- | --- | --- |", *rows, ""]
