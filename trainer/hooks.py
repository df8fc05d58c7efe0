"""How a caller watches and stops a training run (`TrainHooks`, `Progress`) and what it gets back
(`TrainResult`): the run's outside, apart from the loop that drives it (`trainer.train`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("ovex.train")


@dataclass
class Progress:
    epoch: int  # 1-based epoch in progress (or just finished)
    epochs: int
    step: int  # global steps done
    steps_total: int
    examples_per_s: float
    loss: float
    metrics: dict[str, float] | None = None  # set after an evaluation

class TrainHooks(Protocol):
    def on_progress(self, progress: Progress) -> None: ...

    def on_log(self, message: str) -> None: ...

    def should_stop(self) -> bool: ...

class LoggingHooks:
    """Default hooks: messages to the `ovex.train` logger, never stop."""

    def on_progress(self, progress: Progress) -> None:
        pass

    def on_log(self, message: str) -> None:
        log.info(message)

    def should_stop(self) -> bool:
        return False

class QuietHooks(LoggingHooks):
    """Hooks that say nothing: benchmarks and sweeps print one summary line per run instead."""

    def on_log(self, message: str) -> None:
        pass

class _Muted(QuietHooks):
    """Another rank's view of the caller's hooks: rank 0 alone reports, every rank obeys a stop."""

    def __init__(self, hooks: TrainHooks) -> None:
        self.hooks = hooks

    def should_stop(self) -> bool:
        return self.hooks.should_stop()

@dataclass
class TrainResult:
    out_dir: Path | None
    metrics: dict[str, float]
    steps: int
    epochs: int
    seconds: float
    examples_per_s: float
    final_loss: float
    resumed_from_step: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    best_epoch: int | None = None  # with params.valid_fraction > 0: the epoch whose weights were kept
    metrics_valid_p1: float | None = None  # P@1 of that epoch on the held-out training rows
