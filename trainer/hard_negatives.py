"""Hard negatives: each positive's nearest labels by head row, scored exactly beside the sampled ones.

Why: the uniform draw reaches a label that a positive is confused with in one step of K/M, and then
weighs it K/M; the labels that matter most for P@1 (a frequent label's close neighbours) are the ones
whose gradient is noisiest. Taking them every step, with weight 1, keeps their pull and removes that
noise.

Mining is on the label side: every `hard_every` epochs the head's rows (without the bias) are
L2-normalised and each label that has training rows gets its `hard_negatives` nearest other labels by
cosine (faiss: an exact flat index up to `EXACT_UP_TO` labels, an IVF index beyond, so a refresh costs
about K·(K/nlist)·nprobe·d, not K²·d, at 10^6 labels). A step only looks its positives' rows up in that
table: its cost does not depend on K.

Why the objective stays a bound. For a positive pair (b, y) let N_b be the labels that are not positive
for row b and H = table[y] ∖ P_b its hard set (fixed before the step's draw). The sampled columns that
fall in H are masked for that pair, as its row's positives are, and H is scored exactly in groups of G
of its own, weight 1. With G = 1 the estimate is (K/M)·Σ_{j∈S∖(H∪P_b)} φ(j) + Σ_{h∈H} φ(h): a label
of H is counted once with probability 1, any other non-positive with inclusion probability M/K and
weight K/M, so its expectation is the one-vs-each sum over N_b (stratified Horvitz–Thompson; a unigram
draw's count/(M·q) weights give the same). With G > 1 the sampled part's expectation is that of a
random partition of N_b ∖ H into groups (see `trainer.losses.ove_loss`); with H's groups added it is a
partition of N_b, and Π_g (1 + a_g) ≥ 1 + Σ_g a_g makes every such partition's Σ_g log(1 + a_g) an
upper bound on −log p(y|x). `tests/test_hard_negatives.py` checks both by enumeration.

When the sampled negatives already hold every label (M ≥ K) there is nothing left to mine for: the
step is the exact bound it was, and hard negatives change nothing.
"""

from __future__ import annotations

import math

import faiss
import numpy as np
import torch

from trainer.losses import Candidates, masked_negative_pairs

EXACT_UP_TO = 32_768  # labels: an exact flat search below, IVF above (K² · d would not stay affordable)


def mine_neighbours(weight: np.ndarray, queries: np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """int64 [K, k]: for each label in `queries`, its k nearest other labels by cosine of `weight` rows
    (K × d); −1 pads rows of labels not queried, and a row with fewer than k others."""
    n, d = weight.shape
    table = np.full((n, k), -1, dtype=np.int64)
    if n < 2 or queries.size == 0 or k == 0:
        return table
    w = np.ascontiguousarray(weight, dtype=np.float32)
    w = w / np.maximum(np.linalg.norm(w, axis=1, keepdims=True), 1e-12)
    kk = min(k + 1, n)
    if n <= EXACT_UP_TO:
        index: faiss.Index = faiss.IndexFlatIP(d)
    else:
        nlist = int(2 * math.sqrt(n))
        quantizer = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.max_points_per_centroid = 64  # a sample of the labels trains the cells: 64·nlist rows
        index.cp.niter = 8
        index.cp.seed = seed
        index.train(w)
        index.nprobe = 6
    index.add(w)
    _, found = index.search(w[queries], kk)
    found = found.astype(np.int64)
    other = (found != queries[:, None]) & (found >= 0)
    order = np.argsort(~other, axis=1, kind="stable")[:, :k]  # the first k others, in found order
    picked = np.take_along_axis(found, order, 1)
    picked[~np.take_along_axis(other, order, 1)] = -1
    table[queries, : picked.shape[1]] = picked
    return table


class HardNegatives:
    """The mined table and how a step's candidates take it (`extend`); refreshed by the training loop."""

    def __init__(self, n_labels: int, k: int, every: int, seed: int = 0, negatives: int = 0) -> None:
        self.n_labels, self.k, self.every, self.seed = n_labels, k, every, seed
        self.idle = negatives >= n_labels  # every label is sampled every step: nothing to mine for
        self.table: torch.Tensor | None = None  # int64 [K, k], −1 = none

    def due(self, epoch: int, first: int) -> bool:
        """Whether to mine at the start of 0-based `epoch`: from `first` on, every `every` epochs."""
        return not self.idle and epoch >= first and (epoch - first) % self.every == 0

    def refresh(self, head: torch.Tensor, counts: np.ndarray) -> None:
        """Mine from the head's current rows (bias column dropped), for the labels that have rows."""
        weight = head.detach()[:, :-1].float().cpu().numpy()
        queries = np.flatnonzero(np.asarray(counts) > 0).astype(np.int64)
        self.table = torch.from_numpy(mine_neighbours(weight, queries, self.k, self.seed))

    def extend(self, cand: Candidates, y_ind: torch.Tensor) -> None:
        """Give each positive pair of `cand` its hard columns (appended when not there yet) and mask,
        for that pair, the sampled columns its hard set holds. `y_ind` are the pairs' labels, in order."""
        if self.table is None or cand.exhaustive or cand.n_draws >= cand.n_labels:
            return
        hard_columns(cand, self.table.index_select(0, y_ind.cpu()), y_ind.cpu())


def hard_columns(cand: Candidates, hard: torch.Tensor, y_ind: torch.Tensor) -> None:
    """`cand` with the hard labels `hard` (int64 [P, k], −1 = none) of its positive pairs: sets
    `hard_cols`/`hard_keep`, appends the labels not yet among its columns and adds the (pair, sampled
    column) entries of those already sampled to `cand.masked`, so no label counts twice for a pair."""
    k_labels = cand.n_labels
    pos_rows = cand.pos_rows
    # a label positive for the pair's row is never its negative
    pos_keys = torch.sort(pos_rows * k_labels + y_ind).values
    keys = pos_rows.unsqueeze(1) * k_labels + hard.clamp(min=0)
    keep = (hard >= 0) & ~torch.isin(keys, pos_keys)
    # each hard label's column: an existing one, or a new one appended
    ids = cand.label_ids
    order = torch.argsort(ids)
    sorted_ids = ids[order]
    flat = hard.clamp(min=0).reshape(-1)
    where = torch.searchsorted(sorted_ids, flat).clamp_(max=max(ids.numel() - 1, 0))
    present = sorted_ids[where] == flat if ids.numel() else torch.zeros_like(flat, dtype=torch.bool)
    col = torch.where(present, order[where], torch.zeros_like(flat))
    new = torch.unique(flat[~present & keep.reshape(-1)])
    if new.numel():
        slot = torch.searchsorted(new, flat).clamp_(max=new.numel() - 1)
        col = torch.where(~present & (new[slot] == flat), ids.numel() + slot, col)
    hard_cols = col.view_as(hard)
    # sampled columns of a hard label are the hard group's for that pair: masked in the sampled part
    sampled = present.view_as(hard) & keep & (hard_cols < cand.n_sampled)
    p_idx, i_idx = torch.nonzero(sampled, as_tuple=True)
    entries = torch.stack([p_idx, hard_cols[p_idx, i_idx]])
    masked = cand.masked if cand.masked is not None else torch.stack(masked_negative_pairs(cand))
    cand.masked = torch.cat([masked, entries], dim=1)
    cand.label_ids = torch.cat([ids, new])
    cand.in_batch_pos = torch.cat([cand.in_batch_pos, cand.in_batch_pos.new_zeros(new.numel())])
    cand.hard_cols = torch.where(keep, hard_cols, torch.zeros_like(hard_cols))
    cand.hard_keep = keep
