"""`snakemake` whose Slurm executor checks its jobs every POLL_SECONDS, for the one-node test cluster.

snakemake-executor-plugin-slurm 2.x waits 10 s longer after each status check that finds no job ended (from
--slurm-init-seconds-before-status-checks up to 180 s): that spares a big cluster's controller, and on the test
cluster it only delays the moment Snakemake sees a job end (11-29 s per job in the chain test's log, and longer
for a long training job, whose checks were 20, 30, 40 ... s apart). Checking every two seconds changes when a job's
end is noticed, nothing about what is submitted or how its state is read (still `squeue`, as the tests ask).

Run as `python tests/slurm_snakemake.py <snakemake arguments>`. The jobs inside Slurm (the plugin's job step runs
`python -m snakemake`) are untouched.
"""

from __future__ import annotations

import sys

POLL_SECONDS = 2


def poll_every(seconds: float) -> None:
    """Make the Slurm executor's interval between status checks a constant (its setter, the back-off, a no-op)."""
    from snakemake_executor_plugin_slurm import Executor
    from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

    # The plugin assigns this property after every check; if it stops being the one it assigns, say so rather
    # than silently polling at the plugin's pace.
    if not isinstance(vars(RemoteExecutor).get("next_seconds_between_status_checks"), property):
        raise RuntimeError("RemoteExecutor.next_seconds_between_status_checks is no longer a property: "
                           "tests/slurm_snakemake.py cannot fix the Slurm executor's polling interval")
    Executor.next_seconds_between_status_checks = property(lambda self: seconds, lambda self, value: None)


if __name__ == "__main__":
    poll_every(POLL_SECONDS)
    from snakemake.cli import main

    sys.exit(main())
