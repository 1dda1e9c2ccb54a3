"""The prepare stage (rule `prepare`), one module per concern:

`sources` reads files, folders and hub ids into rows; `formats` turns rows into one chat form and
decides what can be trained on; `dedupe` finds exact and near duplicates; `chats` fills placeholders and
makes reasoning and tool calls ready for the chat template (data.reasoning, data.tool_calls); `templates`
resolves the chat template; `tokenize` checks it and tokenizes in batches with the loss mask; `lengths`
splits long documents into blocks and truncates or drops over-length rows; `split` assigns rows to train
and eval by content hash and weights the train rows; `packing` packs train rows into seq_len sequences;
`preference` reads pairs and labelled answers (dpo, orpo, kto); `report` counts each source's rows, warns
about lost rows, and writes the manifest's statistics and preview.txt; `output` writes the output folder;
`pipeline` runs them in order.
"""

from .pipeline import prepare
from .split import SPLITS

__all__ = ["SPLITS", "prepare"]
