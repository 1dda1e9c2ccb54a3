"""`python -m xtrain.chat <folder>`: talk to a tuned model in a terminal.

The folder is a checkpoint (`checkpoints/<recipe>`: a LoRA adapter on its base model, or a full model), an
export (`exports/<recipe>`, whose `merged/` is loaded) or any transformers model folder. Chats are rendered with
the folder's chat template, answers stream token by token and stop where `generation_config.json` says (the
end-of-turn token). `/reset` starts a new conversation, `/exit` (or end of input, or Ctrl-C at the prompt) quits;
Ctrl-C during an answer stops that answer. The model runs on the GPU when there is one (bf16 where it has it, else
fp16), else on the CPU in float32.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .artifacts import read_json
from .errors import XtrainError
from .models.loading import DTYPES, load_tuned

COMMANDS = "/reset starts over, /exit quits"


def model_folder(folder: Path) -> Path:
    """The folder holding the weights and tokenizer: an export's merged/, or `folder` itself."""
    if (folder / "merged" / "config.json").is_file():
        return folder / "merged"
    if (folder / "config.json").is_file() or (folder / "adapter_config.json").is_file():
        return folder
    raise XtrainError(f"{folder}: neither a checkpoint, an export with merged/, nor a model folder (no config.json "
                      "or adapter_config.json); export one with `export: {merged: true}` in the recipe")


def found_device() -> tuple[str, str]:
    """(device, precision): the first GPU in bf16 (fp16 where it lacks bf16) when torch sees one, else the CPU in
    fp32."""
    import torch

    if torch.cuda.is_available():
        return "cuda", "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "cpu", "fp32"


def load(folder: Path, device: str = "cpu", precision: str = "fp32"):
    """(model, tokenizer) of a checkpoint, export or model folder, in `precision` on `device`."""
    from transformers import AutoTokenizer

    weights = model_folder(folder)
    base = weights
    if (weights / "adapter_config.json").is_file():
        manifest = weights / "manifest.json"
        base = Path(read_json(manifest)["base_model"] if manifest.is_file()
                    else read_json(weights / "adapter_config.json")["base_model_name_or_path"])
        if not (base / "config.json").is_file():
            raise XtrainError(f"{weights}: its base model {base} is not here; run from the project folder")
    model = load_tuned(base, weights, dtype=DTYPES[precision], device=device).eval()
    return model, AutoTokenizer.from_pretrained(weights)


def answer(model, tokenizer, messages: list[dict], max_new_tokens: int, temperature: float) -> str:
    """Generate the assistant's next turn, streaming it to stdout; the text without special tokens."""
    from transformers import TextStreamer

    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True).to(model.device)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    output = model.generate(**ids, max_new_tokens=max_new_tokens, streamer=streamer, **sampling,
                            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    return tokenizer.decode(output[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xtrain.chat", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="checkpoints/<recipe>, exports/<recipe>, or a model folder")
    parser.add_argument("--system", help="a system message opening every conversation")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: the GPU when there is one")
    args = parser.parse_args(argv)
    device, precision = found_device()
    if args.device == "cpu":
        device, precision = "cpu", "fp32"
    elif args.device == "cuda" and device != "cuda":
        print("error: --device cuda, but torch sees no GPU", file=sys.stderr)
        return 1
    try:
        model, tokenizer = load(args.folder, device, precision)
    except XtrainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    opening = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(opening)
    print(f"chatting with {args.folder} on {device} in {precision} ({COMMANDS})", flush=True)
    while True:
        try:
            text = input("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            print(flush=True)
            break
        if text == "/exit":
            break
        if text == "/reset":
            messages = list(opening)
            print("(new conversation)", flush=True)
            continue
        if not text:
            continue
        print("model> ", end="", flush=True)
        try:
            reply = answer(model, tokenizer, [*messages, {"role": "user", "content": text}], args.max_new_tokens,
                           args.temperature)
        except KeyboardInterrupt:  # the answer is dropped, the conversation goes on without that turn
            print("\n(interrupted)", flush=True)
            continue
        messages += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
