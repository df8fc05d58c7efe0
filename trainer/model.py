"""`XCModel`: sparse input → EmbeddingBag projection → optional hidden layers → h; label head W, b.

The big tables (input projection D×d, label head K×(d+1) with the bias as last column, loss-owned
K×(d+1) heads) are plain tensors updated row-wise by `trainer.optim.RowAdam`: a step gathers only the
rows it touches into small leaf tensors, so neither the gradient nor the optimizer update ever costs
O(K) or O(D). Hidden layers are ordinary dense modules.

Encoder seam: `make_hidden_layer(encoder, dim, pieces, dropout)`; `maxout` comes from
`trainer.maxout.Maxout(in_dim, out_dim, pieces)`.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from trainer import row_kernels
from trainer.errors import ParamsError


@dataclass(frozen=True)
class ModelShape:
    """What is needed to rebuild the module before loading weights (stored in the artifact config)."""

    n_features: int
    n_labels: int
    dim: int
    encoder: str = "linear"
    hidden: int = 0
    pieces: int = 2
    dropout: float = 0.0
    extra_heads: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {
            "n_features": self.n_features,
            "n_labels": self.n_labels,
            "dim": self.dim,
            "encoder": self.encoder,
            "hidden": self.hidden,
            "pieces": self.pieces,
            "dropout": self.dropout,
            "extra_heads": list(self.extra_heads),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ModelShape:
        return cls(
            n_features=int(d["n_features"]),
            n_labels=int(d["n_labels"]),
            dim=int(d["dim"]),
            encoder=str(d.get("encoder", "linear")),
            hidden=int(d.get("hidden", 0)),
            pieces=int(d.get("pieces", 2)),
            dropout=float(d.get("dropout", 0.0)),
            extra_heads=tuple(str(x) for x in d.get("extra_heads", [])),
        )


class ReluLayer(nn.Module):
    """ReLU → dropout → Linear: one hidden layer of the `mlp` encoder."""

    def __init__(self, in_dim: int, out_dim: int, dropout: float) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.linear = nn.Linear(in_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(self.drop(F.relu(x)))
        return out


def make_hidden_layer(encoder: str, dim: int, pieces: int, dropout: float) -> nn.Module:
    """The encoder switch: one d→d hidden layer of the requested kind."""
    if encoder == "mlp":
        return ReluLayer(dim, dim, dropout)
    if encoder == "maxout":
        try:
            maxout = importlib.import_module("trainer.maxout")
        except ImportError as exc:
            raise ParamsError("encoder 'maxout' is not available in this build") from exc
        layer: nn.Module = maxout.Maxout(dim, dim, pieces, dropout=dropout)
        return layer
    raise ParamsError(f"encoder {encoder!r} has no hidden layers; use mlp or maxout, or hidden=0")


class RowDropout(nn.Module):
    """Dropout of h, with the CPU mask drawn from 16 random bits an element: torch's `bernoulli_` draws one
    double an element, several times slower there. The kept values are scaled by 1/q for the mask's own
    keep probability q (a multiple of 2⁻¹⁶), so the expectation is h exactly, as with `nn.Dropout`."""

    LEVELS = 1 << 16

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.drop = nn.Dropout(p)
        self.cut = round(p * self.LEVELS)  # draws below it are dropped
        self.scale = self.LEVELS / (self.LEVELS - self.cut) if self.cut < self.LEVELS else 0.0

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return h
        if h.device.type != "cpu" or h.numel() % 4:
            out: torch.Tensor = self.drop(h)
            return out
        if self.cut in (0, self.LEVELS):  # p rounds to 0 or 1 on the mask's grid: keep all, or none
            return h if self.cut == 0 else h * 0.0
        words = torch.empty(h.numel() // 4, dtype=torch.int64).random_(-(1 << 63), (1 << 63) - 1)
        draws = words.view(torch.int16).view(h.shape)  # uniform on [-2¹⁵, 2¹⁵)
        keep = (draws >= self.cut - (1 << 15)).to(h.dtype) * self.scale
        return h * keep


class _ProjectRows(torch.autograd.Function):
    """h = A @ T for a batch CSR A (B×U) over gathered table rows T (U×d), with a fast backward.

    Forward is `embedding_bag`; its backward is far slower than one pass over the non-zeros (`_rows_grad`).
    """

    @staticmethod
    def forward(
        ctx: Any, table: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        ctx.save_for_backward(indices, offsets, values)
        ctx.n_rows = table.shape[0]
        return F.embedding_bag(indices, table, offsets, mode="sum", per_sample_weights=values)

    @staticmethod
    def backward(ctx: Any, grad_h: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        indices, offsets, values = ctx.saved_tensors
        return _rows_grad(indices, offsets, values, grad_h, ctx.n_rows), None, None, None


class _ProjectTable(torch.autograd.Function):
    """h = A @ table[ids] for a batch CSR A over positions in `ids`, read straight from the table; the
    gradient of those rows goes to `rows`, a leaf that stands for table[ids] and is never written.

    Why: gathering a step's input rows first copies thousands of rows that the bag sum reads once.
    """

    @staticmethod
    def forward(
        ctx: Any, rows: torch.Tensor, table: torch.Tensor, indices: torch.Tensor, inverse: torch.Tensor,
        offsets: torch.Tensor, values: torch.Tensor,
    ) -> torch.Tensor:
        ctx.save_for_backward(inverse, offsets, values)
        ctx.n_rows = rows.shape[0]
        return F.embedding_bag(indices, table, offsets, mode="sum", per_sample_weights=values)

    @staticmethod
    def backward(ctx: Any, grad_h: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        inverse, offsets, values = ctx.saved_tensors
        return _rows_grad(inverse, offsets, values, grad_h, ctx.n_rows), None, None, None, None, None


def _rows_grad(
    indices: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor, grad_h: torch.Tensor, n_rows: int
) -> torch.Tensor:
    """Aᵀ·grad_h [n_rows, d] for the bags' CSR A over rows 0..n_rows − 1: a numba kernel on the CPU (one
    pass over the non-zeros), scipy where numba is missing, `index_add_` elsewhere."""
    b = grad_h.shape[0]
    grad_h = grad_h.contiguous()  # a slice of a wider gradient when h was concatenated
    if row_kernels.usable(grad_h, values) and indices.dtype == offsets.dtype == torch.int64:
        return row_kernels.project_rows_grad(offsets, indices, values, grad_h, n_rows)
    if grad_h.device.type == "cpu":
        indptr = np.empty(b + 1, dtype=np.int64)
        indptr[:b] = offsets.numpy()
        indptr[b] = indices.numpy().shape[0]
        a = sp.csr_matrix((values.numpy(), indices.numpy(), indptr), shape=(b, n_rows))
        g = np.ascontiguousarray(grad_h.detach().numpy(), dtype=np.float32)
        return torch.from_numpy(np.asarray(a.T @ g, dtype=np.float32))
    counts = torch.diff(offsets, append=offsets.new_full((1,), indices.numel()))
    rows = torch.repeat_interleave(torch.arange(b, device=grad_h.device), counts,
                                   output_size=indices.numel())  # known: no wait for the device
    grad = torch.zeros(n_rows, grad_h.shape[1], dtype=grad_h.dtype, device=grad_h.device)
    return grad.index_add_(0, indices, grad_h.index_select(0, rows) * values.unsqueeze(1))


def project_rows(
    table: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor
) -> torch.Tensor:
    """Sum of value-weighted table rows per bag (EmbeddingBag 'sum' with per-sample weights)."""
    if not table.requires_grad:
        return F.embedding_bag(indices, table, offsets, mode="sum", per_sample_weights=values)
    out: torch.Tensor = _ProjectRows.apply(table, indices, offsets, values)
    return out


def project_table(
    table: torch.Tensor, ids: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`project_rows(table[ids], inverse, ...)` without gathering table[ids]: (the bags' sums, the leaf
    whose `.grad` holds the gradient of table[ids] after backward)."""
    rows = table.new_empty(ids.numel(), table.shape[1]).requires_grad_()
    out: torch.Tensor = _ProjectTable.apply(rows, table.detach(), ids.index_select(0, inverse), inverse,
                                            offsets, values)
    return out, rows


def csr_to_tensors(x: sp.csr_matrix, device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
    """(indices int64, offsets int64 [n], values float32) as EmbeddingBag wants them."""
    indptr = torch.from_numpy(np.asarray(x.indptr, dtype=np.int64))
    indices = torch.from_numpy(np.asarray(x.indices, dtype=np.int64))
    values = torch.from_numpy(np.asarray(x.data, dtype=np.float32))
    return indices.to(device), indptr[:-1].to(device), values.to(device)


HEAD_INIT_BLOCK = 1 << 12  # label rows drawn from one seeded generator
MIN_ROWS = 256  # top-k: rows scored together, whatever the number of labels


def init_head_rows(lo: int, hi: int, dim: int, seed: int) -> torch.Tensor:
    """Initial head rows [lo, hi): W small random, bias (last column) 0.

    Drawn in fixed blocks of labels, each from its own seeded generator, so a rank that owns a shard
    of the labels draws exactly the rows one process would have, without ever holding all K of them.
    """
    out = torch.empty(hi - lo, dim + 1)
    for block in range(lo // HEAD_INIT_BLOCK, (hi + HEAD_INIT_BLOCK - 1) // HEAD_INIT_BLOCK):
        start = block * HEAD_INIT_BLOCK
        gen = torch.Generator().manual_seed(seed * 1_000_003 + block + 1)
        rows = torch.randn(HEAD_INIT_BLOCK, dim + 1, generator=gen) * (0.01 / math.sqrt(dim))
        a, b = max(lo, start), min(hi, start + HEAD_INIT_BLOCK)
        out[a - lo : b - lo] = rows[a - start : b - start]
    out[:, dim] = 0.0
    return out


class XCModel(nn.Module):
    def __init__(
        self,
        shape: ModelShape,
        init_scale: float = 1.0,
        seed: int = 0,
        init: bool = True,
        label_rows: tuple[int, int] | None = None,
    ) -> None:
        """`init=False` leaves the big tables uninitialised: a loader about to overwrite them would
        otherwise hold a random K×d head (and its temporaries) beside the weights it reads.
        `label_rows=(lo, hi)`: hold only those rows of the label tables (one rank's shard); scores and
        top-k are then over that shard, in its local ids."""
        super().__init__()
        self.shape = shape
        d, n_in = shape.dim, shape.n_features
        lo, hi = label_rows if label_rows is not None else (0, shape.n_labels)
        k = hi - lo
        if shape.hidden > 0 and shape.encoder == "linear":
            raise ParamsError("encoder 'linear' takes no hidden layers; use --encoder mlp or maxout")
        gen = torch.Generator().manual_seed(seed)
        # input rows ~ N(0, init_scale²/d): an L2-normalised input gives h of norm ≈ init_scale
        if init:
            input_weight = torch.randn(n_in, d, generator=gen) * (init_scale / math.sqrt(d))
        else:
            input_weight = torch.empty(n_in, d)
        self.input_weight = nn.Parameter(input_weight, requires_grad=False)
        self.input_bias = nn.Parameter(torch.zeros(d))
        self.hidden = nn.ModuleList(
            make_hidden_layer(shape.encoder, d, shape.pieces, shape.dropout) for _ in range(shape.hidden)
        )
        self.drop = RowDropout(shape.dropout)
        head = init_head_rows(lo, hi, d, seed) if init else torch.empty(k, d + 1)
        self.head = nn.Parameter(head, requires_grad=False)
        new = torch.zeros if init else torch.empty
        self.extra = nn.ParameterDict(
            {name: nn.Parameter(new(k, d + 1), requires_grad=False) for name in shape.extra_heads}
        )

    # ---- tables updated row-wise (not through autograd on the full tensor)
    def row_tables(self) -> dict[str, nn.Parameter]:
        tables = {"input": self.input_weight, "head": self.head}
        tables.update({f"extra.{n}": p for n, p in self.extra.items()})
        return tables

    def dense_parameters(self) -> dict[str, nn.Parameter]:
        return {n: p for n, p in self.named_parameters() if p.requires_grad}

    # ---- encoder
    def encode_tensors(
        self, indices: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        """h for a batch in EmbeddingBag form (the indices are rows of the input table)."""
        out: torch.Tensor = self.drop(self.layers(project_rows(self.input_weight, indices, offsets, values)))
        return out

    def layers(self, projected: torch.Tensor) -> torch.Tensor:
        """The encoder after the input projection, without dropout: the bias, then the hidden layers."""
        h = projected + self.input_bias
        for layer in self.hidden:
            h = layer(h)
        return h

    @torch.no_grad()
    def encode(self, x: sp.csr_matrix, chunk: int = 4096) -> torch.Tensor:
        """h(x) for every row of a CSR matrix, in eval mode (dropout off)."""
        was_training = self.training
        self.eval()
        device = self.input_weight.device
        parts = []
        try:
            for start in range(0, x.shape[0], chunk):
                ind, off, val = csr_to_tensors(x[start : start + chunk], device)
                parts.append(self.encode_tensors(ind, off, val))
        finally:
            self.train(was_training)
        if not parts:
            return torch.zeros(0, self.shape.dim, device=device)
        return torch.cat(parts)

    # ---- head
    @property
    def head_weight(self) -> torch.Tensor:
        return self.head[:, : self.shape.dim]

    @property
    def head_bias(self) -> torch.Tensor:
        return self.head[:, self.shape.dim]

    def score(self, h: torch.Tensor, label_ids: torch.Tensor | None = None) -> torch.Tensor:
        """f_k(x) = <w_k, h> + b_k for the given labels (all K when None); DropMax models add log ρ_k(x)."""
        rows = self.head if label_ids is None else self.head.index_select(0, label_ids)
        out = h @ rows[:, : self.shape.dim].T + rows[:, self.shape.dim]
        if "dropmax" in self.extra:  # DropMax predicts with f_k + log ρ_k(x) (trainer/dropmax.py)
            g = self.extra["dropmax"]
            g = g if label_ids is None else g.index_select(0, label_ids)
            out = out + F.logsigmoid(h @ g[:, : self.shape.dim].T + g[:, self.shape.dim])
        return out

    @torch.no_grad()
    def topk(self, x: sp.csr_matrix, k: int, budget: int = 1 << 23) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k (ids, scores) by blocked products, memory bounded by `budget` scores at a time.

        Blocks of at least `MIN_ROWS` rows: with many labels the head is read once per block of rows and
        scored in slices of labels (a running top-k), instead of once per row.
        """
        n, kk = x.shape[0], self.head.shape[0]
        k = min(k, kk)
        rows = max(MIN_ROWS, budget // max(kk, 1))
        cols = max(k, budget // rows)
        ids = np.zeros((n, k), dtype=np.int64)
        vals = np.zeros((n, k), dtype=np.float32)
        for start in range(0, n, rows):
            h = self.encode(x[start : start + rows])
            best_v = best_i = None
            for c0 in range(0, kk, cols):
                label_ids = None if cols >= kk else torch.arange(c0, min(kk, c0 + cols), device=h.device)
                v, i = torch.topk(self.score(h, label_ids), min(k, min(kk, c0 + cols) - c0), dim=1)
                i += c0
                if best_v is not None and best_i is not None:
                    v, where = torch.topk(torch.cat([best_v, v], 1), k, dim=1)
                    i = torch.gather(torch.cat([best_i, i], 1), 1, where)
                best_v, best_i = v, i
            assert best_v is not None and best_i is not None
            ids[start : start + rows] = best_i.cpu().numpy()
            vals[start : start + rows] = best_v.cpu().numpy()
        return ids, vals
