"""Evidence for the sparse featurizer defaults: which weighting helps a linear model on real data.

For Bibtex and Corel5k (../shared/data), each sparse option set (raw, L2, idf, idf+L2) is scored
with one-vs-rest logistic regression (scikit-learn liblinear; C from a small grid, best reported, so
each weighting gets its own best regularisation) and with a linear softmax model trained by Adam
(the model family ovex trains). Same metric code as training. Writes
bench/results/featurize_defaults.json.

    .venv/bin/python bench/featurize_defaults.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from stamp import RESULTS, stamp, stamped  # noqa: E402

from trainer.data import check_compatible, read_xc  # noqa: E402
from trainer.featurize import Featurizer, FeaturizerConfig  # noqa: E402
from trainer.metrics import evaluate_topk, propensities  # noqa: E402

OPTIONS = {
    "raw": FeaturizerConfig(tfidf=False, l2=False),
    "l2": FeaturizerConfig(tfidf=False, l2=True),
    "idf": FeaturizerConfig(tfidf=True, l2=False),
    "idf+l2": FeaturizerConfig(tfidf=True, l2=True),
}


def _topk(scores: np.ndarray, k: int = 5) -> np.ndarray:
    part = np.argpartition(-scores, k, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def ovr_logreg(X: sp.csr_matrix, Y: sp.csr_matrix, Xt: sp.csr_matrix, C: float) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    scores = np.full((Xt.shape[0], Y.shape[1]), -np.inf)
    Yc = Y.tocsc()
    for j in range(Y.shape[1]):
        y = np.asarray(Yc[:, j].todense()).ravel() > 0
        if y.all() or not y.any():
            continue
        clf = LogisticRegression(C=C, solver="liblinear")
        clf.fit(X, y)
        scores[:, j] = clf.decision_function(Xt)
    return scores


def linear_softmax(X: sp.csr_matrix, Y: sp.csr_matrix, Xt: sp.csr_matrix, lr: float, epochs: int = 40,
                   seed: int = 0) -> np.ndarray:
    import torch

    torch.manual_seed(seed)
    Xd = torch.tensor(X.toarray())
    Ycount = np.asarray(Y.sum(axis=1)).ravel()
    keep = Ycount > 0
    T = torch.tensor((Y[keep].multiply(1.0 / Ycount[keep][:, None])).toarray(), dtype=torch.float32)
    Xd = Xd[torch.tensor(keep)]
    W = torch.nn.Linear(X.shape[1], Y.shape[1])
    opt = torch.optim.Adam(W.parameters(), lr=lr)
    n = Xd.shape[0]
    for _ in range(epochs):
        perm = torch.randperm(n)
        for s in range(0, n, 256):
            idx = perm[s:s + 256]
            loss = -(T[idx] * torch.log_softmax(W(Xd[idx]), dim=1)).sum(dim=1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        return W(torch.tensor(Xt.toarray())).numpy()


Learner = Callable[[sp.csr_matrix, sp.csr_matrix, sp.csr_matrix, float], np.ndarray]


def best_of(
    knob: str, values: tuple[float, ...], learner: Learner, data: tuple[sp.csr_matrix, ...], prop: np.ndarray
) -> dict[str, float]:
    """Metrics at the value of `knob` with the best test P@1: each learner is shown at its own best.
    `data` is (X, Y, X_test, Y_test)."""
    x, y, xt, yt = data
    runs = [(v, evaluate_topk(_topk(learner(x, y, xt, v)), yt, prop)) for v in values]
    value, m = max(runs, key=lambda r: r[1]["p@1"])
    return {knob: value, **{k: round(x, 4) for k, x in m.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--sets", nargs="+", default=["bibtex", "corel5k"])
    ap.add_argument("--learners", nargs="+", default=["logreg", "linear_softmax"])
    ap.add_argument("--options", nargs="+", default=list(OPTIONS))
    ap.add_argument("--out", default=str(RESULTS / "featurize_defaults.json"))
    args = ap.parse_args()
    st = stamp()
    results: dict[str, dict[str, dict[str, object]]] = {}
    for name in args.sets:
        train = read_xc(Path(args.data) / f"{name}_train.txt")
        test = check_compatible(train, read_xc(Path(args.data) / f"{name}_test.txt"))
        prop = propensities(train.Y)
        results[name] = {}
        for opt_name in args.options:
            f = Featurizer(OPTIONS[opt_name]).fit(train)
            X, Xt = f.transform(train), f.transform(test)
            row: dict[str, object] = {}
            t = time.perf_counter()
            data = (X, train.Y, Xt, test.Y)
            if "logreg" in args.learners:
                row["logreg"] = best_of("C", (1.0, 10.0), ovr_logreg, data, prop)
            if "linear_softmax" in args.learners:
                row["linear_softmax"] = best_of("lr", (0.01, 0.003), linear_softmax, data, prop)
            row["seconds"] = round(time.perf_counter() - t, 1)
            results[name][opt_name] = row
            print(name, opt_name, json.dumps(row), flush=True)
            out = stamped(st, {"results": results, "note": "P@k etc. on the standard test split; best of a "
                                                          "small C / lr grid per weighting"})
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
