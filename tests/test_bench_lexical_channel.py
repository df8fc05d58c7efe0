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
