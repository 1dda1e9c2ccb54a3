"""Code that runs inside a backend's own interpreter (its virtual environment, conda env or container).

Every module here imports only the standard library and the backend's own stack (torch, transformers,
torchtune, unsloth, pyarrow), never xtrain or pydantic: the backends' environments pin other versions of
xtrain's stack. xtrain itself imports the parts it shares with them (`prepared`, `trainer_parts`) from here.
Backends launch their interpreter with this package's parent folder on PYTHONPATH (`BACKEND_SIDE_PATH`).
"""

from pathlib import Path

BACKEND_SIDE_PATH = str(Path(__file__).resolve().parent.parent)
