"""GGUF files of a merged model, written with the `gguf` package (llama.cpp's own writer library).

A file is written from merged/'s safetensors shards, as llama.cpp's own converter reads a Hugging Face
checkpoint: its values are the merged weights in their dtype (the base model's, or `export.dtype`), read one
tensor at a time, converted and written, so the writer holds one shard's mapping and one tensor, never the model.
The `gguf` writer's streaming order: every tensor's info first (name, shape, type, size, known from the shards'
headers), then the header, the metadata and the tensor infos, then each tensor's data in the same order.

Llama-family models only (Llama, Mistral: llama.cpp's `llama` architecture; Qwen2: `qwen2`); any other
architecture is refused by name. What llama.cpp's converter does, done here with the same library:
- tensors renamed by `gguf.TensorNameMap`; an unmapped tensor is an error, never dropped;
- q/k projections of the `llama` architecture permuted to llama.cpp's rotary layout (rotating pairs of
  adjacent dimensions, where transformers rotates the two halves of each head);
- 1-D tensors (norms, biases) kept in f32; a tensor whose rows do not split into q8_0 blocks falls back to f16;
- the byte-level BPE tokenizer (token types from the tokenizer's added tokens, merges, special ids,
  add_bos, the chat template through `gguf.SpecialVocab`) and the end-of-turn token as `eot_token_id`.
Sentencepiece tokenizers (Llama 2, Mistral v0.1-v0.3) are refused: their vocabulary needs scores this
writer does not derive.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from ..errors import XtrainError

log = logging.getLogger(__name__)

# transformers architecture -> (gguf architecture name, whether q/k are permuted to llama.cpp's rope layout)
ARCHITECTURES = {
    "LlamaForCausalLM": ("LLAMA", True),
    "MistralForCausalLM": ("LLAMA", True),
    "Qwen2ForCausalLM": ("QWEN2", False),
}
# rope types of transformers' rope_parameters this writer carries over
ROPE_TYPES = ("default", "linear", "llama3")


def adds_bos(tokenizer) -> bool:
    """Whether encoding adds the BOS token by itself (Llama 3's does; SmolLM2's, whose bos_token is ChatML's
    `<|im_start|>`, does not): what the GGUF file tells llama.cpp and Ollama to do."""
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and tokenizer.bos_token_id is not None and ids[0] == tokenizer.bos_token_id


def gguf_architecture(config) -> tuple[str, bool]:
    """The GGUF architecture of a transformers config and whether q/k need permuting; refuses any other."""
    names = config.architectures or [type(config).__name__]
    if names[0] not in ARCHITECTURES:
        raise XtrainError(f"export.gguf: architecture {names[0]} cannot be written as GGUF here; supported: "
                          f"{', '.join(ARCHITECTURES)}. Remove export.gguf (merged/ still works with transformers)")
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope not in ROPE_TYPES:
        raise XtrainError(f"export.gguf: rope type {rope!r} of {names[0]} is not carried into GGUF here; supported: "
                          f"{', '.join(ROPE_TYPES)}. Remove export.gguf")
    return ARCHITECTURES[names[0]]


def permute_for_rope(weights, heads: int):
    """llama.cpp's q/k layout: within each head, interleave the two halves (rows i and i + d/2 become 2i, 2i+1)."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape)


def tensor_type(shape: tuple[int, ...], kind: str, name: str):
    """The GGML type of one tensor of `shape` in a file of type `kind`: 1-D in f32, q8_0 rows that do not split
    into blocks in f16."""
    import gguf

    types = gguf.GGMLQuantizationType
    if len(shape) == 1 or kind == "f32":
        return types.F32
    qtype = {"f16": types.F16, "bf16": types.BF16, "q8_0": types.Q8_0}[kind]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if shape[-1] % block:
        log.info("%s: rows of %d values do not split into %s blocks of %d; written as f16", name, shape[-1], kind,
                 block)
        return types.F16
    return qtype


def rope_freqs(config):
    """llama3 rope: the per-dimension divisors of the base frequencies, llama.cpp's `rope_freqs` tensor."""
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, torch.device("cpu"))
    dim = scaled.shape[0] * 2
    base = 1.0 / (config.rope_parameters["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    return (base / scaled.float()).numpy()


def add_hyperparameters(writer, config, name: str, kind: str) -> None:
    import gguf

    heads, hidden = config.num_attention_heads, config.hidden_size
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    rope = config.rope_parameters or {}
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(hidden)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(head_dim)
    if head_dim != hidden // heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    writer.add_vocab_size(config.vocab_size)
    file_types = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                  "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
    writer.add_file_type(file_types[kind])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def pre_tokenizer(spec: dict | None, where: Path) -> str:
    """llama.cpp's name for a byte-level tokenizer's pre-tokenizer (`tokenizer.ggml.pre`), from tokenizer.json."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    steps = (spec or {}).get("pretokenizers", [spec] if spec else [])
    kinds = [step["type"] for step in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and steps[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        pattern = steps[0].get("pattern", {}).get("Regex")
        # transformers' table of llama.cpp pre-tokenizer names by split regex (what it reads GGUF files with)
        known = [name for name, regex in GGUF_PRE_TOKENIZER_SPLITS.items() if regex == pattern]
        if known:
            return known[0]
    raise XtrainError(f"export.gguf: {where}/tokenizer.json has a pre-tokenizer llama.cpp does not name here "
                      f"({kinds}); supported: GPT-2 byte-level, SmolLM, and the Llama 3 and Qwen2 splits. "
                      "Remove export.gguf")


def add_tokenizer(writer, tokenizer_dir: Path, n_vocab: int, end_of_turn_id: int | None) -> None:
    """The byte-level BPE vocabulary, merges, special tokens and chat template of `tokenizer_dir`."""
    import gguf
    from transformers import AutoTokenizer

    spec_file = tokenizer_dir / "tokenizer.json"
    spec = json.loads(spec_file.read_text(encoding="utf-8")) if spec_file.is_file() else {}
    model, decoder = spec.get("model", {}), spec.get("decoder") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback") or decoder.get("type") != "ByteLevel":
        raise XtrainError(f"export.gguf: {tokenizer_dir} has no byte-level BPE tokenizer.json (sentencepiece-style "
                          "vocabularies, as in Llama 2 and Mistral v0.x, are not written here). Remove export.gguf")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    by_id = {index: token for token, index in tokenizer.get_vocab().items()}
    if len(by_id) > n_vocab:
        raise XtrainError(f"export.gguf: the tokenizer of {tokenizer_dir} has {len(by_id)} tokens, the model's "
                          f"embedding only {n_vocab}")
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for index in range(n_vocab):  # embedding rows past the tokenizer (padding to a round size) are unused
        token = by_id.get(index)
        tokens.append(token if token is not None else f"[PAD{index}]")
        types.append(gguf.TokenType.UNUSED if token is None else gguf.TokenType.NORMAL if index not in added
                     else gguf.TokenType.CONTROL if added[index].special else gguf.TokenType.USER_DEFINED)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer(spec.get("pre_tokenizer"), tokenizer_dir))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(tokenizer_dir, load_merges=True, n_vocab=n_vocab)
    # What the tokenizer really does, so llama.cpp adds a BOS exactly when transformers does.
    ids = tokenizer("a")["input_ids"]
    special.add_special_token["bos"] = adds_bos(tokenizer)
    special.add_special_token["eos"] = bool(ids) and ids[-1] == tokenizer.eos_token_id and len(ids) > 1
    if not special.chat_template:
        raise XtrainError(f"export.gguf: {tokenizer_dir} has no chat template to embed")
    special.add_to_gguf(writer, quiet=True)
    if end_of_turn_id is not None:
        writer.add_eot_token_id(end_of_turn_id)


def shard_tensors(merged_dir: Path, config, names, kind: str) -> dict[Path, list[tuple]]:
    """Each shard's tensors as (transformers name, GGUF name, shape, GGML type), in file order, from the shards'
    headers only."""
    from safetensors import safe_open

    shards = {}
    for shard in sorted(merged_dir.glob("*.safetensors")):
        with safe_open(shard, "pt") as weights:
            for hf_name in weights.keys():
                if hf_name == "lm_head.weight" and config.tie_word_embeddings:
                    continue  # llama.cpp uses token_embd when the file has no output tensor
                gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
                if gguf_name is None:
                    raise XtrainError(f"export.gguf: tensor {hf_name} of {config.architectures} has no GGUF name")
                shape = tuple(weights.get_slice(hf_name).get_shape())
                shards.setdefault(shard, []).append((hf_name, gguf_name, shape, tensor_type(shape, kind, gguf_name)))
    return shards


def write_gguf(merged_dir: Path, tokenizer_dir: Path, out: Path, kind: str, name: str,
               end_of_turn_id: int | None) -> None:
    """Write the model saved in `merged_dir` (config.json and safetensors shards, any dtype) and the tokenizer of
    `tokenizer_dir` to the GGUF file `out` with tensors of type `kind` (f32, f16, bf16, q8_0), one tensor at a
    time."""
    import gguf
    import numpy as np
    from safetensors import safe_open
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(merged_dir)
    arch_name, permute = gguf_architecture(config)
    arch = getattr(gguf.MODEL_ARCH, arch_name)
    writer = gguf.GGUFWriter(out, gguf.MODEL_ARCH_NAMES[arch])
    add_hyperparameters(writer, config, name, kind)
    add_tokenizer(writer, tokenizer_dir, config.vocab_size, end_of_turn_id)
    computed = {}
    if (config.rope_parameters or {}).get("rope_type") == "llama3":
        computed[gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight"] = rope_freqs(config)
    for gguf_name, array in computed.items():
        writer.add_tensor_info(gguf_name, array.shape, array.dtype, array.nbytes)
    shards = shard_tensors(merged_dir, config, gguf.get_tensor_name_map(arch, config.num_hidden_layers), kind)
    for _, gguf_name, shape, qtype in (tensor for tensors in shards.values() for tensor in tensors):
        nbytes = math.prod(gguf.quants.quant_shape_to_byte_shape(shape, qtype))
        writer.add_tensor_info(gguf_name, shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    # The data, in the order of the infos above.
    for array in computed.values():
        writer.write_tensor_data(array)
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    for shard, tensors in shards.items():
        with safe_open(shard, "pt") as weights:  # one shard mapped at a time
            for hf_name, gguf_name, _, qtype in tensors:
                array = weights.get_tensor(hf_name).float().numpy()
                role = gguf_name.split(".")[-2]
                if permute and role in heads:
                    array = permute_for_rope(array, heads[role])
                writer.write_tensor_data(gguf.quants.quantize(array, qtype))
    writer.close()
