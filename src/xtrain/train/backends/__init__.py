"""The training backends: the contract they implement (`contract`), what each can run (`capabilities`, data the
plan, preflight and the docs read), the registry keyed by `train.backend` (`registry`, with `check`), and one module
per lane (`trl_cpu`, `trl_local`, `axolotl`, `unsloth`, `torchtune`, `primus`) over shared parts (`trl`,
`distributed`, `guards`, `validation`, `preference_text`). Nothing is re-exported here, so that reading
`capabilities` loads no lane.
"""
