"""Logit adjustment (`logit_adjust` τ): the served bias of label k is its learned bias plus τ·log n_k, n_k
its training rows (at least 1, so labels without rows keep theirs).

On some sets a trained model scores its frequent labels too high against its rare ones for P@1 (on others
not: docs/training.md); a shift by the log of each label's frequency trades between them after training, at
no cost to a step. Only the saved model (and every evaluation of it) carries the shift: training updates the
learned biases, and a continual run takes the shift off its base first (`unapplied`) so that it is never
applied twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from trainer.model import XCModel


def bias_shift(counts: np.ndarray, tau: float) -> np.ndarray:
    """τ·log(max(n_k, 1)) per label: what the saved biases carry beyond the learned ones."""
    return (tau * np.log(np.maximum(np.asarray(counts, np.float64), 1.0))).astype(np.float32)


@torch.no_grad()
def shift_biases(model: XCModel, counts: np.ndarray, tau: float, lo: int = 0) -> None:
    """Add τ·log n_k to the biases of the label rows [lo, lo + rows) that `model` holds (one rank's shard
    or all of them); `counts` covers every label."""
    rows = model.head.shape[0]
    shift = torch.from_numpy(bias_shift(np.asarray(counts)[lo : lo + rows], tau))
    model.head[:, -1] += shift.to(model.head.device, model.head.dtype)


@contextlib.contextmanager
def adjusted(model: XCModel, counts: np.ndarray, tau: float, lo: int = 0) -> Iterator[None]:
    """Within the block the biases carry the shift (evaluation, saving); the learned ones, exactly as they
    were, after."""
    if tau == 0.0:
        yield
        return
    learned = model.head[:, -1].detach().clone()
    shift_biases(model, counts, tau, lo)
    try:
        yield
    finally:
        with torch.no_grad():
            model.head[:, -1] = learned


def unapplied(model: XCModel, counts: np.ndarray | None, tau: float) -> None:
    """Take a saved model's shift off its biases (a base about to be continued). A loaded head maps its
    file read-only, so a shifted one is first copied."""
    if tau != 0.0 and counts is not None:
        model.head.data = model.head.data.clone()
        shift_biases(model, counts, -tau)
