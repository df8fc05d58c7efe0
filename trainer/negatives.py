"""Negative samplers: draws shared by a whole mini-batch, with the importance weights that keep the
sampled one-vs-each sum an unbiased estimate of the sum over all labels.

Sampling is O(M log K) per step (inverse-CDF by binary search), never O(K), so the step cost stays flat
as the label space grows. Uniform negatives are M *distinct* labels (no wasted repeats: a step scores the
same number of columns at K = 10^3 as at 10^6), and M ≥ K takes every label once with weight 1 (exact).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class SampledNegatives:
    """Distinct sampled labels (sorted) with log importance weights log(count / (M·q(j)))."""

    ids: torch.Tensor  # int64 [S], sorted, unique
    log_weight: torch.Tensor  # float32 [S]
    n_draws: int  # M


class NegativeSampler:
    """Uniform or unigram^alpha proposal over K labels (see `draw` for how M negatives are taken).

    Unigram counts are smoothed by +1 so every label keeps q(j) > 0 (otherwise labels never seen as
    positives could never be pushed down and the estimator would be biased).
    """

    def __init__(
        self,
        n_labels: int,
        kind: str = "uniform",
        alpha: float = 0.75,
        label_counts: np.ndarray | None = None,
        seed: int = 0,
        focus: np.ndarray | None = None,
        focus_share: float = 0.0,
    ) -> None:
        if n_labels < 1:
            raise ValueError("n_labels must be >= 1")
        self.n_labels = n_labels
        self.kind = kind
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed)
        self._cdf: torch.Tensor | None = None
        self._log_q: torch.Tensor | None = None
        # uniform only: `focus_share` of each draw taken from the labels of `focus` (bool [K]), the rest
        # from the others (see `draw`)
        self._focus: tuple[torch.Tensor, torch.Tensor] | None = None
        self.focus_share = focus_share
        if kind == "uniform":
            if focus is not None and focus_share > 0.0 and focus.any() and not focus.all():
                mask = np.asarray(focus, dtype=bool)
                self._focus = (torch.from_numpy(np.flatnonzero(mask)),
                               torch.from_numpy(np.flatnonzero(~mask)))
            return
        if kind != "unigram":
            raise ValueError(f"unknown sampler {kind!r}")
        counts = np.zeros(n_labels) if label_counts is None else np.asarray(label_counts, dtype=np.float64)
        if counts.shape != (n_labels,):
            raise ValueError(f"label_counts has shape {counts.shape}, expected ({n_labels},)")
        p = (counts + 1.0) ** alpha
        p /= p.sum()
        cdf = np.cumsum(p)
        cdf[-1] = 1.0
        self._cdf = torch.from_numpy(cdf)
        self._log_q = torch.from_numpy(np.log(p)).to(torch.float32)

    def log_q(self, ids: torch.Tensor) -> torch.Tensor:
        """log proposal probability of each label id (CPU tensor in, CPU tensor out)."""
        if self._log_q is None:
            return torch.full(ids.shape, -math.log(self.n_labels), dtype=torch.float32)
        return self._log_q[ids]

    def draw_raw(self, m: int) -> torch.Tensor:
        """M i.i.d. label ids from the proposal (with repeats), on the CPU."""
        if self._cdf is None:
            return torch.randint(self.n_labels, (m,), generator=self.generator)
        u = torch.rand(m, generator=self.generator, dtype=torch.float64)
        return torch.searchsorted(self._cdf, u, right=True).clamp_(max=self.n_labels - 1)

    def draw(self, m: int, device: torch.device | str = "cpu") -> SampledNegatives:
        """Negatives with importance weights that keep Σ_j w_j φ(j) unbiased for Σ_{all j} φ(j).

        M ≥ K: every label, weight 1. Uniform: M distinct labels, weight K/M each (inclusion probability
        M/K, Horvitz–Thompson). Unigram: M i.i.d. draws with repeats folded, weight count(j)/(M q(j)).

        Uniform with a focus set: `focus_share` of the M distinct labels are drawn from the focus set and
        the rest from the others, every one still weighing K/M. Not unbiased, on purpose: a focus label
        (a continual run's new labels that have rows) is pushed down on other rows more often and as
        hard as any sampled label, where uniform draws would reach it a handful of times in a short run.
        """
        k = self.n_labels
        if m >= k:
            ids = torch.arange(k)
            logw = torch.zeros(k, dtype=torch.float32)
        elif self._cdf is None:
            ids = self._distinct_uniform(m) if self._focus is None else self._focused(m)
            logw = torch.full((m,), math.log(k / m), dtype=torch.float32)
        else:
            ids, counts = torch.unique(self.draw_raw(m), return_counts=True)
            logw = torch.log(counts.to(torch.float32)) - math.log(m) - self.log_q(ids)
        return SampledNegatives(ids=ids.to(device), log_weight=logw.to(device), n_draws=min(m, k))

    def _focused(self, m: int) -> torch.Tensor:
        """M distinct labels (sorted): `focus_share` of them from the focus set, the rest from the others."""
        assert self._focus is not None
        inside, outside = self._focus
        m_in = min(inside.numel(), round(self.focus_share * m))
        m_out = min(outside.numel(), m - m_in)
        m_in = m - m_out
        ids = torch.cat([inside[self._distinct_uniform(m_in, inside.numel())],
                         outside[self._distinct_uniform(m_out, outside.numel())]])
        return torch.sort(ids).values

    def _distinct_uniform(self, m: int, k: int | None = None) -> torch.Tensor:
        """A uniformly random M-subset of the K labels (sorted; of range(k) when given), in O(M) expected
        time for M < K.

        Draws with replacement until at least M distinct labels are seen, then keeps a random M of them:
        the set's law is invariant under relabelling, so every M-subset is equally likely.
        """
        k, g = self.n_labels if k is None else k, self.generator
        if m >= k:
            return torch.arange(k)
        if 2 * m > k:  # dense case: a permutation of K costs O(M) here
            return torch.sort(torch.randperm(k, generator=g)[:m]).values
        ids = torch.unique(torch.randint(k, (m + m // 4 + 8,), generator=g))
        while ids.numel() < m:
            ids = torch.unique(torch.cat([ids, torch.randint(k, (m,), generator=g)]))
        if ids.numel() > m:
            ids = torch.sort(ids[torch.randperm(ids.numel(), generator=g)[:m]]).values
        return ids

    def get_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)
