"""Why a label was chosen: per returned label, the input features that contributed most to its score.

For the linear encoder the score is f_k(x) = ⟨w_k, h(x)⟩ + b_k with h(x) = Σ_j x_j W_j + c (x the
featurized input: tf-idf and L2 for text, the fitted weighting for sparse features; W_j the input table's
row of feature j; c the input bias). So f_k(x) = (b_k + ⟨w_k, c⟩) + Σ_j x_j ⟨w_k, W_j⟩ exactly: each
feature's contribution is x_j ⟨w_k, W_j⟩ and they sum to the score minus that bias. With hidden layers
(mlp, maxout) or a DropMax gate the score is not linear in x; the contribution is then gradient × input,
x_j ∂f_k/∂x_j, a first-order approximation flagged as such.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from service.serving.predictor import InputRow, Predictor, RowPrediction

EXACT = "exact"
GRADIENT = "gradient_x_input"


def _net(predictor: Predictor) -> Any:
    """The torch module behind a loaded version (`trainer.model.XCModel`)."""
    loaded: Any = predictor.model
    return loaded.model


def method(predictor: Predictor) -> str:
    """Which kind of explanation the model allows: exact for a linear encoder without a DropMax gate."""
    net = _net(predictor)
    return EXACT if len(net.hidden) == 0 and "dropmax" not in net.extra else GRADIENT


def explain(
    predictor: Predictor, rows: Sequence[InputRow], preds: Sequence[RowPrediction], max_terms: int
) -> list[list[dict[str, Any]]]:
    """Per input, per returned label (in the answer's order), its explanation: method, bias, the
    `max_terms` largest contributions by magnitude, and how many features contributed."""
    x = predictor.featurize(rows)
    how = method(predictor)
    weight = predictor.model.head_weight
    bias = predictor.model.head_bias
    out: list[list[dict[str, Any]]] = []
    for i, (row, pred) in enumerate(zip(rows, preds, strict=True)):
        lo, hi = x.indptr[i], x.indptr[i + 1]
        cols = np.asarray(x.indices[lo:hi], dtype=np.int64)
        vals = np.asarray(x.data[lo:hi], dtype=np.float64)
        ids = np.asarray([b.id for b in pred.labels], dtype=np.int64)
        if how == EXACT:
            contrib, base = _exact(predictor, cols, vals, weight[ids], bias[ids])
        else:
            contrib, base = _gradient(predictor, cols, vals, ids)
        words = predictor.model.featurizer.terms_by_column(row.text) if row.text is not None else {}
        out.append([_one(how, base[k], contrib[:, k], cols, vals, words, max_terms) for k in range(ids.size)])
    return out


def _exact(
    predictor: Predictor, cols: np.ndarray, vals: np.ndarray, w: np.ndarray, b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(features × labels contributions, per-label bias) of the linear encoder, in float64."""
    net = _net(predictor)
    table = net.input_weight.detach()[torch.from_numpy(cols)].cpu().numpy().astype(np.float64)
    w64 = w.astype(np.float64)
    c = net.input_bias.detach().cpu().numpy().astype(np.float64)
    return vals[:, None] * (table @ w64.T), b.astype(np.float64) + w64 @ c


def _gradient(
    predictor: Predictor, cols: np.ndarray, vals: np.ndarray, ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Gradient × input through the encoder's layers (and the DropMax gate), one backward per label; the
    bias reported is the head's b_k."""
    net = _net(predictor)
    idx = torch.from_numpy(ids)
    rows = net.head.detach().index_select(0, idx)
    d = net.shape.dim
    if ids.size == 0:
        return np.zeros((cols.size, 0)), np.zeros(0)
    with torch.enable_grad():
        v = torch.tensor(vals, dtype=torch.float32, requires_grad=True)
        h = v @ net.input_weight.detach()[torch.from_numpy(cols)] + net.input_bias.detach()
        for layer in net.hidden:
            h = layer(h)
        scores = rows[:, :d] @ h + rows[:, d]
        if "dropmax" in net.extra:
            g = net.extra["dropmax"].detach().index_select(0, idx)
            scores = scores + F.logsigmoid(g[:, :d] @ h + g[:, d])
        grads = [torch.autograd.grad(scores[k], v, retain_graph=True)[0] for k in range(ids.size)]
    contrib = np.stack([gr.detach().numpy().astype(np.float64) for gr in grads], axis=1) * vals[:, None]
    return contrib, rows[:, d].numpy().astype(np.float64)


def _one(
    how: str,
    base: float,
    contrib: np.ndarray,
    cols: np.ndarray,
    vals: np.ndarray,
    words: dict[int, list[str]],
    max_terms: int,
) -> dict[str, Any]:
    top = np.argsort(-np.abs(contrib), kind="stable")[:max_terms]
    return {
        "method": how,
        "approximate": how != EXACT,
        "bias": float(base),
        "contributions": [
            {
                "feature": int(cols[j]),
                "word": " / ".join(words[int(cols[j])]) if int(cols[j]) in words else None,
                "value": float(vals[j]),
                "contribution": float(contrib[j]),
            }
            for j in top
        ],
        "n_features": int(np.count_nonzero(contrib)),
    }
