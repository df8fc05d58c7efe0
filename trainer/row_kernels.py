"""Fused CPU kernels for the row-wise optimizers: one pass over the touched rows instead of ten.

The eager torch update of a row-wise Adam step gathers the moments, runs about eight element-wise ops, each
allocating and streaming a temporary the size of the touched rows, then scatters them back: at ~15k
touched rows × 128 columns per step that memory traffic is most of a training step. These numba kernels
read the gradient, parameter and state of a row once and write them back once. They update rows in
place, in parallel over rows for big updates (safe because a step's row ids are distinct).

`available()` is false when numba is missing (the optimizers then use their torch code, which is also
the path for GPU tensors). Results equal the eager update's up to float32 rounding
(tests/test_row_kernels.py).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch


def _cache_ok() -> bool:
    """numba's on-disk cache needs a writable `__pycache__` (or NUMBA_CACHE_DIR); a read-only install
    (a container's site-packages) compiles at first use instead of failing."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return True
    here = Path(__file__).resolve().parent
    cache = here / "__pycache__"
    return os.access(cache if cache.exists() else here, os.W_OK)


@functools.cache
def available() -> bool:
    """Fused kernels can run: numba is installed (a declared dependency; its absence is not an error)."""
    return importlib.util.find_spec("numba") is not None


PARALLEL_MIN = 1 << 18  # elements; below this one thread is quicker than waking a second


@functools.cache
def _kernels() -> Any:
    """Compile (or load from numba's cache) on first use: importing numba costs ~0.3 s, which a process
    that only serves predictions should not pay."""
    import numba

    # float32 arithmetic with re-association (vectorised reductions, reciprocal square roots), but no
    # "no NaN / no inf" assumptions: a diverging run must still show NaN, not garbage
    fast = {"contract", "arcp", "reassoc", "nsz", "afn"}
    # parallel=True also on one thread: its loop lowering vectorises, and runs 2x faster than the
    # serial build even there (4.8 vs 9.5 ms for 14.6k x 128 Adam rows)
    jit = numba.njit(parallel=True, cache=_cache_ok(), nogil=True, fastmath=fast)

    @jit
    def adam(
        param: Any, mv: Any, last: Any, rows: Any, grad: Any, table: Any, step: float,
        lr: float, b1: float, b2: float, eps: float, wd: float,
    ) -> None:  # pragma: no cover - compiled
        n, w = grad.shape
        top = table.shape[0] - 1
        log_b1, log_b2 = math.log(b1), math.log(b2)
        log_keep = math.log(1.0 - lr * wd) if wd > 0.0 else 0.0
        c1, c2 = np.float32(b1), np.float32(b2)
        o1, o2 = np.float32(1.0 - b1), np.float32(1.0 - b2)
        keep = np.float32(1.0 - lr * wd)
        sbc2 = math.sqrt(1.0 - b2**step)
        own = np.float32(lr * sbc2 / (1.0 - b1**step))
        e = np.float32(eps * sbc2)
        e0 = np.float32(eps)
        for i in numba.prange(n):
            r = rows[i]
            t0 = last[r]
            missed = step - 1.0 - t0
            last[r] = step
            p, m_, v_, g_ = param[r], mv[r, 0], mv[r, 1], grad[i]
            if t0 == 0.0:  # first update: the moments were allocated, not zeroed (trainer.optim)
                m_[:] = 0.0
                v_[:] = 0.0
            if missed > 0.0:  # dense Adam's moves over the missed steps (trainer.optim.catch_up_table)
                h0 = table[min(int(t0), top)]
                h1 = table[min(int(t0 + missed), top)]
                f1, f2 = math.exp(missed * log_b1), math.exp(missed * log_b2)
                move = np.float32(lr * (h0 - f1 / math.sqrt(f2) * h1))  # r^missed = b1^missed / b2^(missed/2)
                d1, d2 = np.float32(f1 * b1), np.float32(f2 * b2)  # the missed decay and this step's
                decay = np.float32(math.exp(missed * log_keep) * (1.0 - lr * wd))
                moved = move * decay
                for j in range(w):
                    g = g_[j]
                    m0, v0 = m_[j], v_[j]
                    m = m0 * d1 + o1 * g
                    v = v0 * d2 + o2 * g * g
                    m_[j] = m
                    v_[j] = v
                    a, b = np.sqrt(v0) + e0, np.sqrt(v) + e  # one division for both moves
                    p[j] = p[j] * decay - (moved * m0 * b + own * m * a) / (a * b)
            else:  # touched at the previous step: no catch-up, one square root and division, not two
                for j in range(w):
                    g = g_[j]
                    m = m_[j] * c1 + o1 * g
                    v = v_[j] * c2 + o2 * g * g
                    m_[j] = m
                    v_[j] = v
                    p[j] = p[j] * keep - own * m / (np.sqrt(v) + e)

    @jit
    def adagrad(
        param: Any, acc: Any, rows: Any, grad: Any, lr: float, eps: float, wd: float
    ) -> None:  # pragma: no cover - compiled
        n, w = grad.shape
        keep = np.float32(1.0 - lr * wd)
        for i in numba.prange(n):
            r = rows[i]
            p, g_ = param[r], grad[i]
            s = np.float32(0.0)
            for j in range(w):
                s += g_[j] * g_[j]
            a = acc[r] + s / np.float32(w)
            acc[r] = a
            scale = np.float32(lr / (math.sqrt(a) + eps))
            for j in range(w):
                p[j] = p[j] * keep - scale * g_[j]

    @jit
    def project_grad(
        offsets: Any, indices: Any, values: Any, grad_h: Any, out: Any
    ) -> None:  # pragma: no cover - compiled
        n_bags, w = grad_h.shape
        n_rows, nnz = out.shape[0], indices.shape[0]
        # the bags' non-zeros regrouped by table row (a counting sort), so that each output row is
        # written by one thread, once, and needs no zeroed buffer beforehand
        start = np.zeros(n_rows + 1, np.int64)
        for k in range(nnz):
            start[indices[k] + 1] += 1
        for r in range(n_rows):
            start[r + 1] += start[r]
        fill = start[:n_rows].copy()
        bag_of = np.empty(nnz, np.int64)
        value_of = np.empty(nnz, np.float32)
        for bag in range(n_bags):
            end = offsets[bag + 1] if bag + 1 < n_bags else nnz
            for k in range(offsets[bag], end):
                at = fill[indices[k]]
                fill[indices[k]] = at + 1
                bag_of[at] = bag
                value_of[at] = values[k]
        for r in numba.prange(n_rows):
            o = out[r]
            for j in range(w):
                o[j] = 0.0
            for at in range(start[r], start[r + 1]):
                v, g = value_of[at], grad_h[bag_of[at]]
                for j in range(w):
                    o[j] += v * g[j]

    return numba, adam, adagrad, project_grad


def usable(*tensors: torch.Tensor) -> bool:
    """The kernels take contiguous CPU float32 tensors (numpy views them without a copy)."""
    return available() and all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors
    )


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


# numba's default thread pool (workqueue, used where no OpenMP/TBB library is found) aborts the process
# when two Python threads launch kernels at once: launches are serialised (each takes milliseconds)
_LAUNCH = threading.Lock()


@contextlib.contextmanager
def _launch(work: int) -> Iterator[Any]:
    """The kernels, on one thread for small updates, else on as many as torch may use (a step's torch
    ops keep their threads too: pinning them to one made CPU steps slower on every set measured)."""
    numba, adam, adagrad, project_grad = _kernels()
    with _LAUNCH:
        threads = torch.get_num_threads()
        n = 1 if work < PARALLEL_MIN else max(1, min(threads, numba.config.NUMBA_NUM_THREADS))
        if numba.get_num_threads() != n:
            numba.set_num_threads(n)
        try:
            yield adam, adagrad, project_grad
        finally:
            # where numba's OpenMP layer and torch load the same libgomp, a launch resets torch's thread count
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)


def adam_rows(
    param: torch.Tensor, mv: torch.Tensor, last: torch.Tensor, rows: torch.Tensor, grad: torch.Tensor,
    table: np.ndarray, step: float, lr: float, b1: float, b2: float, eps: float, wd: float,
) -> None:
    """In place: Adam step `step` on `param[rows]` ([N, w]) with grad [R, w], first catching each row up
    on the steps it missed since `last[row]` (`trainer.optim.RowAdam`); decoupled decay."""
    with _launch(grad.numel()) as (adam, _, _):
        adam(_np(param), _np(mv), _np(last), _np(rows), _np(grad), table, step, lr, b1, b2, eps, wd)


def adagrad_rows(
    param: torch.Tensor, acc: torch.Tensor, rows: torch.Tensor, grad: torch.Tensor,
    lr: float, eps: float, wd: float,
) -> None:
    """In place: row-wise Adagrad (one accumulator per row) on `param[rows]` with grad [R, w]."""
    with _launch(grad.numel()) as (_, adagrad, _):
        adagrad(_np(param), _np(acc), _np(rows), _np(grad), lr, eps, wd)


def project_rows_grad(
    offsets: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, grad_h: torch.Tensor, n_rows: int
) -> torch.Tensor:
    """Aᵀ·grad_h for the bags' CSR A (B × n_rows; `offsets` [B] into `indices`/`values`): the gradient of
    the table rows an `embedding_bag` sum with per-sample weights read, [n_rows, w]."""
    out = torch.empty(n_rows, grad_h.shape[1], dtype=torch.float32)
    with _launch(indices.numel() * grad_h.shape[1]) as (_, _, project_grad):
        project_grad(*(_np(t.contiguous()) for t in (offsets, indices, values, grad_h)), _np(out))
    return out
