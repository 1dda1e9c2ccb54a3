"""Recipes built on other recipes (`model.recipe`): stages of one DAG, from the root model down.

A recipe whose `model.recipe` names another trains on that recipe's checkpoint. What its jobs read as "the base
model" (`base_folder`, the `model` input of its rules) follows from what the upstream recipe trained:

- a full fine-tune: `checkpoints/<upstream>/` as it is (a plain transformers folder);
- a LoRA adapter, `model.adapter: merge` (the default): `bases/<upstream>/`, the adapter folded into its own base
  by rule `merge_base` once, and read by this recipe's prepare, plan, train, evaluate and export jobs;
- a LoRA adapter, `model.adapter: continue`: the upstream's own base folder, with `checkpoints/<upstream>/` as the
  adapter this recipe's training starts from (`continued_adapter`).

Since each stage's jobs take the upstream's checkpoint (or its merged base) as an input, Snakemake reruns the
whole chain below an edit and nothing above it. `check_chains` refuses, before any job, a chain Snakemake could
not build or that would change silently between stages: a missing or cyclic upstream, `model.adapter` where it
means nothing, a continued adapter whose LoRA settings differ, a chat template or `trust_remote_code` that changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .recipe import Model, Recipe, RecipeError
from .train.backends.capabilities import CAPABILITIES

CHECKPOINTS = "checkpoints"
BASES = "bases"  # merged bases of LoRA stages another recipe builds on (rule merge_base)


@dataclass(frozen=True)
class ChainModel:
    """One model of a chain as the evaluate stage loads it: `folder` (plain weights), with `checkpoint` (an adapter
    on it, or a full model that replaces it) unless it is the root; `recipe` None for the root."""

    recipe: str | None
    folder: str
    checkpoint: str | None

    def to_json(self) -> dict[str, str | None]:
        return {"recipe": self.recipe, "folder": self.folder, "checkpoint": self.checkpoint}


def upstream(name: str, recipes: Mapping[str, Recipe], folder: str = "recipes") -> list[str]:
    """The recipes `name` is built on, the one trained first first (empty for a recipe on a model); a missing
    recipe or a cycle is a RecipeError naming them."""
    chain, current = [], name
    while (parent := recipes[current].model.recipe) is not None:
        if parent not in recipes:
            raise RecipeError(f"{folder}/{current}.yaml: model.recipe {parent!r} names no recipe in {folder}/ "
                              f"(known: {', '.join(sorted(recipes))}); fix the name or add {folder}/{parent}.yaml")
        if parent == name or parent in chain:
            raise RecipeError(f"{folder}/{name}.yaml: model.recipe makes a cycle ({' -> '.join([name, *chain, parent])}):"
                              " a recipe cannot be built on itself; point one of them at a model (model.path or "
                              "model.hub)")
        chain.append(parent)
        current = parent
    return chain[::-1]


def root_model(name: str, recipes: Mapping[str, Recipe]) -> Model:
    """The model (folder or hub id) at the top of `name`'s chain."""
    chain = upstream(name, recipes)
    return recipes[chain[0] if chain else name].model


def continues(name: str, recipes: Mapping[str, Recipe]) -> bool:
    """Whether `name` trains its upstream recipe's LoRA adapter further."""
    model = recipes[name].model
    return model.recipe is not None and model.adapter == "continue"


def base_folder(name: str, recipes: Mapping[str, Recipe], model_folder: Callable[[Model], str]) -> str:
    """The plain model folder `name`'s jobs train and evaluate on (the module docstring says which);
    `model_folder` finds a root model's folder (xtrain.models.hub.model_folder)."""
    parent = recipes[name].model.recipe
    if parent is None:
        return model_folder(recipes[name].model)
    if continues(name, recipes):
        return base_folder(parent, recipes, model_folder)
    if recipes[parent].train.method == "full":
        return f"{CHECKPOINTS}/{parent}"
    return f"{BASES}/{parent}"


def continued_adapter(name: str, recipes: Mapping[str, Recipe]) -> str | None:
    """The upstream checkpoint whose adapter `name`'s training starts from (`model.adapter: continue`), else None."""
    return f"{CHECKPOINTS}/{recipes[name].model.recipe}" if continues(name, recipes) else None


def chain_models(name: str, recipes: Mapping[str, Recipe], model_folder: Callable[[Model], str]) -> list[ChainModel]:
    """Every model of `name`'s chain as the evaluate stage loads it: the root, each upstream stage, and `name`
    itself last (for a recipe on a model: the model, then the recipe)."""
    models = [ChainModel(None, model_folder(root_model(name, recipes)), None)]
    for stage in [*upstream(name, recipes), name]:
        models.append(ChainModel(stage, base_folder(stage, recipes, model_folder), f"{CHECKPOINTS}/{stage}"))
    return models


def template(name: str, recipes: Mapping[str, Recipe]) -> str:
    """The chat template `name`'s checkpoint is trained in: its own `data.chat_template`, or with `tokenizer`, its
    upstream's (the checkpoint's tokenizer carries the template it was trained in); `tokenizer` at the root."""
    chosen = recipes[name].data.chat_template
    parent = recipes[name].model.recipe
    return template(parent, recipes) if chosen == "tokenizer" and parent is not None else chosen


def check_chains(recipes: Mapping[str, Recipe], folder: str = "recipes") -> None:
    """Refuse, naming the recipes, any chain that cannot be built or would change silently between stages."""
    for name, recipe in sorted(recipes.items()):
        parent = recipe.model.recipe
        if parent is None:
            continue
        upstream(name, recipes, folder)  # a missing recipe or a cycle
        source, above = f"{folder}/{name}.yaml", recipes[parent]
        if above.train.method == "full" and recipe.model.adapter is not None:
            raise RecipeError(f"{source}: model.adapter: recipe {parent!r} is a full fine-tune, whose checkpoint is "
                              "used as it is: remove model.adapter")
        if continues(name, recipes):
            able = sorted(backend for backend, can in CAPABILITIES.items() if can.adapter_continue)
            if recipe.train.backend not in able:
                raise RecipeError(f"{source}: model.adapter: continue: train.backend {recipe.train.backend} cannot "
                                  f"start from a trained adapter (backends that can: {', '.join(able)}); use one of "
                                  "them, or model.adapter: merge")
            if recipe.train.method == "full":
                raise RecipeError(f"{source}: model.adapter: continue trains recipe {parent!r}'s LoRA adapter further, "
                                  "but train.method is 'full': set train.method: lora, or model.adapter: merge")
            if recipe.eval.lm_eval is not None:
                raise RecipeError(f"{source}: eval.lm_eval: lm-eval would score the root model as the base, not recipe "
                                  f"{parent!r}'s checkpoint, with model.adapter: continue: use model.adapter: merge, "
                                  "or remove eval.lm_eval")
            if recipe.train.lora != above.train.lora:
                raise RecipeError(
                    f"{source}: train.lora must equal recipe {parent!r}'s with model.adapter: continue (the same "
                    f"adapter trains further): {parent} has {above.train.lora.model_dump()}, {name} has "
                    f"{recipe.train.lora.model_dump()}; copy {parent}'s train.lora, or use model.adapter: merge")
        inherited = template(parent, recipes)
        if recipe.data.chat_template not in ("tokenizer", inherited):
            raise RecipeError(
                f"{source}: data.chat_template {recipe.data.chat_template!r} differs from {inherited!r}, the template "
                f"recipe {parent!r}'s checkpoint was trained in: a stage keeps its upstream's template; remove "
                f"data.chat_template (the checkpoint's own is used) or set it to {inherited!r}")
        root = root_model(name, recipes)
        if recipe.model.trust_remote_code != root.trust_remote_code:
            raise RecipeError(
                f"{source}: model.trust_remote_code is {recipe.model.trust_remote_code} but the chain's root model "
                f"{root.name} has {root.trust_remote_code}: every stage of a chain runs the same model code; set "
                f"model.trust_remote_code: {str(root.trust_remote_code).lower()}")


def chain_params(name: str, recipes: Mapping[str, Recipe], model_folder: Callable[[Model], str], stage: str) -> dict:
    """What a stage's params add for a recipe built on another (nothing for a recipe on a model, so its params, and
    so its outputs, stay as they were): the upstream recipe and how this one builds on it; for evaluate, every
    model of the chain (`chain_models`)."""
    parent = recipes[name].model.recipe
    if parent is None:
        return {}
    how = "full" if recipes[parent].train.method == "full" else "continue" if continues(name, recipes) else "merge"
    params = {"upstream": parent, "adapter": how}
    if stage == "evaluate":
        params["models"] = [model.to_json() for model in chain_models(name, recipes, model_folder)]
    return {"chain": params}
