"""Base models named by hub id (`model.hub`), read from the Hugging Face cache, never downloaded by a job.

A recipe's model is a local folder or a hub id with an optional revision; `model_folder` gives the folder
either way (for a hub id, the cached snapshot). A model not in the cache is an error before any job, naming
the id and the command that downloads it. `cached_revision` is the commit a snapshot folder holds, which the
checkpoint manifest records so a rebuild uses the same weights.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import XtrainError
from ..recipe import Model

COMMIT = re.compile(r"^[0-9a-f]{40}$")


def model_folder(model: Model) -> str:
    """The model's folder: `model.path`, or the cached snapshot of `model.hub` at `model.revision`."""
    if model.hub is None:
        return model.path
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(model.hub, revision=model.revision, local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, OSError):
        revision = f" --revision {model.revision}" if model.revision else ""
        raise XtrainError(
            f"model.hub {model.hub!r}{f' at revision {model.revision!r}' if model.revision else ''} is not in the "
            f"Hugging Face cache ({HF_HUB_CACHE}); jobs never download. Download it first: "
            f"`hf download {model.hub}{revision}` (or set HF_HOME to the cache that has it)"
        ) from None


def cached_revision(folder: Path) -> str | None:
    """The commit hash of a Hugging Face cache snapshot folder (`.../snapshots/<commit>`); None for other folders."""
    folder = Path(folder).resolve()
    return folder.name if folder.parent.name == "snapshots" and COMMIT.match(folder.name) else None
