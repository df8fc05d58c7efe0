"""The grown label space of a continual run: every label keeps its name, old names keep their ids.

Checked against the plain definition (a name's id is its position in base names + new names), for XC data
named by id and for named data, with declared labels no row uses.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.continual import _LabelSpace
from trainer.data import Dataset, in_label_space
from trainer.errors import DataFormatError

names_st = st.lists(st.sampled_from([str(i) for i in range(12)] + ["a", "b", "c", "é", "x y"]),
                    min_size=1, max_size=10, unique=True)


def _dataset(rows: list[list[int]], names: list[str] | None, n_labels: int) -> Dataset:
    indptr = np.cumsum([0] + [len(r) for r in rows])
    ind = np.array([j for r in rows for j in r], dtype=np.int64)
    Y = sp.csr_matrix((np.ones(ind.size, np.float32), ind, indptr), shape=(len(rows), n_labels))
    X = sp.csr_matrix((len(rows), 3), dtype=np.float32)
    return Dataset(Y=Y, n_features=3, n_labels=n_labels, X=X, label_names=names, path="<t>")


def _row_names(ds: Dataset) -> list[set[str]]:
    y = sp.csr_matrix(ds.Y)
    own = ds.label_names
    return [{own[j] if own is not None else str(j) for j in y.indices[y.indptr[i]:y.indptr[i + 1]]}
            for i in range(ds.n_rows)]


@settings(max_examples=200, deadline=None)
@given(base=names_st, data=names_st, named=st.booleans(), seed=st.integers(0, 2**16))
def test_rows_keep_their_label_names_and_old_labels_their_ids(
    base: list[str], data: list[str], named: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    n = len(data)
    rows = [sorted(set(rng.choice(n, size=rng.integers(0, 4)).tolist())) for _ in range(rng.integers(1, 6))]
    ds = _dataset(rows, data if named else None, n)
    declared = data if named else [str(j) for j in range(n)]

    space = _LabelSpace(base)
    space.grow(ds)
    moved = in_label_space(ds, space.names, refuse="", index=space.index)

    expected = base + [d for d in declared if d not in base]  # the definition: base names, then new ones
    assert space.names == expected  # old ids unchanged: `expected` starts with the base's names
    assert moved.n_labels == len(expected)
    assert _row_names(moved) == _row_names(ds)  # the same labels, by name, on every row
    assert moved.label_names is None or moved.label_names == expected


def test_a_label_outside_the_space_is_named_with_its_line() -> None:
    space = _LabelSpace(["0", "1"])
    test = _dataset([[0], [1, 2]], None, 3)  # label "2" is in no version of the model
    with pytest.raises(DataFormatError, match=r"label '2' is not in the model's label set") as info:
        in_label_space(test, space.names, refuse="", index=space.index)
    assert info.value.line == 3  # an XC file's second row follows its header line
