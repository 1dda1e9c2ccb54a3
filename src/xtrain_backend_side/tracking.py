"""What every backend's trainer adds to the metrics its experiment trackers record: tokens per second and peak
memory, next to the loss, learning rate and grad norm the trainers log themselves.

Runs inside a backend's own interpreter too (the unsloth runner, torchtune's `tune`): the standard library at load
time, the backend's stack when called.
"""

from __future__ import annotations

import resource
import time


def peak_memory() -> dict[str, float]:
    """This process's peak resident memory and, on a GPU, the peak memory torch allocated there (MiB)."""
    import torch

    # ru_maxrss is KiB on Linux.
    peaks = {"peak_host_memory_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        peaks["peak_gpu_memory_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return peaks


def measured(trainer_class):
    """`trainer_class` (a transformers Trainer) whose logged training steps also carry `tokens_per_second` (input
    tokens since the previous log, per second) and `peak_memory`'s figures. They are added in `Trainer.log`, before
    any callback sees the step, so every reporting integration (TensorBoard, MLflow, W&B) records them."""

    class Measured(trainer_class):
        def log(self, logs, start_time=None, *args, **kwargs):
            if "loss" in logs:
                now, tokens = time.time(), self.state.num_input_tokens_seen
                # The first logged step counts from the start of this session of training (a resumed run's too).
                then, before = getattr(self, "_xtrain_last_log", (start_time, getattr(
                    self, "_initial_num_input_tokens_seen", 0)))
                if then is not None and now > then and tokens:
                    logs["tokens_per_second"] = (tokens - before) / (now - then)
                logs.update(peak_memory())
                self._xtrain_last_log = (now, tokens)
            return super().log(logs, start_time, *args, **kwargs)

    return Measured


class TorchtuneLoggers:
    """A torchtune metric logger that hands every metric to several: torchtune's DiskLogger (xtrain reads its
    losses back) and the trackers of train.report_to. Each entry of `loggers` is a component config
    (`_component_` + its arguments); each logged step also gets this process's peak memory."""

    def __init__(self, loggers: dict):
        from omegaconf import OmegaConf
        from torchtune import config

        self.loggers = [config.instantiate(OmegaConf.create(dict(settings))) for settings in loggers.values()]

    def log(self, name, data, step):
        for logger in self.loggers:
            logger.log(name, data, step)

    def log_dict(self, payload, step):
        payload = {**payload, **peak_memory()}
        for logger in self.loggers:
            logger.log_dict(payload, step)

    def log_config(self, config):
        for logger in self.loggers:
            if hasattr(logger, "log_config"):
                logger.log_config(config)

    def close(self):
        for logger in self.loggers:
            logger.close()
