"""bench/lexical_channel.py: its top-K merge and its metrics against plain-Python oracles."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.bench_scripts import load_bench

lc = load_bench("lexical_channel")


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.integers(5, 30), st.integers(0, 2**31 - 1))
def test_best_is_the_k_highest_scores_best_first(rows: int, cols: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores = rng.permutation(rows * cols).reshape(rows, cols).astype(np.float32)  # no ties
    ids = rng.integers(0, 1000, size=cols)
    values, top = lc._best(scores, ids)
    for r in range(rows):
        order = sorted(range(cols), key=lambda c: -scores[r, c])[: lc.K]
        assert top[r].tolist() == [int(ids[c]) for c in order]
        assert values[r].tolist() == [float(scores[r, c]) for c in order]
    _, top2 = lc._best(scores, np.tile(ids, (rows, 1)))  # per-row ids give the same answer
    assert (top2 == top).all()


def test_metrics_count_unseen_hits_and_the_rows_the_model_could_answer() -> None:
    first_unseen = 6  # labels 0-5 trained, 6-7 only in the test rows
    gold = [{0}, {1, 6}, {7}, {2}]
    y = sp.csr_matrix((np.ones(5), ([0, 1, 1, 2, 3], [0, 1, 6, 7, 2])), shape=(4, 8))
    top = np.array([[0, 1, 2, 3, 4],    # right first, a trained row
                    [3, 4, 5, 0, 6],    # its unseen label fifth
                    [1, 2, 3, 4, 5],    # its unseen label absent
                    [6, 2, 1, 0, 3]])   # an unseen label first on a trained row: a miss at 1
    truth = lc.Truth.of(y, first_unseen)
    assert truth.gold == gold and truth.unseen.tolist() == [False, True, True, False]
    m = lc._metrics(top, y, np.ones(8), truth, first_unseen)
    assert m["p@1"] == 1 / 4
    assert m["p@1 trained rows"] == 1 / 2  # rows 0 and 3
    assert m["unseen hit@5"] == 1 / 2  # rows 1 and 2
    assert m["p@5"] == sum(len(set(t) & g) for t, g in zip(top.tolist(), gold, strict=True)) / (5 * 4)


class _Linear:
    """A model whose representation is its input row and whose head is the identity."""

    def __init__(self, n: int) -> None:
        self.head_weight = np.eye(n, dtype=np.float32)
        self.head_bias = np.zeros(n, dtype=np.float32)

    def encode(self, x: sp.csr_matrix) -> np.ndarray:
        return np.asarray(x.toarray(), dtype=np.float32)


def test_a_label_known_by_its_text_wins_only_when_its_channel_outscores_the_model() -> None:
    n = 8
    x = sp.csr_matrix(np.eye(n, dtype=np.float32)[[2, 5]] * 0.6)  # row 0 is word 2, row 1 word 5
    texts = sp.csr_matrix(np.eye(n, dtype=np.float32)[[5, 7, 0, 1, 3]])  # unseen label 8 says word 5, ...
    tops = lc.rescored(_Linear(n), x, texts, np.arange(n), n, [0.0, 10.0], [-10.0, 0.0], [], seed=0)
    assert tops["model alone"][:, 0].tolist() == [2, 5]
    assert tops["exact α 0 β -10"][:, 0].tolist() == [2, 5]  # the channel is off: the model's answers
    # on: the row that says word 5 puts label 8 (cosine 0.6, score 6) above its own best (0.6)
    assert tops["exact α 10 β 0"][:, 0].tolist() == [2, 8]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 200), st.integers(1, 64), st.integers(0, 2**31 - 1))
def test_a_sketch_gives_each_term_distinct_columns_and_unit_length(n: int, m: int, seed: int) -> None:
    s = lc.sketch(n, m, seed)
    nnz = min(lc.SKETCH_NNZ, m)
    assert s.shape == (n, m) and (np.diff(s.indptr) == nnz).all()  # distinct columns: none summed away
    np.testing.assert_allclose(np.asarray(s.multiply(s).sum(1)).ravel(), 1.0, rtol=1e-6)
    assert (lc.sketch(n, m, seed) != s).nnz == 0  # seeded


def test_a_sketch_estimates_the_cosine_without_bias() -> None:
    rng = np.random.default_rng(0)
    x, z = rng.random(50), rng.random(50)
    x[rng.random(50) < 0.5] = 0
    exact = float(x @ z)
    est = [float((x @ lc.sketch(50, 16, seed)) @ (z @ lc.sketch(50, 16, seed))) for seed in range(2000)]
    assert abs(np.mean(est) - exact) < 4 * np.std(est) / np.sqrt(len(est))
    assert np.std(est) > 0  # a real estimate, not the exact product


def test_a_label_whose_text_is_the_rows_own_is_set_aside_and_counted() -> None:
    n = 8
    x = sp.csr_matrix(np.eye(n, dtype=np.float32)[[2]])  # the row says word 2 only
    texts = sp.csr_matrix(np.array([[0, 0, 1, 0, 0, 0, 0, 0],              # label 8: the row's own text
                                    [0, 0, 0.6, 0.8, 0, 0, 0, 0],          # label 9: shares word 2
                                    *[[0, 0, 0, 0, 0, 0, 0, 1]] * 3], np.float32))  # 10-12: other words
    tops = lc.rescored(_Linear(n), x, texts, np.arange(n), n, [10.0], [0.0], [], seed=0)
    assert tops["exact α 10 β 0"][0, 0] == 8
    assert tops["exact, own text set aside α 10 β 0"][0, 0] == 9
    y = sp.csr_matrix(([1.0], ([0], [9])), shape=(1, 13))
    truth = lc.Truth.of(y, n)
    every = sp.vstack([sp.csr_matrix((n, n), dtype=np.float32), texts]).tocsr()
    assert lc.near_identical(x, every, truth) == {"rows": 1.0, "rows_where_one_is_gold": 0.0}


def test_trained_labels_reading_their_texts_move_by_alpha_t_times_the_cosine() -> None:
    n = 8
    x = sp.csr_matrix(np.eye(n, dtype=np.float32)[[0]] * 0.5)  # the row says word 0
    trained_texts = sp.csr_matrix(np.eye(n, dtype=np.float32)[[1, 1, 1, 0, 1, 1, 1, 1]])  # 3's says word 0
    texts = sp.csr_matrix(np.zeros((5, n), np.float32))
    tops = lc.rescored(_Linear(n), x, texts, np.arange(n), n, [1.0], [-5.0], [], seed=0,
                       trained_texts=trained_texts, trained_alphas=(0.1, 2.0))
    assert tops["exact α 1 β -5"][0, 0] == 0  # the model alone: label 0 (score 0.5)
    assert tops["exact α 1 β -5, trained labels α_t 0.1"][0, 0] == 0  # 0.5 against 0.1 · 0.5
    assert tops["exact α 1 β -5, trained labels α_t 2"][0, 0] == 3  # 0.5 against 2 · 0.5 + 0
