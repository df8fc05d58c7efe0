"""Losses whose predictions are sparse distributions: the sparsemax loss and ev-softmax NLL (with ε).

Both act on the step's candidate set (sampled negatives + the batch's positives, see
`trainer.losses.Candidates`), so a step costs the same at any K. The approximation each makes is stated
where it is made; with the exhaustive candidate set (`--sampler all` / small K) both are exact.

References: Martins & Astudillo 2016 (sparsemax loss), Chen et al. 2021 (ev-softmax and its ε form).
"""

from __future__ import annotations

import math

import torch

from trainer.losses import CandidateBatch, pair_weights
from trainer.sparse_maps import sparsemax_torch

EV_EPSILON = 1e-3  # ε of the training-time ev-softmax: mass kept by labels below the mean (Chen et al.)


def sparsemax_loss_rows(
    z: torch.Tensor, q: torch.Tensor, present: torch.Tensor | None = None
) -> torch.Tensor:
    """Sparsemax loss per row: L(z; q) = −⟨q, z⟩ + ½Σ_{j∈S}(z_j² − τ²) + ½‖q‖², gradient sparsemax(z) − q.

    Evaluated as ½‖q − z‖² − ½‖p − z‖² (the same value, p = sparsemax(z)) on scores shifted by the row
    max — the loss is shift-invariant, and this form stays accurate for large scores. With p detached the
    autograd gradient is exactly p − q (the identity that makes this loss the Fenchel-Young loss of
    sparsemax). ``q`` rows are distributions (non-negative, summing to 1) with no mass on entries that
    ``present`` (bool, optional) marks absent; absent entries take no part and get no gradient.
    """
    if present is not None:
        with torch.no_grad():
            p = sparsemax_torch(torch.where(present, z.detach(), -torch.inf))
        z = torch.where(present, z, torch.zeros_like(z))  # finite stand-in: its term is (0 − 0)·(…) = 0
    else:
        with torch.no_grad():
            p = sparsemax_torch(z.detach())
    zs = z - z.detach().max(dim=-1, keepdim=True).values
    return 0.5 * ((q - p) * (q + p - 2.0 * zs)).sum(dim=-1)


def sparsemax_loss(batch: CandidateBatch) -> torch.Tensor:
    """Sparsemax loss on the candidate set; target uniform over the row's positives (multi-label).

    Approximation: labels outside the candidate set are treated as scoring below τ, i.e. they get zero
    probability and no gradient this step. Sampled negatives are not importance-weighted: the loss is
    not a sum over negatives, so there is no unbiased reweighting; the sampler only decides which
    labels can push τ up. Mean over rows with at least one positive.
    """
    c = batch.cand
    s = batch.scores
    counts = c.pos_mask.sum(dim=1)
    rows = counts > 0
    if not bool(rows.any()):
        return s.sum() * 0.0
    q = c.pos_mask[rows].to(s.dtype) / counts[rows].unsqueeze(1).to(s.dtype)
    return sparsemax_loss_rows(s[rows], q).mean()


def sparsemax_pairs_loss(batch: CandidateBatch) -> torch.Tensor:
    """Variant: one sparsemax loss per positive pair (b, y), target one-hot on y, the row's other positives
    removed from its candidates — the multi-label convention of `ove`/`softmax` (each positive must beat
    the non-positives; positives are not forced to share mass). Same candidate-set approximation."""
    c = batch.cand
    s = batch.scores
    if c.pos_rows.numel() == 0:
        return s.sum() * 0.0
    z = s.index_select(0, c.pos_rows)  # [P, C]
    other_pos = c.pos_mask.index_select(0, c.pos_rows)
    pair = torch.arange(c.pos_rows.numel(), device=s.device)
    other_pos[pair, c.pos_cols] = False
    q = torch.zeros_like(z)
    q[pair, c.pos_cols] = 1.0
    return sparsemax_loss_rows(z, q, present=~other_pos).mean()


def evsoftmax_loss(batch: CandidateBatch, eps: float = EV_EPSILON) -> torch.Tensor:
    """NLL of ε-ev-softmax, p_k ∝ (1{v_k ≥ t} + ε)·e^{v_k}, per positive pair on the candidate set.

    t is the mean of *all* K scores of the row, estimated without bias from the candidates: the row's
    positives exactly plus the sampled non-positives with their importance weights count/(M·q). The
    normaliser uses the same weights (a sampled-softmax estimate; exact in exhaustive mode). As in the
    softmax loss, a row's other positives leave the denominator of each positive pair; pairs are
    weighted as `trainer.losses.pair_weights` says (mean over pairs, or per-row weighting).
    """
    c = batch.cand
    s = batch.scores
    n = c.n_sampled
    if c.pos_rows.numel() == 0:
        return s.sum() * 0.0
    w = torch.exp(c.neg_logw).to(s.dtype).unsqueeze(0) * (~c.pos_mask[:, :n]).to(s.dtype)  # [B, n]
    with torch.no_grad():
        pos_sum = (s * c.pos_mask.to(s.dtype)).sum(dim=1)
        t = (pos_sum + (s[:, :n] * w).sum(dim=1)) / float(c.n_labels)  # [B]
        ind = (s >= t.unsqueeze(1)).to(s.dtype)
        log_gate = torch.log(ind + eps)
    logits = s + log_gate  # [B, C]
    # negatives of each row: sampled columns not positive for it, with log importance weights
    neg_logits = logits[:, :n] + torch.log(w.clamp_min(1e-30)) + torch.where(w > 0, 0.0, -math.inf)
    lse_neg = torch.logsumexp(neg_logits, dim=1)  # [B]
    lp = logits[c.pos_rows, c.pos_cols]
    nll = torch.logaddexp(lp, lse_neg[c.pos_rows]) - lp
    return nll @ pair_weights(c, s.dtype)  # mean over pairs, or `label_weighting` (cand.pair_weight)
