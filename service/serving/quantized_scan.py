"""A certified int8 scan of a linear head: read 1 byte per weight, re-score exactly only what may matter.

The head is stored a second time as int8 codes with one scale per label row (ŵ_k = σ_k·q_k). A query's
approximate score â_k = σ_k·⟨q_k, h⟩ + b_k differs from its score s_k = ⟨w_k, h⟩ + b_k by at most

    e_k = ‖h‖·(r_k + 4γ(‖w_k‖ + r_k)) + 4γ·|b_k|,   r_k = ‖w_k − ŵ_k‖ (computed exactly at build),

where r_k‖h‖ bounds the quantization error (Cauchy–Schwarz) and γ = (d+4)u/(1 − (d+4)u), u = 2⁻²⁴,
bounds float32 rounding of a dot product *and* of the exact re-scoring in any summation order (Higham,
"Accuracy and Stability of Numerical Algorithms", §3.1).

The scan multiplies integers, which is what makes it fast: the query is rounded to int16 codes too,
ĥ = t·p (t = max|h|/Q), so ⟨q_k, p⟩ is an exact int32 sum (Q keeps d·127·Q below 2³¹) and
â_k = σ_k·t·⟨q_k, p⟩ + b_k takes a handful of float32 roundings, fewer than γ allows for. The query's
rounding δ = h − ĥ adds |⟨ŵ_k, δ⟩| ≤ ‖ŵ_k‖·‖δ‖ ≤ 127√d·σ_k·‖δ‖ to e_k, about 1/Q of the row term.

So every label satisfies â_k − e_k ≤ s_k ≤ â_k + e_k. With L the k-th largest lower bound, a label
whose upper bound is below L cannot be in the top k: every other label is re-scored from the float32
weights, and the answer is exact by construction. For sparsemax the support lies within 1 of the best
score (τ ≥ z_max − 1), so `reach=1` re-scores every label whose upper bound is within 1 of the best
lower bound, which is everything the support can hold: certified whenever the candidates fit the
re-scoring cap.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]

_U = 2.0**-24


Check = Callable[[], None]  # called between the chunks of a build; raises to abandon it (a cancelled job)


def no_check() -> None:
    return None


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
    """int8 codes [K, d], per-row scale [K], bias [K] and error terms (e = ‖h‖·radius + bias_err), all in
    *position* order: labels grouped by cell, `Cells.order[p]` being the label at position p."""

    codes: I8
    scale: F32
    bias: F32
    radius: F32
    bias_err: F32

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in (self.codes, self.scale, self.bias, self.radius, self.bias_err)))


@dataclass(frozen=True)
class Cells:
    """k-means cells of the rows [w_k, b_k]: cell c holds positions offsets[c]:offsets[c+1] and every
    row in it lies within `radius[c]` of `centroids[c]`, so ⟨[h, 1], μ_c⟩ + ‖[h, 1]‖·r_c bounds the
    score of each of its labels and a query skips the cells whose bound is below its threshold."""

    order: I64
    offsets: I64
    centroids: F32
    radius: F32

    @property
    def nlist(self) -> int:
        return int(self.centroids.shape[0])

    @functools.cached_property
    def _mu(self) -> tuple[F64, F64, F64]:
        """Centroids, their norms and radii in float64, computed once (the cache is memory-mapped)."""
        mu = np.ascontiguousarray(self.centroids, dtype=np.float64)
        return mu, np.linalg.norm(mu, axis=1), self.radius.astype(np.float64)

    def bounds(self, h: F32) -> F64:
        """[n, nlist] upper bound on every score in each cell (float64, with a rounding margin)."""
        mu, mu_norm, r = self._mu
        q = np.hstack([h.astype(np.float64), np.ones((h.shape[0], 1))])
        qn = np.linalg.norm(q, axis=1)[:, None]
        with np.errstate(invalid="ignore"):
            u = q @ mu.T + qn * r
            u = u + 1e-9 * (1.0 + np.abs(u) + qn * (mu_norm[None, :] + np.abs(r)))
        return np.where(np.isneginf(r), -np.inf, np.nan_to_num(u, nan=np.inf))


def quantize_head(
    weight: F32, bias: F32, order: I64 | None = None, chunk: int = 65536, check: Check = no_check
) -> Int8Head:
    """Per-row symmetric int8 codes (scale = max|w|/127) and the exact error terms of the bound, for
    the rows `weight[order]` (all rows in order when None)."""
    n, d = weight.shape
    codes = np.empty((n, d), dtype=np.int8)
    scale = np.empty(n, dtype=np.float32)
    radius = np.empty(n, dtype=np.float64)
    g4 = 4.0 * rounding_gamma(d)
    for s in range(0, n, chunk):
        check()
        rows = np.arange(s, min(s + chunk, n)) if order is None else order[s : s + chunk]
        w = weight[rows].astype(np.float64)
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
    b = np.ascontiguousarray(bias if order is None else bias[order], dtype=np.float32)
    bias_err = np.abs(b.astype(np.float64)) * g4 + 1e-30
    return Int8Head(codes, scale, b, _round_up32(radius), _round_up32(bias_err))


def build_cells(
    weight: F32, bias: F32, nlist: int, seed: int = 0, chunk: int = 65536, check: Check = no_check
) -> Cells:
    """k-means (L2) on [w, b]; labels ordered by cell; each cell's radius computed over all its rows."""
    import faiss

    n, d = weight.shape
    nlist = max(1, min(nlist, n))

    def rows(s: int, e: int) -> F32:
        return np.ascontiguousarray(np.hstack([weight[s:e], bias[s:e, None]]), dtype=np.float32)

    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(n, size=min(n, max(40 * nlist, 10_000)), replace=False))
    x = np.ascontiguousarray(np.hstack([weight[sample], bias[sample, None]]), dtype=np.float32)
    if nlist > 1:
        km = faiss.Kmeans(d + 1, nlist, niter=10, seed=seed, max_points_per_centroid=64, verbose=False)
        km.train(x)
        centroids = np.asarray(km.centroids, dtype=np.float32)
    else:
        centroids = x.astype(np.float64).mean(axis=0, keepdims=True).astype(np.float32)
    quant = faiss.IndexFlatL2(d + 1)
    quant.add(centroids)
    assign = np.empty(n, dtype=np.int64)
    radius = np.full(nlist, -np.inf)
    for s in range(0, n, chunk):
        check()
        e = min(s + chunk, n)
        xs = rows(s, e)
        _, a = quant.search(xs, 1)
        a = a[:, 0].astype(np.int64)
        assign[s:e] = a
        dist = np.linalg.norm(xs.astype(np.float64) - centroids[a].astype(np.float64), axis=1)
        np.maximum.at(radius, a, dist)
    order = np.argsort(assign, kind="stable").astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(assign, minlength=nlist))]).astype(np.int64)
    r = np.where(np.isfinite(radius), radius * (1 + 1e-9) + 1e-30, -np.inf)
    return Cells(order, offsets, centroids, _round_up32(r))


def append_rows(
    head: Int8Head, cells: Cells, weight: F32, bias: F32, check: Check = no_check
) -> tuple[Int8Head, Cells]:
    """The int8 head and cells of the labels of (`head`, `cells`) followed by the new rows `weight`,
    `bias` (ids K, K+1, ...), without k-means: each new row joins its nearest centroid's cell, whose
    radius widens to cover it, and gets its own codes and exact error terms, so every bound of the
    scan holds as for a built index. The old labels' codes and error terms are kept as they are."""
    k0, m = int(cells.order.shape[0]), int(weight.shape[0])
    if m == 0:
        return head, cells
    check()
    new = quantize_head(weight, bias, check=check)
    x = np.hstack([weight.astype(np.float64), bias.astype(np.float64)[:, None]])
    mu = cells.centroids.astype(np.float64)
    # nearest centroid by ‖x − μ‖² = ‖x‖² − 2⟨x, μ⟩ + ‖μ‖², in float64; the radius below is measured
    # directly, so a near-tie picked the other way only widens a cell a little more
    d2 = (x * x).sum(axis=1)[:, None] - 2.0 * (x @ mu.T) + (mu * mu).sum(axis=1)[None, :]
    assign = np.argmin(d2, axis=1).astype(np.int64)
    dist = np.linalg.norm(x - mu[assign], axis=1)
    radius = cells.radius.astype(np.float64)
    widened = np.full(cells.nlist, -np.inf)
    np.maximum.at(widened, assign, dist * (1 + 1e-9) + 1e-30)
    radius = np.maximum(radius, widened)
    # positions: each cell's old labels, then its new ones (a stable sort by cell keeps both in order)
    sizes = np.diff(cells.offsets)
    cell_of = np.concatenate([np.repeat(np.arange(cells.nlist, dtype=np.int64), sizes), assign])
    perm = np.argsort(cell_of, kind="stable")
    check()

    def joined(old: npt.NDArray[Any], add: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return np.ascontiguousarray(np.concatenate([old, add])[perm])

    order = joined(cells.order, np.arange(k0, k0 + m, dtype=np.int64)).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(cell_of, minlength=cells.nlist))]).astype(np.int64)
    out_head = Int8Head(
        joined(head.codes, new.codes),
        joined(head.scale, new.scale),
        joined(head.bias, new.bias),
        joined(head.radius, new.radius),
        joined(head.bias_err, new.bias_err),
    )
    out_radius = np.where(np.isneginf(radius), -np.inf, radius)
    return out_head, Cells(order, offsets, np.ascontiguousarray(cells.centroids), _round_up32(out_radius))


@functools.cache
def _kernel() -> Any:
    """Compiled at first use (numba import and compile cost a serving process nothing until then)."""
    import numba

    # re-association and FMA only: the bound covers any summation order; NaN/inf must stay visible
    fast = {"contract", "reassoc", "nsz"}

    @numba.njit(nogil=True, cache=_cache_ok(), fastmath=fast)
    def scan(
        codes: Any, scale: Any, bias: Any, radius: Any, bias_err: Any, hq: Any, t: float, hnorm: float,
        qslack: float, cells: Any, cell_ub: Any, offsets: Any, kk: int, reach: float,
        heap: Any, out_pos: Any, out_lo: Any, out_up: Any, stats: Any,
    ) -> int:  # pragma: no cover - compiled
        d = hq.shape[0]
        n_heap, n = 0, 0
        best, skipped = -np.inf, -np.inf
        floor = -np.inf if kk > 0 else np.inf
        i = 0
        while i < cells.shape[0] and cell_ub[i] >= floor:
            c = cells[i]
            for k in range(offsets[c], offsets[c + 1]):
                row = codes[k]
                acc = np.int32(0)
                for j in range(d):  # int32 throughout (no overflow: see `query_levels`), so it vectorizes
                    acc = np.int32(acc + np.int32(np.int32(row[j]) * np.int32(hq[j])))
                a = np.float32(acc) * (scale[k] * np.float32(t)) + bias[k]
                e = np.float32(hnorm) * radius[k] + np.float32(qslack) * scale[k] + bias_err[k]
                lo, up = a - e, a + e
                if lo != lo:  # NaN never hides a label
                    lo = -np.inf
                if up != up:
                    up = np.inf
                if up >= floor:
                    out_pos[n] = k
                    out_lo[n] = lo
                    out_up[n] = up
                    n += 1
                elif up > skipped:
                    skipped = up
                # a min-heap of the kk best lower bounds: its root is the k-th best so far
                moved = False
                if n_heap < kk:
                    p = n_heap
                    n_heap += 1
                    while p > 0 and heap[(p - 1) // 2] > lo:
                        heap[p] = heap[(p - 1) // 2]
                        p = (p - 1) // 2
                    heap[p] = lo
                    moved = True
                elif kk > 0 and lo > heap[0]:
                    p = 0
                    while True:
                        q = 2 * p + 1
                        if q >= kk:
                            break
                        if q + 1 < kk and heap[q + 1] < heap[q]:
                            q += 1
                        if heap[q] >= lo:
                            break
                        heap[p] = heap[q]
                        p = q
                    heap[p] = lo
                    moved = True
                if lo > best:
                    best = lo
                    moved = True
                if moved and n_heap == kk and kk > 0:
                    f = float(heap[0])
                    if reach >= 0.0:
                        f = min(f, best - reach - 1e-4 * (1.0 + abs(best)))
                    floor = max(floor, f)
            i += 1
        stats[0] = n
        stats[1] = n_heap
        stats[2] = best
        stats[3] = skipped
        return i

    return scan


def _cache_ok() -> bool:
    from trainer.row_kernels import _cache_ok as ok

    return ok()


def _numba_available() -> bool:
    from trainer.row_kernels import available

    return available()


@dataclass(frozen=True)
class Scan:
    """What one pass over some cells found: the labels whose upper bound reached the floor as it rose
    (`pos`, `lower`, `upper`), the k best lower bounds seen (`heap`), the best lower bound, the largest
    upper bound of a scanned label *not* kept (`skipped`), and how many of the given cells it scanned
    before their bound fell below the floor (`stop`)."""

    pos: I64
    lower: F32
    upper: F32
    heap: F32
    best: float
    skipped: float
    stop: int


@dataclass(frozen=True)
class QuantizedQuery:
    """int16 codes `p` and scale `t` of a query (ĥ = t·p), its norm ‖h‖ (which the kernel weighs the
    per-label error terms with), and `slack` = 127√d·‖h − ĥ‖, which times a row's scale bounds what the
    query's rounding can move that row's score (both rounded up)."""

    p: npt.NDArray[np.int16]
    t: float
    norm: float
    slack: float


def query_levels(dim: int) -> int:
    """The largest |code| Q of a query such that d·127·Q, the largest possible int32 sum, fits."""
    return int(min(2**15 - 1, (2**31 - 1) // (127 * max(dim, 1))))


def quantize_query(h: F32) -> QuantizedQuery:
    """Round a query to int16 codes for the integer scan; what the rounding moves goes into the bound."""
    h64 = np.asarray(h, dtype=np.float32).astype(np.float64)
    d, levels = h64.shape[0], query_levels(h64.shape[0])
    amax = float(np.abs(h64).max()) if d else 0.0
    t = np.float32(amax / levels)
    if t > 0 and np.isfinite(t):
        p = np.clip(np.rint(h64 / np.float64(t)), -levels, levels).astype(np.int16)
    else:  # zero, subnormal or non-finite: no codes, the whole query is slack (inf/NaN stay visible)
        t, p = np.float32(0.0), np.zeros(d, dtype=np.int16)
    delta = np.linalg.norm(h64 - np.float64(t) * p.astype(np.float64))  # exact products, float64 sum
    norm, slack = _round_up32(np.array([np.linalg.norm(h64), 127.0 * np.sqrt(d) * delta]) * (1.0 + 8 * _U))
    return QuantizedQuery(p, float(t), float(norm), float(slack))


def scan_cells(
    head: Int8Head, offsets: I64, q: QuantizedQuery, cells: I64, cell_ub: F64, kk: int, reach: float | None
) -> Scan:
    """Scan `cells` (best bound first) for one query, quantized once by `quantize_query` however many
    threads share its cells, keeping a floor: the k-th best lower bound seen (lowered to best − reach,
    with a rounding margin, when asked; -inf until k labels are seen).
    Stops at the first cell whose bound is below the floor; keeps every label whose upper bound reaches
    the floor at the time it is scanned. The floor only rises, so whatever the final floor, every label
    whose upper bound reaches it is kept."""
    total = int((offsets[cells + 1] - offsets[cells]).sum())
    pos = np.empty(total, dtype=np.int64)
    lower = np.empty(total, dtype=np.float32)
    upper = np.empty(total, dtype=np.float32)
    heap = np.empty(max(kk, 1), dtype=np.float32)
    r = -1.0 if reach is None else float(reach)
    if _numba_available():
        stats = np.zeros(4, dtype=np.float64)
        stop = _kernel()(head.codes, head.scale, head.bias, head.radius, head.bias_err, q.p, q.t, q.norm,
                         q.slack, cells, np.ascontiguousarray(cell_ub, dtype=np.float64), offsets, kk, r,
                         heap, pos, lower, upper, stats)
        n, nh = int(stats[0]), int(stats[1])
        return Scan(pos[:n], lower[:n], upper[:n], heap[:nh], float(stats[2]), float(stats[3]), int(stop))
    # numpy: every given cell, the same arithmetic (exact integer sums); floor applied once
    if total:
        pos[:] = np.concatenate([np.arange(offsets[c], offsets[c + 1]) for c in cells])
    acc = (head.codes[pos].astype(np.int64) @ q.p.astype(np.int64)).astype(np.float32)
    a = acc * (head.scale[pos] * np.float32(q.t)) + head.bias[pos]
    e = np.float32(q.norm) * head.radius[pos] + np.float32(q.slack) * head.scale[pos] + head.bias_err[pos]
    lower, upper = np.nan_to_num(a - e, nan=-np.inf), np.nan_to_num(a + e, nan=np.inf)
    heap = np.sort(lower)[::-1][:kk] if kk else np.empty(0, np.float32)
    best = float(lower.max(initial=-np.inf))
    return Scan(pos, lower, upper, heap, best, -np.inf, len(cells))


def score_bounds(head: Int8Head, h: F32) -> tuple[F32, F32]:
    """[n, K] lower and upper bounds of every label's score for each query (position order)."""
    k = head.codes.shape[0]
    lo = np.empty((h.shape[0], k), dtype=np.float32)
    up = np.empty((h.shape[0], k), dtype=np.float32)
    offsets = np.array([0, k], dtype=np.int64)
    one = np.zeros(1, dtype=np.int64)
    for i in range(h.shape[0]):  # k + 1 best: the floor never rises, so every label is kept
        s = scan_cells(head, offsets, quantize_query(h[i]), one, np.full(1, np.inf), k + 1, None)
        lo[i, s.pos], up[i, s.pos] = s.lower, s.upper
    return lo, up
