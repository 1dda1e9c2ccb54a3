"""The smoke stage (rule `smoke`): a recipe's own path, end to end on the CPU in minutes, before it waits in a GPU
queue. `run` rehearses prepare, plan, launch, train and evaluate on a sample; `model` shrinks the recipe's model;
`report` writes `smoke/<recipe>/report.md`."""

from .run import smoke

__all__ = ["smoke"]
