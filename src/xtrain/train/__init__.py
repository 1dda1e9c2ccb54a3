"""The train stage (rule `train`): a recipe's backend run on the plan's layout, ending in the checkpoint contract.

`run` runs the backend and writes `checkpoints/<recipe>/` (weights, tokenizer, train_metrics.json, manifest.json);
`checkpoint` checks that contract from the files on disk; `backends/` holds the backend contract, what each backend
can run (`backends.capabilities`), the registry and one module per lane; `tracking` maps `train.report_to` onto each
backend; `allocator` picks the memory allocator the train job runs under. Nothing is re-exported here: the plan
reads `backends.capabilities` and `allocator`, and importing this package must not load the lanes.
"""
