"""`ovex predict --normalization`: a loaded model's top-k with a sparse distribution and an exactness flag.

The map and its certificate are `trainer.sparse_maps.normalize_topk`, the one the service's predictor
(`service.serving.predictor`) calls too; what is here is only what differs on the command line:

- retrieval is exact (`LoadedModel.topk` of k+1 labels), so the bound on the labels left out is the
  (k+1)-th score. The service's top-k comes from the retrievers it builds and tunes from its settings
  (int8 scan, IVF, HNSW, its blocked exact scorer), and it widens a sparsemax answer until it certifies:
  those live in service, which trainer never imports;
- the probabilities are those of the k returned labels, renormalised, with `exact` saying whether they
  equal the map over all K (the documented output of `ovex predict`); the service's exact pass sums
  the (ev-)softmax mass of every label instead and answers the full distribution's;
- ev-softmax's threshold is the O(d) mean for a linear head and the mean of the exact scores for a
  DropMax model (its scores are not linear in h), and float32 scores against that float64 threshold
  are given a rounding margin (`sparse_maps.f32_score_tol`, as in the service).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from trainer.sparse_maps import (
    TopKDistribution,
    evsoftmax_threshold_linear,
    f32_score_tol,
    linear_head_means,
    normalize_topk,
)


def evsoftmax_threshold_for(model: Any, x: sp.csr_matrix) -> np.ndarray:
    """Mean of all K scores per row: O(d) for a linear head, exact scoring for DropMax models."""
    if "dropmax" in model.model.extra:
        return np.asarray(model.scores(x), dtype=np.float64).mean(axis=1)
    w_mean, b_mean = linear_head_means(model.head_weight, model.head_bias)
    return evsoftmax_threshold_linear(model.encode(x), w_mean, b_mean)


def predict_topk(
    model: Any, x: sp.csr_matrix, k: int, normalization: str
) -> tuple[np.ndarray, np.ndarray, TopKDistribution]:
    """(ids [n,k'], scores [n,k'], distribution) with k' = min(k, K), best first; an unknown
    `normalization` is normalize_topk's ValueError."""
    n_labels = int(model.n_labels)
    kk = min(k, n_labels)
    fetch = min(kk + 1, n_labels)
    ids, scores = model.topk(x, fetch)
    if fetch > kk:
        bound = np.asarray(scores[:, kk], dtype=np.float64)
        ids, scores = ids[:, :kk], scores[:, :kk]
    else:
        bound = np.full(x.shape[0], -np.inf)
    threshold = None
    tol: float | np.ndarray = 0.0
    if normalization == "evsoftmax":
        threshold = evsoftmax_threshold_for(model, x)
        tol = f32_score_tol(scores, threshold)
    dist = normalize_topk(normalization, scores, bound, n_labels, threshold=threshold, score_tol=tol)
    return ids, scores, dist
