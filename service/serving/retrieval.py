"""Top-k labels by score ⟨w_k, h⟩ + b_k: an exact blocked scorer and faiss indexes, each with a bound.

Every search returns, per query, an upper bound on the score of every label it did *not* return; the
sparse maps turn that bound into the certificate of an answer (`RowPrediction.certified`, `exact` to clients):

* exact scorer and flat index: the (k+1)-th score (they score every label);
* int8 scan (`QuantizedScanner`): the largest upper bound left out — a skipped cell's bound, a label's
  int8 bound below the floor, or the next re-scored score — so its answers are exact by construction;
* IVF: max of (a) a per-cell bound ⟨q, μ_c⟩ + ‖q‖·r_c over the cells not probed (r_c = the cell's
  radius), (b) the last approximate score of the probed cells plus the scalar quantizer's error bound,
  (c) the (k+1)-th exactly re-scored candidate;
* HNSW: +inf (a graph walk certifies nothing), so its answers are never flagged exact.

Approximate inner-product search over un-normalised vectors is a trap, so the approximate indexes work
on the MIPS → nearest-neighbour reduction of Bachrach et al. (2014): with the bias folded in
(w' = [w, b], q' = [h, 1]) and M = max ‖w'‖, w'' = [w', √(M² − ‖w'‖²)] and q'' = [q', 0] give
‖q'' − w''‖² = ‖q'‖² + M² − 2⟨q', w'⟩, so the nearest w'' is the best-scoring label. Cells are k-means
cells of w'' (L2); inside probed cells candidates are scored by inner product on 8-bit codes and the best
are re-scored exactly from the float weights, so returned scores are always exact.

Indexes are built in the serving process at first load and cached in `<artifact>/index/<kind>/` with
faiss's own format and `.npy` (not pickle), written to a temporary directory and renamed into place, and
memory-mapped when loaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import faiss
import numpy as np
import numpy.typing as npt
import torch
from threadpoolctl import threadpool_limits

from service.serving.quantized_scan import (
    Cells,
    Check,
    Int8Head,
    Scan,
    append_rows,
    build_cells,
    no_check,
    quantize_head,
    quantize_query,
    rounding_gamma,
    scan_cells,
)
from service.settings import IndexKind, RetrievalKind, Settings, default_of
from trainer.durable import fsync_tree

log = logging.getLogger("ovex.retrieval")

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

INDEX_FORMAT = 5  # 3: radii over [w, b] only; 5: one folder per backend, int8 codes in cells


def configure_threads(n: int) -> None:
    """Pin torch, faiss (OpenMP) and numpy's BLAS thread counts: faiss sets none of its own, and idle
    BLAS/OpenMP workers spin on a busy machine. OpenMP's count belongs to the calling thread, so every
    thread that runs faiss calls this."""
    torch.set_num_threads(n)
    faiss.omp_set_num_threads(n)
    threadpool_limits(limits=n, user_api="blas")


@dataclass(frozen=True)
class TopK:
    """Best-first ids and exact scores of the returned labels, and a bound on all the others.

    `ids[n, k]` (-1 where fewer than k labels exist), `scores[n, k]` (-inf padding), `bound[n]`: every
    label not returned scores at most this (-inf: nothing left out; +inf: nothing known).
    """

    ids: I64
    scores: F32
    bound: F64


@dataclass(frozen=True)
class RetrievalConfig:
    """What picks and tunes the index: the retrieval part of the service's `Settings` (`from_settings`),
    whose defaults it takes from there rather than repeating them, plus two constants of the build."""

    kind: RetrievalKind = field(default_factory=functools.partial(default_of, "retrieval"))
    exact_max_weights: int = field(default_factory=functools.partial(default_of, "exact_max_weights"))
    ivf_nlist: int | None = field(default_factory=functools.partial(default_of, "ivf_nlist"))
    ivf_nprobe: int | None = field(default_factory=functools.partial(default_of, "ivf_nprobe"))
    recall_target: float = field(default_factory=functools.partial(default_of, "index_recall_target"))
    hnsw_m: int = field(default_factory=functools.partial(default_of, "hnsw_m"))
    hnsw_ef_search: int = field(default_factory=functools.partial(default_of, "hnsw_ef_search"))
    exact_block_rows: int = field(default_factory=functools.partial(default_of, "exact_block_rows"))
    lone_scan_threads: int = field(default_factory=functools.partial(default_of, "lone_scan_threads"))
    tune_queries: int = 128
    seed: int = 0

    @classmethod
    def from_settings(cls, s: Settings) -> RetrievalConfig:
        return cls(
            kind=s.retrieval,
            exact_max_weights=s.exact_max_weights,
            ivf_nlist=s.ivf_nlist,
            ivf_nprobe=s.ivf_nprobe,
            recall_target=s.index_recall_target,
            hnsw_m=s.hnsw_m,
            hnsw_ef_search=s.hnsw_ef_search,
            exact_block_rows=s.exact_block_rows,
            lone_scan_threads=s.lone_scan_threads,
        )


class Retriever(Protocol):
    """A top-k backend: `search(h, k)` with `h[n, d]` float32.

    `reach=r` asks for every label that may score within r of the best as well (sparsemax's support
    lies within 1 of it); backends that cannot enumerate those ignore it and the caller widens k.
    """

    kind: str

    def search(self, h: F32, k: int, reach: float | None = None) -> TopK: ...


def _fold_query(h: F32, extra: int) -> F32:
    """[h, 1, 0 × (extra − 1)]: the bias column and, for the NN reduction, the zero coordinate."""
    n = h.shape[0]
    out = np.zeros((n, h.shape[1] + extra), dtype=np.float32)
    out[:, : h.shape[1]] = h
    out[:, h.shape[1]] = 1.0
    return out


def _pad(ids: I64, scores: F32, k: int) -> tuple[I64, F32]:
    if ids.shape[1] >= k:
        return ids[:, :k], scores[:, :k]
    n, have = ids.shape
    pi = np.full((n, k), -1, dtype=np.int64)
    ps = np.full((n, k), -np.inf, dtype=np.float32)
    pi[:, :have] = ids
    ps[:, :have] = scores
    return pi, ps


class ExactScorer:
    """Scores every label by blocked matrix products (torch, `exact_block_rows` labels at a time).

    Blocks keep the n×K score matrix from ever existing at once; per block only the top k+1 survive.
    It can also sum exp(score) over the labels at or above a per-query threshold in the same pass,
    which makes ev-softmax exact on this path whatever its support size.
    """

    kind = "exact"

    def __init__(
        self,
        weight: F32,
        bias: F32,
        block_rows: int = 65536,
        gate_weight: F32 | None = None,
        gate_bias: F32 | None = None,
    ) -> None:
        self.weight = torch.from_numpy(weight)
        self.bias = torch.from_numpy(np.ascontiguousarray(bias, dtype=np.float32))
        self.n_labels = int(weight.shape[0])
        self.block_rows = block_rows
        # DropMax heads score f_k + log σ(g_k(h)): not a linear head, so only this path can serve them.
        self.gate_weight = None if gate_weight is None else torch.from_numpy(gate_weight)
        self.gate_bias = None if gate_bias is None else torch.from_numpy(np.ascontiguousarray(gate_bias))

    def _block_scores(self, q: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        s = torch.addmm(self.bias[start:stop], q, self.weight[start:stop].T)
        if self.gate_weight is not None and self.gate_bias is not None:
            g = torch.addmm(self.gate_bias[start:stop], q, self.gate_weight[start:stop].T)
            s = s + torch.nn.functional.logsigmoid(g)
        return s

    def mean_scores(self, h: F32) -> F64:
        """Mean of all K scores per query (the ev-softmax threshold when the head is not linear)."""
        q = torch.from_numpy(np.ascontiguousarray(h, dtype=np.float32))
        total = torch.zeros(q.shape[0], dtype=torch.float64)
        with torch.no_grad():
            for start in range(0, self.n_labels, self.block_rows):
                stop = min(start + self.block_rows, self.n_labels)
                total += self._block_scores(q, start, stop).double().sum(dim=1)
        out: F64 = (total / self.n_labels).numpy()
        return out

    def search(self, h: F32, k: int, reach: float | None = None) -> TopK:
        top, _ = self.search_with_mass(h, k, None)
        return top

    def search_with_mass(self, h: F32, k: int, thresholds: F64 | None,
                         exclude: Sequence[Sequence[int]] | None = None) -> tuple[TopK, F64 | None]:
        """Top-k plus, if `thresholds` is given, log Σ exp(s) over the labels with s ≥ threshold; the
        labels `exclude` names for a row are neither returned nor counted for it."""
        q = torch.from_numpy(np.ascontiguousarray(h, dtype=np.float32))
        n = q.shape[0]
        gone_r = gone_c = None
        if exclude is not None and any(len(e) for e in exclude):
            gone_r = torch.from_numpy(np.repeat(np.arange(n), [len(e) for e in exclude]).astype(np.int64))
            gone_c = torch.from_numpy(np.concatenate([np.asarray(e, np.int64) for e in exclude]))
        kk = min(k + 1, self.n_labels)
        best_s = torch.full((n, 0), -math.inf)
        best_i = torch.zeros((n, 0), dtype=torch.int64)
        t = torch.from_numpy(thresholds.astype(np.float32))[:, None] if thresholds is not None else None
        lse = torch.full((n,), -math.inf, dtype=torch.float64)
        with torch.no_grad():
            for start in range(0, self.n_labels, self.block_rows):
                stop = min(start + self.block_rows, self.n_labels)
                s = self._block_scores(q, start, stop)
                if gone_r is not None and gone_c is not None:
                    here = (gone_c >= start) & (gone_c < stop)
                    s[gone_r[here], gone_c[here] - start] = -math.inf
                bs, bi = torch.topk(s, min(kk, stop - start), dim=1)
                cat_s = torch.cat([best_s, bs], dim=1)
                cat_i = torch.cat([best_i, bi + start], dim=1)
                sel_s, sel = torch.topk(cat_s, min(kk, cat_s.shape[1]), dim=1)
                best_s, best_i = sel_s, torch.gather(cat_i, 1, sel)
                if t is not None:
                    masked = torch.where(s >= t, s, torch.tensor(-math.inf)).double()
                    lse = torch.logaddexp(lse, torch.logsumexp(masked, dim=1))
        scores = best_s.numpy().astype(np.float32)
        ids = best_i.numpy().astype(np.int64)
        bound = scores[:, k].astype(np.float64) if scores.shape[1] > k else np.full(n, -np.inf)
        ids, scores = _pad(ids, scores, k)
        return TopK(ids, scores, bound), (lse.numpy() if t is not None else None)


class QuantizedScanner:
    """The int8 copy of the head in k-means cells, searched best cell first with certified bounds.

    Per query: the cells' bounds ⟨[h, 1], μ_c⟩ + ‖[h, 1]‖·r_c order the cells; one compiled pass scans
    them best first, keeping the k best int8 lower bounds as a floor L (or best − reach), stopping at
    the first cell whose bound is below L and keeping every label whose upper bound reaches L; those
    are re-scored from the float32 weights. A label in a skipped cell or below L cannot be in the
    answer, so the answer is exact by construction and `bound` (the largest bound left out) says so
    to the sparse maps. A large head's scan can be split between threads (cells dealt round-robin,
    each with its own floor, which is never above the shared one): `workers` threads always when
    given, else `lone_workers` for a search of one query (a request that came alone, so the other
    cores are idle) on a head whose queries read most of it (where the cell bounds prune, separate
    floors rise slower and the split costs more than it saves), and one thread per query in a batch.
    """

    kind = "int8"
    SPLIT_MIN_BYTES = 1 << 22  # below this a second thread costs more than it saves
    SPLIT_MIN_READ = 0.5  # share of the head the recent queries scanned, above which a split pays

    def __init__(
        self,
        head: Int8Head,
        cells: Cells,
        weight: F32,
        bias: F32,
        max_candidates: int = 4096,
        workers: int | None = None,
        lone_workers: int = 1,
    ) -> None:
        self.head = head
        self.cells = cells
        self.weight = weight
        self.bias = np.ascontiguousarray(bias, dtype=np.float32)
        self.n_labels = int(weight.shape[0])
        self.max_candidates = max_candidates
        self.workers = workers
        self.lone_workers = lone_workers
        self._w = torch.from_numpy(weight)
        self._b = torch.from_numpy(self.bias)
        self._offsets = np.ascontiguousarray(cells.offsets, dtype=np.int64)
        self._sizes = np.diff(self._offsets)
        self.scanned = 0  # labels whose int8 bounds were computed, over all queries (for benchmarks)
        self.read_share = 1.0  # moving average of the share of labels a query scanned

    def _n_workers(self, n_queries: int) -> int:
        if self.workers is not None:
            return max(1, self.workers)
        big = self.head.codes.nbytes >= self.SPLIT_MIN_BYTES and self.read_share >= self.SPLIT_MIN_READ
        return max(1, self.lone_workers) if n_queries == 1 and big else 1

    def search(self, h: F32, k: int, reach: float | None = None) -> TopK:
        h = np.ascontiguousarray(h, dtype=np.float32)
        n = h.shape[0]
        kk = min(k, self.n_labels)
        u_cells = self.cells.bounds(h)
        nw = self._n_workers(n)
        rows = [self._one(h[i], u_cells[i], kk, reach, nw) for i in range(n)]
        width = max(k, max(len(r[0]) for r in rows) if rows else 0)
        ids_out = np.full((n, width), -1, dtype=np.int64)
        sc_out = np.full((n, width), -np.inf, dtype=np.float32)
        bound = np.empty(n, dtype=np.float64)
        for i, (ids, sc, b) in enumerate(rows):
            ids_out[i, : len(ids)] = ids
            sc_out[i, : len(sc)] = sc
            bound[i] = b
        return TopK(ids_out, sc_out, bound)

    def _scan(self, h: F32, u: F64, kk: int, reach: float | None, nw: int) -> tuple[list[Scan], float]:
        """The scans of each worker's share of the cells, and the largest bound of a cell left out."""
        order = np.argsort(-u, kind="stable")
        parts = [order[t::nw] for t in range(nw)] if nw > 1 else [order]
        q = quantize_query(h)

        def run(cells: I64) -> Scan:
            return scan_cells(self.head, self._offsets, q, cells, u[cells], kk, reach)

        if nw > 1:
            futures = [_pool(nw - 1).submit(run, p) for p in parts[1:]]
            scans = [run(parts[0])] + [f.result() for f in futures]
        else:
            scans = [run(parts[0])]
        b_cells = max((float(u[p[s.stop]]) for p, s in zip(parts, scans, strict=True) if s.stop < len(p)),
                      default=-math.inf)
        scanned = sum(int(self._sizes[p[: s.stop]].sum()) for p, s in zip(parts, scans, strict=True))
        self.scanned += scanned
        self.read_share = 0.9 * self.read_share + 0.1 * scanned / max(self.n_labels, 1)
        return scans, b_cells

    def _one(self, h: F32, u: F64, kk: int, reach: float | None, nw: int) -> tuple[I64, F32, float]:
        scans, b_cells = self._scan(h, u, kk, reach, nw)
        pos = np.concatenate([s.pos for s in scans])
        up = np.concatenate([s.upper for s in scans])
        heap = np.concatenate([s.heap for s in scans])
        floor = _floor(heap, max((s.best for s in scans), default=-math.inf), kk, reach)
        cand = np.flatnonzero(up >= floor)
        cap = max(self.max_candidates, kk + 1)
        if len(cand) > cap:  # too many near-ties to re-score: the best `cap` by upper bound
            cand = cand[np.argsort(-up[cand], kind="stable")[:cap]]
        left = np.ones(len(up), dtype=bool)
        left[cand] = False
        b_rest = max(b_cells, max((s.skipped for s in scans), default=-math.inf),
                     float(up[left].max()) if left.any() else -math.inf)
        labels = torch.from_numpy(self.cells.order[pos[cand]])
        s = torch.addmv(self._b[labels], self._w[labels], torch.from_numpy(h))
        srt = torch.argsort(s, descending=True, stable=True)
        ids, sc = labels[srt].numpy(), s[srt].numpy().astype(np.float32)
        keep = kk if reach is None else max(kk, int((sc >= floor).sum()))
        b_next = self._rounded_up(int(ids[keep]), float(sc[keep]), h) if len(sc) > keep else -math.inf
        return ids[:keep].astype(np.int64), sc[:keep], max(b_rest, b_next)

    def _rounded_up(self, label: int, score: float, h: F32) -> float:
        """A float32 re-scored score raised by its rounding error: a bound on the true score."""
        g = 2.0 * rounding_gamma(h.shape[0])
        wn = float(np.linalg.norm(self.weight[label].astype(np.float64)))
        return score + g * (wn * float(np.linalg.norm(h.astype(np.float64))) + abs(float(self.bias[label])))


def _floor(heap: F32, best: float, kk: int, reach: float | None) -> float:
    """The k-th best lower bound (-inf while fewer than k are known), lowered to best − reach (with a
    rounding margin) when asked: the same rule as the scan kernel's, over all workers' heaps."""
    if not kk:
        return math.inf
    if len(heap) < kk:
        return -math.inf
    floor = float(np.partition(heap, len(heap) - kk)[len(heap) - kk])
    if reach is not None:
        floor = min(floor, best - float(reach) - 1e-4 * (1.0 + abs(best)))
    return floor


@functools.cache
def _pool(n: int) -> ThreadPoolExecutor:
    """Helper threads for split scans (the kernel releases the GIL); one pool per size, kept for life."""
    return ThreadPoolExecutor(max_workers=n, thread_name_prefix="ovex-scan")


class FlatRetriever:
    """faiss exact inner-product index over [w, b] for small K: every label scored, bound exact."""

    kind = "flat"

    def __init__(self, weight: F32, bias: F32) -> None:
        self.n_labels, self.dim = weight.shape
        self.index = faiss.IndexFlatIP(self.dim + 1)
        self.index.add(np.hstack([weight, bias[:, None]]).astype(np.float32))

    def search(self, h: F32, k: int, reach: float | None = None) -> TopK:
        kk = min(k + 1, self.n_labels)
        d, i = self.index.search(_fold_query(h, 1), kk)
        bound = d[:, k].astype(np.float64) if kk > k else np.full(h.shape[0], -np.inf)
        ids, scores = _pad(i.astype(np.int64), d.astype(np.float32), k)
        return TopK(ids, scores, bound)


def _rescore(weight: F32, bias: F32, h: F32, cand: I64) -> F32:
    """Exact scores of candidate ids (-1 → -inf), gathering only their rows."""
    valid = cand >= 0
    safe = np.where(valid, cand, 0)
    w = weight[safe]  # [n, R, d]
    s = np.einsum("nrd,nd->nr", w, h, dtype=np.float32) + bias[safe]
    return np.where(valid, s, -np.inf).astype(np.float32)


def _take_best(cand: I64, s: F32, k: int) -> tuple[I64, F32, F64]:
    """Best k of re-scored candidates, and the (k+1)-th exact score as part of the bound."""
    order = np.argsort(-s, axis=1, kind="stable")
    s_sorted = np.take_along_axis(s, order, axis=1)
    c_sorted = np.take_along_axis(cand, order, axis=1)
    c_sorted = np.where(np.isfinite(s_sorted), c_sorted, -1)
    nxt = s_sorted[:, k].astype(np.float64) if s.shape[1] > k else np.full(s.shape[0], -np.inf)
    ids, scores = _pad(c_sorted, s_sorted, k)
    return ids, scores, nxt


def _slack(qnorm: F64, scale: float) -> F64:
    """Rounding margin for bounds computed from float32 products: never let a bound be optimistic."""
    return 1e-5 * (1.0 + qnorm * scale)


class IVFRetriever:
    """IVF over the NN-reduced label vectors, 8-bit codes, exact re-scoring, certified per-cell bound."""

    kind = "ivf"

    def __init__(
        self,
        index: Any,
        centroids: F32,
        radii: F32,
        sq_err: F32,
        max_norm: float,
        nprobe: int,
        weight: F32,
        bias: F32,
    ) -> None:
        self.index = index
        self.centroids = centroids.astype(np.float64)
        self.radii = radii.astype(np.float64)  # -inf for empty cells
        self.sq_err = sq_err.astype(np.float64)
        self.max_norm = max_norm
        self.nlist = int(index.nlist)
        self.nprobe = max(1, min(int(nprobe), self.nlist))
        self.weight = weight
        self.bias = bias
        self.n_labels = int(weight.shape[0])
        self.tuned_recall = math.nan  # recall@10 on proxy queries at the chosen nprobe

    def search(self, h: F32, k: int, reach: float | None = None, nprobe: int | None = None) -> TopK:
        n = h.shape[0]
        q2 = _fold_query(h, int(self.index.d) - h.shape[1])
        npr = max(1, min(nprobe or self.nprobe, self.nlist))
        dq, iq = self.index.quantizer.search(q2, npr)
        pool = min(self.n_labels, k + 1 + max(k, 16))
        self.index.nprobe = npr  # faiss checks the preassigned width against it
        d, cand = self.index.search_preassigned(q2, pool, iq, dq)
        cand = cand.astype(np.int64)
        s = _rescore(self.weight, self.bias, h, cand)
        ids, scores, b_rescored = _take_best(cand, s, k)

        q64 = q2.astype(np.float64)
        qnorm = np.linalg.norm(q64, axis=1)
        # (a) cells not probed: every member is within r_c of its centroid.
        cell = q64 @ self.centroids.T + qnorm[:, None] * self.radii[None, :]
        np.put_along_axis(cell, iq.astype(np.int64).clip(0), -np.inf, axis=1)
        b_cells = cell.max(axis=1) if self.nlist > npr else np.full(n, -np.inf)
        # (b) probed but not in the pool: approximate score ≤ the pool's last, plus the code error.
        full_pool = cand[:, -1] >= 0
        eps = np.abs(q64) @ self.sq_err
        b_pool = np.where(full_pool, d[:, -1].astype(np.float64) + eps, -np.inf)
        bound = np.maximum(np.maximum(b_cells, b_pool), b_rescored)
        bound = np.where(np.isfinite(bound), bound + _slack(qnorm, self.max_norm), bound)
        return TopK(ids, scores, bound)


class HNSWRetriever:
    """HNSW over the NN-reduced vectors with exact re-scoring. A graph gives no bound: never exact."""

    kind = "hnsw"

    def __init__(self, index: Any, ef_search: int, weight: F32, bias: F32) -> None:
        self.index = index
        self.index.hnsw.efSearch = ef_search
        self.weight = weight
        self.bias = bias
        self.n_labels = int(weight.shape[0])

    def search(self, h: F32, k: int, reach: float | None = None) -> TopK:
        pool = min(self.n_labels, k + 1 + max(k, 16))
        self.index.hnsw.efSearch = max(self.index.hnsw.efSearch, pool)
        _, cand = self.index.search(_fold_query(h, int(self.index.d) - h.shape[1]), pool)
        cand = cand.astype(np.int64)
        ids, scores, _ = _take_best(cand, _rescore(self.weight, self.bias, h, cand), k)
        return TopK(ids, scores, np.full(h.shape[0], np.inf))


# ------------------------------------------------------------------------------------------------
# building, tuning, caching


def reduced_width(dim: int) -> int:
    """Width of the NN-reduced vectors, [w, b, √(M² − ‖[w, b]‖²)] zero-padded to a multiple of 16:
    faiss's scalar-quantizer scan has a fast path only for such widths (≈20× faster at d=128)."""
    return -(-(dim + 2) // 16) * 16


def _reduced(weight: F32, bias: F32, start: int, stop: int, max_norm: float) -> F32:
    """Rows [start, stop) of the NN-reduced label matrix w'' = [w, b, √(M² − ‖[w, b]‖²), 0…]."""
    w = weight[start:stop]
    dim = w.shape[1]
    out = np.zeros((stop - start, reduced_width(dim)), dtype=np.float32)
    out[:, :dim] = w
    out[:, dim] = bias[start:stop]
    wb = out[:, : dim + 1].astype(np.float64)
    out[:, dim + 1] = np.sqrt(np.maximum(max_norm * max_norm - np.einsum("ij,ij->i", wb, wb), 0.0))
    return out


def _max_norm(weight: F32, bias: F32, chunk: int) -> float:
    m = 0.0
    for s in range(0, weight.shape[0], chunk):
        w = weight[s : s + chunk].astype(np.float64)
        sq = np.einsum("ij,ij->i", w, w) + bias[s : s + chunk].astype(np.float64) ** 2
        m = max(m, float(sq.max()))
    return math.sqrt(m) * (1 + 1e-6)


def fingerprint(weight: F32, bias: F32, artifact_dir: Path | None = None) -> str:
    """Cheap identity of a head to validate a cached index: shape, a strided sample of rows, all biases,
    and the weights file's size and modification time (a rewritten file never reuses old codes,
    whose error bounds would no longer hold)."""
    hsh = hashlib.blake2b(digest_size=16)
    if artifact_dir is not None:
        for f in sorted(artifact_dir.glob("*.safetensors")):
            st = f.stat()
            hsh.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    hsh.update(np.asarray(weight.shape, dtype=np.int64).tobytes())
    step = max(1, weight.shape[0] // 2048)
    hsh.update(np.ascontiguousarray(weight[::step]).tobytes())
    hsh.update(np.ascontiguousarray(bias).tobytes())
    return hsh.hexdigest()


def default_nlist(n_labels: int) -> int:
    """About 2·√K cells: a few hundred labels per cell keeps the per-query scan and k-means cheap."""
    return int(min(65536, max(16, 2 * math.sqrt(n_labels))))


def _build_ivf(
    weight: F32, bias: F32, cfg: RetrievalConfig, check: Check
) -> tuple[Any, dict[str, Any], dict[str, F32]]:
    n_labels, dim = weight.shape
    d2 = reduced_width(dim)
    chunk = 65536
    max_norm = _max_norm(weight, bias, chunk)
    nlist = min(cfg.ivf_nlist or default_nlist(n_labels), n_labels)
    rng = np.random.default_rng(cfg.seed)
    n_train = min(n_labels, max(32 * nlist, 20_000))
    sample_ids = np.sort(rng.choice(n_labels, size=n_train, replace=False))
    sample = _reduced(weight[sample_ids], bias[sample_ids], 0, n_train, max_norm)
    km = faiss.Kmeans(d2, nlist, niter=12, seed=cfg.seed, max_points_per_centroid=32, verbose=False)
    km.train(sample)
    centroids = np.asarray(km.centroids, dtype=np.float32)
    quantizer = faiss.IndexFlatL2(d2)
    quantizer.add(centroids)
    index = faiss.IndexIVFScalarQuantizer(
        quantizer, d2, nlist, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT, False
    )
    index.by_residual = False
    index.train(sample)  # quantizer already trained: this fits the 8-bit ranges only
    radii = np.full(nlist, -np.inf)
    sq_err = np.zeros(d2)
    for s in range(0, n_labels, chunk):
        check()
        x = _reduced(weight, bias, s, min(s + chunk, n_labels), max_norm)
        _, assign = quantizer.search(x, 1)
        a = np.ascontiguousarray(assign[:, 0])
        ids = np.arange(s, s + x.shape[0], dtype=np.int64)
        # the cells are already known (needed for the radii): add without assigning a second time
        index.add_core(x.shape[0], faiss.swig_ptr(x), faiss.swig_ptr(ids), faiss.swig_ptr(a))
        # radius over the coordinates a query can weigh ([w, b]; the reduction's extra coordinate and the
        # padding meet zeros in q''), so the cell bound ⟨q, μ_c⟩ + ‖q‖·r_c stays valid and is tighter
        m = dim + 1
        r = np.linalg.norm(x[:, :m].astype(np.float64) - centroids[a][:, :m].astype(np.float64), axis=1)
        np.maximum.at(radii, a, r)
        rec = index.sq.decode(index.sq.compute_codes(x))
        sq_err = np.maximum(sq_err, np.abs(rec.astype(np.float64) - x.astype(np.float64)).max(axis=0))
    meta: dict[str, Any] = {"nlist": nlist, "max_norm": max_norm}
    arrays = {
        "centroids": centroids,
        "radii": radii.astype(np.float32),
        "sq_err": (sq_err * (1 + 1e-3) + 1e-7).astype(np.float32),
    }
    return index, meta, arrays


def _ivf_retriever(
    index: Any, meta: dict[str, Any], arrays: dict[str, F32], nprobe: int, weight: F32, bias: F32
) -> IVFRetriever:
    """An `IVFRetriever` over a built or cached index (its bounds come from `_build_ivf`'s arrays)."""
    return IVFRetriever(
        index, arrays["centroids"], arrays["radii"], arrays["sq_err"], float(meta["max_norm"]),
        nprobe, weight, bias,
    )


def _tune_nprobe(retr: IVFRetriever, exact: ExactScorer, cfg: RetrievalConfig) -> tuple[int, float]:
    """Smallest power-of-two nprobe whose recall@10 on proxy queries (label vectors) meets the target."""
    rng = np.random.default_rng(cfg.seed + 1)
    nq = min(cfg.tune_queries, retr.n_labels)
    rows = rng.choice(retr.n_labels, size=nq, replace=False)
    q = np.ascontiguousarray(retr.weight[rows], dtype=np.float32)
    # a label's own vector plus noise of 30% of its scale: an input near, not on, its labels
    q = q + rng.normal(0, 0.3, size=q.shape).astype(np.float32) * np.abs(q).mean()
    k = min(10, retr.n_labels)
    truth = exact.search(q, k).ids
    nprobe, recall = 1, 0.0
    while True:
        got = retr.search(q, k, nprobe=nprobe).ids
        recall = float(np.mean([len(set(g) & set(t)) / k for g, t in zip(got, truth, strict=True)]))
        if recall >= cfg.recall_target or nprobe >= retr.nlist:
            return nprobe, recall
        nprobe = min(nprobe * 2, retr.nlist)


def _index_dir(artifact_dir: Path, kind: str) -> Path:
    """Each backend caches under its own folder, so switching backends never rebuilds the other."""
    return artifact_dir / "index" / kind


def _write_index_dir(
    artifact_dir: Path, kind: str, index: Any, meta: dict[str, Any], arrays: dict[str, npt.NDArray[Any]],
    strict: bool = False,
) -> None:
    """Write `<artifact>/index/<kind>/` atomically: temp dir beside it, then rename over. A failure costs
    only the cache (logged), unless `strict` (the caller's write of a whole version depends on it)."""
    final = _index_dir(artifact_dir, kind)
    tmp: Path | None = None
    try:
        final.parent.mkdir(exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{kind}.tmp-", dir=final.parent))
        if index is not None:
            faiss.write_index(index, str(tmp / "index.faiss"))
        for name, arr in arrays.items():
            np.save(tmp / f"{name}.npy", arr, allow_pickle=False)
        (tmp / "meta.json").write_text(json.dumps({**meta, "format": INDEX_FORMAT, "kind": kind}, indent=1))
        fsync_tree(tmp)  # a cache that a crash left half written would load as a wrong index
        old: Path | None = None
        if final.exists():
            old = final.parent / f".{kind}.old-{os.getpid()}-{time.time_ns()}"
            os.replace(final, old)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if strict:
            raise
        log.warning("index cache not written", extra={"dir": str(final), "error": str(exc)})


def _read_index_dir(
    artifact_dir: Path, kind: str, fp: str
) -> tuple[Any, dict[str, Any], dict[str, npt.NDArray[Any]]] | None:
    """The cached index of this kind if it was built from this very head, else None (rebuild).
    Arrays are memory-mapped: pages load as the first queries touch them, and are shared between
    processes serving the same artifact."""
    d = _index_dir(artifact_dir, kind)
    try:
        meta = json.loads((d / "meta.json").read_text())
        if meta.get("format") != INDEX_FORMAT or meta.get("kind") != kind or meta.get("fingerprint") != fp:
            log.info("cached index is stale, rebuilding", extra={"dir": str(d)})
            return None
        index = faiss.read_index(str(d / "index.faiss")) if (d / "index.faiss").exists() else None
        arrays = {p.stem: np.load(p, mmap_mode="r", allow_pickle=False) for p in d.glob("*.npy")}
        return index, meta, arrays
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RuntimeError) as exc:
        log.warning("cached index unreadable, rebuilding", extra={"dir": str(d), "error": str(exc)})
        return None


def choose_kind(n_labels: int, dim: int, cfg: RetrievalConfig) -> IndexKind:
    """`auto` by the bytes a query must read: a small head is scanned exactly in float32; a larger one
    through its int8 copy in cells, which reads a quarter of the bytes at worst and, on a trained
    head, a few percent of them — exact either way. IVF and HNSW only when asked: IVF's cell bound
    certifies few answers, a graph none."""
    if cfg.kind != "auto":
        return cfg.kind
    return "exact" if n_labels * dim <= cfg.exact_max_weights else "int8"


def _int8_arrays(head: Int8Head, cells: Cells) -> dict[str, npt.NDArray[Any]]:
    """The int8 scan's arrays as its cache stores them."""
    return {
        "codes": head.codes,
        "scale": head.scale,
        "bias": head.bias,
        "radius": head.radius,
        "bias_err": head.bias_err,
        "order": cells.order,
        "offsets": cells.offsets,
        "centroids": cells.centroids,
        "cell_radius": cells.radius,
    }


def extend_int8_cache(
    base_dir: Path, base_weight: F32, base_bias: F32, out_dir: Path, weight: F32, bias: F32,
    cfg: RetrievalConfig, check: Check = no_check,
) -> bool:
    """Write `out_dir`'s int8 scan cache for a head that is the base's head with rows appended (`weight`,
    `bias`: all rows, the base's first), from the base's own cache: the new rows join the nearest cells
    (`append_rows`) instead of k-means running again. False, with nothing written, when the new head is
    not served by the int8 scan or the base has no cache built from its head (the service then builds
    the index at load). The base's files are only read. Errors writing the cache are raised."""
    k0 = int(base_weight.shape[0])
    if choose_kind(int(weight.shape[0]), int(weight.shape[1]), cfg) != "int8":
        return False
    if choose_kind(k0, int(base_weight.shape[1]), cfg) != "int8":
        return False
    cached = _read_index_dir(base_dir, "int8", fingerprint(base_weight, base_bias, base_dir))
    if cached is None:
        return False
    a = cached[2]
    if int(a["order"].shape[0]) != k0:
        return False
    head = Int8Head(a["codes"], a["scale"], a["bias"], a["radius"], a["bias_err"])
    cells = Cells(a["order"], a["offsets"], a["centroids"], a["cell_radius"])
    head, cells = append_rows(
        head, cells, np.ascontiguousarray(weight[k0:]), np.ascontiguousarray(bias[k0:]), check
    )
    fp = fingerprint(weight, bias, out_dir)
    _write_index_dir(out_dir, "int8", None, {"fingerprint": fp, "nlist": cells.nlist, "appended": True},
                     _int8_arrays(head, cells), strict=True)
    return True


def _int8_scanner(
    weight: F32, bias: F32, cfg: RetrievalConfig, artifact_dir: Path | None, fp: str, check: Check
) -> QuantizedScanner:
    """The celled int8 copy of the head, read from the cache when built from these weights."""
    t0 = time.perf_counter()
    cached = _read_index_dir(artifact_dir, "int8", fp) if artifact_dir is not None else None
    if cached is not None:
        a = cached[2]
        # The codes are read in full by most queries: a private copy sits on huge pages (numpy asks for
        # them), which the page cache behind a memory map does not; that scans faster, for K·d bytes
        # of private memory. The small arrays stay mapped.
        head = Int8Head(np.array(a["codes"]), a["scale"], a["bias"], a["radius"], a["bias_err"])
        cells = Cells(a["order"], a["offsets"], a["centroids"], a["cell_radius"])
    else:
        nlist = cfg.ivf_nlist or default_nlist(int(weight.shape[0]))
        # k-means over every label row: minutes at 10^7 labels, once (the result is cached beside the model)
        log.info("building the int8 scan", extra={"labels": int(weight.shape[0]), "cells": nlist})
        cells = build_cells(weight, bias, nlist, cfg.seed, check=check)
        head = quantize_head(weight, bias, cells.order, check=check)
        if artifact_dir is not None:
            _write_index_dir(artifact_dir, "int8", None, {"fingerprint": fp, "nlist": cells.nlist},
                             _int8_arrays(head, cells))
    log.info(
        "int8 scan ready",
        extra={
            "labels": int(weight.shape[0]),
            "cells": cells.nlist,
            "cached": cached is not None,
            "bytes": head.nbytes,
            "seconds": round(time.perf_counter() - t0, 2),
        },
    )
    return QuantizedScanner(head, cells, weight, bias, lone_workers=cfg.lone_scan_threads)


def build_retriever(
    weight: F32, bias: F32, cfg: RetrievalConfig, artifact_dir: Path | None, exact: ExactScorer,
    check: Check = no_check,
) -> Retriever:
    """The index for this head, loaded from the artifact's cache when it matches, else built (calling
    `check` between chunks, which may raise to abandon the build) and cached."""
    kind = choose_kind(int(weight.shape[0]), int(weight.shape[1]), cfg)
    if kind == "exact":
        return exact
    if kind == "flat":
        return FlatRetriever(weight, bias)
    fp = fingerprint(weight, bias, artifact_dir)
    with _building(artifact_dir, kind):
        if kind == "int8":
            return _int8_scanner(weight, bias, cfg, artifact_dir, fp, check)
        if kind == "hnsw":
            return _hnsw(weight, bias, cfg, artifact_dir, fp, check)
        return _ivf(weight, bias, cfg, artifact_dir, fp, exact, check)


@contextlib.contextmanager
def _building(artifact_dir: Path | None, kind: str) -> Iterator[None]:
    """One process (or thread) at a time reads or builds an artifact's index of a kind: N workers
    starting on an uncached artifact build it once, the others wait and read the cache it wrote. An
    artifact whose folder cannot take a lock file (read-only) is built without one."""
    if artifact_dir is None:
        yield
        return
    try:
        (artifact_dir / "index").mkdir(exist_ok=True)
        lock = open(artifact_dir / "index" / f".{kind}.lock", "a")  # noqa: SIM115 - held across the yield
    except OSError:
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _hnsw(
    weight: F32, bias: F32, cfg: RetrievalConfig, artifact_dir: Path | None, fp: str, check: Check
) -> HNSWRetriever:
    t0 = time.perf_counter()
    cached = _read_index_dir(artifact_dir, "hnsw", fp) if artifact_dir is not None else None
    if cached is not None and cached[0] is not None:
        index = cached[0]
    else:
        max_norm = _max_norm(weight, bias, 65536)
        index = faiss.IndexHNSWFlat(reduced_width(weight.shape[1]), cfg.hnsw_m)
        index.hnsw.efConstruction = 80
        for s in range(0, weight.shape[0], 65536):
            check()
            index.add(_reduced(weight, bias, s, min(s + 65536, weight.shape[0]), max_norm))
        if artifact_dir is not None:
            _write_index_dir(artifact_dir, "hnsw", index, {"fingerprint": fp, "hnsw_m": cfg.hnsw_m}, {})
    log.info(
        "hnsw index ready",
        extra={
            "labels": int(weight.shape[0]),
            "cached": cached is not None,
            "seconds": round(time.perf_counter() - t0, 2),
        },
    )
    return HNSWRetriever(index, cfg.hnsw_ef_search, weight, bias)


def _ivf(
    weight: F32, bias: F32, cfg: RetrievalConfig, artifact_dir: Path | None, fp: str, exact: ExactScorer,
    check: Check,
) -> IVFRetriever:
    t0 = time.perf_counter()
    cached = _read_index_dir(artifact_dir, "ivf", fp) if artifact_dir is not None else None
    if cached is not None and cached[0] is not None:
        index, meta, arrays = cached
        retr = _ivf_retriever(index, meta, arrays, int(cfg.ivf_nprobe or meta["nprobe"]), weight, bias)
        retr.tuned_recall = float(meta.get("tuned_recall_at_10", math.nan))
        log.info(
            "ivf index loaded from cache",
            extra={"labels": int(weight.shape[0]), "nlist": retr.nlist, "nprobe": retr.nprobe},
        )
        if not cfg.ivf_nprobe and meta.get("recall_target") != cfg.recall_target:
            retr.nprobe, retr.tuned_recall = _tune_nprobe(retr, exact, cfg)  # the target changed: cheap
            log.info("ivf nprobe re-tuned", extra={"nprobe": retr.nprobe, "recall_at_10": retr.tuned_recall})
        return retr
    index, meta, arrays = _build_ivf(weight, bias, cfg, check)
    retr = _ivf_retriever(index, meta, arrays, 1, weight, bias)
    if cfg.ivf_nprobe:
        retr.nprobe, retr.tuned_recall = min(cfg.ivf_nprobe, retr.nlist), math.nan
    else:
        retr.nprobe, retr.tuned_recall = _tune_nprobe(retr, exact, cfg)
    meta.update(
        {
            "fingerprint": fp,
            "nprobe": retr.nprobe,
            "tuned_recall_at_10": retr.tuned_recall,
            "recall_target": cfg.recall_target,
            "n_labels": int(weight.shape[0]),
        }
    )
    if artifact_dir is not None:
        _write_index_dir(artifact_dir, "ivf", index, meta, arrays)
    log.info(
        "ivf index built",
        extra={
            "labels": int(weight.shape[0]),
            "nlist": retr.nlist,
            "nprobe": retr.nprobe,
            "proxy_recall_at_10": retr.tuned_recall,
            "seconds": round(time.perf_counter() - t0, 2),
        },
    )
    return retr
