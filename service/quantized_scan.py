"""A certified int8 scan of a linear head: read 1 byte per weight, re-score exactly only what may matter.

The head is stored a second time as int8 codes with one scale per label row (ŵ_k = s_k·q_k). A query's
approximate score â_k = s_k·⟨q_k, h⟩ + b_k differs from its score s_k = ⟨w_k, h⟩ + b_k by at most

    e_k = ‖h‖·(r_k + 4γ(‖w_k‖ + r_k)) + 4γ·|b_k|,   r_k = ‖w_k − ŵ_k‖ (computed exactly at build),

where r_k‖h‖ bounds the quantization error (Cauchy–Schwarz) and γ = (d+4)u/(1 − (d+4)u), u = 2⁻²⁴,
bounds float32 rounding of this scan *and* of the exact re-scoring in any summation order (Higham,
"Accuracy and Stability of Numerical Algorithms", §3.1). So every label satisfies â_k − e_k ≤ s_k ≤
â_k + e_k. With L the k-th largest lower bound, a label whose upper bound is below L cannot be in the
top k: every other label is re-scored from the float32 weights, and the answer is exact by
construction. For sparsemax the support lies within 1 of the best score (τ ≥ z_max − 1), so
`reach=1` re-scores every label whose upper bound is within 1 of the best lower bound, which is
everything the support can hold: certified whenever the candidates fit the re-scoring cap.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]

_U = 2.0**-24


def rounding_gamma(dim: int) -> float:
    """γ for a float32 dot product of length `dim` plus the scale, bias and bound arithmetic."""
    m = (dim + 4) * _U
    return m / (1.0 - m)


def _round_up32(x: F64) -> F32:
    """float64 → float32, never below the input (a bound must stay a bound after the cast)."""
    y = x.astype(np.float32)
    low = y.astype(np.float64) < x
    return np.where(low, np.nextafter(y, np.float32(np.inf)), y).astype(np.float32)


@dataclass(frozen=True)
class Int8Head:
    """int8 codes [K, d], per-row scale [K], and per-row error terms: e_k = ‖h‖·radius_k + bias_err_k."""

    codes: I8
    scale: F32
    radius: F32
    bias_err: F32

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.scale.nbytes + self.radius.nbytes + self.bias_err.nbytes)


def quantize_head(weight: F32, bias: F32, chunk: int = 65536) -> Int8Head:
    """Per-row symmetric int8 codes (scale = max|w|/127) and the exact error terms of the bound."""
    n, d = weight.shape
    codes = np.empty((n, d), dtype=np.int8)
    scale = np.empty(n, dtype=np.float32)
    radius = np.empty(n, dtype=np.float64)
    g4 = 4.0 * rounding_gamma(d)
    for s in range(0, n, chunk):
        w = weight[s : s + chunk].astype(np.float64)
        amax = np.abs(w).max(axis=1) if d else np.zeros(w.shape[0])
        sc = (amax / 127.0).astype(np.float32)
        sc = np.where((sc > 0) & np.isfinite(sc), sc, np.float32(1.0)).astype(np.float32)  # zero rows
        q = np.clip(np.rint(w / sc[:, None].astype(np.float64)), -127, 127)
        codes[s : s + chunk] = q.astype(np.int8)
        scale[s : s + chunk] = sc
        # ŵ = q·s is exact in float64 (7-bit × 24-bit mantissas), so r is the true residual norm
        r = np.linalg.norm(w - q * sc[:, None].astype(np.float64), axis=1)
        wn = np.linalg.norm(w, axis=1)
        radius[s : s + chunk] = (r + g4 * (wn + r)) * (1.0 + 8 * _U) + 1e-30
    bias_err = np.abs(bias.astype(np.float64)) * g4 + 1e-30
    return Int8Head(codes, scale, _round_up32(radius), _round_up32(bias_err))


@functools.cache
def _kernel() -> Any:
    """Compiled at first use (numba import and compile cost a serving process nothing until then)."""
    import numba

    # re-association and FMA only: the bound covers any summation order; NaN/inf must stay visible
    fast = {"contract", "reassoc", "nsz"}

    @numba.njit(nogil=True, cache=_cache_ok(), fastmath=fast)
    def scan(
        codes: Any, scale: Any, bias: Any, radius: Any, bias_err: Any, h: Any, hnorm: Any,
        lower: Any, upper: Any,
    ) -> None:  # pragma: no cover - compiled
        n, d = h.shape
        for k in range(codes.shape[0]):
            row = codes[k]
            s, b, c, g = scale[k], bias[k], radius[k], bias_err[k]
            for i in range(n):
                hi = h[i]
                acc = np.float32(0.0)
                for j in range(d):
                    acc += np.float32(row[j]) * hi[j]
                a = acc * s + b
                e = hnorm[i] * c + g
                lower[i, k] = a - e
                upper[i, k] = a + e

    return scan


def _cache_ok() -> bool:
    from trainer.row_kernels import _cache_ok as ok

    return ok()


def _numba_available() -> bool:
    from trainer.row_kernels import available

    return available()


def score_bounds(head: Int8Head, bias: F32, h: F32) -> tuple[torch.Tensor, torch.Tensor]:
    """(lower, upper) [n, K] float32 with lower ≤ ⟨w_k, h⟩ + b_k ≤ upper for every label (NaN → ±inf)."""
    n = h.shape[0]
    k = head.codes.shape[0]
    hnorm = _round_up32(np.linalg.norm(h.astype(np.float64), axis=1) * (1.0 + 8 * _U))
    lower = np.empty((n, k), dtype=np.float32)
    upper = np.empty((n, k), dtype=np.float32)
    if _numba_available():
        _kernel()(head.codes, head.scale, bias, head.radius, head.bias_err, h, hnorm, lower, upper)
    else:  # blocked torch: dequantize a slice, one GEMM, the same bound
        ht = torch.from_numpy(h)
        for s in range(0, k, 8192):
            e = min(s + 8192, k)
            w = torch.from_numpy(head.codes[s:e]).to(torch.float32)
            a = (ht @ w.T) * torch.from_numpy(head.scale[s:e]) + torch.from_numpy(bias[s:e])
            err = torch.from_numpy(hnorm)[:, None] * torch.from_numpy(head.radius[s:e]) + torch.from_numpy(
                head.bias_err[s:e]
            )
            lower[:, s:e] = (a - err).numpy()
            upper[:, s:e] = (a + err).numpy()
    lo, up = torch.from_numpy(lower), torch.from_numpy(upper)
    lo = torch.nan_to_num(lo, nan=-math.inf, posinf=math.inf, neginf=-math.inf)
    up = torch.nan_to_num(up, nan=math.inf, posinf=math.inf, neginf=-math.inf)
    return lo, up
