"""Sparse output maps: sparsemax, ev-softmax and softmax, in full and top-k forms.

The numpy functions serve predictions (the service gets only the top-k scores of a query and must say
whether the distribution it returns is the one the full score vector would give); the torch functions
train (batched, differentiable, with sparsemax's own Jacobian). Conventions shared by all of them:

* maps act on the last axis and are batched over the leading ones;
* ``-inf`` marks an *absent* entry (padding, a label not retrieved): it gets probability 0 and takes no
  part in thresholds or means; a row that is entirely absent gets all zeros (there is no distribution);
* NaN is an error (``ValueError``), never silently a probability;
* numpy maps compute in float64 and return float64 probabilities.

References: Martins & Astudillo 2016 (sparsemax), Chen et al. 2021 (ev-softmax).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

F64 = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

_EPS64 = float(np.finfo(np.float64).eps)


# --------------------------------------------------------------------------------------------------
# numpy helpers


def _as_scores(z: npt.ArrayLike, name: str = "scores") -> F64:
    a = np.asarray(z, dtype=np.float64)
    if a.ndim == 0:
        raise ValueError(f"{name}: expected at least one dimension, got a scalar")
    if np.isnan(a).any():
        raise ValueError(f"{name}: contains NaN")
    return a


def _as_bound(bound: npt.ArrayLike | None, shape: tuple[int, ...], name: str = "bound") -> F64:
    """Broadcast a per-row bound; ``None`` means "no bound known" (+inf). NaN also counts as unknown."""
    if bound is None:
        return np.full(shape, np.inf)
    b = np.asarray(bound, dtype=np.float64)
    try:
        b = np.broadcast_to(b, shape).copy()
    except ValueError as exc:
        raise ValueError(f"{name}: shape {b.shape} does not match rows {shape}") from exc
    b[np.isnan(b)] = np.inf
    return b


def _sparsemax_tau(z: F64) -> tuple[F64, F64, F64]:
    """Threshold τ and support size per row, from the sorted prefix (Martins & Astudillo 2016, alg. 1).

    Works on scores shifted by the row max m so ±huge finite values keep their differences; returns
    (τ − m, support_size, m) — kept apart because m + (τ − m) rounds away small differences of huge
    scores. ``+inf`` entries are handled by the caller; rows with no finite entry get τ − m = +inf,
    support 0 and m = 0.
    """
    m = np.max(z, axis=-1, keepdims=True)
    empty = ~np.isfinite(m)  # all -inf
    m_safe = np.where(empty, 0.0, m)
    with np.errstate(invalid="ignore", over="ignore"):
        zs = -np.sort(-(z - m_safe), axis=-1)  # descending, first entry 0 for non-empty rows
        csum = np.cumsum(zs, axis=-1)
        ks = np.arange(1, z.shape[-1] + 1, dtype=np.float64)
        # -inf entries give 1 + k·(-inf) = -inf > cumsum(-inf) = -inf: False, so they never enter.
        support = (1.0 + ks * zs) > csum
    k_z = support.sum(axis=-1, keepdims=True).astype(np.float64)
    idx = np.maximum(k_z.astype(np.int64) - 1, 0)
    c = np.take_along_axis(csum, idx, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        tau_shift = (c - 1.0) / np.maximum(k_z, 1.0)
    tau_shift = np.where(empty, np.inf, tau_shift)
    return tau_shift[..., 0], k_z[..., 0], m_safe[..., 0]


def sparsemax(z: npt.ArrayLike) -> F64:
    """Sparsemax over the last axis: the Euclidean projection of the scores onto the simplex.

    Ties are split evenly; ``+inf`` entries (if any) share the whole mass equally, which is the limit
    of the projection as those scores grow.
    """
    a = _as_scores(z)
    if a.shape[-1] == 0:
        return np.zeros_like(a)
    pos_inf = np.isposinf(a)
    has_inf = pos_inf.any(axis=-1, keepdims=True)
    finite_part = np.where(has_inf, np.where(pos_inf, 0.0, -np.inf), a)
    tau_s, _, m = _sparsemax_tau(finite_part)
    with np.errstate(invalid="ignore"):
        p = np.maximum((finite_part - m[..., None]) - tau_s[..., None], 0.0)
    p = np.where(np.isfinite(p), p, 0.0)
    return p


def sparsemax_topk(top_scores: npt.ArrayLike, bound: npt.ArrayLike | None) -> tuple[F64, Bools]:
    """Sparsemax of the k best scores of each row, and whether it equals sparsemax over all labels.

    ``top_scores[n, k]`` are the retrieved scores (best first is customary but not needed; ``-inf``
    = absent). ``bound[n]`` is an upper bound on every score *not* returned: the (k+1)-th score when
    retrieval was exact, a per-cell bound for IVF, ``-inf`` when nothing was left out, and ``None`` /
    ``+inf`` when nothing is known (HNSW) — such rows are never flagged exact.

    Exactness: with τ the threshold of the top-k, every label left out has score ≤ bound; if
    bound ≤ τ, each of them gets max(z − τ, 0) = 0 and τ also solves the full problem. Because τ carries
    rounding error, the flag asks for bound ≤ τ − tol with tol a bound on that error (so a tie exactly at
    τ reads as "not exact": conservative, never optimistic).
    """
    a = _topk_scores(top_scores)
    p, exact, _, _ = _sparsemax_topk(a, _as_bound(bound, a.shape[:1]))
    return p, exact


def _topk_scores(top_scores: npt.ArrayLike) -> F64:
    a = _as_scores(top_scores, "top_scores")
    if a.ndim != 2:
        raise ValueError(f"top_scores: expected shape [n, k], got {a.shape}")
    return a


def _sparsemax_topk(a: F64, b: F64) -> tuple[F64, Bools, F64, F64]:
    """Probabilities, exact flags, τ and τ's rounding tolerance. Without +inf scores the probabilities
    and τ come from one threshold computation (this runs once per answered request)."""
    if a.shape[1] == 0 or np.isposinf(a).any():
        p = sparsemax(a)
        tau, nonempty = _topk_tau(a)
    else:
        tau_s, k_z, m = _sparsemax_tau(a)
        with np.errstate(invalid="ignore"):
            p = np.maximum((a - m[:, None]) - tau_s[:, None], 0.0)
        p = np.where(np.isfinite(p), p, 0.0)
        tau, nonempty = tau_s + m, k_z > 0
    tol = _tau_tolerance(a, b)
    with np.errstate(invalid="ignore"):
        exact = nonempty & (np.isneginf(b) | (np.isfinite(b) & (b <= tau - tol)))
    # A row whose mass sits on +inf scores (tau = +inf) is exact unless a left-out score may be +inf too.
    exact |= nonempty & np.isposinf(tau) & ~np.isposinf(b)
    return p, exact, tau, tol


def _topk_tau(a: F64) -> tuple[F64, Bools]:
    """τ per row (+inf for rows holding +inf scores) and whether the row has any present entry."""
    if a.shape[1] == 0:
        return np.full(a.shape[0], np.inf), np.zeros(a.shape[0], dtype=bool)
    pos_inf = np.isposinf(a).any(axis=1)
    tau_s, k_z, m = _sparsemax_tau(np.where(np.isposinf(a), -np.inf, a))
    tau = tau_s + m
    nonempty = pos_inf | (k_z > 0)
    return np.where(pos_inf, np.inf, tau), nonempty


def _tau_tolerance(a: F64, b: F64) -> F64:
    """Upper bound on the rounding error of τ (cumulative sum of k shifted scores, then a division)."""
    fin = np.where(np.isfinite(a), np.abs(a), 0.0)
    scale = np.maximum(fin.max(axis=1), np.where(np.isfinite(b), np.abs(b), 0.0))
    k = a.shape[1]
    return 4.0 * (k + 2) * _EPS64 * (1.0 + scale)


@dataclass(frozen=True)
class TopKDistribution:
    """A distribution over the k returned labels of each row, with what it certifies about the rest.

    ``probs[n, k]`` sums to 1 per row (zeros included, aligned with the scores given); ``exact[n]`` says
    it equals the map applied to all K scores; ``rest_mass_bound[n]`` is an upper bound on the mass the
    full distribution puts on labels *not* returned (0 when exact; 1 when nothing is known).
    """

    probs: F64
    exact: Bools
    rest_mass_bound: F64


def sparsemax_topk_report(
    top_scores: npt.ArrayLike, bound: npt.ArrayLike | None, n_labels: int | None = None
) -> TopKDistribution:
    """``sparsemax_topk`` plus a bound on the mass the full sparsemax gives to labels not returned.

    Adding labels can only raise τ, so each left-out label gets at most (bound − τ_topk)+; with R of them
    (R = n_labels − k, or unknown → the bound is 1) the rest carries at most min(1, R·(bound − τ_topk)+).
    """
    a = _topk_scores(top_scores)
    b = _as_bound(bound, a.shape[:1])
    p, exact, tau, tol = _sparsemax_topk(a, b)
    rest = np.ones(a.shape[0])
    if n_labels is not None:
        r = max(int(n_labels) - a.shape[1], 0)
        with np.errstate(invalid="ignore", over="ignore"):
            gap = np.maximum(b - tau + tol, 0.0)
            cand = np.minimum(1.0, r * gap)
        cand = np.where(np.isfinite(cand), cand, 1.0)
        rest = np.where(r == 0, 0.0, cand)
        rest = np.where(np.isneginf(b), 0.0, rest)
    rest = np.where(exact, 0.0, rest)
    return TopKDistribution(probs=p, exact=exact, rest_mass_bound=rest)


# --------------------------------------------------------------------------------------------------
# ev-softmax (numpy)


def evsoftmax_threshold(z: npt.ArrayLike) -> F64:
    """The ev-softmax threshold from all scores: their mean over present (finite) entries, capped at
    the row max so rounding can never leave the support empty."""
    a = _as_scores(z)
    present = np.isfinite(a)
    n = present.sum(axis=-1)
    s = np.where(present, a, 0.0).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = s / n
    mx = np.where(present, a, -np.inf).max(axis=-1)
    return np.where(n > 0, np.minimum(mean, mx), np.inf)


def evsoftmax(z: npt.ArrayLike, threshold: npt.ArrayLike | None = None) -> F64:
    """ev-softmax (Chen et al. 2021): p_k ∝ 1{z_k ≥ t}·exp(z_k), t = mean of the scores by default.

    ``threshold`` overrides t (e.g. the O(d) linear-head mean when ``z`` holds only some labels).
    """
    a = _as_scores(z)
    t = evsoftmax_threshold(a) if threshold is None else np.asarray(threshold, dtype=np.float64)
    t = np.broadcast_to(t, a.shape[:-1])
    keep = np.isfinite(a) & (a >= t[..., None])
    m = np.where(keep, a, -np.inf).max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(keep, np.exp(np.where(keep, a - m, 0.0)), 0.0)
    s = e.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(s > 0, e / s, 0.0)
    return p


def linear_head_means(weight: npt.ArrayLike, bias: npt.ArrayLike) -> tuple[F64, float]:
    """mean_k w_k and mean_k b_k of a linear head, precomputed once per model: accumulated in float64
    for accuracy, without a float64 copy of the head (a memory-mapped [K, d] table stays mapped)."""
    w, b = np.asarray(weight), np.asarray(bias)
    if w.ndim != 2 or b.shape != (w.shape[0],):
        raise ValueError(f"head shapes: weight {w.shape}, bias {b.shape}; expected [K, d] and [K]")
    return w.mean(axis=0, dtype=np.float64), float(b.mean(dtype=np.float64))


def evsoftmax_threshold_linear(h: npt.ArrayLike, w_mean: npt.ArrayLike, b_mean: float) -> F64:
    """Mean of all K scores ⟨w_k, h⟩ + b_k in O(d): ⟨mean_k w_k, h⟩ + mean_k b_k (linearity of the mean)."""
    hh = np.asarray(h, dtype=np.float64)
    return hh @ np.asarray(w_mean, dtype=np.float64) + float(b_mean)


F32_SCORE_RTOL = 1e-5  # float32 scores vs a float64 threshold: margin relative to the score scale


def f32_score_tol(scores: npt.ArrayLike, threshold: npt.ArrayLike) -> F64:
    """The rounding margin per row between float32 scores and a threshold computed apart in float64 (the
    O(d) mean): a score this close to the threshold cannot be told above it from below."""
    a = np.asarray(scores, dtype=np.float64)
    scale = np.where(np.isfinite(a), np.abs(a), 0.0).max(axis=1, initial=0.0)
    t = np.asarray(threshold, dtype=np.float64)
    out: F64 = F32_SCORE_RTOL * (1.0 + np.maximum(scale, np.where(np.isfinite(t), np.abs(t), 0.0)))
    return out


def _rest_mass_bound(m: F64, log_s: F64, bound: F64, r: int) -> F64:
    """Upper bound on Z_rest / (Z_ret + Z_rest) given Z_rest ≤ r·exp(bound) (the ratio grows with Z_rest).

    Z_ret = exp(m)·exp(log_s) with m the largest kept score: the difference m − bound is taken first
    so huge scores do not round the logs away.
    """
    if r == 0:
        return np.zeros_like(m)
    with np.errstate(invalid="ignore", over="ignore"):
        log_ratio = (m - bound) + log_s - np.log(float(r))  # log(Z_ret / (r·e^bound))
        out = 1.0 / (1.0 + np.exp(log_ratio))
    out = np.where(np.isneginf(bound), 0.0, out)
    out = np.where(np.isposinf(bound) | ~np.isfinite(m), 1.0, out)
    return np.where(np.isfinite(out), out, 1.0)


def evsoftmax_topk(
    top_scores: npt.ArrayLike,
    threshold: npt.ArrayLike,
    bound: npt.ArrayLike | None,
    n_labels: int,
    score_tol: float | npt.ArrayLike = 0.0,
) -> TopKDistribution:
    """ev-softmax of the returned labels, given the threshold over *all* K labels (O(d) for a linear head).

    ``score_tol`` widens the rounding margin when the threshold and the scores come from different
    computations (e.g. float32 scores, float64 O(d) threshold): scores within it of t read as ambiguous.

    Exact when every label left out is below the threshold (bound < t, with a rounding margin) and no
    returned score sits within rounding of t. Otherwise ``rest_mass_bound`` bounds the mass of the
    labels left out: at most R = K − k of them, each with weight ≤ exp(bound). If no returned score
    reaches t (retrieval missed the true maximum), the best returned label gets all the mass and the
    row is flagged inexact with rest bound 1.
    """
    a = _as_scores(top_scores, "top_scores")
    if a.ndim != 2:
        raise ValueError(f"top_scores: expected shape [n, k], got {a.shape}")
    n, k = a.shape
    t = np.broadcast_to(np.asarray(threshold, dtype=np.float64), (n,)).copy()
    if np.isnan(t).any():
        raise ValueError("threshold: contains NaN")
    b = _as_bound(bound, (n,))
    fin = np.where(np.isfinite(a), np.abs(a), 0.0)
    scale = np.maximum(fin.max(axis=1) if k else 0.0, np.where(np.isfinite(t), np.abs(t), 0.0))
    tol = 16.0 * _EPS64 * (1.0 + scale) * max(k, 1) + np.broadcast_to(np.asarray(score_tol, np.float64), (n,))
    present = np.isfinite(a)
    any_reach = (present & (a >= t[:, None])).any(axis=1) if k else np.zeros(n, dtype=bool)
    top = np.where(present, a, -np.inf).max(axis=1) if k else np.full(n, -np.inf)
    t_eff = np.where(any_reach, t, top)
    p = evsoftmax(a, t_eff)
    keep = present & (a >= t_eff[:, None])
    m = np.where(keep, a, -np.inf).max(axis=1) if k else np.full(n, -np.inf)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        log_s = np.log(np.where(keep, np.exp(np.where(keep, a - m[:, None], 0.0)), 0.0).sum(axis=1))
    r = max(int(n_labels) - k, 0)
    rest = _rest_mass_bound(m, log_s, b, r)
    near = (present & (np.abs(a - t[:, None]) <= tol[:, None])).any(axis=1) if k else np.zeros(n, dtype=bool)
    with np.errstate(invalid="ignore"):
        left_out_below = np.isneginf(b) | (r == 0) | (np.isfinite(b) & (b < t - tol))
    exact = any_reach & left_out_below & ~near
    rest = np.where(exact, 0.0, np.where(any_reach, rest, 1.0))
    return TopKDistribution(probs=p, exact=exact, rest_mass_bound=rest)


# --------------------------------------------------------------------------------------------------
# softmax (numpy)


def softmax(z: npt.ArrayLike) -> F64:
    """Plain softmax over the last axis (``-inf`` = absent), the dense reference."""
    a = _as_scores(z)
    m = np.max(a, axis=-1, keepdims=True) if a.shape[-1] else np.zeros((*a.shape[:-1], 1))
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(a - m)
    e = np.where(np.isfinite(a), e, 0.0)
    s = e.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(s > 0, e / s, 0.0)


def softmax_topk(top_scores: npt.ArrayLike, bound: npt.ArrayLike | None, n_labels: int) -> TopKDistribution:
    """Softmax renormalised over the returned labels. Softmax gives every label mass, so the answer is
    exact only when nothing was left out (k = K or bound = −inf); otherwise the mass of the R = K − k
    labels left out is at most R·e^bound / (Z_returned + R·e^bound)."""
    a = _as_scores(top_scores, "top_scores")
    if a.ndim != 2:
        raise ValueError(f"top_scores: expected shape [n, k], got {a.shape}")
    n, k = a.shape
    b = _as_bound(bound, (n,))
    p = softmax(a)
    present = np.isfinite(a)
    m = np.where(present, a, -np.inf).max(axis=1) if k else np.full(n, -np.inf)
    m0 = np.where(np.isfinite(m), m, 0.0)
    e = np.where(present, np.exp(np.where(present, a - m0[:, None], 0.0)), 0.0)
    with np.errstate(divide="ignore"):
        log_s = np.log(e.sum(axis=1))
    r = max(int(n_labels) - k, 0)
    rest = _rest_mass_bound(m, log_s, b, r)
    exact = ((r == 0) | np.isneginf(b)) & np.isfinite(m)
    return TopKDistribution(probs=p, exact=np.asarray(exact, dtype=bool), rest_mass_bound=rest)


NORMALIZATIONS = ("sparsemax", "evsoftmax", "softmax")


def normalize_topk(
    name: str,
    top_scores: npt.ArrayLike,
    bound: npt.ArrayLike | None,
    n_labels: int,
    threshold: npt.ArrayLike | None = None,
    score_tol: float | npt.ArrayLike = 0.0,
) -> TopKDistribution:
    """One entry point for serving and ``ovex predict``: the named map over retrieved top-k scores.

    ``threshold`` (ev-softmax only) is the mean of all K scores, e.g. from
    ``evsoftmax_threshold_linear``; it is required for ``evsoftmax``, as is ``score_tol`` when it
    was computed apart from the scores (see `evsoftmax_topk`).
    """
    if name == "sparsemax":
        return sparsemax_topk_report(top_scores, bound, n_labels)
    if name == "softmax":
        return softmax_topk(top_scores, bound, n_labels)
    if name == "evsoftmax":
        if threshold is None:
            raise ValueError("evsoftmax needs the threshold (mean of all K scores)")
        return evsoftmax_topk(top_scores, threshold, bound, n_labels, score_tol)
    raise ValueError(f"normalization: unknown {name!r}; expected one of {', '.join(NORMALIZATIONS)}")


# --------------------------------------------------------------------------------------------------
# torch (training)


def _torch_tau_shifted(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(τ − m, m) per row, m the row max, for scores on the last axis (−inf = absent).

    Kept apart because m + (τ − m) rounds away the differences between huge scores."""
    m = z.max(dim=-1, keepdim=True).values
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    zs = torch.sort(z - m, dim=-1, descending=True).values
    csum = zs.cumsum(dim=-1)
    ks = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype, device=z.device)
    support = (1.0 + ks * zs) > csum
    k_z = support.sum(dim=-1, keepdim=True).clamp(min=1)
    c = csum.gather(-1, k_z - 1)
    return (c - 1.0) / k_z.to(z.dtype), m


class SparsemaxFunction(torch.autograd.Function):
    """Sparsemax over the last axis with its closed-form Jacobian J = diag(s) − s sᵀ/|S| (s = support).

    J is symmetric, so the same product serves backward (vjp) and forward-mode (jvp):
    J v = s ⊙ (v − mean_{S} v).
    """

    @staticmethod
    def forward(z: torch.Tensor) -> torch.Tensor:
        if z.shape[-1] == 0:
            return z.clone()
        tau_s, m = _torch_tau_shifted(z)
        return torch.clamp((z - m) - tau_s, min=0.0).nan_to_num(0.0)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    def _jac_prod(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = (p > 0).to(v.dtype)
        n = s.sum(dim=-1, keepdim=True).clamp(min=1.0)
        v_s = torch.where(s > 0, v, torch.zeros_like(v))
        mean = v_s.sum(dim=-1, keepdim=True) / n
        return s * (v_s - mean)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        (p,) = ctx.saved_tensors
        return SparsemaxFunction._jac_prod(p, grad_out)

    @staticmethod
    def jvp(ctx: Any, z_t: torch.Tensor) -> torch.Tensor:
        (p,) = ctx.saved_tensors
        return SparsemaxFunction._jac_prod(p, z_t)


def sparsemax_torch(z: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Differentiable sparsemax along ``dim`` (−inf entries = absent, probability 0, zero gradient)."""
    if dim in (-1, z.dim() - 1):
        out: torch.Tensor = SparsemaxFunction.apply(z)
        return out
    moved: torch.Tensor = SparsemaxFunction.apply(z.movedim(dim, -1))
    return moved.movedim(-1, dim)


def evsoftmax_torch(v: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """ev-softmax over the last axis; with ``eps`` > 0 the training-time form of Chen et al. 2021,
    p_k ∝ (1{v_k ≥ mean(v)} + ε)·exp(v_k), which gives every entry mass so NLL stays finite.

    ``mask`` (bool, same shape) marks present entries; the mean is over present entries only.
    """
    return torch.exp(evsoftmax_log_torch(v, mask, eps))


def evsoftmax_log_torch(v: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """log of ε-ev-softmax (absent entries: −inf). The indicator is piecewise constant, so gradients
    flow through exp(v) only, as in the paper."""
    present = torch.isfinite(v) if mask is None else mask & torch.isfinite(v)
    vz = torch.where(present, v, torch.zeros_like(v))
    n = present.sum(dim=-1, keepdim=True).clamp(min=1).to(v.dtype)
    with torch.no_grad():
        mean = vz.sum(dim=-1, keepdim=True) / n
        mx = torch.where(present, v, torch.full_like(v, -torch.inf)).max(dim=-1, keepdim=True).values
        t = torch.minimum(mean, mx)
        ind = (present & (v >= t)).to(v.dtype)
        log_w = torch.log(ind + eps)
        shift = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    # shift by the row max first: logsumexp of huge scores would round log 2 etc. away
    logits = torch.where(present, (vz - shift) + log_w, torch.full_like(v, -torch.inf))
    return logits - torch.logsumexp(logits, dim=-1, keepdim=True)
