"""The prepare stage (rule `prepare`), one module per concern:

`sources` reads files, folders and hub ids into rows; `formats` turns rows into one chat form and
decides what can be trained on; `dedupe` finds exact and near duplicates; `tokenize` checks the chat
template and tokenizes in batches with the loss mask; `report` writes the manifest's statistics and
preview.txt; `pipeline` runs them in order and writes the output folder.
"""

from .pipeline import SPLITS, prepare

__all__ = ["SPLITS", "prepare"]
