"""xtrain: reproducible LLM fine-tuning, one YAML recipe at a time."""

__version__ = "0.1.0"
