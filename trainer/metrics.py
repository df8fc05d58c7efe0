"""Ranking metrics for extreme classification: P@k, nDCG@k and propensity-scored P@k.

One module used by training, evaluation, benchmarks and the API, so every figure ovex reports is
computed the same way. Inputs are top-k label ids per row (best first) and the true labels as CSR.

Conventions (the usual XC-repository ones):
- every row counts in the mean, including rows with no true labels (they score 0 on every metric);
- ids < 0 in `top_ids` are padding ("no prediction") and never match;
- if `top_ids` has fewer than k columns, the missing slots are misses (P@k still divides by k);
- PSP@k is normalised by the best achievable PSP@k for that row (Jain et al. 2016 report it so),
  so it lies in [0, 1] and a ranking that puts the rarest true labels first scores 1.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = [
    "DEFAULT_KS",
    "evaluate_topk",
    "hits",
    "ndcg_at_k",
    "precision_at_k",
    "propensities",
    "psp_at_k",
    "top_from_lists",
]

DEFAULT_KS = (1, 3, 5)


def _as_csr(Y: sp.spmatrix | np.ndarray) -> sp.csr_matrix:
    Yc = sp.csr_matrix(Y)
    if not Yc.has_canonical_format:
        Yc = Yc.copy()
        Yc.sum_duplicates()
    Yc.eliminate_zeros()
    return Yc


def _as_top(top_ids: np.ndarray, n_rows: int, k: int) -> np.ndarray:
    top = np.asarray(top_ids)
    if top.ndim != 2 or top.shape[0] != n_rows:
        raise ValueError(f"top_ids must have shape (n_rows={n_rows}, k), got {top.shape}")
    if not np.issubdtype(top.dtype, np.integer):
        raise ValueError(f"top_ids must hold integer label ids, got dtype {top.dtype}")
    top = top.astype(np.int64, copy=False)
    if top.shape[1] < k:
        pad = np.full((n_rows, k - top.shape[1]), -1, dtype=np.int64)
        top = np.hstack([top, pad])
    return top[:, :k]


def top_from_lists(rows: list[list[int]], k: int) -> np.ndarray:
    """Ranked label lists of any lengths (a peer's predictions) as the [n, k] int64 ids the metrics take:
    cut to k, short lists padded with -1."""
    top = np.full((len(rows), k), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        r = list(r)[:k]
        top[i, : len(r)] = r
    return top


def hits(top_ids: np.ndarray, Y: sp.spmatrix, k: int | None = None) -> np.ndarray:
    """Boolean (n, k) matrix: is the j-th predicted label of row i a true label of row i?"""
    Yc = _as_csr(Y)
    n, n_labels = Yc.shape
    top = _as_top(top_ids, n, np.asarray(top_ids).shape[1] if k is None else k)
    if top.size and int(top.max()) >= n_labels:
        raise ValueError(f"top_ids holds label id {int(top.max())} but Y has only {n_labels} labels")
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(Yc.indptr))
    true_keys = rows * n_labels + Yc.indices.astype(np.int64)  # sorted: canonical CSR
    q = np.arange(n, dtype=np.int64)[:, None] * n_labels + top
    pos = np.searchsorted(true_keys, q)
    pos = np.minimum(pos, max(true_keys.size - 1, 0))
    found = true_keys[pos] == q if true_keys.size else np.zeros(q.shape, bool)
    return found & (top >= 0)


def _discounts(k: int) -> np.ndarray:
    return 1.0 / np.log2(np.arange(k, dtype=np.float64) + 2.0)


def precision_at_k(top_ids: np.ndarray, Y: sp.spmatrix, k: int) -> float:
    """Mean over rows of (number of true labels among the top k) / k."""
    h = hits(top_ids, Y, k)
    return float(h.sum(axis=1).mean() / k) if h.shape[0] else 0.0


def ndcg_at_k(top_ids: np.ndarray, Y: sp.spmatrix, k: int) -> float:
    """Mean over rows of DCG@k / ideal DCG@k (binary relevance, log2 discount)."""
    Yc = _as_csr(Y)
    h = hits(top_ids, Yc, k)
    if h.shape[0] == 0:
        return 0.0
    disc = _discounts(k)
    dcg = h.astype(np.float64) @ disc
    n_true = np.minimum(np.diff(Yc.indptr), k)
    ideal = np.concatenate([[0.0], np.cumsum(disc)])[n_true]
    with np.errstate(divide="ignore", invalid="ignore"):
        per_row = np.where(ideal > 0, dcg / np.where(ideal > 0, ideal, 1.0), 0.0)
    return float(per_row.mean())


def propensities(Y_train: sp.spmatrix, A: float = 0.55, B: float = 1.5) -> np.ndarray:
    """Jain et al. (2016) label propensities p_l = 1 / (1 + C (N_l + B)^-A), C = (ln N - 1)(B + 1)^A.

    N is the number of training rows and N_l the number carrying label l; rare labels get small
    propensities, so PSP rewards getting them right. (A=0.55, B=1.5 are the paper's defaults.)
    """
    Yc = _as_csr(Y_train)
    n = max(Yc.shape[0], 1)
    counts = np.bincount(Yc.indices, minlength=Yc.shape[1]).astype(np.float64)
    C = (np.log(n) - 1.0) * (B + 1.0) ** A
    return 1.0 / (1.0 + C * np.power(counts + B, -A))


def psp_at_k(top_ids: np.ndarray, Y: sp.spmatrix, prop: np.ndarray, k: int) -> float:
    """Propensity-scored P@k, normalised by the best achievable value (sum over rows, then ratio).

    As in the XC repository's evaluation code: sum_rows Σ_top-k y/p divided by
    sum_rows (the k largest 1/p among the row's true labels).
    """
    Yc = _as_csr(Y)
    n, n_labels = Yc.shape
    p = np.asarray(prop, dtype=np.float64)
    if p.shape != (n_labels,):
        raise ValueError(f"propensities must have shape ({n_labels},), got {p.shape}")
    if n == 0:
        return 0.0
    inv = 1.0 / p
    top = _as_top(top_ids, n, k)
    h = hits(top, Yc, k)
    gained = float(np.where(h, inv[np.clip(top, 0, None)], 0.0).sum())
    # best achievable: the k rarest true labels of each row
    row_of = np.repeat(np.arange(n, dtype=np.int64), np.diff(Yc.indptr))
    w = inv[Yc.indices]
    order = np.lexsort((-w, row_of))
    rank = np.arange(order.size) - Yc.indptr[row_of[order]]
    best = float(w[order][rank < k].sum())
    return gained / best if best > 0 else 0.0


def evaluate_topk(top_ids: np.ndarray, Y: sp.spmatrix, propensities: np.ndarray | None = None,
                  ks: tuple[int, ...] = DEFAULT_KS) -> dict[str, float]:
    """All standard metrics at once: `p@k`, `ndcg@k` and (with propensities) `psp@k` for k in ks."""
    Yc = _as_csr(Y)
    out: dict[str, float] = {}
    for k in ks:
        out[f"p@{k}"] = precision_at_k(top_ids, Yc, k)
    for k in ks:
        out[f"ndcg@{k}"] = ndcg_at_k(top_ids, Yc, k)
    if propensities is not None:
        for k in ks:
            out[f"psp@{k}"] = psp_at_k(top_ids, Yc, propensities, k)
    return out
