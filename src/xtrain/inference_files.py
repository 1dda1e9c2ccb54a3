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


def model_card(*, recipe: str, base_model: str, method: str, backend: str, train: dict[str, Any],
               hardware: dict[str, Any], data: dict[str, Any], metrics: dict[str, Any], license_: str | None,
               merged_dtype: str | None = None) -> str:
    """README.md of a checkpoint, in the Hugging Face model-card format; of its merged export (one plain
    transformers model, weights in `merged_dtype`) when that is given."""
    plain = method == "full" or merged_dtype is not None
    header = {"base_model": base_model, "library_name": "transformers" if plain else "peft",
              "tags": ["xtrain", backend, method, "sft", *(["merged"] if merged_dtype else [])],
              **({"license": license_} if license_ else {})}
    form = "full fine-tune" if method == "full" else "LoRA adapter merged into the base weights" if merged_dtype \
        else "LoRA adapter"
    form += f", {merged_dtype} weights" if merged_dtype else ""
    sources = "\n".join(f"| `{name}` | {stats.get('format', '')} | {stats['rows']} | {stats['kept']} | "
                        f"{', '.join(f'{reason} {count}' for reason, count in stats['dropped'].items()) or 'none'} |"
                        for name, stats in data["sources"].items())
    splits = data["splits"]
    lines = [
        "---", yaml.safe_dump(header, sort_keys=False).strip(), "---", "",
        f"# {recipe}", "",
        f"`{base_model}` fine-tuned with xtrain ({form}, backend `{backend}`), recipe `recipes/{recipe}.yaml`.", "",
        "## Use", "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer" if plain else
        "from peft import AutoPeftModelForCausalLM\nfrom transformers import AutoTokenizer",
        f"model = {'AutoModelForCausalLM' if plain else 'AutoPeftModelForCausalLM'}.from_pretrained(\"<this folder>\")",
        "tokenizer = AutoTokenizer.from_pretrained(\"<this folder>\")  # its chat template is the base model's",
        "```", "",
        "`generation_config.json` stops at the chat template's end-of-turn token"
        + (f" `{data['end_of_turn']['token']}`" if data.get("end_of_turn") else "") + ".", "",
        "## Data", "",
        f"Chat template: `{data['chat_template']}`; assistant tokens found by {data.get('masking', 'n/a')}"
        + ("; every token trained (data.train_on_inputs)" if data.get("train_on_inputs") else "") + ".",
        f"Train split: {splits['train']['rows']} sequences, {splits['train']['tokens']} tokens "
        f"({splits['train']['supervised_tokens']} supervised); eval split: {splits['eval']['rows']} rows. "
        f"Fingerprint `{data['fingerprint']}`.", "",
        "| source | format | rows | kept | dropped |", "| --- | --- | --- | --- | --- |", sources, "",
        "## Training", "",
        f"{metrics['steps']} optimizer steps, {metrics['tokens_seen']} tokens, final loss {metrics['final_loss']}, "
        f"{metrics['tokens_per_second']} tokens/s, {metrics['wall_seconds']} s.", "",
        "```yaml", yaml.safe_dump({"train": train, "hardware": hardware}, sort_keys=False).strip(), "```", "",
        "## Evaluation", "",
        f"Base vs tuned on the held-out split: `reports/{recipe}/eval.json` and `reports/{recipe}/report.html` "
        "(written after this checkpoint, by the evaluate stage).", "",
    ]
    return "\n".join(lines)
