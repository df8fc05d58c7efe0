"""bench/real.py: its tail and bucket metrics against a plain-Python oracle, its crash rows, and one small
run end to end (bench/ is not a package, so the script is loaded by path)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.bench_scripts import load_bench

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "real.py"
DATA = ROOT.parent / "shared" / "data"


real = load_bench("real")


def oracle(top: list[list[int]], rows: list[set[int]], counts: list[int], n_labels: int) -> dict[str, Any]:
    """The definitions, one row and one slot at a time."""
    count = [counts[j] if j < len(counts) else 0 for j in range(n_labels)]
    tail = {j for j in range(n_labels) if 1 <= count[j] <= 5}
    out: dict[str, Any] = {}
    with_tail = [i for i, r in enumerate(rows) if r & tail]
    out["tail_rows"] = len(with_tail)
    for k in (1, 5):
        shares = []
        for i in with_tail:
            slots = (top[i] + [-1] * 5)[:k]
            shares.append(sum(1 for j in slots if j >= 0 and j in rows[i] and j in tail) / k)
        out[f"tail_p@{k}"] = sum(shares) / len(shares) if shares else None
    buckets = {"1-5": (1, 5), "6-20": (6, 20), "21-100": (21, 100), ">100": (101, 10**9)}
    out["rows"] = {}
    for name, (lo, hi) in buckets.items():
        hits = []
        for i, r in enumerate(rows):
            known = [count[j] for j in r if count[j] > 0]
            if known and lo <= min(known) <= hi:
                first = top[i][0] if top[i] else -1
                hits.append(1.0 if first in r else 0.0)
        out["rows"][name] = len(hits)
        out[f"p@1[{name}]"] = sum(hits) / len(hits) if hits else None
    return out


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[list[int]], list[set[int]], list[int], int]:
    n_labels = draw(st.integers(1, 8))
    n_rows = draw(st.integers(0, 12))
    width = draw(st.integers(1, 7))  # fewer than 5 columns are padded, more are cut
    label = st.integers(0, n_labels - 1)
    rows = draw(st.lists(st.sets(label, max_size=n_labels), min_size=n_rows, max_size=n_rows))
    top = draw(st.lists(st.lists(st.integers(-1, n_labels - 1), min_size=width, max_size=width),
                        min_size=n_rows, max_size=n_rows))
    counts = draw(st.lists(st.sampled_from([0, 1, 2, 5, 6, 20, 21, 100, 101, 150]), max_size=n_labels))
    return top, rows, counts, n_labels


@settings(max_examples=200, deadline=None)
@given(cases())
def test_tail_metrics_match_the_oracle(case: tuple[list[list[int]], list[set[int]], list[int], int]) -> None:
    top, rows, counts, n_labels = case
    y = sp.lil_matrix((len(rows), n_labels), dtype=np.float32)
    for i, r in enumerate(rows):
        for j in r:
            y[i, j] = 1.0
    top_arr = np.array(top, dtype=np.int64).reshape(len(rows), -1) if rows else np.zeros((0, 5), np.int64)
    got = real.tail_metrics(top_arr, sp.csr_matrix(y), np.array(counts, dtype=np.int64))
    want = oracle(top if rows else [], rows, counts, n_labels)
    assert got["rows"] == want["rows"]
    assert got["tail_rows"] == want["tail_rows"]
    for key, value in want.items():
        if key == "rows":
            continue
        assert (got[key] is None) == (value is None), key
        if value is not None:
            assert got[key] == pytest.approx(value), key


def test_child_status_names_the_signal_or_the_last_line() -> None:
    assert real.child_status(-11, "") == "crashed: signal 11 (SIGSEGV)"
    assert real.child_status(1, "Traceback ...\n  File x\nValueError: bad\n\n") == "failed: ValueError: bad"
    assert real.child_status(2, "") == "failed: (no output)"


@pytest.mark.skipif(not (DATA / "bibtex_train.txt").exists(), reason="needs ../shared/data (Bibtex)")
def test_bibtex_end_to_end_through_ovex_train(tmp_path: Path) -> None:
    """ovex through its console command (and omikuji where the bench extras are installed) against the
    popularity floor, each in its own process, into one results file."""
    peers = ["omikuji"] if importlib.util.find_spec("omikuji") is not None else []
    out = tmp_path / "real"
    cmd = [sys.executable, str(SCRIPT), "--sets", "bibtex", "--methods", "popularity", "ovex", *peers,
           "--seeds", "0", "--out", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=240)
    result = json.loads(out.with_suffix(".json").read_text())
    runs = {r["method"]: r for r in result["runs"]}
    assert set(runs) == {"popularity", "ovex", *peers}
    for r in runs.values():
        assert r["status"] == "ok" and r["set"] == "bibtex" and r["seed"] == 0
        assert {"p@1", "p@5", "psp@5", "tail_p@1", "p@1[>100]"} <= set(r["metrics"])
        assert r["peak_rss_mb"] > 0 and r["predict_rows_per_s"] > 0
        assert r["train_wall_s"] >= 0 and r["train_cpu_s"] >= 0
    for method in ("ovex", *peers):
        assert runs[method]["metrics"]["p@1"] > runs["popularity"]["metrics"]["p@1"] + 0.3, method
    assert runs["ovex"]["unmapped_model_labels"] == 0 and runs["ovex"]["train_wall_s"] > 0
    for method in peers:  # a peer's training time ends with its model on disk, as ovex's does
        assert 0 < runs[method]["save_s"] < runs[method]["train_wall_s"]
    assert set(result["summary"]["bibtex"]) == {"popularity", "ovex", *peers}
    for key in ("commit", "dirty", "date", "machine", "loadavg_before", "loadavg_after", "torch", "command"):
        assert key in result
    assert result["warmup_s"] > 0  # ovex's kernels were loaded before the timed run
    assert "## bibtex" in out.with_suffix(".md").read_text()


def test_each_ovex_args_adds_its_own_row_with_its_label(tmp_path: Path) -> None:
    out = tmp_path / "rows"
    cmd = [sys.executable, str(SCRIPT), "--sets", "bibtex", "--methods", "ovex", "--seeds", "0",
           "--ovex-args=--epochs 1", "--label", "one epoch", "--ovex-args=--epochs 2 --dim 16",
           "--out", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=240)
    runs = json.loads(out.with_suffix(".json").read_text())["runs"]
    assert [(r["label"], r["ovex_args"], r["status"]) for r in runs] == [
        ("ovex", [], "ok"), ("one epoch", ["--epochs", "1"], "ok"),
        ("ovex[--epochs 2 --dim 16]", ["--epochs", "2", "--dim", "16"], "ok")]
    assert len({r["metrics"]["p@1"] for r in runs}) > 1  # the flags reached the runs
    bad = subprocess.run([*cmd[:9], "--label", "a", "--label", "b", "--out", str(tmp_path / "bad")], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "2 --label for 1 --ovex-args" in bad.stderr
    assert not (tmp_path / "bad.json").exists()


def test_the_label_texts_set_gives_the_peers_one_text_row_per_label_with_rows(tmp_path: Path) -> None:
    """`wordnet-texts`: each label with training rows adds its text as a row of it alone (the peers' rows);
    a label only test rows carry adds none, and the scored training labels stay the rows' own."""
    from trainer.data import Dataset

    texts_path = tmp_path / "texts.jsonl"
    pairs = [("b", "bee text"), ("z", "test only"), ("a", "ay text"), ("q", "unknown")]
    texts_path.write_text("".join(json.dumps({"name": n, "text": t}) + "\n" for n, t in pairs))
    names = ["a", "b", "c", "z"]  # c has rows and no text; z only test rows carry
    y = sp.csr_matrix(np.array([[1, 0, 1, 0], [0, 1, 0, 0], [1, 1, 0, 0]], np.float32))
    train = Dataset(Y=y[:, :3], n_features=0, n_labels=3, texts=["r0", "r1", "r2"], label_names=names[:3])
    test = Dataset(Y=sp.csr_matrix((1, 4), dtype=np.float32), n_features=0, n_labels=4, texts=["t"],
                   label_names=names)
    b = real.Bench(train, test, names, y, sp.csr_matrix((1, 4), dtype=np.float32), tmp_path / "x.jsonl", 3,
                   label_texts=texts_path)
    assert b.peer_rows()[0] == ["r0", "r1", "r2"]  # no text rows yet: the rows alone
    b.text_rows = real.label_text_rows(b, dict(pairs))
    texts, labels = b.text_rows
    assert texts == ["bee text", "ay text"]  # in the file's order; z (no rows) and q (not a label) left out
    np.testing.assert_array_equal(labels.toarray(), [[0, 1, 0, 0], [1, 0, 0, 0]])
    rows, y_peer = b.peer_rows()
    assert rows == ["r0", "r1", "r2", "bee text", "ay text"]
    np.testing.assert_array_equal(y_peer.toarray(), np.vstack([y.toarray(), labels.toarray()]))
    np.testing.assert_array_equal(b.y_train.toarray(), y.toarray())  # what the scorer's counts read


def test_the_label_texts_set_leaves_twins_out_of_the_peers_answers_where_rows_never_carry_them() -> None:
    from trainer.data import Dataset

    names = [f"l{j}" for j in range(12)]
    texts = {n: f"text of {n}" for n in names}
    rows = [f"text of l{r}" for r in range(11)]  # row r is label r's twin and carries label r + 1 alone
    y = sp.csr_matrix((np.ones(11, np.float32), np.arange(1, 12), np.arange(12)), shape=(11, 12))
    train = Dataset(Y=y, n_features=0, n_labels=12, texts=rows, label_names=names)
    test = Dataset(Y=sp.csr_matrix((2, 12), dtype=np.float32), n_features=0, n_labels=12,
                   texts=["TEXT of  l3", "something else"], label_names=names)
    b = real.Bench(train, test, names, y, sp.csr_matrix((2, 12), dtype=np.float32), Path("x"), 12)
    b.twins = real.test_twins(b, texts)
    assert b.twins == [[3], []]  # case and runs of spaces aside, as ovex compares them
    assert real.fetched(b) == real.K + 1
    fetched = [3, 0, 1, 2, 4, 5]
    assert real.without_twins(b, [fetched, fetched]) == [[0, 1, 2, 4, 5], [3, 0, 1, 2, 4]]
    carried = sp.csr_matrix((np.ones(11, np.float32), np.arange(11), np.arange(12)), shape=(11, 12))
    b.y_train = carried  # rows that carry their twins keep them as answers
    assert real.test_twins(b, texts) is None
    b.twins = None
    assert real.fetched(b) == real.K and real.without_twins(b, [fetched]) == [[3, 0, 1, 2, 4]]


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="the peers' tf-idf: scikit-learn")
def test_omikuji_lead_features_are_the_peers_plus_the_marked_leading_words() -> None:
    """`omikuji-lead` learns from the peers' tf-idf terms and ovex's marked leading words beside them;
    the plain peers' features stay as they were, and the row is offered on the text sets alone."""
    from trainer.data import Dataset

    texts = ["red apple pie. green tea", "red apple tart. green tea", "blue sky. red apple"] * 2
    y = sp.csr_matrix(np.ones((len(texts), 1), np.float32))
    ds = Dataset(Y=y, n_features=0, n_labels=1, texts=texts, label_names=["x"])
    b = real.Bench(ds, ds, ["x"], y, y, Path("x"), 1)
    plain, _, _, _, _ = real.peer_features(b, "wordnet")
    lead, lead_test, _, _, _ = real.peer_features(b, "wordnet", lead_words=2)
    # the marked words seen in 2+ texts: ^red ^apple ^green ^tea ^blue ^sky
    assert lead.shape[1] == plain.shape[1] + 6 and lead_test.shape == lead.shape
    assert all(n > 0 for n in np.diff(lead.indptr) - np.diff(plain.indptr))
    assert "omikuji-lead" in real.METHODS and real.LEAD_PEERS == ("omikuji-lead",)
