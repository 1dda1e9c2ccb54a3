"""Everything checked about a recipe before any job runs: its schema, its paths, its model (the files of its folder:
a tokenizer, safetensors weights, an architecture transformers knows or `model.trust_remote_code`, positions for
`data.seq_len`, and what a GGUF export will need), its lm-eval task folder (no Python unless `eval.lm_eval.trust_code`), its data (each local
source's format is detected and its first rows parse), its batch layout and what its backend can honour.

The workflow (rules/common.smk) runs `preflight` on every recipe as it starts, so a mistake costs no
compute; a failure is a `RecipeError` that names the recipe file, the field and what to do.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from .data.lengths import check_seq_len
from .data.pipeline import check_first_rows
from .errors import XtrainError
from .evaluate.harness import check_task_code
from .models.hub import model_folder
from .paths import check_recipe_paths
from .plan.planner import check_micro_batch
from .recipe import DATA_KINDS, Export, Model, Recipe, RecipeError, load_recipe
from .train.backends import registry

log = logging.getLogger(__name__)

# Any one of these makes a folder's tokenizer loadable (fast tokenizer, sentencepiece, BPE or WordPiece vocabulary).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")


def preflight(path: str | Path, project: Path, allowed: Iterable[str] = (), built: Iterable[str] = ()) -> Recipe:
    """Load and check one recipe file; `allowed` and `built` as in `paths.check_recipe_paths`."""
    recipe = load_recipe(path)
    check_recipe_paths(recipe, str(path), project, allowed, built)
    try:
        # A hub model must be in the cache. A recipe on another recipe's checkpoint (model.recipe) has its model
        # checked where its chain starts, and the chain by xtrain.chain.check_chains, once every recipe is read.
        folder = project / model_folder(recipe.model) if recipe.model.recipe is None else None
        if folder is not None and (folder / "config.json").is_file():  # else a rule builds it
            check_model_folder(folder, recipe.model, recipe.export)
            check_seq_len(folder, recipe.data.seq_len)
        if recipe.eval.lm_eval is not None:
            check_task_code(recipe.eval.lm_eval, project)
        for source in recipe.data.sources:
            if source.path is not None and (project / source.path).exists():
                check_first_rows(source, project / source.path, DATA_KINDS[recipe.train.objective])
        check_micro_batch(recipe.train, recipe.hardware)
        registry.check(recipe.train.backend, recipe.train, recipe.hardware, packed=recipe.data.packing)
    except XtrainError as exc:  # these name the field; the recipe file is added here
        raise RecipeError(f"{path}: {exc}") from None
    if recipe.model.trust_remote_code:
        log.warning("%s: model.trust_remote_code is set: the Python code in %s will run", path, recipe.model.name)
    return recipe


def check_model_folder(folder: Path, model: Model, export: Export | None) -> None:
    """What a model folder's files say without loading weights: it has a tokenizer, its weights are not only pickles
    (unpickling runs code), its architecture is one transformers knows unless `model.trust_remote_code`, and a GGUF
    export can write it."""
    field = "model.path" if model.hub is None else "model.hub"
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise XtrainError(f"{field}: {folder} has no tokenizer files (one of {', '.join(TOKENIZER_FILES)}): copy the "
                          "base model's tokenizer into the folder")
    pickles = sorted(folder.glob("pytorch_model*.bin"))
    if pickles and not any(folder.glob("*.safetensors")):
        raise XtrainError(
            f"{field}: {pickles[0]} holds pickled weights (loading a pickle can run code) and the folder has no "
            "safetensors: convert them once, where you trust the file, e.g. `python -c \"from transformers import "
            f"AutoModelForCausalLM as M; M.from_pretrained('{folder}').save_pretrained('{folder}')\"` (it writes "
            "model.safetensors), then remove the .bin files"
        )
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    model_type = config.get("model_type") if isinstance(config, dict) else None
    # An auto_map beside a model_type transformers knows is not used without trust_remote_code: only the rest is custom.
    if not model.trust_remote_code and (model_type is not None or "auto_map" in config):
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        if model_type not in CONFIG_MAPPING_NAMES:
            code = " (its auto_map names the Python files)" if "auto_map" in config else ""
            raise XtrainError(
                f"model.trust_remote_code: {folder / 'config.json'} names model_type {model_type!r}, an architecture "
                f"transformers does not know, whose code ships with the model{code}: set model.trust_remote_code: "
                "true to run that code (read it first), or use a model transformers knows"
            )
    if export is not None and export.gguf:
        check_gguf_export(folder, model)


def check_gguf_export(folder: Path, model: Model) -> None:
    """What export.gguf will need: an architecture the GGUF writer knows, and an embedding row for every token."""
    from transformers import AutoConfig, AutoTokenizer

    from .export.gguf_file import gguf_architecture

    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=model.trust_remote_code)
        tokens = len(AutoTokenizer.from_pretrained(folder, trust_remote_code=model.trust_remote_code).get_vocab())
    except (OSError, ValueError) as exc:
        log.debug("reading %s", folder, exc_info=True)
        raise XtrainError(f"export.gguf: transformers cannot read the config or tokenizer of {folder}: "
                          f"{str(exc).splitlines()[0]}") from None
    gguf_architecture(config)
    if tokens > config.vocab_size:
        raise XtrainError(f"export.gguf: the tokenizer of {folder} has {tokens} tokens, more than the model's "
                          f"{config.vocab_size} embedding rows (vocab_size in config.json): GGUF files cannot hold it; "
                          "use the model's own tokenizer, or remove export.gguf")
