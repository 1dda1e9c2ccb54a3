"""xtrain's Primus experiment checked by Primus' own config parser (issue 19).

    python bench/primus_config_check.py PRIMUS_SRC [BRIDGE_SRC MEGATRON_LM_SRC]

Renders the primus backend's experiment (its own `native`, then `write_config`) on the tiny model for each shape
the lane claims, and runs Primus' parser on it: `load_primus_config` (what `primus-cli train posttrain` calls,
primus/core/runtime/train_runtime.py) and the Megatron Bridge adapter's argument build (`MegatronBridgeArgBuilder`
+ `normalize_megatron_bridge_dataset_args`, megatron_bridge_adapter.py `convert_config`). Each key xtrain wrote
is compared with what the parser hands the trainer.

Primus' trainer then calls the recipe flavor with every key and drops those it does not accept
(config_utils.py `auto_filter_and_call`), merges keys named like a ConfigContainer section into it
(`_merge_dict_to_dataclass`) and applies a few by hand (`_apply_nested_overrides`). That needs Megatron Bridge and
Megatron-LM, which need GPUs; given their sources at the commits Primus pins (third_party/), the script reads the
same rules from the source instead (Python's `ast`, no import) and says per key which one takes it.
Prints markdown tables.
"""

from __future__ import annotations

import ast
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from xtrain.data import prepare  # noqa: E402
from xtrain.models.tiny import build_tiny_model  # noqa: E402
from xtrain.plan import make_plan  # noqa: E402
from xtrain.recipe import Data, DataSource, Hardware, Lora, Train  # noqa: E402
from xtrain.train.backends.contract import TrainJob
from xtrain.train.backends.registry import get_backend  # noqa: E402

# Every accelerator x GPU count x node count the lane claims (MI300X), LoRA and full, packed or not.
SHAPES = [(gpus, nodes, method, packed) for gpus, nodes in ((1, 1), (8, 1), (8, 2))
          for method in ("lora", "full") for packed in (False, True)]
FLAVORS = {"llama.llama3": "llama3_8b_finetune_config", "qwen.qwen3": "qwen3_8b_finetune_config"}
# ConfigContainer section -> (source root, file, dataclass) of the object the finetune flavors build for it.
SECTIONS = {
    "rng": ("bridge", "megatron/bridge/training/config.py", "RNGConfig"),
    "scheduler": ("bridge", "megatron/bridge/training/config.py", "SchedulerConfig"),
    "logger": ("bridge", "megatron/bridge/training/config.py", "LoggerConfig"),
    "dataset": ("bridge", "megatron/bridge/data/builders/hf_dataset.py", "HFDatasetConfig"),
    "optimizer": ("megatron", "megatron/core/optimizer/optimizer_config.py", "OptimizerConfig"),
}


def tiny_inputs(work: Path) -> tuple[Path, dict[bool, Path]]:
    """The tiny model (as tests/conftest.py builds it) and the demo data prepared unpacked and packed."""
    settings = yaml.safe_load((REPO / "config/config.yaml").read_text())["tiny_model"]
    model = work / "tiny-llama"
    build_tiny_model(REPO / settings["corpus"], model, **settings["settings"])
    prepared = {}
    for packed in (False, True):
        data = Data(sources=[DataSource(path=str(REPO / "data/demo/chat.jsonl"))], seq_len=128, eval_fraction=0.1,
                    packing=packed)
        prepared[packed] = work / f"prepared-{'packed' if packed else 'plain'}"
        prepare([Path(data.sources[0].path)], model, data, prepared[packed])
    return model, prepared


def render(model: Path, prepared: Path, work: Path, gpus: int, nodes: int, method: str) -> dict:
    """The experiment file the backend writes for one shape, and the overrides it set."""
    import json

    lora = {"lora": Lora(target_modules=["all-linear"])} if method == "lora" else {}
    train = Train(backend="primus", method=method, global_batch_size=16, max_steps=8, report_to=["tensorboard"],
                  **lora)
    hardware = Hardware(accelerator="rocm", gpus=gpus, nodes=nodes, gpu_model="mi300x")
    plan = make_plan(model, json.loads((prepared / "manifest.json").read_text()), train, hardware)
    job = TrainJob(model, prepared, plan, train, hardware, work / "out", work / "runs", None)
    return get_backend("primus").write_config(job)


def primus_parse(config_file: Path) -> SimpleNamespace:
    """Primus' parse of the experiment, as its post-training runtime does it, into the trainer's arguments."""
    from primus.backends.megatron_bridge.argument_builder import MegatronBridgeArgBuilder
    from primus.backends.megatron_bridge.config_utils import normalize_megatron_bridge_dataset_args
    from primus.core.config.primus_config import get_module_config, load_primus_config

    module = get_module_config(load_primus_config(config_file, SimpleNamespace(config=str(config_file))),
                               "post_trainer")
    assert module.framework == "megatron_bridge", module.framework
    return normalize_megatron_bridge_dataset_args(MegatronBridgeArgBuilder().update(module.params).finalize())


def plain(value):
    return {k: plain(v) for k, v in vars(value).items()} if isinstance(value, SimpleNamespace) else value


def read_back(written: dict, parsed: SimpleNamespace) -> list[str]:
    """The overrides whose parsed value differs from the value written (nested keys by dotted path)."""
    args, differ = plain(parsed), []
    for key, value in written.items():
        if isinstance(value, dict):
            differ += [f"{key}.{k}" for k, v in value.items() if args.get(key, {}).get(k) != v]
        elif args.get(key) != value:
            differ.append(f"{key} ({args.get(key, 'missing')!r})")
    return differ


def functions(path: Path) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)}


def classes(path: Path) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef)}


def flavor_rules(bridge: Path, recipe: str, flavor: str) -> dict[str, object]:
    """What a finetune flavor does with its keyword arguments: those it reads itself or passes on to its common
    builder (accepted), those it passes to that builder itself (a second value is a TypeError), and the settings
    it assigns after building (line numbers)."""
    module = bridge / "megatron/bridge/recipes" / (recipe.replace(".", "/") + ".py")
    defined = functions(module)
    body = defined[flavor]
    builder = next(node for node in ast.walk(body)
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defined)
    common = defined[builder.func.id]
    own = {node.args[0].value for node in ast.walk(body) if isinstance(node, ast.Call)
           and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop") and node.args
           and isinstance(node.args[0], ast.Constant)}
    assigned = {}
    for node in ast.walk(body):
        for target in getattr(node, "targets", []):
            if isinstance(target, ast.Attribute) and node.lineno > builder.lineno:
                assigned.setdefault(target.attr, f"{module.name}:{node.lineno}")
    return {"accepted": {a.arg for a in common.args.args + common.args.kwonlyargs} | own,
            "fixed": {k.arg: f"{module.name}:{builder.lineno}" for k in builder.keywords if k.arg},
            "assigned": assigned}


def dataclass_fields(root: Path, file: str, name: str) -> dict[str, bool]:
    """A dataclass's fields (with bases defined in the same file or Bridge's training config) -> whether its
    default is a value (a None default is never replaced: `_merge_dict_to_dataclass` requires the same type)."""
    index = classes(root / file)
    training = root / "megatron/bridge/training/config.py"
    if training.exists():
        index = classes(training) | index
    found: dict[str, bool] = {}
    node = index.get(name)
    for base in getattr(node, "bases", []):
        if isinstance(base, ast.Name) and base.id in index:
            found |= dataclass_fields(root, file, base.id)
    for item in getattr(node, "body", []):
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            found[item.target.id] = not (isinstance(item.value, ast.Constant) and item.value.value is None)
    return found


def primus_reads(primus: Path) -> set[str]:
    """The argument names Primus' Bridge trainer reads itself: recipe and flavor, and the nested overrides."""
    config_utils = functions(primus / "primus/backends/megatron_bridge/config_utils.py")["load_recipe_config"]
    nested = functions(primus / "primus/backends/megatron_bridge/megatron_bridge_base_trainer.py")[
        "_apply_nested_overrides"]
    names = {n.attr for n in ast.walk(config_utils) if isinstance(n, ast.Attribute)
             and isinstance(n.value, ast.Name) and n.value.id == "backend_args"}
    names |= {n.value for n in ast.walk(nested) if isinstance(n, ast.Constant) and isinstance(n.value, str)
              and n.value.isidentifier()}
    return names


def taken_by(key: str, value, rules: dict, container: set[str], sources: dict[str, Path], primus: set[str]) -> str:
    """Which rule of Primus' Bridge trainer takes one override, per the pinned sources."""
    if key in primus:
        return "Primus"
    if key in rules["fixed"]:
        return f"**conflict**: the flavor passes its own {key} ({rules['fixed'][key]}), TypeError"
    if key in rules["accepted"]:
        late = rules["assigned"].get(key)
        return f"flavor argument, then reset by the flavor ({late})" if late else "flavor argument"
    if key in container and isinstance(value, dict) and key in SECTIONS:
        where, file, name = SECTIONS[key]
        fields = dataclass_fields(sources[where], file, name)
        skipped = [k for k in value if not fields.get(k)]
        return f"{name} fields" + (f"; **not merged**: {', '.join(skipped)}" if skipped else "")
    return "**dropped** (no flavor argument or ConfigContainer section)"


def main(primus_src: Path, bridge_src: Path | None, megatron_src: Path | None) -> None:
    sys.path.insert(0, str(primus_src))
    rows, written_keys = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, prepared = tiny_inputs(work)
        for gpus, nodes, method, packed in SHAPES:
            shape = f"{nodes} x {gpus} MI300X, {method}, {'packed' if packed else 'unpacked'}"
            launch = render(model, prepared[packed], work / shape.replace(" ", "_").replace(",", ""), gpus, nodes,
                            method)
            overrides = launch["config"]["modules"]["post_trainer"]["overrides"]
            written_keys |= overrides
            try:
                differ = read_back(overrides, primus_parse(launch["config_file"]))
                verdict = "parsed"
            except Exception as error:  # the parser's refusal is the result reported
                differ, verdict = [], f"refused: {type(error).__name__}: {error}"
            rows.append(f"| {shape} | {verdict} | {len(overrides) - len(differ)}/{len(overrides)}"
                        f"{' (differ: ' + ', '.join(differ) + ')' if differ else ''} | `{' '.join(launch['argv'])}` |")
    print("| shape | Primus' parser | overrides read back as written | launch |\n| --- | --- | --- | --- |")
    print("\n".join(rows))
    if bridge_src is None or megatron_src is None:
        return
    sources = {"bridge": bridge_src / "src", "megatron": megatron_src}
    container = set(dataclass_fields(sources["bridge"], "megatron/bridge/training/config.py", "ConfigContainer"))
    primus = primus_reads(primus_src)
    rules = {recipe: flavor_rules(sources["bridge"], recipe, flavor) for recipe, flavor in FLAVORS.items()}
    print(f"\n| override (all shapes) | {' | '.join(FLAVORS.values())} |\n| --- |{' --- |' * len(FLAVORS)}")
    for key, value in sorted(written_keys.items()):
        cells = [taken_by(key, value, rules[recipe], container, sources, primus) for recipe in FLAVORS]
        print(f"| `{key}` | {' | '.join(cells)} |")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 4):
        sys.exit(__doc__)
    main(*(Path(arg) for arg in sys.argv[1:2]), *(Path(arg) for arg in sys.argv[2:]) or (None, None))
