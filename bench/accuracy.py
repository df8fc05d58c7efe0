"""Accuracy on real data (issue 2, "Must show" 2): ovex against the extreme-classification peers.

On Bibtex and Corel5k, for each seed, trains and scores in one run, with one metric code
(`trainer.metrics.evaluate_topk` on each method's top-5 ids):

* `ovex-ove`, `ovex-ove-subset` (OVE paper eq. 6), `ovex-softmax`: default `TrainParams` with only `loss`
  and `seed` set, trained by `trainer.train.train` (the code path of `ovex train`), written as an artifact,
  loaded back and scored as `ovex evaluate` does;
* `ovex-ove-pairs` (NOT the defaults): `--group-size 1 --epochs 20`, the pairwise one-vs-each bound with
  the schedule it was tuned to (the defaults before round v7 of bench/results/accuracy_sweep.md), shown
  beside the grouped default so the gain of grouping is read off one table;
* `omikuji` (Parabel-style label trees, default hyper-parameters, trained on the XC file itself);
* `napkinxc-ovr` (one-vs-rest) and `napkinxc-plt` (probabilistic label tree), default settings;
* `sklearn-lr` / `sklearn-lr-l2`: one-vs-rest logistic regression (liblinear, C=1) on the raw rows and on
  L2-normalised rows: the linear references (the best choice differs between the two sets).

Peers are optional (`pip install .[bench]`); a missing one is skipped with a note. Results:
bench/results/accuracy.json (every run, means and spreads, targets) and bench/results/accuracy.md.

    .venv/bin/python bench/accuracy.py [--data-dir ../shared/data] [--seeds 0 1 2] [--methods ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from stamp import RESULTS, mean_std, stamp, stamped, under_title  # noqa: E402

from trainer import metrics as xc_metrics  # noqa: E402
from trainer.artifact import load_artifact  # noqa: E402
from trainer.data import Dataset, read_xc  # noqa: E402
from trainer.hooks import QuietHooks  # noqa: E402
from trainer.params import TrainParams  # noqa: E402
from trainer.train import train  # noqa: E402

SETS = ("bibtex", "corel5k")
OVEX = ("ovex-ove", "ovex-ove-pairs", "ovex-ove-subset", "ovex-softmax")
PAIRS = {"group_size": 1, "epochs": 20}  # the non-default row: pairwise OVE at its own best schedule
PEERS = ("omikuji", "napkinxc-ovr", "napkinxc-plt", "sklearn-lr", "sklearn-lr-l2")
METHODS = OVEX + PEERS
K = 5
REPORTED = ("p@1", "p@3", "p@5", "ndcg@5", "psp@1", "psp@5")

Top = np.ndarray  # [n, K] int64 label ids, -1 = padding


def _l2(x: sp.csr_matrix) -> sp.csr_matrix:
    norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel())
    norms[norms == 0] = 1.0
    return sp.csr_matrix(sp.diags(1.0 / norms) @ x)


def _label_lists(y: sp.csr_matrix) -> list[list[int]]:
    return [y.indices[y.indptr[i] : y.indptr[i + 1]].tolist() for i in range(y.shape[0])]


# ------------------------------------------------------------------------------------ methods


def run_ovex(
    loss: str, tr: Dataset, te: Dataset, seed: int, train_path: Path, extra: dict[str, Any] | None = None
) -> Top:
    """Default params (only loss, seed and `extra` set), artifact written and loaded back, scored exactly."""
    params = TrainParams(**{**(extra or {}), "loss": loss, "seed": seed})
    with tempfile.TemporaryDirectory(prefix="ovex-acc-") as tmp:
        train(params, tr, te, out_dir=Path(tmp) / "model", hooks=QuietHooks())
        model = load_artifact(Path(tmp) / "model")
        x = sp.csr_matrix(model.featurizer.transform(te), dtype=np.float32)
        top, _ = model.topk(x, K)
    return np.asarray(top, dtype=np.int64)


def run_omikuji(tr: Dataset, te: Dataset, seed: int, train_path: Path) -> Top:
    import omikuji

    model = omikuji.Model.train_on_data(str(train_path), omikuji.Model.default_hyper_param(), n_threads=1)
    assert te.X is not None
    x = sp.csr_matrix(te.X)
    rows = []
    for i in range(x.shape[0]):
        a, b = x.indptr[i], x.indptr[i + 1]
        pairs = list(zip(x.indices[a:b].tolist(), x.data[a:b].tolist(), strict=True))
        rows.append([label for label, _ in model.predict(pairs, top_k=K)])
    return xc_metrics.top_from_lists(rows, K)


def _napkinxc(kind: str) -> Callable[[Dataset, Dataset, int, Path], Top]:
    def run(tr: Dataset, te: Dataset, seed: int, train_path: Path) -> Top:
        from napkinxc import models

        assert tr.X is not None and te.X is not None
        with tempfile.TemporaryDirectory(prefix="napkinxc-") as tmp:
            if kind == "plt":
                model: Any = models.PLT(tmp, seed=seed, threads=1)
            else:
                model = models.OVR(tmp, threads=1)
            model.fit(sp.csr_matrix(tr.X, dtype=np.float32), _label_lists(sp.csr_matrix(tr.Y)))
            rows = model.predict(sp.csr_matrix(te.X, dtype=np.float32), top_k=K)
        return xc_metrics.top_from_lists([[int(r) for r in row] for row in rows], K)

    return run


def _sklearn(l2: bool) -> Callable[[Dataset, Dataset, int, Path], Top]:
    def run(tr: Dataset, te: Dataset, seed: int, train_path: Path) -> Top:
        from sklearn.linear_model import LogisticRegression
        from sklearn.multiclass import OneVsRestClassifier

        assert tr.X is not None and te.X is not None
        x, xt = sp.csr_matrix(tr.X, dtype=np.float64), sp.csr_matrix(te.X, dtype=np.float64)
        if l2:
            x, xt = _l2(x), _l2(xt)
        y = sp.csr_matrix(tr.Y, dtype=np.int64)
        clf = OneVsRestClassifier(LogisticRegression(solver="liblinear", C=1.0, random_state=seed))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # labels with no positive training row: constant predictors
            clf.fit(x, y)
            scores = np.asarray(clf.decision_function(xt), dtype=np.float64)
        # labels without a positive training row get a constant predictor scoring 0, above every real
        # (negative) decision value: rank them last instead
        scores[:, np.asarray(y.sum(axis=0)).ravel() == 0] = -np.inf
        top = np.argsort(-scores, axis=1, kind="stable")[:, :K]
        return top.astype(np.int64)

    return run


RUNNERS: dict[str, Callable[[Dataset, Dataset, int, Path], Top]] = {
    "ovex-ove": lambda tr, te, s, p: run_ovex("ove", tr, te, s, p),
    "ovex-ove-subset": lambda tr, te, s, p: run_ovex("ove-subset", tr, te, s, p),
    "ovex-softmax": lambda tr, te, s, p: run_ovex("softmax", tr, te, s, p),
    "ovex-ove-pairs": lambda tr, te, s, p: run_ovex("ove", tr, te, s, p, PAIRS),
    "omikuji": run_omikuji,
    "napkinxc-ovr": _napkinxc("ovr"),
    "napkinxc-plt": _napkinxc("plt"),
    "sklearn-lr": _sklearn(l2=False),
    "sklearn-lr-l2": _sklearn(l2=True),
}
REQUIRES = {"omikuji": "omikuji", "napkinxc-ovr": "napkinxc", "napkinxc-plt": "napkinxc",
            "sklearn-lr": "sklearn", "sklearn-lr-l2": "sklearn"}


def available(method: str) -> bool:
    module = REQUIRES.get(method)
    if module is None:
        return True
    try:
        __import__(module)
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------------------------ summary


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """set -> method -> metric -> {mean, std, min, max} over seeds (train seconds included)."""
    out: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["set"], r["method"]), []).append(r)
    for (name, method), rs in groups.items():
        stats: dict[str, dict[str, float]] = {}
        for key in (*REPORTED, "seconds"):
            vals = np.array([r["metrics"][key] if key != "seconds" else r["seconds"] for r in rs])
            std = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
            stats[key] = {"mean": float(vals.mean()), "std": std, "min": float(vals.min()),
                          "max": float(vals.max()), "n": len(vals)}
        out.setdefault(name, {})[method] = stats
    return out


def targets(summary: dict[str, dict[str, dict[str, dict[str, float]]]]) -> dict[str, dict[str, Any]]:
    """Issue 2: ove's P@1 within 1 point of softmax, and >= the best peer's P@1, on each set."""
    out: dict[str, dict[str, Any]] = {}
    for name, by_method in summary.items():
        p1 = {m: s["p@1"]["mean"] for m, s in by_method.items()}
        t: dict[str, Any] = {}
        if "ovex-ove" in p1 and "ovex-softmax" in p1:
            gap = p1["ovex-ove"] - p1["ovex-softmax"]
            t["ove_minus_softmax"] = gap
            t["ove_within_1pt_of_softmax"] = bool(gap >= -0.01)
        peers = {m: v for m, v in p1.items() if m in PEERS}
        if "ovex-ove" in p1 and peers:
            best = max(peers, key=lambda m: peers[m])
            t["best_peer"] = best
            t["best_peer_p@1"] = peers[best]
            t["ove_minus_best_peer"] = p1["ovex-ove"] - peers[best]
            t["ove_at_least_best_peer"] = bool(p1["ovex-ove"] >= peers[best])
        if "ovex-ove" in p1 and "ovex-ove-pairs" in p1:
            t["ove_minus_ove_pairs"] = p1["ovex-ove"] - p1["ovex-ove-pairs"]
        out[name] = t
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Accuracy on real data: ovex vs peers",
        "",
        f"Command: `{result['command']}`  ",
        f"Seeds: {result['seeds']}; mean ± sample std over seeds; every method scored by "
        "`trainer.metrics.evaluate_topk` on its top-5 test predictions; train s = wall time to train "
        "and score on a shared 2-core CPU, one thread (indicative only).  ",
        f"ovex defaults: `{json.dumps(result['ovex_defaults'])}`",
        "",
    ]
    for name, by_method in result["summary"].items():
        lines += [f"## {name}", "", "| method | P@1 | P@3 | P@5 | nDCG@5 | PSP@1 | PSP@5 | s |",
                  "|---|---|---|---|---|---|---|---|"]
        for method in METHODS:
            if method not in by_method:
                continue
            s = by_method[method]
            cells = [mean_std(s[k]) if k == "p@1" else f"{s[k]['mean']:.4f}"
                     for k in REPORTED]
            lines.append(f"| {method} | " + " | ".join(cells) + f" | {s['seconds']['mean']:.0f} |")
        t = result["targets"].get(name, {})
        lines.append("")
        if "ove_minus_softmax" in t:
            lines.append(f"- ove − softmax P@1: {t['ove_minus_softmax']:+.4f} "
                         f"(target ≥ −0.01: {'met' if t['ove_within_1pt_of_softmax'] else 'NOT met'})")
        if "best_peer" in t:
            lines.append(f"- ove − best peer ({t['best_peer']}, {t['best_peer_p@1']:.4f}) P@1: "
                         f"{t['ove_minus_best_peer']:+.4f} "
                         f"(target ≥ 0: {'met' if t['ove_at_least_best_peer'] else 'NOT met'})")
        if "ove_minus_ove_pairs" in t:
            group = result["ovex_defaults"]["group_size"]
            lines.append(f"- ove (groups of {group}) − ove-pairs (groups of 1, 20 epochs) P@1: "
                         f"{t['ove_minus_ove_pairs']:+.4f}")
        lines.append("")
    for note in result.get("notes", []):
        lines.append(f"- {note}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the CPU is shared)")
    ap.add_argument("--out", type=Path, default=RESULTS / "accuracy")
    args = ap.parse_args()
    st = stamp()
    torch.set_num_threads(args.threads)

    notes: list[str] = []
    methods = [m for m in args.methods if available(m)]
    for m in args.methods:
        if m not in methods:
            notes.append(f"{m} skipped: its package is not installed (pip install .[bench])")
    runs: list[dict[str, Any]] = []
    result: dict[str, Any] = {
        "command": "python bench/accuracy.py " + " ".join(sys.argv[1:]),
        "seeds": args.seeds,
        "ovex_defaults": TrainParams().to_json_dict(),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": args.threads},
        "runs": runs,
        "notes": notes,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.sets:
        train_path = args.data_dir / f"{name}_train.txt"
        tr, te = read_xc(train_path), read_xc(args.data_dir / f"{name}_test.txt")
        y_test = sp.csr_matrix(te.Y)
        prop = xc_metrics.propensities(sp.csr_matrix(tr.Y))
        for method in methods:
            for seed in args.seeds:
                torch.manual_seed(seed)
                t0 = time.perf_counter()
                top = RUNNERS[method](tr, te, seed, train_path)
                seconds = time.perf_counter() - t0
                m = xc_metrics.evaluate_topk(top, y_test, prop)
                runs.append({"set": name, "method": method, "seed": seed, "seconds": seconds, "metrics": m})
                print(f"{name:8s} {method:16s} seed {seed} p@1 {m['p@1']:.4f} p@3 {m['p@3']:.4f} "
                      f"p@5 {m['p@5']:.4f} ndcg@5 {m['ndcg@5']:.4f} {seconds:6.1f}s", flush=True)
                result["summary"] = summarise(runs)
                result["targets"] = targets(result["summary"])
                args.out.with_suffix(".json").write_text(json.dumps(stamped(st, result), indent=1))
    args.out.with_suffix(".md").write_text(under_title(markdown(result), st))
    print(markdown(result))


if __name__ == "__main__":
    main()
