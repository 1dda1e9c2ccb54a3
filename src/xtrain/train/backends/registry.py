"""The backend registry: every training backend, keyed by the recipe's `train.backend`.

The contract the backends implement (`TrainJob`, `TrainResult`) is in `contract`, what each can run in
`capabilities`; each backend is one module beside this one. `check` is the one question asked before anything
runs: can this backend train this recipe's `train` and `hardware` (its declared capabilities, then its own
`check`)?
"""

from __future__ import annotations

from ...errors import XtrainError
from ...plan.planner import precisions
from ...recipe import Hardware, Train
from .. import tracking
from .axolotl import Axolotl
from .capabilities import refusal
from .contract import Backend
from .primus import Primus
from .torchtune import Torchtune
from .trl_cpu import TrlCpu
from .trl_local import TrlLocal
from .unsloth import Unsloth

__all__ = ["REGISTRY", "check", "get_backend"]

REGISTRY: dict[str, Backend] = {
    backend.name: backend for backend in (TrlCpu(), TrlLocal(), Axolotl(), Unsloth(), Torchtune(), Primus())
}


def get_backend(name: str) -> Backend:
    if name not in REGISTRY:
        raise XtrainError(f"train.backend {name!r} is not a backend of this version of xtrain; available: "
                          f"{', '.join(REGISTRY)}")
    return REGISTRY[name]


def check(name: str, train: Train, hardware: Hardware, packed: bool = False) -> Backend:
    """The backend `name`, once it is known to run these settings (`packed`: the train rows are packed)."""
    backend = get_backend(name)
    if reason := refusal(name, backend.capabilities, train, hardware, packed):
        able = [other.name for other in REGISTRY.values() if other.name != name
                and not refusal(other.name, other.capabilities, train, hardware, packed)]
        raise XtrainError(reason + (f"; backends that run these settings: {', '.join(able)}" if able else ""))
    precisions(hardware, name)  # one the device runs and the backend trains in
    tracking.check(train)
    backend.check(train, hardware)
    return backend
