"""A lexical channel for labels known only by their text, beside the defaults' model (a design probe).

A head row can only score ⟨h(x), v⟩, and the encoder keeps little of the words a test-only label's text
shares with an input (`docs/training.md`, label texts). This asks what a channel that keeps them would give:
each WordNet test-only label is scored α·cos(x, text) + β, the tf-idf cosine of the input row and the
label's text under the model's own featurizer, and competes with the trained labels' scores as trained.
The `projected` rows compute the cosine through a fixed random projection of width m (Gaussian, seeded),
which a served model could hold as m more input columns and head columns, so it would stay an ordinary
linear head. Each seed's model is trained once by `ovex train` with the defaults (real.py's `run_ovex`) and
rescored over the grid; one scorer and label space as real.py. A record of a design probe, not a feature:
`make bench ONLY=lexical_channel`.

    .venv/bin/python bench/lexical_channel.py [--seeds 0 1 2] [--alphas 10 20 ...] [--betas 2 4 ...]
        [--widths 512 1024] [--out bench/results/lexical_channel]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from real import K, _cell, _stats, load_set, run_ovex  # noqa: E402
from stamp import RESULTS, finish, markdown_line, stamp, write_results  # noqa: E402

from trainer import metrics as xc_metrics  # noqa: E402

ALPHAS = (10.0, 20.0, 30.0, 40.0)
BETAS = (2.0, 3.0, 4.0, 5.0, 6.0)
WIDTHS = (512, 1024)
SHOWN = ("p@1", "p@5", "p@1 trained rows", "unseen hit@5")


def _best(scores: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The K best of each row's scores and the ids beside them, best first."""
    idx = np.argpartition(-scores, K - 1, axis=1)[:, :K]
    idx = np.take_along_axis(idx, np.argsort(-np.take_along_axis(scores, idx, 1), 1), 1)
    top = np.take_along_axis(ids, idx, 1) if ids.ndim == 2 else ids[idx]
    return np.take_along_axis(scores, idx, 1), top


@dataclass(frozen=True)
class Truth:
    """Each test row's labels in the shared space, and which rows carry a test-only label (read once)."""

    gold: list[set[int]]
    unseen: np.ndarray  # bool [rows]

    @classmethod
    def of(cls, y_test: sp.csr_matrix, first_unseen: int) -> Truth:
        y = sp.csr_matrix(y_test)
        gold = [set(y.indices[y.indptr[i]:y.indptr[i + 1]].tolist()) for i in range(y.shape[0])]
        return cls(gold, np.array([any(g >= first_unseen for g in labels) for labels in gold]))


def _metrics(top: np.ndarray, y_test: sp.csr_matrix, prop: np.ndarray, truth: Truth,
             first_unseen: int) -> dict[str, float]:
    m = xc_metrics.evaluate_topk(top, y_test, prop)
    rows = list(zip(top.tolist(), truth.gold, strict=True))
    found = np.array([any(t >= first_unseen and t in g for t in row) for row, g in rows])
    first_right = np.array([row[0] in g for row, g in rows])
    return {"p@1": float(m["p@1"]), "p@5": float(m["p@5"]),
            "p@1 trained rows": float(first_right[~truth.unseen].mean()),
            "unseen hit@5": float(found[truth.unseen].mean())}


def rescored(model: Any, x: sp.csr_matrix, texts: sp.csr_matrix, to_shared: np.ndarray, first_unseen: int,
             alphas: list[float], betas: list[float], widths: list[int], seed: int) -> dict[str, np.ndarray]:
    """Top-K shared ids for the model alone and for each channel, α and β."""
    rng = np.random.default_rng(seed)
    channels: list[tuple[str, np.ndarray | None, Any]] = [("exact", None, texts)]
    for m in widths:  # the input side's projection, and the texts already projected
        proj = rng.standard_normal((x.shape[1], m)).astype(np.float32) / np.sqrt(m)
        channels.append((f"projected {m}", proj, texts @ proj))
    unseen_ids = first_unseen + np.arange(texts.shape[0])
    h = model.encode(x)
    tops: dict[str, list[np.ndarray]] = {"model alone": []}
    for s in range(0, x.shape[0], 2048):
        own_scores, own = _best(h[s:s + 2048] @ model.head_weight.T + model.head_bias, to_shared)
        tops["model alone"].append(own)
        rows = x[s:s + 2048]
        for name, proj, t in channels:
            cos = rows @ t.T if proj is None else (rows @ proj) @ t.T
            best_cos, best = _best(cos.toarray() if sp.issparse(cos) else np.asarray(cos), unseen_ids)
            ids = np.concatenate([own, best], 1)
            for a in alphas:
                for b in betas:
                    both = np.concatenate([own_scores, a * best_cos + b], 1)
                    tops.setdefault(f"{name} α {a:g} β {b:g}", []).append(_best(both, ids)[1])
    return {k: np.concatenate(v) for k, v in tops.items()}


def main() -> None:
    from trainer.artifact import load_artifact

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--alphas", nargs="+", type=float, default=list(ALPHAS))
    ap.add_argument("--betas", nargs="+", type=float, default=list(BETAS))
    ap.add_argument("--widths", nargs="+", type=int, default=list(WIDTHS))
    ap.add_argument("--out", type=Path, default=RESULTS / "lexical_channel")
    args = ap.parse_args()
    st = stamp()
    b = load_set("wordnet", args.data_dir)
    prop = xc_metrics.propensities(b.y_train)
    first = b.n_train_labels
    with open(args.data_dir / "wordnet_label_texts.jsonl") as fh:
        label_text = {(r := json.loads(line))["name"]: r["text"] for line in fh}
    unseen_texts = [label_text.get(name, "") for name in b.names[first:]]
    truth = Truth.of(b.y_test, first)
    runs: dict[str, list[dict[str, float]]] = {}
    index = {name: i for i, name in enumerate(b.names)}
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix="ovex-lexical-") as tmp:
            run_ovex(b, "wordnet", "ovex", seed, [], Path(tmp))
            model = load_artifact(Path(tmp) / "model")
        to_shared = np.array([index.get(n, -1) for n in model.label_names], dtype=np.int64)
        x = model.featurizer.transform(b.test)
        texts = model.featurizer.transform_texts(unseen_texts)
        tops = rescored(model, x, texts, to_shared, first, args.alphas, args.betas, args.widths, seed)
        for name, top in tops.items():
            runs.setdefault(name, []).append(_metrics(top, b.y_test, prop, truth, first))
        print(f"seed {seed}: model alone {runs['model alone'][-1]}", flush=True)
    result: dict[str, Any] = {
        **finish(st), "seeds": args.seeds, "unseen_labels": len(unseen_texts),
        "rows": {k: {m: _stats([r[m] for r in rs]) for m in SHOWN} for k, rs in runs.items()}, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, result, st, markdown)
    print(markdown(result))


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# A lexical channel for test-only labels beside the defaults' model (WordNet)",
        "",
        markdown_line(result) + "  ",
        f"Seeds {result['seeds']}: mean ± sample std. Each of the {result['unseen_labels']:,} test-only "
        "labels scores α·cos(x, its text) + β beside the trained labels' scores as trained. p@1 trained "
        "rows: P@1 over the test rows that carry no test-only label; unseen hit@5: the share of the rows "
        "that carry one whose top 5 holds one.",
        "",
        "| scoring | " + " | ".join(SHOWN) + " |",
        "|---" * (len(SHOWN) + 1) + "|",
    ]
    for name, a in result["rows"].items():
        cells = " | ".join(_cell(a, k, std=True) for k in SHOWN)
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
