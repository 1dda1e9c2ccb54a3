"""The export stage (rule `export`): a checkpoint -> `exports/<recipe>/`, what people run. `run` writes the folder;
`merge` folds a LoRA adapter into its base; `gguf_file` writes GGUF files with llama.cpp's `gguf` writer, streamed
from merged/'s shards; `ollama` writes the Modelfile."""

from .run import export

__all__ = ["export"]
