"""The label head sharded by rows across R ranks: a rank's candidates, losses and top-k over its shard.

Rank r owns the contiguous labels [lo_r, hi_r) (K_r ≈ K/R of them) with their head rows and optimizer
state; the encoder is replicated and data-parallel. A step (the pattern of Partial FC and Megatron's
vocabulary-parallel cross-entropy) moves only batch-sized tensors, never anything of size K:

1. each rank encodes its slice of the global batch; h is all-gathered (B·d floats);
2. each rank scores the positive pairs whose label it owns; the scores are summed over ranks so every
   rank holds f_y of all P pairs (P floats);
3. each rank draws M_r = ⌈M·K_r/K⌉ negatives from its own rows and forms its groups locally;
4. each rank's loss is its own negatives' share of the objective; Σ_r loss_r is the loss of the step;
5. backward: the gradient w.r.t. the positive scores is summed over ranks (P floats), the gradient
   w.r.t. h reduce-scattered back to the rank that encoded each row (B·d floats); dense gradients are
   summed over ranks and the replicated input table's touched rows are gathered (rows touched · d).

Why the sharded estimate is unbiased. Write the OVE objective of a positive pair p = (b, y) as
Σ_{m∉P_b} φ_p(m), φ_p(m) = log(1 + e^{f_m − f_y}), and split the sum by shard: Σ_r Σ_{m ∈ shard r, m∉P_b}
φ_p(m). Rank r draws a uniformly random M_r-subset S_r of its K_r labels, independently of the others,
so every label of shard r is included with probability M_r/K_r, and weighs K_r/M_r (Horvitz–Thompson):
E[(K_r/M_r) Σ_{m∈S_r} φ_p(m)] = Σ_{m∈shard r} φ_p(m). Summing over r, the sharded estimate has the OVE
sum as its expectation, the same expectation as one rank's (stratified sampling, one stratum a shard).
With a unigram proposal each rank uses q restricted to its shard, q_r(j) ∝ q(j), and weights
count(j)/(M_r q_r(j)): again unbiased per stratum. Masking (m ∈ P_b) is exact on every rank because
each rank knows every row's labels.

Grouped bound (G > 1). Rank r cuts its random M_r-subset into groups of G: its term is
(K_r/M_r) Σ_g log(1 + Σ_{m∈g} e^{f_m − f_y}), whose expectation is (K_r/G)·Φ_r(G), Φ_r(G) the mean of
log(1 + a_g) over random G-subsets g of shard r. That is the expectation over random partitions of each
shard into groups of G; every such partition of the negatives gives an upper bound on −log p(y|x)
(Π_g (1 + a_g) ≥ 1 + Σ_g a_g), so the sharded estimate is unbiased for a bound of the same family
as one rank's, between the exact softmax and OVE; it equals one rank's expectation exactly when G = 1,
and for G > 1 differs only in that no group mixes labels of two shards (tests enumerate both).

Exact softmax (loss `softmax`): each rank takes the log-sum-exp of its shard's non-positive scores per
row; the R values are all-gathered (R·B floats) and combined, so the loss and its gradients are those of
one rank to float rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from trainer.collectives import RankGroup
from trainer.errors import ParamsError
from trainer.losses import CandidateBatch, Candidates, exhaustive_candidates, pair_weights, sampled_candidates
from trainer.negatives import NegativeSampler

# losses whose per-shard values sum to the loss over all labels (or that combine shards themselves)
SHARDABLE_LOSSES = ("ove", "softmax")


@dataclass(frozen=True)
class LabelShard:
    """Labels [lo, hi) of K, owned by one rank."""

    lo: int
    hi: int
    n_labels: int  # K, all shards together

    @property
    def size(self) -> int:
        return self.hi - self.lo

    def negatives(self, m: int) -> int:
        """This shard's share of M negatives, in proportion to its rows (all of them when M ≥ K)."""
        if m >= self.n_labels:
            return self.size
        return max(1, min(self.size, math.ceil(m * self.size / self.n_labels)))


def shard_bounds(n_labels: int, world: int, rank: int) -> LabelShard:
    """Contiguous, near-equal row ranges (the first K mod R shards one row longer)."""
    if n_labels < world:
        raise ParamsError(f"{n_labels} labels cannot be sharded across {world} ranks (need K >= ranks)")
    base, extra = divmod(n_labels, world)
    lo = rank * base + min(rank, extra)
    return LabelShard(lo, lo + base + (1 if rank < extra else 0), n_labels)


def check_shardable(loss: str, world: int) -> None:
    if world > 1 and loss not in SHARDABLE_LOSSES:
        raise ParamsError(
            f"loss {loss!r} runs on one rank only; across {world} ranks use one of {list(SHARDABLE_LOSSES)}"
        )


@dataclass
class ShardCandidates:
    """A rank's candidate columns (its own label rows, local ids) over every positive pair of the batch.

    `cand.pos_rows` lists all P pairs of the global batch; `cand.pos_cols` is the column of a pair whose
    label this shard owns and `cand.label_ids.numel()` (no column) for the others, so the losses' masking
    ("a sampled column that is a positive of the pair's row") covers every pair of that row.
    """

    cand: Candidates
    owned: torch.Tensor  # int64 [P_r]: indices into the P pairs of those this shard owns


def shard_candidates(
    y_ptr: torch.Tensor,
    y_ind: torch.Tensor,
    shard: LabelShard,
    sampler: NegativeSampler | None,
    m: int,
    group_size: int,
) -> ShardCandidates:
    """Candidates of one shard: its sampled negatives (all its rows when `sampler` is None) and the
    positives it owns; labels `y_ind` are global ids, columns local ones."""
    owned_mask = (y_ind >= shard.lo) & (y_ind < shard.hi)
    owned = torch.nonzero(owned_mask).squeeze(1)
    counts = torch.zeros(y_ptr.numel() - 1, dtype=torch.int64, device=y_ind.device)
    rows = torch.repeat_interleave(torch.arange(counts.numel(), device=y_ind.device), y_ptr[1:] - y_ptr[:-1])
    counts.index_add_(0, rows[owned], torch.ones_like(owned))
    o_ptr = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
    o_ind = y_ind[owned] - shard.lo
    if sampler is None:
        local = exhaustive_candidates(o_ptr, o_ind, shard.size)
    else:
        local = sampled_candidates(o_ptr, o_ind, sampler, shard.negatives(m), group_size)
    pos_cols = torch.full_like(y_ind, local.label_ids.numel())
    pos_cols[owned] = local.pos_cols
    local.pos_rows, local.pos_cols = rows, pos_cols
    return ShardCandidates(local, owned)


def shard_softmax_loss(batch: CandidateBatch, group: RankGroup) -> torch.Tensor:
    """This rank's share of the exact softmax NLL over all K labels (its value times R is the loss).

    The log-sum-exp of every row's non-positive scores is taken per shard and combined over ranks; the
    NLL of each pair is then the same on every rank, so each contributes 1/R of it (the gradients through
    the all-gather sum back to the full NLL's).
    """
    c, s = batch.cand, batch.scores
    if c.pos_rows.numel() == 0:
        return s.sum() * 0.0
    # a finite floor, not −inf: a shard whose columns are all positives of a row adds exp(floor) = 0 and
    # keeps a gradient of 0 instead of NaN
    lse_local = torch.logsumexp(s.masked_fill(c.pos_mask, -1e30), dim=1)
    lse = torch.logsumexp(group.gather_rows(lse_local.unsqueeze(0)), dim=0)
    sp_ = batch.positive_scores()
    nll = torch.logaddexp(sp_, lse[c.pos_rows]) - sp_
    return (nll @ pair_weights(c, s.dtype)) / group.world


@torch.no_grad()
def shard_topk(
    model: torch.nn.Module, x: sp.csr_matrix, k: int, shard: LabelShard, group: RankGroup
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k over all K labels: each rank's top-k of its shard, all-gathered and merged."""
    kk = min(k, shard.n_labels)
    ids, vals = model.topk(x, min(kk, shard.size))  # type: ignore[operator]
    if group.world == 1:
        return ids, vals
    n = x.shape[0]
    t_ids = torch.full((n, kk), -1, dtype=torch.int64)
    t_vals = torch.full((n, kk), -math.inf, dtype=torch.float32)
    t_ids[:, : ids.shape[1]] = torch.from_numpy(ids) + shard.lo
    t_vals[:, : vals.shape[1]] = torch.from_numpy(vals)
    dev = group.device
    all_ids = group.gather_rows(t_ids.T.contiguous().to(dev)).reshape(group.world * kk, n).T.cpu()
    all_vals = group.gather_rows(t_vals.T.contiguous().to(dev)).reshape(group.world * kk, n).T.cpu()
    top_vals, where = torch.topk(all_vals, kk, dim=1)
    return torch.gather(all_ids, 1, where).numpy(), top_vals.numpy()
