"""Everything checked about a recipe before any job runs: its schema, its paths, its model (the files of its folder:
a tokenizer, safetensors weights, an architecture transformers knows or `model.trust_remote_code`, positions for
`data.seq_len`, and what a GGUF export will need), its lm-eval task folder (no Python unless `eval.lm_eval.trust_code`), its GRPO rewards (a Python reward's function
found in its file by `ast`, never run), its data (each local source's format is detected and its first rows parse, and
hold every column a reward reads), its batch layout and what its backend can honour.

The workflow (rules/common.smk) runs `preflight` on every recipe as it starts, so a mistake costs no
compute; a failure is a `RecipeError` that names the recipe file, the field and what to do.
"""

from __future__ import annotations

import ast
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
from xtrain_backend_side.rewards import REWARDS_FOLDER, needed_columns

from .recipe import DATA_KINDS, Export, Model, Recipe, RecipeError, Reward, load_recipe
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
        reward_columns = check_rewards(recipe.train.rewards, project)
        for source in recipe.data.sources:
            if source.path is not None and (project / source.path).exists():
                check_first_rows(source, project / source.path, DATA_KINDS[recipe.train.objective],
                                 reward_columns=reward_columns)
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


# What TRL passes every reward besides the prompt row's columns (xtrain_backend_side.rewards.Term).
REWARD_ARGUMENTS = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                    "environments"}


def check_rewards(rewards: list[Reward], project: Path) -> dict[str, str]:
    """The columns train.rewards read from each prompt row (column -> the reward that reads it): the built-ins'
    (`answer`, `tools` or the column named), and each Python reward's parameters without a default."""
    needed = needed_columns(reward.model_dump() for reward in rewards)
    for index, reward in enumerate(rewards):
        if reward.type == "python":
            for column in python_reward_columns(project, reward.file, reward.function, f"train.rewards[{index}]"):
                needed.setdefault(column, reward.name)
    return needed


def python_reward_columns(project: Path, file: str, function: str, field: str) -> list[str]:
    """The row columns `function` of the reward file reads (its parameters without a default), read from the file
    with `ast`, never run; refused: a file resolving outside the project's rewards/, one that does not parse, no
    such function at its top level, an async one, one without **kwargs (each reward is called with every column)."""
    folder = (project / REWARDS_FOLDER).resolve()
    path = (project / file).resolve()
    if not path.is_relative_to(folder):
        raise XtrainError(f"{field}.file: {file} resolves to {path}, outside {folder}: reward code lives in the "
                          f"project's {REWARDS_FOLDER}/ folder; copy the file there rather than linking it")
    try:
        tree = ast.parse(path.read_bytes(), filename=file)
    except SyntaxError as exc:
        raise XtrainError(f"{field}.file: {file} line {exc.lineno}: {exc.msg}: fix the file") from None
    defined = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    bound = {name.id for node in tree.body if isinstance(node, ast.Assign | ast.AnnAssign)
             for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
             for name in ast.walk(target) if isinstance(name, ast.Name)}
    bound |= {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    node = defined.get(function)
    if node is None:
        if function in bound:  # made by a call or imported: its parameters are known only when it runs
            return []
        names = sorted(name for name in defined if not name.startswith("_"))
        raise XtrainError(f"{field}.function: {file} defines no function {function!r} at its top level (it defines "
                          f"{names or 'none'}): fix train.rewards[].function or define it in the file")
    where = f"{field}.function: {function} ({file} line {node.lineno})"
    if isinstance(node, ast.AsyncFunctionDef):
        raise XtrainError(f"{where} is async; rewards are called as plain functions: define it with `def`")
    args = node.args
    if args.posonlyargs:
        raise XtrainError(f"{where} takes positional-only parameters; rewards are called with keyword arguments: "
                          "remove the `/`")
    if args.kwarg is None:
        raise XtrainError(f"{where} takes no **kwargs, but each reward is called with the prompts, completions, "
                          "completion_ids, every column of the row and TRL's trainer_state: add **kwargs for those it "
                          "does not read")
    required = args.args[:len(args.args) - len(args.defaults)]
    required += [arg for arg, default in zip(args.kwonlyargs, args.kw_defaults) if default is None]
    return [arg.arg for arg in required if arg.arg not in REWARD_ARGUMENTS]
