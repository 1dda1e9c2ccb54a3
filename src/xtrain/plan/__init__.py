"""The plan stage (rule `plan`): how a run is laid out and what it will cost, decided before any device is allocated.

`planner` chooses precision, micro-batch, accumulation, checkpointing, compilation and the parallel layout, and
sizes the launch resources; it reads the model's shape (`model`), predicts memory (`memory`) and time (`speed`,
from the CPU `probe` and the GPU table), decides `torch.compile` (`compile`), and writes the typed plan.json
(`schema`) that every later stage reads.
"""

from .planner import make_plan
from .schema import Plan, read_plan, write_plan

__all__ = ["Plan", "make_plan", "read_plan", "write_plan"]
