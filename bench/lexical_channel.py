"""A lexical channel for labels known only by their text, beside the defaults' model (a design probe).

A head row can only score ⟨h(x), v⟩, and the encoder keeps little of the words a test-only label's text
shares with an input (`docs/training.md`, label texts). This asks what a channel that keeps them would give:
each WordNet test-only label is scored α·cos(x, text) + β, the tf-idf cosine of the input row and the
label's text under the model's own featurizer, and competes with the trained labels' scores as trained.
The `sketch` rows compute the cosine through a fixed sparse sign projection of width m (seeded), which a
served model could hold as m more input columns and head columns, so it would stay an ordinary linear
head. Two diagnostics beside them: the exact channel with each row's own text set aside (a WordNet noun is
often itself the label of its hyponyms, and its text then matches the row's almost word for word, though
it is never the row's label), and the exact channel with the trained labels reading their texts too.
Each seed's model is trained once by `ovex train` with the defaults (real.py's `run_ovex`) and rescored
over the grid; one scorer and label space as real.py. A record of a design probe, not a feature:
`make bench ONLY=lexical_channel`.

    .venv/bin/python bench/lexical_channel.py [--seeds 0 1 2] [--alphas 10 20 ...] [--betas 2 4 ...]
        [--widths 512 1024 2048] [--out bench/results/lexical_channel]
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
WIDTHS = (512, 1024, 2048)
TRAINED_ALPHAS = (2.0, 5.0)
SHOWN = ("p@1", "p@5", "p@1 trained rows", "unseen hit@5")
SELF = 0.9  # a cosine this high is the row's own text: WordNet's nouns are labels of their hyponyms
SKETCH_NNZ = 8  # each term's nonzeros in a sketch column: spread thin, so no term can pass for another


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


def sketch(n_features: int, m: int, seed: int) -> sp.csr_matrix:
    """A sparse sign projection (n_features × m, SKETCH_NNZ entries ±1/√SKETCH_NNZ a term, seeded): what a
    served model would hold as m fixed input columns; ⟨xS, zS⟩ estimates ⟨x, z⟩ without bias."""
    rng = np.random.default_rng(seed)
    nnz = min(SKETCH_NNZ, m)
    cols = rng.integers(0, m, size=(n_features, nnz))
    while (dup := (np.diff(np.sort(cols, axis=1), axis=1) == 0).any(axis=1)).any():  # distinct columns a term
        cols[dup] = rng.integers(0, m, size=(int(dup.sum()), nnz))
    signs = rng.choice([-1.0, 1.0], size=cols.shape) / np.sqrt(cols.shape[1])
    rows = np.repeat(np.arange(n_features), cols.shape[1])
    return sp.csr_matrix((signs.ravel().astype(np.float32), (rows, cols.ravel())), shape=(n_features, m))


def rescored(model: Any, x: sp.csr_matrix, texts: sp.csr_matrix, to_shared: np.ndarray, first_unseen: int,
             alphas: list[float], betas: list[float], widths: list[int], seed: int,
             trained_texts: sp.csr_matrix | None = None,
             trained_alphas: tuple[float, ...] = ()) -> dict[str, np.ndarray]:
    """Top-K shared ids for the model alone and for each channel, α and β; with `trained_texts` (the
    trained labels' texts, in the model's order), also the exact channel with each trained label scoring
    α_t·cos(x, its text) more."""
    channels: list[tuple[str, sp.csr_matrix | None, Any]] = [("exact", None, texts),
                                                             ("exact, own text set aside", None, texts)]
    for m in widths:  # the input side's projection, and the texts already projected
        proj = sketch(x.shape[1], m, seed)
        channels.append((f"sketch {m}", proj, (texts @ proj).toarray()))
    unseen_ids = first_unseen + np.arange(texts.shape[0])
    h = model.encode(x)
    tops: dict[str, list[np.ndarray]] = {"model alone": []}
    for s in range(0, x.shape[0], 2048):
        own_full = h[s:s + 2048] @ model.head_weight.T + model.head_bias
        own_scores, own = _best(own_full, to_shared)
        tops["model alone"].append(own)
        rows = x[s:s + 2048]
        trained = [] if trained_texts is None else [
            (a_t, _best(own_full + a_t * (rows @ trained_texts.T).toarray(), to_shared))
            for a_t in trained_alphas]
        for name, proj, t in channels:
            cos = (rows @ t.T).toarray() if proj is None else (rows @ proj).toarray() @ t.T
            if name.endswith("set aside"):
                cos[cos > SELF] = 0.0
            best_cos, best = _best(cos, unseen_ids)
            heads = [("", own_scores, own)] + ([(f", trained labels α_t {a_t:g}", *b) for a_t, b in trained]
                                                if name == "exact" else [])
            for tag, head_scores, head in heads:
                ids = np.concatenate([head, best], 1)
                for a in alphas:
                    for b in betas:
                        both = np.concatenate([head_scores, a * best_cos + b], 1)
                        tops.setdefault(f"{name} α {a:g} β {b:g}{tag}", []).append(_best(both, ids)[1])
    return {k: np.concatenate(v) for k, v in tops.items()}


def near_identical(x: sp.csr_matrix, texts: sp.csr_matrix, truth: Truth) -> dict[str, float]:
    """How many test rows have a label whose text is nearly their own (cosine above SELF), and how often
    such a label is one of the row's own: a channel that reads texts ranks it first, rightly or not."""
    rows, gold = 0, 0
    for s in range(0, x.shape[0], 2048):
        cos = (x[s:s + 2048] @ texts.T).tocsr()
        cos.data[cos.data <= SELF] = 0.0
        cos.eliminate_zeros()
        for i in range(cos.shape[0]):
            near = cos.indices[cos.indptr[i]:cos.indptr[i + 1]]
            rows += near.size > 0
            gold += any(int(k) in truth.gold[s + i] for k in near)
    return {"rows": rows / x.shape[0], "rows_where_one_is_gold": gold / max(rows, 1)}


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
    every_name_text = [label_text.get(name, "") for name in b.names]  # the shared label space's order
    truth = Truth.of(b.y_test, first)
    runs: dict[str, list[dict[str, float]]] = {}
    near: list[dict[str, float]] = []
    index = {name: i for i, name in enumerate(b.names)}
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix="ovex-lexical-") as tmp:
            run_ovex(b, "wordnet", "ovex", seed, [], Path(tmp))
            model = load_artifact(Path(tmp) / "model")
        to_shared = np.array([index.get(n, -1) for n in model.label_names], dtype=np.int64)
        assert (to_shared >= 0).all(), "every trained label is in the shared label space"
        x = model.featurizer.transform(b.test)
        every_text = model.featurizer.transform_texts(every_name_text)  # featurized once, sliced below
        texts, trained_texts = every_text[first:], every_text[to_shared]
        near.append(near_identical(x, every_text, truth))
        tops = rescored(model, x, texts, to_shared, first, args.alphas, args.betas, args.widths, seed,
                        trained_texts, TRAINED_ALPHAS)
        for name, top in tops.items():
            runs.setdefault(name, []).append(_metrics(top, b.y_test, prop, truth, first))
        print(f"seed {seed}: model alone {runs['model alone'][-1]}", flush=True)
    result: dict[str, Any] = {
        **finish(st), "seeds": args.seeds, "unseen_labels": len(b.names) - first,
        "near_identical": {k: _stats([n[k] for n in near]) for k in near[0]},
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
        "that carry one whose top 5 holds one. `sketch m`: the cosine through a sparse sign projection of "
        f"width m ({SKETCH_NNZ} nonzeros a term). `own text set aside`: a diagnostic, not a linear head: the "
        f"exact channel with each test-only label whose text has cosine above {SELF} with the row left out. "
        "`trained labels α_t`: every trained label also scores α_t·cos(x, its text).",
        "",
        f"Test rows with a label (of every label) whose text has cosine above {SELF} with theirs: "
        f"{result['near_identical']['rows']['mean']:.4f}; of those rows, the share where such a label is one "
        f"of the row's own: {result['near_identical']['rows_where_one_is_gold']['mean']:.4f}.",
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
