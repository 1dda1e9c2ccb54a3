"""A real one-node Slurm cluster on this machine, for workflow tests (Debian's slurm-wlm 22.05).

Installs slurmctld/slurmd/munge when missing (root only), writes /etc/slurm/slurm.conf on free ports
(a config that was there is put back afterwards), starts munged, slurmctld and slurmd, and stops
exactly the daemons it started. No accounting daemon: callers poll with squeue. While it runs, this process's
SLURM_CONF (tests/conftest.py's, naming no cluster) is unset: Slurm's commands read /etc/slurm/slurm.conf, as the
Snakemake job step does (it strips SLURM_CONF).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from debian import ensure_installed

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
CONF = Path("/etc/slurm/slurm.conf")
# How long a daemon may take to come up; generous, as a test may run beside a CPU hog (bench/suite_under_load.py).
STARTUP_SECONDS = 120


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# How long slurmctld keeps a finished job for `scontrol show job` (there is no sacct): a chained run is read back
# after its last job, and on a loaded machine its first jobs had ended more than 5 minutes before (seen).
FINISHED_JOB_SECONDS = 3600


def slurm_conf(state: Path, cpus: int, memory_mb: int) -> str:
    return f"""\
ClusterName=xtrain-test
SlurmctldHost=localhost
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge={FINISHED_JOB_SECONDS}
DefMemPerCPU=1000
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/spool
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd.pid
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=xtrain Nodes=localhost MaxTime=INFINITE State=UP
"""


class Cluster:
    def __init__(self, state: Path):
        self.state = state
        self.started: list[int] = []
        self.saved_conf = CONF.read_text() if CONF.exists() else None
        self.saved_conf_variable = os.environ.get("SLURM_CONF")

    def start(self) -> None:
        if not ensure_installed(["slurmctld", "munged"], list(PACKAGES)):
            raise RuntimeError("Slurm is not installed and installing it needs root")
        for sub in ("ctld", "spool"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 - 4096
        CONF.parent.mkdir(parents=True, exist_ok=True)
        CONF.write_text(slurm_conf(self.state, os.cpu_count() or 1, memory_mb))
        os.environ.pop("SLURM_CONF", None)
        self._start_munge()
        subprocess.run(["slurmctld", "-c"], check=True)  # -c: a clean state, no jobs from an earlier run
        self._remember("slurmctld.pid")
        subprocess.run(["slurmd", "-N", "localhost"], check=True)
        self._remember("slurmd.pid")
        self._wait_idle()

    def _start_munge(self) -> None:
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode == 0:
            return
        run_dir = Path("/run/munge")
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(run_dir, "munge", "munge")
        if not Path("/etc/munge/munge.key").exists():
            subprocess.run(["runuser", "-u", "munge", "--", "mungekey", "--create"], check=True)
        subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True)
        deadline = time.monotonic() + STARTUP_SECONDS  # munged daemonises before it is ready on a busy machine
        while not (pid := subprocess.run(["pgrep", "-x", "munged"], capture_output=True, text=True).stdout.split()):
            if time.monotonic() > deadline:
                raise RuntimeError("munged did not start; see /var/log/munge/munged.log")
            time.sleep(0.2)
        self.started += [int(p) for p in pid]

    def _remember(self, pidfile: str) -> None:
        path = self.state / pidfile
        for _ in range(int(STARTUP_SECONDS / 0.1)):
            if path.exists() and path.read_text().strip():
                self.started.append(int(path.read_text()))
                return
            time.sleep(0.1)
        raise RuntimeError(f"{pidfile} did not appear; see {self.state}/*.log")

    def _wait_idle(self, timeout: float = STARTUP_SECONDS) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True).stdout
            if "idle" in state:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm node never became idle: {state!r}; see {self.state}/slurmd.log")

    def stop(self) -> None:
        for pid in reversed(self.started):
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                pass
        if self.saved_conf is None:
            CONF.unlink(missing_ok=True)
        else:
            CONF.write_text(self.saved_conf)
        if self.saved_conf_variable is not None:
            os.environ["SLURM_CONF"] = self.saved_conf_variable


def show_jobs() -> list[dict[str, str]]:
    """Every job slurmctld still remembers (MinJobAge keeps finished ones), as key=value dicts."""
    out = subprocess.run(["scontrol", "-o", "show", "job"], capture_output=True, text=True, check=True).stdout
    jobs = []
    for line in out.splitlines():
        fields = {}
        for token in line.split():
            key, _, value = token.partition("=")
            fields[key] = value
        jobs.append(fields)
    return jobs
