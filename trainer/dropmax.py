"""DropMax (Lee et al. 2018) on the candidate set: a softmax whose non-target classes are randomly dropped
with learned, input-dependent retain probabilities.

Model. A second K-row head (the loss-owned table ``extra.dropmax``, K×(d+1), row-updated like the label
head) gives retain logits g_k(x) = ⟨θ_k, h⟩ + c_k and retain probabilities ρ_k(x) = σ(g_k(x)).
Given a mask z ∈ {0,1}^K, p(y | x, z) = (z_y + ε)e^{f_y} / Σ_k (z_k + ε)e^{f_k};
prior p(z|x) = Π Bern(ρ_k(x)).

Variational training (label-aware posterior): q(z | x, y) keeps every target (π_t = 1) and draws the
other classes from the prior (π_k = ρ_k(x)). Per row the objective is
    E_q[−log p(y | x, z)]                   one relaxed-Bernoulli (concrete) sample, temperature T
  + KL[q(z|x,y) ‖ p(z|x)] = Σ_t −log ρ_t    (only targets differ between q and p)
  + β_aux · Σ_k BCE(ρ_k, y_k)               auxiliary: ρ must predict the labels at test time (no y)
  − β_ent · Σ_{k∉y} H(Bern(ρ_k))            entropy bonus: non-target masks stay stochastic (no collapse)
Inference uses the mask's expectation: p(y | x, ρ(x)) ∝ ρ_y e^{f_y}, i.e. softmax of the effective scores
f_k + log ρ_k(x) (`effective_scores`).

Scaling: classes in play per step are the positives and the sampled negatives. Sums over non-targets
(the softmax normaliser, the auxiliary and entropy terms) use the sampler's importance weights, so they
estimate the sums over all K labels; the step cost is that of OVE.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from trainer.losses import CandidateBatch, pair_weights

HEAD = "dropmax"  # name of the loss-owned retain-logit table (saved as `extra.dropmax`)
TEMPERATURE = 0.5  # concrete relaxation temperature
MASK_EPS = 1e-6  # ε in (z_k + ε): a fully dropped class keeps a trace of mass, so log p stays finite
AUX_WEIGHT = 1.0
ENTROPY_WEIGHT = 0.01


def effective_scores(f: torch.Tensor, retain_logits: torch.Tensor) -> torch.Tensor:
    """Scores whose softmax is DropMax's predictive distribution p(y | x, ρ(x)): f_k + log σ(g_k)."""
    return f + F.logsigmoid(retain_logits)


def relaxed_bernoulli(
    logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Concrete / relaxed Bernoulli sample σ((logit π + log u − log(1 − u)) / T), differentiable in π."""
    u = torch.rand(logits.shape, generator=generator, dtype=logits.dtype, device=logits.device)
    u = u.clamp(1e-6, 1.0 - 1e-6)
    return torch.sigmoid((logits + torch.log(u) - torch.log1p(-u)) / temperature)


def bernoulli_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H(Bern(σ(g))) computed from the logit (stable for large |g|)."""
    p = torch.sigmoid(logits)
    return F.softplus(logits) - p * logits


def dropmax_loss(batch: CandidateBatch) -> torch.Tensor:
    """DropMax objective on the candidate set, mean over positive pairs (see the module docstring)."""
    c = batch.cand
    s = batch.scores
    n = c.n_sampled
    p_count = c.pos_rows.numel()
    if p_count == 0:
        return s.sum() * 0.0
    if HEAD not in batch.extra:
        raise ValueError(f"dropmax needs the loss-owned head {HEAD!r} in batch.extra")
    g = batch.h_aug() @ batch.extra[HEAD].T  # [B, C] retain logits
    pos = c.pos_mask
    # label-aware posterior: targets kept (z = 1), others ~ relaxed Bernoulli(ρ)
    z = relaxed_bernoulli(g, TEMPERATURE)
    z = torch.where(pos, torch.ones_like(z), z)
    logits = s + torch.log(z + MASK_EPS)
    w = torch.exp(c.neg_logw).to(s.dtype).unsqueeze(0) * (~pos[:, :n]).to(s.dtype)  # [B, n]
    log_w = torch.log(w.clamp_min(1e-30)) + torch.where(w > 0, 0.0, -math.inf)
    lse_neg = torch.logsumexp(logits[:, :n] + log_w, dim=1)
    lp = logits[c.pos_rows, c.pos_cols]
    # pair weights (mean over pairs, or `label_weighting`); a row's terms weigh what its pairs weigh,
    # so with the default 1/P every term is summed and divided by P
    pw = pair_weights(c, s.dtype)
    if c.pair_weight is None:
        rw = torch.full((s.shape[0],), 1.0 / p_count, dtype=s.dtype, device=s.device)
    else:
        rw = torch.zeros(s.shape[0], dtype=s.dtype, device=s.device).index_add(0, c.pos_rows, pw)
    nll = (torch.logaddexp(lp, lse_neg[c.pos_rows]) - lp) @ pw * p_count
    # KL[q || p]: only targets differ (π = 1 vs ρ): −log ρ_t
    g_pos = g[c.pos_rows, c.pos_cols]
    kl = F.softplus(-g_pos) @ pw * p_count
    # auxiliary BCE of ρ against the labels: positives exactly, negatives estimated from the samples
    aux = kl + (F.softplus(g[:, :n]) * w).sum(dim=1) @ rw * p_count
    # entropy of the non-target retain distributions (estimated the same way)
    ent = (bernoulli_entropy(g[:, :n]) * w).sum(dim=1) @ rw * p_count
    total = nll + kl + AUX_WEIGHT * aux - ENTROPY_WEIGHT * ent
    return total / p_count
