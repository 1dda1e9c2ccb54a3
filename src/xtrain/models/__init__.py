"""Where base models come from and what makes a model folder usable: hub ids read from the local cache (`hub`),
the embedded demo model built offline (`tiny`), a GGUF file converted into a model folder (`gguf`), loading a
checkpoint for inference (`loading`), the generation config and model card a checkpoint ships
(`inference_files`), and the table of known accelerators (`gpus`). Nothing is re-exported here: the recipe schema
reads `gpus`, and importing this package must not load the rest.
"""
