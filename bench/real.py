"""Real-data benchmark: `ovex train` as a user runs it, against omikuji, napkinXC's PLT and popularity.

Sets (read from `--data-dir`, default ../shared/data; never copied into the repo):

* `wordnet`: JSONL texts, 15,958 training labels (1,199 more occur only in the test rows: misses for all);
* `wordnet-texts`: the same rows with the set's label texts (`wordnet_label_texts.jsonl`, every label's),
  which each method uses as it can: ovex trains with `--label-texts` (its defaults: each text also a
  training row of its label, and the labels no training row has answered from their texts); the peers
  train on the same texts as rows, one per label that has training rows, labelled with that label. An
  input's twins (labels whose text is its own, `trainer.twins`) are left out of every method's answers
  by ovex's rule on the training rows, which never carry theirs here. Scored as `wordnet`: propensities
  and tails from the training rows alone;
* `bibtex`, `corel5k`: XC files, the standard splits;
* `synth-1e5`: planted data at scale (`trainer.synth`, seed 7: 100,000 labels, 50,000 features, 100,000
  training and 2,000 test rows), written once to a cache under the system's temporary directory.

Methods (each (set, method, seed) in its own child process, so peak RSS and crashes are per run):

* `ovex`: the console command `ovex train --train FILE --out DIR --seed S --quiet` (defaults; no `--test`, so
  no per-epoch evaluation is timed) as a subprocess, on the JSONL for wordnet (ovex's own featurizer) and
  the XC file otherwise; the artifact is loaded back and the test rows scored with `model.topk`; one
  untimed run of a small planted set first loads (on a fresh checkout, compiles) ovex's numba kernels;
* `ovex-tfidf` (wordnet only): the same command on the peers' TF-IDF features written as an XC file;
* `omikuji`: Parabel-style trees, default hyper-parameters, all cores (training and prediction, with the
  weights densified above density 0.1 first, as omikuji's own `test` command does), on the peers'
  features; its training time ends with the model saved (`Model.save`, timed apart as `save_s`), as
  `ovex train` and napkinXC's `fit` end with theirs on disk;
* `omikuji-lead` (text sets): omikuji as above on the peers' features plus the marked leading words ovex's
  featurizer adds by default (`--lead-words`): what that default is worth to a peer;
* `napkinxc-plt`: napkinXC's probabilistic label tree, default settings, on the peers' features;
* `popularity`: the 5 most frequent training labels for every row (the floor).

The peers' features are the XC files as given, and for wordnet
`TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=2)` fit on the training texts (its time is
part of the peers' training time and reported on its own). Every method's top-5 predictions are mapped to
label names and scored in one label space (training labels first, test-only ones after) by one scorer:
`trainer.metrics.evaluate_topk` plus `tail_metrics` below.

    .venv/bin/python bench/real.py [--sets wordnet bibtex corel5k] [--methods ...] [--seeds 0 1 2]
        [--out bench/results/real] [--ovex-args="--dim 256" --label "ovex[--dim 256]"]

`--ovex-args` adds, after each default `ovex` / `ovex-tfidf` row, one more row trained with those extra
flags, labelled `--label` (default `ovex[ARGS]`; the tfidf row gets `-tfidf` appended to a given label);
given more than once, one row for each, the n-th `--label` naming the n-th row.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib.util
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from stamp import finish, machine, stamp, write_results  # noqa: E402, F401  (machine, _git: imported from here by others)
from stamp import git as _git  # noqa: E402, F401

from trainer import metrics as xc_metrics  # noqa: E402
from trainer.data import Dataset, in_label_space, read_jsonl, read_xc, write_xc  # noqa: E402
from trainer.params import TrainParams  # noqa: E402

SETS = ("wordnet", "bibtex", "corel5k", "synth-1e5", "wordnet-texts")
TEXT_SETS = ("wordnet", "wordnet-texts")  # JSONL rows: the peers' features are TF-IDF of the texts
# planted sets: labels, features, training rows, test rows, seed (`ovex synth`)
SYNTH: dict[str, tuple[int, int, int, int, int]] = {"synth-1e5": (100_000, 50_000, 100_000, 2_000, 7)}
METHODS = ("ovex", "ovex-tfidf", "omikuji", "omikuji-lead", "napkinxc-plt", "popularity")
OVEX_METHODS = ("ovex", "ovex-tfidf")
# needs texts to build the peers' features from: wordnet only (not wordnet-texts: ovex's label tower
# cannot read texts through a feature file)
TEXT_ONLY = ("ovex-tfidf",)
# the peers' features plus ovex's marked leading words: texts only (either text set)
LEAD_PEERS = ("omikuji-lead",)
REQUIRES = {"omikuji": "omikuji", "omikuji-lead": "omikuji", "napkinxc-plt": "napkinxc"}
K = 5
REPORTED = ("p@1", "p@3", "p@5", "ndcg@5", "psp@1", "psp@5")
TAIL_MAX = 5  # a tail label has 1..TAIL_MAX training rows
BUCKETS: tuple[tuple[str, int, float], ...] = (
    ("1-5", 1, 5), ("6-20", 6, 20), ("21-100", 21, 100), (">100", 101, float("inf")))
TABLE = (*REPORTED, "tail_p@1", "tail_p@5", "train_wall_s", "train_cpu_s", "peak_rss_mb",
         "predict_rows_per_s")
SUMMARISED = (*TABLE, "featurize_s", "test_featurize_s", "save_s", *(f"p@1[{b}]" for b, _, _ in BUCKETS))
RESULTS = ROOT / "bench" / "results"
TFIDF: dict[str, Any] = {"sublinear_tf": True, "ngram_range": (1, 2), "min_df": 2}


# ------------------------------------------------------------------------------------ metrics


def tail_metrics(top: np.ndarray, y_test: sp.spmatrix, train_counts: np.ndarray) -> dict[str, Any]:
    """Tail precision and P@1 by frequency bucket, from top-k ids (-1 = padding) and training label counts.

    Shows where a method's accuracy comes from: `tail_p@k` is, over the test rows with at least one true
    label of 1..TAIL_MAX training rows, the mean share of the top k that are such labels of that row (None
    without such rows); `p@1[b]` is P@1 over the rows whose rarest true label with training rows falls in
    bucket b (rows with no such label are left out), `rows[b]` their number. Labels past
    `train_counts` have no training rows.
    """
    y = sp.csr_matrix(y_test)
    y.sum_duplicates()
    n, n_labels = y.shape
    counts = np.zeros(n_labels, np.int64)
    m = min(n_labels, len(train_counts))
    counts[:m] = np.asarray(train_counts, np.int64)[:m]
    top = np.asarray(top, np.int64)  # [n, any width]: cut or padded to K
    if top.shape[1] < K:
        top = np.hstack([top, np.full((n, K - top.shape[1]), -1, np.int64)])
    top = top[:, :K]
    hit = xc_metrics.hits(top, y, K) if n else np.zeros((0, K), bool)
    is_tail = (counts >= 1) & (counts <= TAIL_MAX)
    tail_hit = hit & is_tail[np.clip(top, 0, None)] & (top >= 0)
    row_of = np.repeat(np.arange(n), np.diff(y.indptr))
    has_tail = np.bincount(row_of[is_tail[y.indices]], minlength=n) > 0
    out: dict[str, Any] = {"tail_rows": int(has_tail.sum())}
    for k in (1, K):
        out[f"tail_p@{k}"] = float(tail_hit[has_tail, :k].sum(axis=1).mean() / k) if has_tail.any() else None
    known = counts[y.indices].astype(np.float64)
    known[known == 0] = np.inf
    rarest = np.full(n, np.inf)
    np.minimum.at(rarest, row_of, known)
    rows: dict[str, int] = {}
    for name, lo, hi in BUCKETS:
        in_bucket = np.isfinite(rarest) & (rarest >= lo) & (rarest <= hi)
        rows[name] = int(in_bucket.sum())
        out[f"p@1[{name}]"] = float(hit[in_bucket, 0].mean()) if in_bucket.any() else None
    out["rows"] = rows
    return out


# ------------------------------------------------------------------------------------ data


@dataclass
class Bench:
    """One set in the shared label space: training labels in a fixed order, test-only labels after them."""

    train: Dataset  # as read (texts for wordnet, features for XC)
    test: Dataset  # as read, labels in the shared space
    names: list[str]  # the shared label space: label id -> name
    y_train: sp.csr_matrix  # n_train x len(names)
    y_test: sp.csr_matrix  # n_test x len(names)
    train_path: Path
    n_train_labels: int
    label_texts: Path | None = None  # the set's label texts (`wordnet-texts`)
    # the label texts as rows for the peers: (texts, labels in the shared space), one per label with rows
    text_rows: tuple[list[str], sp.csr_matrix] | None = None
    # each test row's twins (`trainer.twins`: labels whose text is the row's own), left out of every
    # method's answers where the training rows never carry theirs, as an ovex model with texts does
    twins: list[list[int]] | None = None

    def peer_rows(self) -> tuple[list[str] | None, sp.csr_matrix]:
        """The training texts and labels the peers learn from: the rows, then the text rows if any."""
        if self.text_rows is None:
            return self.train.texts, self.y_train
        assert self.train.texts is not None
        texts, y = self.text_rows
        return [*self.train.texts, *texts], sp.vstack([self.y_train, y], format="csr")


def _widen(y: sp.spmatrix, width: int) -> sp.csr_matrix:
    c = sp.csr_matrix(y, dtype=np.float32)
    return sp.csr_matrix((c.data, c.indices, c.indptr), shape=(c.shape[0], width))


def load_set(name: str, data_dir: Path) -> Bench:
    """Read one set; a JSONL test set is moved into the training labels' ids (unknown names after them)."""
    if name in TEXT_SETS:
        train_path = data_dir / "wordnet_train.jsonl"
        tr = read_jsonl(train_path)
        assert tr.label_names is not None
        te = in_label_space(read_jsonl(data_dir / "wordnet_test.jsonl"), tr.label_names)
        assert te.label_names is not None
        names = list(te.label_names)
        n_train_labels = tr.n_labels
        if name == "wordnet-texts":
            from trainer.label_texts import read_label_texts

            width = len(names)
            b = Bench(tr, te, names, _widen(tr.Y, width), _widen(te.Y, width), train_path, n_train_labels,
                      label_texts=data_dir / "wordnet_label_texts.jsonl")
            texts = dict(read_label_texts(b.label_texts))
            b.text_rows, b.twins = label_text_rows(b, texts), test_twins(b, texts)
            return b
    else:
        train_path, test_path = synth_files(name) if name in SYNTH else (
            data_dir / f"{name}_train.txt", data_dir / f"{name}_test.txt")
        tr, te = read_xc(train_path), read_xc(test_path)
        n_train_labels = tr.n_labels
        names = [str(i) for i in range(max(tr.n_labels, te.n_labels))]
    width = len(names)
    return Bench(tr, te, names, _widen(tr.Y, width), _widen(te.Y, width), train_path, n_train_labels)


def label_text_rows(b: Bench, texts: dict[str, str]) -> tuple[list[str], sp.csr_matrix]:
    """The set's label texts of the labels that have training rows, each a row of its own label."""
    index = {n: i for i, n in enumerate(b.names)}
    counts = np.bincount(b.y_train.indices, minlength=len(b.names))
    pairs = [(index[n], t) for n, t in texts.items() if n in index and counts[index[n]] > 0]
    ids = np.array([i for i, _ in pairs], dtype=np.int64)
    y = sp.csr_matrix((np.ones(ids.size, np.float32), ids, np.arange(ids.size + 1)),
                      shape=(ids.size, len(b.names)))
    return [t for _, t in pairs], y


def test_twins(b: Bench, texts: dict[str, str]) -> list[list[int]] | None:
    """Each test row's twins in the shared space, by ovex's rule (`trainer.twins`) on the training rows;
    None where the rows carry their twins (then they stay answers)."""
    from trainer.twins import count_twins, twin_index, twins_of

    assert b.train.texts is not None
    index = twin_index(b.names, texts)
    if not count_twins(b.train.texts, index, b.y_train).excluded:
        return None
    return twins_of(index, b.test.texts or [None] * b.y_test.shape[0])


def without_twins(b: Bench, rows: list[list[int]]) -> list[list[int]]:
    """Each row's first K labels that are not its twins (`Bench.twins`), from a list fetched with room
    for them (`fetched`)."""
    if b.twins is None:
        return [r[:K] for r in rows]
    return [[j for j in r if j not in t][:K] for r, t in zip(rows, b.twins, strict=True)]


def fetched(b: Bench) -> int:
    """How many labels a peer fetches per row so that K remain once its twins are left out."""
    from trainer.twins import most_excluded

    return K + most_excluded(b.twins)


def synth_files(name: str) -> tuple[Path, Path]:
    """The (train, test) XC files of a planted set, generated once into a cache outside the repository
    (the generator is seeded: the same files on every machine)."""
    from trainer.synth import write_synth

    labels, features, rows, test_rows, seed = SYNTH[name]
    key = f"{labels}-{features}-{rows}-{test_rows}-{seed}"
    cache = Path(tempfile.gettempdir()) / "ovex-bench-synth" / key
    train, test = cache / "train.txt", cache / "test.txt"
    if not (train.exists() and test.exists()):
        cache.mkdir(parents=True, exist_ok=True)
        tmp_train, tmp_test = cache / f"train.{os.getpid()}.tmp", cache / f"test.{os.getpid()}.tmp"
        write_synth(tmp_train, labels, features, rows, seed=seed, test_path=tmp_test, test_rows=test_rows)
        os.replace(tmp_test, test)
        os.replace(tmp_train, train)
    return train, test


def peer_features(b: Bench, set_name: str, lead_words: int = 0
                  ) -> tuple[sp.csr_matrix, sp.csr_matrix, float, float, float]:
    """The peers' (train, test) features, the seconds (wall, CPU) to fit them on the training rows and
    the wall seconds to transform the test rows. `lead_words` > 0 adds ovex's marked leading words
    (`trainer.featurize.tokenize`) to a text's terms, so a peer learns from what ovex's featurizer adds."""
    if set_name not in TEXT_SETS:
        assert b.train.X is not None and b.test.X is not None
        d = max(b.train.X.shape[1], b.test.X.shape[1])
        xtr = sp.csr_matrix(b.train.X, dtype=np.float32)
        xte = sp.csr_matrix(b.test.X, dtype=np.float32)
        return (sp.csr_matrix((xtr.data, xtr.indices, xtr.indptr), shape=(xtr.shape[0], d)),
                sp.csr_matrix((xte.data, xte.indices, xte.indptr), shape=(xte.shape[0], d)), 0.0, 0.0, 0.0)
    from sklearn.feature_extraction.text import TfidfVectorizer

    texts, _ = b.peer_rows()
    assert texts is not None and b.test.texts is not None
    w0, c0 = time.perf_counter(), time.process_time()
    vec = TfidfVectorizer(**TFIDF)
    if lead_words:
        from trainer.featurize import LEAD_MARK, tokenize

        words = vec.build_analyzer()
        vec = TfidfVectorizer(sublinear_tf=TFIDF["sublinear_tf"], min_df=TFIDF["min_df"], analyzer=lambda t: [
            *words(t), *(term for term in tokenize(t, 1, lead_words) if term.startswith(LEAD_MARK))])
    xtr = sp.csr_matrix(vec.fit_transform(texts), dtype=np.float32)
    fit_wall, fit_cpu = time.perf_counter() - w0, time.process_time() - c0
    t0 = time.perf_counter()
    xte = sp.csr_matrix(vec.transform(b.test.texts), dtype=np.float32)
    return xtr, xte, fit_wall, fit_cpu, time.perf_counter() - t0


# ------------------------------------------------------------------------------------ one run (child)


def _peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "unknown"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def ovex_train(train_path: Path, out: Path, seed: int, extra: list[str], log: Path) -> dict[str, float]:
    """`ovex train` as a subprocess; its wall time, CPU time (user+sys) and peak RSS from `os.wait4`."""
    cmd = [sys.executable, "-m", "service.cli", "train", "--train", str(train_path), "--out", str(out),
           "--seed", str(seed), "--quiet", *extra]
    with open(log, "wb") as fh:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    if code < 0:
        raise RuntimeError(f"ovex train crashed: signal {-code} ({_signal_name(-code)})")
    if code != 0:
        raise RuntimeError(f"ovex train failed ({code}): {_last_line(log.read_text(errors='replace'))}")
    return {"train_wall_s": wall, "train_cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_mb": usage.ru_maxrss / 1024}


def run_ovex(b: Bench, set_name: str, method: str, seed: int, extra: list[str], work: Path) -> dict[str, Any]:
    """Train with the console command, load the artifact, predict, and map ids to the shared space by name."""
    from trainer.artifact import load_artifact

    res: dict[str, Any] = {}
    if method == "ovex-tfidf":
        xtr, xte, fit_wall, fit_cpu, te_s = peer_features(b, set_name)
        train_path = work / "train_tfidf.txt"
        t0 = time.perf_counter()
        write_xc(train_path, xtr, b.y_train[:, : b.n_train_labels])
        res["write_s"] = time.perf_counter() - t0
        test = Dataset(Y=b.y_test, n_features=xte.shape[1], n_labels=b.y_test.shape[1], X=xte)
        index = {str(i): i for i in range(b.n_train_labels)}  # an XC file's labels are named by their ids
        res.update(featurize_s=fit_wall, test_featurize_s=te_s)
    else:
        fit_wall = fit_cpu = 0.0
        train_path, test = b.train_path, b.test
        index = {name: i for i, name in enumerate(b.names)}
    texts = [] if b.label_texts is None else ["--label-texts", str(b.label_texts)]
    res.update(ovex_train(train_path, work / "model", seed, [*texts, *extra], work / "train.log"))
    res["train_wall_s"] += fit_wall
    res["train_cpu_s"] += fit_cpu
    model = load_artifact(work / "model")
    t0 = time.perf_counter()
    x = model.featurizer.transform(test)
    if method == "ovex":
        res["test_featurize_s"] = time.perf_counter() - t0
    # as served: an input's twins left out where the model excludes them (a model with label texts)
    exclude = model.excluded(test.texts) if test.texts is not None else None
    t0 = time.perf_counter()
    ids, _ = model.topk(x, K, exclude=exclude)
    res["predict_s"] = time.perf_counter() - t0
    to_shared = np.array([index.get(name, -1) for name in model.label_names] + [-1], dtype=np.int64)
    ids = np.asarray(ids, np.int64)
    res["top"] = to_shared[np.where(ids >= 0, ids, len(model.label_names))]
    res["unmapped_model_labels"] = int((to_shared[:-1] < 0).sum())
    return res


def warm_ovex() -> float:
    """One untimed `ovex train` of a small planted set, before the timed runs; its wall seconds.

    Why: the first run of an install compiles ovex's numba kernels into their on-disk cache (tens of
    seconds on a small CPU), which every later run loads; without this the first timed seed pays it alone.
    """
    from trainer.synth import write_synth

    work = Path(tempfile.mkdtemp(prefix="ovex-real-warm-"))
    try:
        write_synth(work / "rows.txt", 50, 500, 2000, seed=0)
        return ovex_train(work / "rows.txt", work / "model", 0, ["--epochs", "1"], work / "train.log")[
            "train_wall_s"]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_omikuji(b: Bench, set_name: str, seed: int, work: Path, lead_words: int = 0) -> dict[str, Any]:
    """Omikuji's defaults on all cores, trained from an XC file (the given one for XC sets)."""
    import omikuji

    xtr, xte, fit_wall, fit_cpu, te_s = peer_features(b, set_name, lead_words)
    res: dict[str, Any] = {"featurize_s": fit_wall}
    path = b.train_path
    if set_name in TEXT_SETS:
        path = work / "train_tfidf.txt"
        t0 = time.perf_counter()
        write_xc(path, xtr, b.peer_rows()[1][:, : b.n_train_labels])
        res["write_s"] = time.perf_counter() - t0
    w0, c0 = time.perf_counter(), time.process_time()
    model = omikuji.Model.train_on_data(str(path), omikuji.Model.default_hyper_param(), n_threads=None)
    t0 = time.perf_counter()
    model.save(str(work / "omikuji"))
    res["save_s"] = time.perf_counter() - t0
    res["train_wall_s"] = time.perf_counter() - w0 + fit_wall
    res["train_cpu_s"] = time.process_time() - c0 + fit_cpu
    model.densify_weights(0.1)  # what omikuji's own `test` command does by default: same answers, faster
    t0 = time.perf_counter()
    pairs = []
    for i in range(xte.shape[0]):
        a, e = xte.indptr[i], xte.indptr[i + 1]
        pairs.append(list(zip(xte.indices[a:e].tolist(), xte.data[a:e].tolist(), strict=True)))
    res["test_featurize_s"] = te_s + time.perf_counter() - t0
    t0 = time.perf_counter()
    # a row at a time is all omikuji's Python API takes; its call releases the GIL, so rows run on all cores
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        rows = list(pool.map(lambda p: [label for label, _ in model.predict(p, top_k=fetched(b))], pairs))
    rows = without_twins(b, rows)
    res["predict_s"] = time.perf_counter() - t0
    res["top"] = xc_metrics.top_from_lists(rows, K)  # omikuji's ids are the XC file's: the shared ids
    return res


def run_napkinxc(b: Bench, set_name: str, seed: int, work: Path) -> dict[str, Any]:
    """napkinXC's PLT with its defaults (threads included) on the peers' features."""
    from napkinxc import models

    xtr, xte, fit_wall, fit_cpu, te_s = peer_features(b, set_name)
    y = b.peer_rows()[1]
    labels = [y.indices[y.indptr[i] : y.indptr[i + 1]].tolist() for i in range(y.shape[0])]
    w0, c0 = time.perf_counter(), time.process_time()
    model = models.PLT(str(work / "plt"), seed=seed)
    model.fit(xtr, labels)
    res: dict[str, Any] = {"featurize_s": fit_wall, "test_featurize_s": te_s,
                           "train_wall_s": time.perf_counter() - w0 + fit_wall,
                           "train_cpu_s": time.process_time() - c0 + fit_cpu}
    t0 = time.perf_counter()
    rows = without_twins(b, [[int(r) for r in row] for row in model.predict(xte, top_k=fetched(b))])
    res["predict_s"] = time.perf_counter() - t0
    res["top"] = xc_metrics.top_from_lists(rows, K)
    return res


def run_popularity(b: Bench, set_name: str, seed: int, work: Path) -> dict[str, Any]:
    """The same 5 most frequent training labels for every row: what a method must beat."""
    w0, c0 = time.perf_counter(), time.process_time()
    counts = np.bincount(b.y_train.indices, minlength=b.y_train.shape[1])
    best = np.argsort(-counts, kind="stable")[: fetched(b)].tolist()
    res: dict[str, Any] = {"train_wall_s": time.perf_counter() - w0, "train_cpu_s": time.process_time() - c0}
    t0 = time.perf_counter()
    res["top"] = xc_metrics.top_from_lists(without_twins(b, [best] * b.y_test.shape[0]), K)
    res["predict_s"] = time.perf_counter() - t0
    return res


def run_one(set_name: str, method: str, seed: int, extra: list[str], data_dir: Path, work: Path
            ) -> dict[str, Any]:
    """One (set, method, seed) in this process; returns its JSON row (metrics, times, peak RSS)."""
    b = load_set(set_name, data_dir)
    if method in OVEX_METHODS:
        res = run_ovex(b, set_name, method, seed, extra, work)
    else:
        runner = {"omikuji": run_omikuji, "napkinxc-plt": run_napkinxc, "popularity": run_popularity,
                  "omikuji-lead": partial(run_omikuji, lead_words=TrainParams().lead_words)}[method]
        res = runner(b, set_name, seed, work)
        res["peak_rss_mb"] = _peak_rss_mb()
    top = res.pop("top")
    train_counts = np.bincount(b.y_train.indices, minlength=b.y_train.shape[1])
    prop = xc_metrics.propensities(b.y_train)  # y_train is as wide as the shared space: test-only labels
    metrics = xc_metrics.evaluate_topk(top, b.y_test, prop)
    tail = tail_metrics(top, b.y_test, train_counts)
    n_test = b.y_test.shape[0]
    res["predict_rows_per_s"] = n_test / max(res["predict_s"], 1e-9)
    scores: dict[str, Any] = {**metrics, **{k: v for k, v in tail.items() if k != "rows"}}
    res.update(metrics=scores, bucket_rows=tail["rows"], n_test=n_test, n_labels=len(b.names),
               n_train_labels=b.n_train_labels, worker_peak_rss_mb=_peak_rss_mb())
    return res


# ------------------------------------------------------------------------------------ driver (parent)


def child_status(code: int, stderr: str) -> str:
    """What a child that did not finish says in the table: the signal that ended it, or its last words."""
    if code < 0:
        return f"crashed: signal {-code} ({_signal_name(-code)})"
    return f"failed: {_last_line(stderr)}"


def run_child(set_name: str, method: str, seed: int, extra: list[str], data_dir: Path) -> dict[str, Any]:
    """Run one (set, method, seed) in a fresh process; a crash or error becomes the row's status."""
    work = Path(tempfile.mkdtemp(prefix="ovex-real-"))
    try:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", set_name, method, str(seed),
               "--workdir", str(work), "--data-dir", str(data_dir)]
        if extra:
            cmd.append("--ovex-args=" + shlex.join(extra))
        t0 = time.perf_counter()
        with open(work / "stderr.txt", "wb") as err:
            code = subprocess.run(cmd, cwd=ROOT, stderr=err, check=False).returncode
        row: dict[str, Any] = {"run_wall_s": time.perf_counter() - t0}
        stderr = (work / "stderr.txt").read_text(errors="replace")
        if code == 0:
            row.update(json.loads((work / "result.json").read_text()), status="ok")
        else:
            row.update(status=child_status(code, stderr), stderr_tail=stderr.splitlines()[-20:])
        return row
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _stats(vals: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "n": len(vals)}


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """set -> label -> metric -> {mean, sample std, n} over the seeds that finished; failures listed."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["set"], r["label"]), []).append(r)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (name, label), rs in groups.items():
        ok = [r for r in rs if r["status"] == "ok"]
        failures = [r["status"] for r in rs if r["status"] != "ok"]
        s: dict[str, Any] = {"seeds": len(rs), "ok": len(ok), "failures": failures}
        if ok:
            s["bucket_rows"] = ok[0]["bucket_rows"]
        for key in SUMMARISED:
            vals = [_value(r, key) for r in ok]
            finite = [v for v in vals if v is not None]
            if finite:
                s[key] = _stats(finite)
        out.setdefault(name, {})[label] = s
    return out


def _value(r: dict[str, Any], key: str) -> float | None:
    v = r["metrics"].get(key) if key in r["metrics"] else r.get(key)
    return None if v is None else float(v)


def _cell(s: dict[str, Any], key: str, std: bool = False) -> str:
    if key not in s:
        return "–"
    m, sd = s[key]["mean"], s[key]["std"]
    if key.endswith("_s") or key in ("peak_rss_mb", "predict_rows_per_s"):
        text = f"{m:,.1f}" if m < 100 else f"{m:,.0f}"
        return text + (f" ± {sd:,.1f}" if std and sd else "")
    return f"{m:.4f}" + (f" ± {sd:.4f}" if std else "")


def comparison(by_label: dict[str, dict[str, Any]]) -> list[str]:
    """The headline lines, ovex against omikuji on one set (none if either has no finished run)."""
    a, o = by_label.get("ovex", {}), by_label.get("omikuji", {})
    if "p@1" not in a or "p@1" not in o:
        return []

    def mean(s: dict[str, Any], k: str) -> float:
        return float(s[k]["mean"])

    lines = [f"- ovex P@1 − omikuji P@1: {mean(a, 'p@1') - mean(o, 'p@1'):+.4f} "
             f"({mean(a, 'p@1'):.4f} vs {mean(o, 'p@1'):.4f})"]
    for key, shown in (("p@5", "P@5"), ("psp@5", "PSP@5")):
        lines.append(f"- ovex {shown} vs omikuji: {mean(a, key):.4f} vs {mean(o, key):.4f} "
                     f"({mean(a, key) - mean(o, key):+.4f})")
    saved = f", of which omikuji's save {mean(o, 'save_s'):.1f} s" if "save_s" in o else ""
    lines.append(f"- ovex train wall / omikuji train wall: "
                 f"{mean(a, 'train_wall_s') / mean(o, 'train_wall_s'):.2f}× "
                 f"({mean(a, 'train_wall_s'):.1f} s vs {mean(o, 'train_wall_s'):.1f} s{saved})")
    return lines


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# Real data: `ovex train` vs omikuji, napkinXC PLT and popularity",
        "",
        f"Command: `{result['command']}`  ",
        f"Commit {result['commit'][:12]}{' (dirty)' if result['dirty'] else ''}, {result['date']}; "
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']:.1f} GiB; torch {result['torch']}; "
        f"load average before {result['loadavg_before'][0]:.2f}, after {result['loadavg_after'][0]:.2f}.  ",
        f"Seeds {result['seeds']}: mean ± sample std over seeds. Every method's top 5 scored by one scorer "
        "in one label space (test-only labels are misses for all). Tail = labels with 1–5 training rows; "
        "tail P@k over the test rows with a tail label. Train wall/CPU: the `ovex train` process (ovex), or "
        "the fit in process (peers), TF-IDF fitting included where used, each until its model is on disk "
        "(omikuji's `save` is timed in it, napkinXC's `fit` writes its own); peak RSS: that training process "
        "(ovex) or the whole run's process (peers); predict rows/s: top-5 from already featurized test rows.",
        "",
    ]
    if "warmup_s" in result:
        lines += [f"Before the timed runs, one untimed `ovex train` of a small planted set "
                  f"({result['warmup_s']:.1f} s) loaded ovex's numba kernels, compiling them into their "
                  "cache on a fresh checkout, as any earlier run of the install would have: every timed "
                  "seed measures the same warm install.", ""]
    head = ["method", "P@1", "P@3", "P@5", "nDCG@5", "PSP@1", "PSP@5", "tail P@1", "tail P@5",
            "train wall s", "train CPU s", "peak RSS MB", "predict rows/s"]
    for name, by_label in result["summary"].items():
        lines += [f"## {name}", ""]
        sizes = next((r for r in result["runs"] if r["set"] == name and r["status"] == "ok"), None)
        if sizes is not None:
            lines += [f"Label space: {sizes['n_train_labels']:,} labels from the training file, "
                      f"{sizes['n_labels']:,} with those only test rows have; "
                      f"{sizes['n_test']:,} test rows.", ""]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for label, s in by_label.items():
            if not s["ok"]:
                lines.append(f"| {label} | {s['failures'][0]} ({len(s['failures'])} of {s['seeds']} seeds) |"
                             + " |" * (len(head) - 2))
                continue
            cells = [_cell(s, k, std=k == "p@1") for k in TABLE]
            failed = s["failures"]
            note = f" ({len(failed)} of {s['seeds']} seeds: {failed[0]})" if failed else ""
            lines.append(f"| {label}{note} | " + " | ".join(cells) + " |")
        rows = next((s["bucket_rows"] for s in by_label.values() if "bucket_rows" in s), None)
        if rows is not None:
            lines += ["", "P@1 by the training-row count of each test row's rarest true label:", "",
                      "| method | " + " | ".join(b for b, _, _ in BUCKETS) + " |",
                      "|" + "---|" * (len(BUCKETS) + 1),
                      "| test rows | " + " | ".join(str(rows[b]) for b, _, _ in BUCKETS) + " |"]
            for label, s in by_label.items():
                if s["ok"]:
                    cells = [_cell(s, f"p@1[{b}]") for b, _, _ in BUCKETS]
                    lines.append(f"| {label} | " + " | ".join(cells) + " |")
        comp = comparison(by_label)
        if comp:
            lines += ["", *comp]
        lines.append("")
    for note in result.get("notes", []):
        lines.append(f"- {note}")
    return "\n".join(lines) + "\n"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=RESULTS / "real", help="prefix of the .json and .md written")
    ap.add_argument("--ovex-args", action="append", default=[], help='extra `ovex train` flags for an extra '
                    'row, e.g. --ovex-args="--dim 256"; once for each extra row')
    ap.add_argument("--label", action="append", default=[],
                    help="the label of the extra row of the same rank (default: ovex[ARGS])")
    ap.add_argument("--one", nargs=3, metavar=("SET", "METHOD", "SEED"), help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    extras = [shlex.split(a) for a in args.ovex_args]
    if len(args.label) > len(extras):
        ap.error(f"{len(args.label)} --label for {len(extras)} --ovex-args: one label a row")

    if args.one:  # the child: one run, its row written to --workdir/result.json
        faulthandler.enable()
        set_name, method, seed = args.one[0], args.one[1], int(args.one[2])
        row = run_one(set_name, method, seed, extras[0] if extras else [], args.data_dir, args.workdir)
        (args.workdir / "result.json").write_text(json.dumps(row))
        return

    notes: list[str] = []
    plan: list[tuple[str, str, str, list[str]]] = []  # set, method, label, extra ovex flags
    for name in args.sets:
        for method in args.methods:
            if method in TEXT_ONLY and name != "wordnet":
                continue
            if method in LEAD_PEERS and name not in TEXT_SETS:
                continue
            needs = [REQUIRES[method]] if method in REQUIRES else []
            if name in TEXT_SETS and method not in ("ovex", "popularity"):
                needs.append("sklearn")  # the peers' TF-IDF features
            missing = [m for m in needs if importlib.util.find_spec(m) is None]
            if missing:
                notes.append(f"{method} on {name} skipped: {', '.join(missing)} not installed "
                             "(pip install .[bench])")
                continue
            plan.append((name, method, method, []))
            for n, (raw, extra) in enumerate(zip(args.ovex_args, extras, strict=True)):
                if extra and method in OVEX_METHODS:
                    named = n < len(args.label)
                    label = args.label[n] if named else f"{method}[{raw}]"
                    if named and method == "ovex-tfidf":
                        label += "-tfidf"
                    plan.append((name, method, label, extra))
    runs: list[dict[str, Any]] = []
    st = stamp()
    result: dict[str, Any] = {
        **finish(st),
        "versions": {p: _version(p) for p in ("omikuji", "napkinxc", "scikit-learn", "numpy", "scipy")},
        "seeds": args.seeds,
        "tfidf": {**TFIDF, "ngram_range": list(TFIDF["ngram_range"])},
        "notes": notes,
        "runs": runs,
        "summary": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if any(method in OVEX_METHODS for _, method, _, _ in plan):
        result["warmup_s"] = warm_ovex()
        print(f"warm-up (untimed) ovex train: {result['warmup_s']:.1f}s", flush=True)
    for name, method, label, flags in plan:
        for seed in args.seeds:
            row = {"set": name, "method": method, "label": label, "seed": seed, "ovex_args": flags,
                   **run_child(name, method, seed, flags, args.data_dir)}
            runs.append(row)
            if row["status"] == "ok":
                mt = row["metrics"]
                print(f"{name:8s} {label:16s} seed {seed} p@1 {mt['p@1']:.4f} p@5 {mt['p@5']:.4f} "
                      f"psp@5 {mt['psp@5']:.4f} train {row['train_wall_s']:.1f}s "
                      f"rss {row['peak_rss_mb']:.0f}MB", flush=True)
            else:
                print(f"{name:8s} {label:16s} seed {seed} {row['status']}", flush=True)
            result["summary"] = summarise(runs)
            write_results(args.out, result, st, markdown)
    print(markdown(result))


if __name__ == "__main__":
    main()
