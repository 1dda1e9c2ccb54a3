"""The export stage: a checkpoint -> `exports/<recipe>/`, what people run (recipe section `export:`).

- `merged/`: one plain transformers model (`merge`), for transformers, vLLM, or `python -m xtrain.chat`;
- `<recipe>-<type>.gguf` for each `export.gguf` type (`gguf_file`), for llama.cpp, LM Studio, Ollama;
- `Modelfile` (`ollama`) beside the first GGUF file;
- `README.md`: the model card (Hugging Face's format) with the evaluation results, also in merged/;
- `export.json`: every file with its size, and the seconds each part took.
Memory stays bounded by the model in one dtype, not by float32 copies of it: the merge runs in merged/'s dtype
(`export.dtype`, else the base model's) on the device `export()` is given, merged/ is saved in shards and the model
released, and only then is each GGUF file written, streamed from merged/'s shards one tensor at a time (so GGUF is
written from the merged weights in the base's dtype, as llama.cpp's own converter reads a Hugging Face checkpoint).
Without `export.merged` the shards go to a scratch folder in the staging folder, removed before publishing. The
folder appears only when complete.
"""

from __future__ import annotations

import gc
import logging
import shutil
import time
from functools import partial
from pathlib import Path

from xtrain_backend_side.progress import Progress

from ..artifacts import atomic_dir, read_json, write_json
from ..models.inference_files import base_license, model_card
from ..models.loading import config_dtype
from ..recipe import Export, Hardware, Train
from .gguf_file import gguf_architecture, write_gguf
from .merge import add_model_files, merged_model, save_weights
from .ollama import modelfile

log = logging.getLogger(__name__)


def end_of_turn_tokens(tokenizer, checkpoint_dir: Path) -> list[str]:
    """The tokens generation stops at: the checkpoint's generation_config eos ids (with the end-of-turn token)."""
    eos = read_json(checkpoint_dir / "generation_config.json").get("eos_token_id")
    ids = [] if eos is None else [eos] if isinstance(eos, int) else eos
    return tokenizer.convert_ids_to_tokens(ids)


def export(*, model_dir: Path, checkpoint_dir: Path, prepared_dir: Path, evaluation: dict, settings: Export,
           train: Train, hardware: Hardware, out: Path, trust_remote_code: bool = False, device: str = "cpu") -> dict:
    """Write `out`; `evaluation` (the recipe's eval.json) goes into the export's model card. The merge runs on
    `device` ("cpu", "cuda" or "auto")."""
    from transformers import AutoConfig, AutoTokenizer

    if settings.gguf:  # refuse an architecture before the minutes of merging
        gguf_architecture(AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code))
    # A line after each part (merge, the merged folder, each GGUF file), with the time left at the mean so far.
    progress = Progress(log.info, "export: parts", 1 + len(settings.gguf) + settings.merged, every=0)
    prepared = read_json(prepared_dir / "manifest.json")
    end_of_turn = prepared.get("end_of_turn")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir)
    manifest = read_json(checkpoint_dir / "manifest.json")
    dtype = settings.dtype or config_dtype(model_dir, trust_remote_code)
    card = partial(
        model_card, recipe=out.name, base_model=manifest["base_model"], backend=manifest["backend"],
        train=train.model_dump(mode="json"), hardware=hardware.model_dump(mode="json"), data=prepared,
        metrics=read_json(checkpoint_dir / "train_metrics.json"), license_=base_license(model_dir),
        evaluation=evaluation, merged_dtype=dtype if settings.merged else None, lineage=manifest.get("lineage", []),
    )
    seconds = {}
    with atomic_dir(out) as staging:
        # The GGUF writer reads the merged shards; without export.merged they are scratch, removed before publishing.
        merged = staging / ("merged" if settings.merged else "merged.scratch")
        merged.mkdir()
        started = time.perf_counter()
        model = merged_model(model_dir, checkpoint_dir, dtype, device, trust_remote_code)
        seconds["merge"] = time.perf_counter() - started
        progress.advance()
        started = time.perf_counter()
        save_weights(model, merged, settings.shard_gb)
        del model
        gc.collect()  # PEFT's wrappers hold reference cycles: free the weights now, before the GGUF writer runs
        if settings.merged:
            add_model_files(checkpoint_dir, merged, card())
            seconds["save_merged"] = time.perf_counter() - started
            progress.advance()
        else:  # export.json keeps its keys: scratch shards are part of the merge
            seconds["merge"] += time.perf_counter() - started
        for kind in settings.gguf:
            started = time.perf_counter()
            write_gguf(merged, checkpoint_dir, staging / f"{out.name}-{kind}.gguf", kind, out.name,
                       end_of_turn["id"] if end_of_turn else None)
            seconds[f"gguf_{kind}"] = time.perf_counter() - started
            progress.advance()
        if not settings.merged:
            shutil.rmtree(merged)
        if settings.ollama:
            text = modelfile(tokenizer, f"{out.name}-{settings.gguf[0]}.gguf", end_of_turn_tokens(tokenizer, checkpoint_dir))
            (staging / "Modelfile").write_text(text, encoding="utf-8")
        (staging / "README.md").write_text(card(
            model_folder="merged" if settings.merged else None, ollama=settings.ollama,
            gguf_files=[f"{out.name}-{kind}.gguf" for kind in settings.gguf]), encoding="utf-8")
        files = {str(path.relative_to(staging)): path.stat().st_size
                 for path in sorted(staging.rglob("*")) if path.is_file()}
        summary = {"checkpoint": str(checkpoint_dir), "files": files,
                   "seconds": {part: round(value, 2) for part, value in seconds.items()}}
        write_json(staging / "export.json", summary)
    log.info("exported %s: %s", out, ", ".join(f"{name} ({size} bytes)" for name, size in files.items()))
    return summary
