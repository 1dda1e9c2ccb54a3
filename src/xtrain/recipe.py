"""The recipe schema: the single source of truth for what a recipe may say.

A recipe is one YAML file in `recipes/`; its file stem is the recipe name. Every section is a strict
pydantic model (unknown fields are errors), and `load_recipe` turns any problem into a `RecipeError`
that names the file, the field and what to do. Each pipeline stage receives only the slice of the
recipe it reads (`stage_params`), so Snakemake reruns only the stages an edit can affect.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from xtrain_backend_side.rewards import REWARDS_FOLDER, needed_columns, reward_keys

from .errors import RecipeError
from .models.gpus import DEFAULT_GPU, GPUS

# Every training backend, in the order docs list them: the one list; the registry (backends/), config/config.yaml
# and envs/ are checked against it (tests/test_backends.py).
BACKENDS = ("trl_cpu", "trl_local", "axolotl", "unsloth", "torchtune", "primus")
RECIPE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")  # a hub model or dataset id, `org/name`

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class ProjectPath:
    """Marks a recipe field that names a local file or folder: `paths.check_recipe_paths` confines every field so
    marked (the folder and each file inside it), so a new path field declares itself and cannot skip the check."""


LocalPath = Annotated[str | None, ProjectPath()]


class Section(BaseModel):
    # A NaN or infinite number (YAML's .nan, .inf) is never a meaningful setting.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _one_value_is_a_one_item_list(cls, data: Any) -> Any:
        """A list field given one value (`gguf: f16`, `target_modules: all-linear`) holds that one value."""
        if not isinstance(data, dict):
            return data
        lists = list_fields(cls)
        single = {key: [value] for key, value in data.items()
                  if key in lists and value is not None and not isinstance(value, list)}
        return {**data, **single} if single else data


@functools.cache
def list_fields(section: type[BaseModel]) -> frozenset[str]:
    """The fields of a section that hold a list (possibly also null)."""
    def is_list(annotation: Any) -> bool:
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            return any(is_list(arg) for arg in typing.get_args(annotation))
        return typing.get_origin(annotation) is list

    return frozenset(name for name, field in section.model_fields.items() if is_list(field.annotation))


class Located(Section):
    """A section that names either a local `path` or a `hub` id: `path` is required unless `hub` is given (then it
    is null), so a section with neither says "path is missing"."""

    @model_validator(mode="before")
    @classmethod
    def _no_path_with_hub(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("hub") is not None and "path" not in data:
            return {**data, "path": None}
        return data

    def check_one_location(self, local: str, hub: str) -> None:
        if (self.path is None) == (self.hub is None):
            raise ValueError(f"give exactly one of `path` ({local}) and `hub` ({hub})")


class Model(Located):
    """The base model to fine-tune: a local Hugging Face folder (config, tokenizer, weights), a hub id, or another
    recipe's checkpoint (`recipe`: the stages chain in one DAG, src/xtrain/chain.py)."""

    @model_validator(mode="before")
    @classmethod
    def _no_path_with_recipe(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("recipe") is not None and "path" not in data:
            return {**data, "path": None}
        return data

    path: LocalPath = Field(
        description="Folder with config.json, tokenizer and weights, relative to the project (folders outside it "
        "only when config/config.yaml lists them in `allowed_paths`); null with `hub`."
    )
    hub: str | None = Field(
        None, pattern=HUB_ID.pattern,
        description="Hugging Face hub model id (`org/name`), read from the Hugging Face cache ($HF_HOME): download it "
        "first (`hf download org/name`); the commit used is recorded in the checkpoint manifest.",
    )
    revision: str | None = Field(
        None, description="With `hub`: a branch, tag or commit hash of the model (default: the cached `main`)."
    )
    recipe: str | None = Field(
        None, pattern=RECIPE_NAME.pattern,
        description="Another recipe's name (its file stem in recipes/): this recipe trains on that recipe's "
        "checkpoint, so the two run as stages of one DAG and an edit upstream makes every stage below stale; "
        "null with `path` or `hub`. The root model is found through the chain.",
    )
    adapter: Literal["merge", "continue"] | None = Field(
        None,
        description="With `recipe`, when that recipe trained a LoRA adapter: `merge` (the default) folds it into its "
        "base once (bases/<recipe>/, reused by evaluation and export) and trains on the merged model; `continue` "
        "trains that same adapter further (this recipe's train.lora must equal the upstream's).",
    )
    # Strict: only a YAML true turns it on, not "yes", "on" or 1.
    trust_remote_code: bool = Field(
        False,
        strict=True,
        description="Run the Python code a model folder ships (custom architectures). Off unless set; when set, "
        "a warning is logged and the checkpoint manifest records it.",
    )

    @model_validator(mode="after")
    def _one_location(self) -> Model:
        given = [name for name in ("path", "hub", "recipe") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of `path` (a local model folder), `hub` (a hub model id) and `recipe` "
                             f"(another recipe's checkpoint); got {' and '.join(given) or 'none'}")
        if self.revision is not None and self.hub is None:
            raise ValueError("`revision` picks a version of a `hub` model: remove it, or give `hub`")
        if self.adapter is not None and self.recipe is None:
            raise ValueError("`adapter` says what to do with an upstream recipe's LoRA adapter: remove it, or give "
                             "`recipe`")
        return self

    @property
    def name(self) -> str:
        """How manifests and messages name the model."""
        if self.recipe is not None:
            return f"recipe:{self.recipe}"
        return self.path if self.path is not None else f"hub:{self.hub}" + (f"@{self.revision}" if self.revision else "")


# Row formats a source may hold, and the columns (and turn keys) each reads, under their canonical names.
# `DataSource.columns` renames any of them to what a file really calls it.
SOURCE_COLUMNS: dict[str, tuple[str, ...]] = {
    "messages": ("messages", "role", "content", "tools"),
    "sharegpt": ("conversations", "from", "value", "system", "tools"),
    "alpaca": ("instruction", "input", "output", "system", "history"),
    "prompt_completion": ("prompt", "completion"),
    "text": ("text",),
}
CHAT_ROLES = ("system", "user", "assistant", "tool")
# Model families whose stock chat template (as TRL ships it) a recipe may name, for a base model without one.
CHAT_TEMPLATE_FAMILIES = ("llama3", "llama3_1", "llama3_2", "qwen2_5", "qwen3", "gemma", "gemma3", "phi3", "phi3_5",
                          "deepseekv3", "cohere", "cohere2", "gptoss", "glm4moe", "lfm2")
CHAT_TEMPLATES = ("tokenizer", "chatml", *CHAT_TEMPLATE_FAMILIES)


class DataSource(Located):
    """One dataset: a local file or folder, or a hub id; its row format and how its names map to ours."""

    path: LocalPath = Field(
        description="Local .json (array), .jsonl, .csv, .parquet, .txt or .md file, or a `datasets.save_to_disk` "
        "folder, "
        "relative to the project; null with `hub`.",
    )
    hub: str | None = Field(None, description="Hugging Face hub dataset id (needs the network or a local cache).")
    split: str = Field(
        "train", description="Split read from a hub dataset or a saved DatasetDict; for a .txt/.md corpus, `file` "
        "makes the whole file one document (default: one per line).",
    )
    format: Literal["auto", *SOURCE_COLUMNS] = Field(
        "auto", description="Row format: " + ", ".join(SOURCE_COLUMNS) + "; `auto` tells it from the first row."
    )
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="Canonical name -> this source's name, e.g. {instruction: question} or {from: speaker}.",
    )
    roles: dict[str, str] = Field(
        default_factory=dict,
        description="Role name in the data -> " + ", ".join(CHAT_ROLES) + ", e.g. {bot: assistant}.",
    )
    weight: PositiveFloat = Field(
        1.0, description="Times each train row of this source is used: 2 doubles it, 0.5 keeps half (by hash)."
    )
    tools: list[dict[str, Any]] | None = Field(
        None, description="Tool schemas (OpenAI's function format) for the rows of this source that give none of "
        "their own, rendered by the chat template's tool support.",
    )
    replace: dict[str, str] = Field(
        default_factory=dict,
        description="Values for `{{name}}` placeholders in the text, e.g. {name: Ada, author: Lab} for an identity "
        "set; a placeholder left unfilled in a source that has this map is an error.",
    )

    @model_validator(mode="after")
    def _one_location_and_known_names(self) -> DataSource:
        self.check_one_location("a local file or folder", "a hub dataset id")
        if self.columns and self.format == "auto":
            raise ValueError("`columns` renames the columns of one format: set `format` too")
        allowed = SOURCE_COLUMNS.get(self.format, ())
        unknown = sorted(set(self.columns) - set(allowed))
        if unknown:
            raise ValueError(f"columns {unknown} are not read by format {self.format}; it reads {list(allowed)}")
        bad_roles = sorted(role for role in self.roles.values() if role not in CHAT_ROLES)
        if bad_roles:
            raise ValueError(f"roles map to {bad_roles}; map each to one of {list(CHAT_ROLES)}")
        return self

    @property
    def name(self) -> str:
        """How manifests and messages name this source."""
        return self.path if self.path is not None else f"hub:{self.hub}"


class Data(Section):
    """What to train on and how it is cut into token sequences."""

    sources: list[DataSource] = Field(min_length=1, description="One or more datasets, mixed by `weight`.")
    seq_len: PositiveInt = Field(512, le=131072, description="Longest token sequence (and packing bin size).")
    eval_fraction: float = Field(
        0.1, gt=0, lt=1, description="Share of rows held out for evaluation, chosen by content hash."
    )
    over_length: Literal["drop", "truncate"] = Field(
        "drop", description="Rows longer than seq_len are dropped, or cut to seq_len; both are counted."
    )
    near_dedupe_threshold: float | None = Field(
        None, gt=0, le=1, description="Drop rows whose MinHash Jaccard similarity to a kept row reaches this; null: off."
    )
    chat_template: Literal[CHAT_TEMPLATES] = Field(
        "tokenizer",
        description="The model tokenizer's chat template (a family's stock template works as shipped), `chatml`, or "
        "a model family's stock template by name (" + ", ".join(CHAT_TEMPLATE_FAMILIES) + ") for a base model "
        "without one.",
    )
    train_on_inputs: bool = Field(
        False, description="Train on every token; by default only assistant turns (and their end-of-turn token), "
        "found by the template's {% generation %} blocks, TRL's training variant of it, or incremental rendering.",
    )
    packing: bool = Field(
        False, description="Pack train rows best-fit-decreasing into seq_len sequences that do not attend to each other."
    )
    block_stride: PositiveInt | None = Field(
        None, description="Plain documents (`text` format) longer than seq_len become blocks of seq_len tokens starting "
        "every this many tokens (default seq_len: no overlap); no token is cut off.",
    )
    reasoning: Literal["keep", "drop", "inline"] = Field(
        "keep",
        description="Assistant reasoning (reasoning/thinking parts, `reasoning_content`): `keep` renders it through "
        "the chat template (refused when the template cannot), `drop` removes it, `inline` writes it before the "
        "answer as <think>...</think>.",
    )
    tool_calls: Literal["template", "inline"] = Field(
        "template",
        description="Tool calls (assistant `tool_calls`, sharegpt `function_call` turns) and a row's `tools` list: "
        "`template` renders them through the chat template's own tool support (refused when it has none), `inline` "
        "writes each call as <tool_call>JSON</tool_call> in the assistant's text and the tool list in the system turn.",
    )
    drop_warning: float = Field(
        0.1, gt=0, le=1,
        description="Warn (console and manifest `warnings`) when a source loses at least this share of its rows.",
    )

    @model_validator(mode="after")
    def _stride_within_a_block(self) -> Data:
        if self.block_stride is not None and self.block_stride > self.seq_len:
            raise ValueError(f"block_stride {self.block_stride} is over seq_len {self.seq_len}: tokens between blocks "
                             "would be skipped; use at most seq_len")
        return self

    @model_validator(mode="after")
    def _each_source_once(self) -> Data:
        names = [source.name for source in self.sources]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"sources {repeated} are listed more than once: list each once and use `weight`")
        return self


class Lora(Section):
    r: PositiveInt = Field(16, description="LoRA rank.")
    alpha: PositiveFloat = Field(32, description="LoRA scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the LoRA input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="Module names (suffixes) that get adapters, or ['all-linear'].",
    )
    use_dora: bool = Field(False, description="DoRA: each adapted weight split into a magnitude and a direction, "
                           "the LoRA update applied to the direction (more parameters and compute per step).")
    use_rslora: bool = Field(False, description="rsLoRA: scale the update by alpha / sqrt(r) instead of alpha / r "
                             "(keeps high ranks learning).")
    modules_to_save: list[str] = Field(
        default_factory=list, description="Module names (suffixes) trained in full beside the adapters and saved "
        "with them, e.g. [embed_tokens, lm_head] when tokens were added to the vocabulary.",
    )

    def peft_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `peft.LoraConfig` (peft spells "every linear layer" as a bare string)."""
        targets = list(self.target_modules)
        return {
            "r": self.r,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "target_modules": "all-linear" if targets == ["all-linear"] else targets,
            "use_dora": self.use_dora,
            "use_rslora": self.use_rslora,
            "modules_to_save": list(self.modules_to_save) or None,
        }


class Quantization(Section):
    """How the frozen base is stored with train.method qlora (bitsandbytes); the compute dtype is the plan's."""

    bits: Literal[4] = Field(4, description="Bits per base weight (4: bitsandbytes' Linear4bit).")
    quant_type: Literal["nf4", "fp4"] = Field(
        "nf4", description="4-bit data type: nf4 (normal float, QLoRA's) or fp4."
    )
    double_quant: bool = Field(
        True, description="Quantize the quantization constants too (about 0.4 bits per weight saved)."
    )


class Preference(Section):
    """Settings of a preference objective (train.objective dpo, kto or orpo)."""

    beta: PositiveFloat = Field(0.1, description="DPO/KTO: how far the tuned model may move from the reference "
                                "(higher keeps it closer); ORPO: the weight of the odds-ratio term (its lambda).")
    loss_type: Literal["sigmoid", "ipo", "hinge"] = Field(
        "sigmoid", description="DPO only: the pair loss (sigmoid: DPO; ipo; hinge: SLiC)."
    )
    desirable_weight: PositiveFloat = Field(1.0, description="KTO only: loss weight of rows labelled desirable.")
    undesirable_weight: PositiveFloat = Field(1.0, description="KTO only: loss weight of rows labelled undesirable.")

    ONLY: ClassVar[dict[str, str]] = {"loss_type": "dpo", "desirable_weight": "kto", "undesirable_weight": "kto"}


class Rl(Section):
    """Settings of online reinforcement learning (train.objective grpo): how completions are sampled and how far the
    policy may move per update."""

    generations: int = Field(4, ge=2, description="Completions sampled per prompt (the group whose rewards are "
                             "compared); train.global_batch_size counts completions, so it is a multiple of this.")
    max_completion_length: PositiveInt = Field(128, description="Longest completion sampled, in tokens.")
    temperature: PositiveFloat = Field(1.0, description="Sampling temperature of the completions.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling: keep the smallest set of tokens whose "
                         "probabilities reach this (1: off).")
    kl_weight: float = Field(0.0, ge=0, description="Weight of the KL penalty to the base model (TRL's beta); 0 "
                             "holds no reference model.")
    clip_epsilon: PositiveFloat = Field(0.2, description="How far the probability ratio of a token may move from 1 "
                                        "before the update is clipped (PPO's epsilon).")
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = Field(
        "dapo", description="How token losses are averaged: grpo (per completion, then over the group), dr_grpo (by "
        "a constant: no length bias), dapo (over every completion token of the step), bnpo (over the micro-batch's).",
    )
    steps_per_generation: PositiveInt | None = Field(
        None, description="Micro-steps trained on each batch of generations (default: the gradient accumulation "
        "steps, one generation per optimizer step).",
    )


# Built-in rewards (xtrain_backend_side.rewards) and `python`: a function of the user's in the project's rewards/.
REWARD_TYPES = ("answer", "format", "length", "tool_call", "python")


class Reward(Section):
    """One term of train.rewards: a built-in check or a Python function of the project's, times its weight."""

    type: Literal[REWARD_TYPES] = Field(
        description="answer: 1 when the completion's final answer equals the row's (GSM8K's `#### n`, `\\boxed{}`, "
        "or the last number; numbers compared as numbers), else 0; format: 1 when the completion matches `pattern`; "
        "length: 0 up to `max_tokens` completion tokens, falling to -1 at twice that; tool_call: 1 when the "
        "completion holds a tool call (<tool_call>JSON</tool_call> or a bare JSON object) that parses and names a tool "
        "of the row's list; python: `function` of `file`, called as TRL calls rewards (completions, the row's "
        "columns) and returning one float per completion.",
    )
    weight: float = Field(1.0, description="Weight of this reward in the sum each completion is scored by.")
    column: str | None = Field(
        None, description="answer: the row's column holding the reference answer (default `answer`); tool_call: the "
        "column holding the row's tool schemas (default `tools`).",
    )
    pattern: str | None = Field(None, description="format: a Python regular expression searched in the completion "
                                "(`.` matches newlines; anchor it with ^ and $ to match the whole).")
    max_tokens: PositiveInt | None = Field(None, description="length: completion tokens allowed before the penalty.")
    file: LocalPath = Field(None, description="python: a .py file in the project's rewards/ folder.")
    function: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                                 description="python: the name of the function in `file`.")

    SETTINGS: ClassVar[dict[str, tuple[str, ...]]] = {
        "answer": ("column",), "format": ("pattern",), "length": ("max_tokens",), "tool_call": ("column",),
        "python": ("file", "function"),
    }

    @model_validator(mode="after")
    def _settings_of_its_type(self) -> Reward:
        own = self.SETTINGS[self.type]
        given = [name for name in ("column", "pattern", "max_tokens", "file", "function") if getattr(self, name) is not None]
        if stray := [name for name in given if name not in own]:
            raise ValueError(f"reward type {self.type} does not read {stray}: remove them (it reads {list(own)})")
        if missing := [name for name in own if name != "column" and getattr(self, name) is None]:
            raise ValueError(f"reward type {self.type} needs {missing}")
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"pattern {self.pattern!r} is not a regular expression: {exc}") from None
        if self.file is not None and (Path(self.file).suffix != ".py" or
                                      Path(self.file).parts[:1] != (REWARDS_FOLDER,) or ".." in Path(self.file).parts):
            raise ValueError(f"file {self.file!r}: reward code lives in the project's {REWARDS_FOLDER}/ folder, as "
                             f"{REWARDS_FOLDER}/<name>.py (never in data or model folders)")
        if self.weight == 0:
            raise ValueError("weight 0 scores nothing: remove the reward, or give it a weight")
        return self

    @property
    def name(self) -> str:
        """How logs, metrics and errors name this reward."""
        return f"{self.file}:{self.function}" if self.type == "python" else self.type



OBJECTIVES = ("sft", "dpo", "kto", "orpo", "grpo")
# Training methods: LoRA adapters on a frozen base (16/32-bit, or 4-bit for qlora), or every weight.
METHODS = ("lora", "qlora", "full")
ADAPTER_METHODS = ("lora", "qlora")
# Experiment trackers train.report_to may name (transformers' integration names); `none` turns them off.
TRACKERS = ("tensorboard", "mlflow", "wandb")
# What each objective trains on, as prepare writes it: chats, pairs of a chosen and a rejected answer, or answers
# labelled desirable or not. Objectives that share a kind share their prepared data.
DATA_KINDS = {"sft": "chats", "dpo": "pairs", "orpo": "pairs", "kto": "labelled", "grpo": "prompts"}


class Train(Section):
    """How to train: the backend, the method and the optimisation settings."""

    backend: Literal[BACKENDS] = Field("trl_cpu", description="Training backend: " + ", ".join(BACKENDS) + ".")
    objective: Literal[OBJECTIVES] = Field(
        "sft", description="sft: supervised fine-tuning on chat or text data; dpo: pairs of a chosen and a rejected "
        "answer; orpo: the same pairs, without a reference model (SFT loss plus an odds-ratio term); kto: answers "
        "labelled desirable or not; grpo: online reinforcement learning from prompts, each completion scored by "
        "train.rewards. The data must be of that kind.",
    )
    preference: Preference | None = Field(
        None, description="DPO/KTO settings; only with objective dpo or kto (defaults apply when unset)."
    )
    # Left out of the dumps when unset, so the stage slices (and hashes) of other recipes do not change.
    rl: Rl | None = Field(
        None, exclude_if=lambda value: value is None,
        description="GRPO sampling and update settings; only with objective grpo (defaults apply when unset).",
    )
    rewards: list[Reward] = Field(
        default_factory=list, exclude_if=lambda value: not value,
        description="GRPO: the rewards each completion is scored by, summed by weight; at least one.",
    )
    method: Literal[METHODS] = Field(
        "lora", description="lora: LoRA adapters on the frozen base; qlora: LoRA adapters on a base stored in 4 bits "
        "(train.quantization); full: a full fine-tune."
    )
    lora: Lora | None = Field(
        None, description="LoRA settings; only with method lora or qlora (defaults apply when unset)."
    )
    quantization: Quantization | None = Field(
        None, description="How the base is quantized; only with method: qlora (defaults apply when unset)."
    )
    neftune_noise_alpha: PositiveFloat | None = Field(
        None, description="NEFTune: uniform noise of this scale (alpha / sqrt(length x width)) added to the input "
        "embeddings while training (never when evaluating or generating); 5 is the paper's usual value. sft only.",
    )
    global_batch_size: PositiveInt = Field(8, description="Sequences per optimizer step, over all devices.")
    micro_batch_size: PositiveInt | None = Field(
        None, description="Sequences per device per forward pass; the plan chooses it when unset."
    )
    epochs: PositiveFloat = Field(1, description="Passes over the training split (ignored when max_steps is set).")
    max_steps: PositiveInt | None = Field(None, description="Stop after this many optimizer steps.")
    learning_rate: PositiveFloat = Field(2e-4, description="Peak learning rate.")
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = Field(
        "cosine", description="Learning-rate schedule after warmup."
    )
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="Share of steps spent warming up.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: PositiveFloat = Field(1.0, description="Gradient clipping norm.")
    logging_steps: PositiveInt = Field(5, description="Record the loss every this many steps.")
    checkpoint_minutes: PositiveFloat = Field(
        15, description="Save a resumable trainer checkpoint at least this often (and at each quarter of the run)."
    )
    seed: int = Field(0, ge=0, description="Seed for weights of new layers, dropout and data order.")
    report_to: list[Literal[(*TRACKERS, "none")]] = Field(
        ["tensorboard"], description="Experiment trackers the training metrics (loss, learning rate, grad norm, "
        "tokens/s, peak memory) go to: tensorboard (event files under runs/<recipe>/tensorboard/, offline), mlflow "
        "(train.mlflow_tracking_uri or MLFLOW_TRACKING_URI), wandb (W&B, configured by its WANDB_* variables); "
        "`none` or [] for none. Credentials come from the environment only.",
    )
    mlflow_tracking_uri: str | None = Field(
        None, description="With report_to mlflow: a local file store (file:mlruns) or a tracking server URI "
        "(https://host); default: MLFLOW_TRACKING_URI. No credentials in it: MLFLOW_TRACKING_USERNAME / "
        "MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN in the environment.",
    )

    # Fields that decide the run's shape (memory, time, batch layout); the plan reads only these.
    SHAPE_FIELDS: ClassVar[tuple[str, ...]] = ("backend", "objective", "method", "lora", "quantization", "global_batch_size", "micro_batch_size", "epochs", "max_steps", "rl")

    @property
    def adapters(self) -> bool:
        """Whether the run trains LoRA adapters (method lora or qlora) rather than every weight."""
        return self.method in ADAPTER_METHODS

    @field_validator("report_to", mode="before")
    @classmethod
    def _trackers(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        if "none" in value:
            if value != ["none"]:
                raise ValueError(f"`none` turns tracking off and goes alone, not with {[v for v in value if v != 'none']}")
            return []
        if len(set(value)) != len(value):
            raise ValueError(f"a tracker is named twice in {value}")
        return value

    @model_validator(mode="after")
    def _mlflow_uri_only_with_mlflow(self) -> Train:
        uri = self.mlflow_tracking_uri
        if uri is None:
            return self
        if "mlflow" not in self.report_to:
            raise ValueError("mlflow_tracking_uri is set but report_to does not name mlflow: add mlflow to report_to "
                             "or remove mlflow_tracking_uri")
        parts = urlsplit(uri)
        if parts.username or parts.password:
            raise ValueError("mlflow_tracking_uri carries credentials: remove them from the URI and set "
                             "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) in the "
                             "environment")
        return self

    @model_validator(mode="before")
    @classmethod
    def _lora_only_with_lora(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        method = data.get("method", "lora")
        if method == "full" and data.get("lora") is not None:
            raise ValueError("`lora` settings are given but method is `full`: remove `lora` or set method: lora")
        if method != "qlora" and data.get("quantization") is not None:
            raise ValueError(f"`quantization` settings are given but method is `{method}`: remove `quantization` or "
                             "set method: qlora")
        if method in ADAPTER_METHODS and data.get("lora") is None:
            data = {**data, "lora": {}}
        if method == "qlora" and data.get("quantization") is None:
            data = {**data, "quantization": {}}
        return data

    @model_validator(mode="after")
    def _neftune_with_sft(self) -> Train:
        if self.neftune_noise_alpha is not None and self.objective != "sft":
            raise ValueError(f"neftune_noise_alpha applies to objective sft only, not {self.objective}: remove it")
        return self

    @model_validator(mode="before")
    @classmethod
    def _rl_only_with_grpo(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        objective = data.get("objective", "sft")
        if objective != "grpo":
            given = [name for name in ("rl", "rewards") if data.get(name) not in (None, [])]
            if given:
                raise ValueError(f"{' and '.join(f'`{name}`' for name in given)} apply to objective grpo, but objective "
                                 f"is `{objective}`: remove them or set objective: grpo")
            return data
        return data if data.get("rl") is not None else {**data, "rl": {}}

    @model_validator(mode="before")
    @classmethod
    def _preference_only_with_a_preference_objective(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        objective, settings = data.get("objective", "sft"), data.get("preference")
        if objective in ("sft", "grpo"):
            if settings is not None:
                raise ValueError(f"`preference` settings are given but objective is `{objective}`: remove them or set "
                                 "objective: dpo, kto or orpo")
            return data
        for name, only in Preference.ONLY.items():
            default = Preference.model_fields[name].default  # a dumped recipe carries every default
            if isinstance(settings, dict) and settings.get(name, default) != default and only != objective:
                raise ValueError(f"preference.{name} applies to objective {only} only, not {objective}: remove it "
                                 "(or leave it at its default)")
        return data if settings is not None else {**data, "preference": {}}


class Hardware(Section):
    """Where the run goes: CPU, or GPUs per node times nodes."""

    accelerator: Literal["cpu", "cuda", "rocm"] = Field("cpu", description="Device kind to train on.")
    gpus: int = Field(0, ge=0, description="GPUs per node (0 for CPU).")
    nodes: PositiveInt = Field(1, description="Number of nodes.")
    processes: PositiveInt = Field(
        1, description="CPU only: data-parallel training processes per node (trl_local, over gloo); they share "
        "the node's cores and memory.",
    )
    gpu_model: Literal[tuple(GPUS)] | None = Field(
        None,
        description="GPU model, for its memory and peak throughput in the plan; default "
        + ", ".join(f"{model} for {kind}" for kind, model in DEFAULT_GPU.items()) + ".",
    )
    gpu_memory_gb: PositiveFloat | None = Field(
        None, description="Memory per GPU in GiB; default: the gpu_model's (set it for a partitioned GPU)."
    )
    cpus: PositiveInt | None = Field(
        None, description="CPU cores per node for the training job; default: the planning machine's count."
    )
    host_memory_gb: PositiveFloat | None = Field(
        None, description="Host RAM per node in GiB; default: the planning machine's."
    )

    @model_validator(mode="after")
    def _gpus_match_accelerator(self) -> Hardware:
        if self.accelerator == "cpu" and self.gpus:
            raise ValueError(f"gpus is {self.gpus} but accelerator is `cpu`: set accelerator: cuda or rocm, or gpus: 0")
        if self.accelerator != "cpu" and self.processes != 1:
            raise ValueError(f"processes is {self.processes} but accelerator is `{self.accelerator}`: GPU runs start "
                             "one process per GPU; set gpus instead and leave processes at 1")
        if self.accelerator != "cpu" and not self.gpus:
            raise ValueError(f"accelerator is `{self.accelerator}` but gpus is 0: set gpus to at least 1")
        if self.gpu_model and GPUS[self.gpu_model].vendor != self.accelerator:
            raise ValueError(
                f"gpu_model {self.gpu_model} is a {GPUS[self.gpu_model].vendor} device but accelerator is "
                f"`{self.accelerator}`: fix one of them"
            )
        return self

    @property
    def devices(self) -> int:
        """Data-parallel workers: GPUs, or CPU processes, over all nodes."""
        return self.processes_per_node * self.nodes

    @property
    def processes_per_node(self) -> int:
        """Training processes on each node: one per GPU, or the CPU `processes`."""
        return self.gpus or self.processes

    @property
    def gpu(self) -> str | None:
        """The GPU model the plan assumes: the recipe's, else the accelerator's default."""
        return self.gpu_model or DEFAULT_GPU.get(self.accelerator)


# Every number the evaluate stage writes to eval.json (what `eval.gate` may name), and what it means.
LOSS_METRICS = {
    "eval_rows": "rows of the eval split",
    "eval_supervised_tokens": "tokens the loss is computed on (assistant tokens)",
    "base_loss": "mean NLL of the base model over supervised tokens",
    "tuned_loss": "mean NLL of the tuned model over supervised tokens",
    "base_perplexity": "exp(base_loss)",
    "tuned_perplexity": "exp(tuned_loss)",
    "loss_improvement": "base_loss - tuned_loss (positive: tuning helped)",
}
GENERATION_METRICS = {
    "generations": "eval prompts answered greedily by each model",
    "base_exact_match": "share of base answers equal to the reference (case and spacing ignored)",
    "tuned_exact_match": "share of tuned answers equal to the reference (case and spacing ignored)",
    "base_token_f1": "mean word-level F1 of base answers against the reference",
    "tuned_token_f1": "mean word-level F1 of tuned answers against the reference",
    "base_stop_rate": "share of base answers that end with the end-of-turn token within max_new_tokens",
    "tuned_stop_rate": "share of tuned answers that end with the end-of-turn token within max_new_tokens",
}
# Preference recipes (train.objective dpo / kto) add these; their loss metrics are over the chosen (dpo) or the
# desirable (kto) answers.
PREFERENCE_METRICS = {
    "eval_pairs": "held-out pairs (dpo) or labelled answers (kto)",
    "base_chosen_logp_per_token": "base model's mean log-probability per token of the chosen/desirable answers",
    "tuned_chosen_logp_per_token": "tuned model's mean log-probability per token of the chosen/desirable answers",
    "base_rejected_logp_per_token": "base model's mean log-probability per token of the rejected/undesirable answers",
    "tuned_rejected_logp_per_token": "tuned model's mean log-probability per token of the rejected/undesirable answers",
    "base_preference_accuracy": "dpo: share of pairs where the base model gives the chosen answer the higher log-prob",
    "tuned_preference_accuracy": "dpo: share of pairs where the tuned model gives the chosen answer the higher log-prob",
    "reward_accuracy": "share where the implicit reward (tuned - base log-prob) ranks the chosen answer above the "
    "rejected one (dpo), or has the sign of the label (kto)",
    "reward_margin": "dpo: mean implicit reward of chosen minus rejected, in nats (times beta: DPO's reward margin)",
}
# GRPO recipes (train.objective grpo): every held-out prompt answered greedily, scored by train.rewards
# (xtrain.evaluate.rewarded); they add eval_rows, generations and the stop rates, and no loss.
REWARD_METRICS = {
    "base_reward_mean": "grpo: the base model's mean reward (train.rewards summed by weight), held-out prompts",
    "tuned_reward_mean": "grpo: the tuned model's mean reward (train.rewards summed by weight), held-out prompts",
    "reward_improvement": "grpo: tuned_reward_mean - base_reward_mean (positive: tuning helped)",
}
# Per reward of train.rewards, named as in train_metrics.json (answer, format, rewards/x.py:score; format#2 for a
# second format): its mean, and its accuracy, the share of held-out prompts on which it passed (a built-in at its best
# score: 1 for answer, format and tool_call, 0 for length; a python reward above 0).
REWARD_TERM_METRIC = re.compile(r"^(base|tuned)_reward_(.+)_(mean|accuracy)$")
EVAL_METRICS = {**LOSS_METRICS, **GENERATION_METRICS, **PREFERENCE_METRICS, **REWARD_METRICS}


class Gate(Section):
    """Bounds one eval.json metric must stay within, or the gate step fails."""

    min: float | None = Field(None, description="Fail when the metric is below this.")
    max: float | None = Field(None, description="Fail when the metric is above this.")

    @model_validator(mode="after")
    def _a_bound(self) -> Gate:
        if self.min is None and self.max is None:
            raise ValueError("a gate needs `min`, `max` or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}: no value can pass")
        return self


LM_EVAL_METRIC = re.compile(r"^(base|tuned)_lm_(.+)$")


class LmEval(Section):
    """lm-evaluation-harness tasks run on base and tuned; each result lands in eval.json as
    `<base|tuned>_lm_<task>_<metric>`."""

    tasks: list[str] = Field(min_length=1, description="Task names: the harness's own, or defined in `include_path`.")
    include_path: LocalPath = Field(
        None, description="Folder of local task YAML files (with local data files: works offline), relative to the project."
    )
    # Strict, as model.trust_remote_code: only a YAML true.
    trust_code: bool = Field(
        False,
        strict=True,
        description="Let the task YAMLs of `include_path` run Python (`!function`, `class`, an `include` from outside "
        "the folder) and render their templates outside the Jinja sandbox. Off unless set; when set, a warning is "
        "logged and eval.json records it.",
    )
    limit: PositiveInt | None = Field(None, description="Score only the first this many examples of each task.")
    num_fewshot: int | None = Field(None, ge=0, description="Few-shot examples; null: each task's default.")


class Eval(Section):
    """How the evaluate stage measures base vs tuned, and the gates a tuned model must pass."""

    batch_size: PositiveInt = Field(8, description="Sequences per evaluation forward pass (and generation batch).")
    generations: int = Field(
        8, ge=0, description="Eval prompts (the first by content hash) answered greedily by base and tuned; 0: none."
    )
    max_new_tokens: PositiveInt = Field(64, description="Length limit of each generated answer, in tokens.")
    lm_eval: LmEval | None = Field(None, description="Optional lm-evaluation-harness tasks, base and tuned.")
    gate: dict[str, Gate] = Field(
        default_factory=dict,
        description="eval.json metric -> {min, max}, e.g. {loss_improvement: {min: 0}}; the gate step fails "
        "when a metric is out of bounds (the report is still written).",
    )

    @field_validator("gate")
    @classmethod
    def _gates_on_known_metrics(cls, gate: dict[str, Gate], info: ValidationInfo) -> dict[str, Gate]:
        known = EVAL_METRICS if info.data.get("generations") else {**LOSS_METRICS, **PREFERENCE_METRICS,
                                                                    **REWARD_METRICS}
        harness = info.data.get("lm_eval")
        tasks = harness.tasks if harness else []
        # Harness metric names depend on the task; a gate must at least name a task the recipe runs. A reward's
        # metrics depend on train.rewards, checked with it (Recipe._gates_on_what_evaluation_measures).
        unknown = sorted(metric for metric in set(gate) - set(known)
                         if not ((match := LM_EVAL_METRIC.match(metric)) and
                                 any(match[2].startswith(f"{task}_") for task in tasks))
                         and not REWARD_TERM_METRIC.match(metric))
        if unknown:
            hint = " (generation metrics need eval.generations > 0)" if set(unknown) <= set(EVAL_METRICS) else ""
            raise ValueError(f"gate on unknown metric {unknown}{hint}; known metrics: {', '.join(known)}"
                             + "".join(f", base_lm_{task}_<metric>, tuned_lm_{task}_<metric>" for task in tasks)
                             + ", and for grpo <base|tuned>_reward_<reward>_<mean|accuracy>")
        return gate


# GGUF types written, as llama.cpp's converter offers them (the `gguf` package reads k-quants but cannot write them).
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")
EXPORT_DTYPES = ("float32", "bfloat16", "float16")


class Export(Section):
    """What the export stage makes of the checkpoint (exports/<recipe>/): a merged model, GGUF files, a Modelfile."""

    merged: bool = Field(
        True, description="Write merged/: the LoRA adapter merged into the base weights (or the full checkpoint), "
        "safetensors, tokenizer with the chat template, generation_config.json, model card.",
    )
    dtype: Literal[EXPORT_DTYPES] | None = Field(
        None, description="dtype of merged/'s weights: " + ", ".join(EXPORT_DTYPES) + "; default: the base model's "
        "(float32 when its config names none).",
    )
    shard_gb: PositiveFloat = Field(5, description="Largest safetensors shard of merged/, in GB.")
    gguf: list[Literal[GGUF_TYPES]] = Field(
        default_factory=list,
        description="GGUF files to write, one per type (<recipe>-<type>.gguf; Llama, Qwen2 and Mistral models): "
        + ", ".join(GGUF_TYPES) + ". Quantized types keep norms in f32, and tensors whose rows do not split into "
        "the type's blocks in f16, as llama.cpp does.",
    )
    ollama: bool = Field(
        False, description="Write an Ollama Modelfile beside the GGUF of the first `gguf` type (chat template and "
        "stop tokens of ChatML or Llama 3 templates).",
    )

    @model_validator(mode="after")
    def _asks_for_something(self) -> Export:
        if len(set(self.gguf)) != len(self.gguf):
            raise ValueError(f"gguf lists a type twice ({self.gguf}): list each once")
        if self.ollama and not self.gguf:
            raise ValueError("ollama: true needs a GGUF file to point at: list a type in `gguf`, e.g. [q8_0]")
        if not self.merged and not self.gguf:
            raise ValueError("export asks for nothing (merged: false and no gguf types): remove the section, "
                             "set merged: true or list gguf types")
        return self


class Recipe(Section):
    model: Model
    data: Data
    train: Train = Field(default_factory=Train)
    hardware: Hardware = Field(default_factory=Hardware)
    eval: Eval = Field(default_factory=Eval)
    export: Export | None = Field(None, description="Export stage settings; none: the recipe is not exported.")

    @model_validator(mode="after")
    def _batch_divides_over_devices(self) -> Recipe:
        devices = self.hardware.devices
        if self.train.global_batch_size % devices:
            raise ValueError(
                f"train.global_batch_size {self.train.global_batch_size} is not divisible by the "
                f"{devices} devices of `hardware`: use a multiple of {devices}"
            )
        return self

    @model_validator(mode="after")
    def _grpo_has_rewards_and_room(self) -> Recipe:
        train = self.train
        if train.objective != "grpo":
            return self
        if not train.rewards:
            raise ValueError("train.rewards: objective grpo scores each completion by its rewards, and none are listed: "
                             "list at least one, e.g. rewards: [{type: answer}] (docs/recipe.md lists them)")
        if train.global_batch_size % train.rl.generations:
            raise ValueError(f"train.global_batch_size {train.global_batch_size} counts completions, "
                             f"train.rl.generations {train.rl.generations} per prompt: use a multiple of "
                             f"{train.rl.generations}")
        if train.rl.max_completion_length >= self.data.seq_len:
            raise ValueError(f"train.rl.max_completion_length {train.rl.max_completion_length} leaves no room for the "
                             f"prompt in data.seq_len {self.data.seq_len}: raise seq_len or shorten the completions")
        return self

    @model_validator(mode="after")
    def _gates_on_what_evaluation_measures(self) -> Recipe:
        """A GRPO recipe's evaluation measures rewards, no loss; any other recipe's measures no reward."""
        grpo = self.train.objective == "grpo"
        keys = reward_keys([reward.name for reward in self.train.rewards])
        rewarded = {f"{model}_reward_{key}_{figure}" for model in ("base", "tuned") for key in keys
                    for figure in ("mean", "accuracy")} | set(REWARD_METRICS)
        lossless = set(LOSS_METRICS) - {"eval_rows"} | set(PREFERENCE_METRICS) | {
            f"{model}_{name}" for model in ("base", "tuned") for name in ("exact_match", "token_f1")}
        for metric in self.eval.gate:
            if grpo and metric in lossless:
                raise ValueError(f"eval.gate: {metric} is not measured for objective grpo, which scores the held-out "
                                 f"prompts' answers by train.rewards: gate on {', '.join(sorted(rewarded))}")
            if REWARD_TERM_METRIC.match(metric) or metric in REWARD_METRICS:
                if not grpo:
                    raise ValueError(f"eval.gate: {metric} is measured for objective grpo only, not "
                                     f"{self.train.objective}: remove it")
                if metric not in rewarded:
                    raise ValueError(f"eval.gate: {metric} names no reward of train.rewards: gate on "
                                     f"{', '.join(sorted(rewarded))}")
        return self

    @model_validator(mode="after")
    def _preference_data_is_neither_packed_nor_cut(self) -> Recipe:
        if self.train.objective == "sft":
            return self
        if self.data.packing:
            raise ValueError(f"data.packing: train.objective {self.train.objective} trains on each prompt with its "
                             "answers, which are not packed: set data.packing: false")
        if self.data.over_length == "truncate":
            raise ValueError(f"data.over_length: truncate would cut answers that train.objective "
                             f"{self.train.objective} compares whole: set data.over_length: drop (or raise data.seq_len)")
        if self.data.train_on_inputs:
            raise ValueError(f"data.train_on_inputs: train.objective {self.train.objective} scores the answers only: "
                             "set data.train_on_inputs: false")
        return self

    def hash(self) -> str:
        return content_hash(self.model_dump(mode="json"))


def content_hash(value: Any) -> str:
    """sha256 of a JSON-serialisable value in canonical form."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def stage_params(recipe: Recipe, stage: str) -> dict[str, Any]:
    """The slice of the recipe one stage reads, as plain JSON data (Snakemake params)."""
    dump = recipe.model_dump(mode="json")
    # Only a recipe that trusts remote code passes it on, so the slices (and builds) of others do not change.
    trust = {"model": {"trust_remote_code": True}} if recipe.model.trust_remote_code else {}
    kind = DATA_KINDS[recipe.train.objective]
    preference = {"data_kind": kind} if kind != "chats" else {}
    if recipe.train.objective == "grpo":  # prompts leave room for their completion; the rewards' columns are checked
        preference["prompts"] = {"max_completion_length": recipe.train.rl.max_completion_length,
                                 "reward_columns": needed_columns(dump["train"]["rewards"])}
    up_to_evaluation = {k: v for k, v in dump.items() if k != "export"}  # the export section is export's alone
    evaluation = {k: v for k, v in dump["eval"].items() if k != "gate"}
    rewards = {"train": {"rewards": dump["train"]["rewards"]}} if recipe.train.objective == "grpo" else {}
    slices = {
        # A preference objective decides what the data is (pairs, labelled answers) and how it is prepared; SFT
        # recipes' slices stay as they were, so their prepared data is not rebuilt (nor DPO's for ORPO).
        "prepare": {"data": dump["data"], **preference, **trust},
        "plan": {
            "train": {k: dump["train"][k] for k in Train.SHAPE_FIELDS if k in dump["train"]},  # rl: grpo only
            "hardware": dump["hardware"],
            **trust,
        },
        "train": {"train": dump["train"], "hardware": dump["hardware"], **trust},
        # The gate step reads the gates; evaluate does not, so a gate edit does not rerun evaluation.
        # GRPO's held-out prompts are scored by the rewards training used.
        "evaluate": {"eval": evaluation, **rewards, **trust},
        # The jobs after training are placed on the recipe's hardware (plan/jobs.py).
        "plan_evaluate": {"eval": evaluation, "hardware": dump["hardware"], **trust},
        "plan_export": {"export": dump["export"], "hardware": dump["hardware"], **trust},
        "gate": {"gate": dump["eval"]["gate"]},
        # A LoRA checkpoint merged into its base for the recipes built on it (model.recipe): nothing but the weights.
        "merge_base": {**trust},
        # train and hardware go into the export's model card; editing them retrains, so they add no rerun.
        "export": {"export": dump["export"], "train": dump["train"], "hardware": dump["hardware"], **trust},
        # The report shows the recipe up to evaluation; the export section is the export stage's alone.
        "report": up_to_evaluation,
        # The smoke test rehearses the recipe up to evaluation (prepare, plan, launch, train, evaluate) and plans
        # every job of the real run, the export's too.
        "smoke": dump,
    }
    return slices[stage]


def trusts_remote_code(params: dict[str, Any]) -> bool:
    """Whether a stage's params (from `stage_params`) allow running a model folder's own code."""
    return bool(params.get("model", {}).get("trust_remote_code", False))


def _field_path(loc: tuple) -> str:
    return ".".join(str(part) if not isinstance(part, int) else f"[{part}]" for part in loc).replace(".[", "[")


def _members(kind: Any) -> list[Any]:
    """The types a field annotation may hold: a union's members (null left out), Annotated's inner type."""
    if typing.get_origin(kind) is typing.Annotated:
        return _members(typing.get_args(kind)[0])
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return [member for arg in typing.get_args(kind) for member in _members(arg) if member is not type(None)]
    return [kind]


def _section_at(loc: tuple) -> type[BaseModel] | None:
    """The section a validation error's location points into (through list items and mapping values)."""
    kinds: list[Any] = [Recipe]
    for part in loc:
        step = []
        for kind in (member for kind in kinds for member in _members(kind)):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                if part in kind.model_fields:
                    step.append(kind.model_fields[part].annotation)
                elif part == kind.__name__:  # pydantic names the member of a union of sections
                    step.append(kind)
            elif typing.get_origin(kind) is list and isinstance(part, int):
                step.append(typing.get_args(kind)[0])
            elif typing.get_origin(kind) is dict and isinstance(part, str):
                step.append(typing.get_args(kind)[1])
        kinds = step
    sections = [kind for kind in kinds for kind in _members(kind) if isinstance(kind, type) and issubclass(kind, BaseModel)]
    return sections[0] if sections else None


def _unknown_field(loc: tuple) -> str:
    """The message for a field no section has: the closest allowed name, else every allowed name."""
    where = _field_path(loc)
    section = _section_at(loc[:-1])
    allowed = sorted(section.model_fields) if section is not None else []
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    if close:
        return f"{where}: unknown field; did you mean `{close[0]}`?"
    parent = _field_path(loc[:-1]) or "the top level"
    known = f": {', '.join(allowed)}" if allowed else ""
    return f"{where}: unknown field; remove it, or name one of the fields of {parent}{known} (docs/recipe.md)"


def _describe(error: dict) -> str:
    where = _field_path(error["loc"]) or "(top level)"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return _unknown_field(error["loc"])
    if error["type"] == "missing":
        return f"{where}: required field is missing; add it"
    value = error.get("input")
    return f"{where}: {message}" + ("" if isinstance(value, dict | list) else f" (got {value!r})")


def parse_recipe(data: Any, source: str) -> Recipe:
    """Validate already-parsed recipe data; errors name `source` and each failing field."""
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: a recipe is a YAML mapping with sections model, data, train, hardware, eval")
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        lines = "\n".join(f"  {_describe(e)}" for e in exc.errors())
        raise RecipeError(f"{source}: invalid recipe\n{lines}") from None


def recipe_name(path: Path) -> str:
    name = path.stem
    if not RECIPE_NAME.match(name):
        raise RecipeError(
            f"{path}: recipe name {name!r} may hold only letters, digits, '_' and '-' "
            "(it becomes a folder name in every output); rename the file"
        )
    return name


class RecipeLoader(yaml.SafeLoader):
    """The safe loader (no Python tags, so a recipe cannot build objects or run code), refusing a key given
    twice in one mapping: plain YAML keeps the last silently, and the first setting would be ignored."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping; keep one", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate one recipe file (safe YAML loader only)."""
    path = Path(path)
    recipe_name(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"{path}: recipe file not found") from None
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    try:
        data = yaml.load(text, Loader=RecipeLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise RecipeError(f"{path}:{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    return parse_recipe(data, str(path))


def json_schema() -> dict[str, Any]:
    """JSON schema of a recipe, generated from the pydantic models (config/recipe.schema.json)."""
    return Recipe.model_json_schema()
