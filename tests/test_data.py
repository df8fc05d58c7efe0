"""Readers: every malformed input gets its own error with file, line and fault; round trips are exact."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trainer.data as data
from trainer.data import MAX_LABEL_NAME, check_compatible, read_dataset, read_jsonl, read_xc, write_xc
from trainer.errors import DataFormatError

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _write(tmp_path: Path, text: str, name: str = "d.txt") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _err(path: Path) -> DataFormatError:
    with pytest.raises(DataFormatError) as ei:
        read_dataset(path)
    return ei.value


# ----------------------------------------------------------------------------- well-formed XC


def test_reads_rows_in_all_shapes(tmp_path: Path) -> None:
    p = _write(tmp_path, "5 10 4\n1,3 2:0.5 7:2\n 0:1 9:3\n4:1.5\n2\n\t3,0\t5:1e-3\n")
    ds = read_xc(p)
    assert (ds.n_rows, ds.n_features, ds.n_labels) == (5, 10, 4)
    assert ds.X is not None and ds.X.dtype == np.float32 and ds.Y.dtype == np.float32
    assert ds.Y.toarray().tolist() == [[0, 1, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0], [1, 0, 0, 1]]
    dense = ds.X.toarray()
    assert dense[0, 2] == np.float32(0.5) and dense[0, 7] == 2
    assert dense[1, 0] == 1 and dense[1, 9] == 3
    assert dense[2, 4] == np.float32(1.5)
    assert ds.X[3].nnz == 0
    assert dense[4, 5] == np.float32(1e-3)
    assert ds.X.has_sorted_indices


def test_ids_are_sorted_within_rows(tmp_path: Path) -> None:
    ds = read_xc(_write(tmp_path, "1 10 5\n4,1 9:9 3:3 5:5\n"))
    assert ds.X is not None
    assert ds.X.indices.tolist() == [3, 5, 9] and ds.X.data.tolist() == [3, 5, 9]
    assert ds.Y.indices.tolist() == [1, 4]


def test_blank_line_inside_is_an_empty_row_and_trailing_blanks_are_ignored(tmp_path: Path) -> None:
    ds = read_xc(_write(tmp_path, "3 4 2\n0 1:1\n\n1 2:1\n\n  \n"))
    assert ds.n_rows == 3 and ds.Y[1].nnz == 0 and ds.X is not None and ds.X[1].nnz == 0


def test_many_chunks_keep_row_order_and_line_numbers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "_BLOCK_BYTES", 23)
    rows = [f"{i % 3} {i}:{i + 1}" for i in range(50)]
    ds = read_xc(_write(tmp_path, "50 60 3\n" + "\n".join(rows) + "\n"))
    assert ds.X is not None
    assert ds.X.indices.tolist() == list(range(50))
    assert ds.Y.indices.tolist() == [i % 3 for i in range(50)]
    rows[40] = "0 40:1 40:2"
    e = _err(_write(tmp_path, "50 60 3\n" + "\n".join(rows) + "\n", "bad.txt"))
    assert e.line == 42 and "duplicate feature id 40" in e.message


# ----------------------------------------------------------------------------- malformed XC

BAD_CASES = [
    ("", 1, "empty file"),
    ("3 5\n", 1, "bad header"),
    ("a b c\n0 1:1\n", 1, "bad header"),
    ("1 2 3 4\n0 1:1\n", 1, "bad header"),
    ("-1 2 3\n", 1, "bad header"),
    ("1 0 3\n0\n", 1, "feature count D must be positive"),
    ("1 5 -2\n0 1:1\n", 1, "bad header '1 5 -2': expected three non-negative integers"),
    ("1 5.0 2\n0 1:1\n", 1, "bad header '1 5.0 2': expected three non-negative integers"),
    ("1 5 1e3\n0 1:1\n", 1, "bad header '1 5 1e3': expected three non-negative integers"),
    ("1 5 1000000000000\n0 1:1\n", 1, "bad header: L=1000000000000 labels is more than the 2,147,483,648"),
    ("1 2147483649 2\n0 1:1\n", 1, "bad header: D=2147483649 features is more than the 2,147,483,648"),
    ("3 5 2\n0 1:1\n1 2:1\n", 4, "file ends after 2 rows but the header declares N=3"),
    ("1 5 2\n0 1:1\n1 2:1\n", 3, "more rows than N=1"),
    ("2 5 2\n0 1:1\n1 5:1\n", 3, "feature id 5 >= D=5"),
    ("1 5 2\n0 -1:1\n", 2, "negative feature id -1"),
    ("2 5 2\n0 1:1\n2 1:1\n", 3, "label id 2 >= L=2"),
    ("1 5 2\n-1 1:1\n", 2, "negative label id -1"),
    ("1 5 2\n0 1:nan\n", 2, "non-finite value 'nan' for feature 1"),
    ("1 5 2\n0 1:inf\n", 2, "non-finite value 'inf' for feature 1"),
    ("1 5 2\n0 1:-Infinity\n", 2, "non-finite value '-Infinity'"),
    ("1 5 2\n0 1:1e40\n", 2, "overflows float32"),
    ("1 5 2\n0 1:1 3:1 1:2\n", 2, "duplicate feature id 1"),
    ("1 5 2\n1,0,1 1:1\n", 2, "duplicate label id 1"),
    ("1 5 2\n0 1:2:3\n", 2, "unparsable token '1:2:3'"),
    ("1 5 2\n0 1:1 abc\n", 2, "unparsable token 'abc'"),
    ("1 5 2\n0 1:x\n", 2, "unparsable value 'x'"),
    ("1 5 2\n0 a:1\n", 2, "unparsable feature id 'a'"),
    ("1 5 2\n0,,1 1:1\n", 2, "empty label id"),
    ("1 5 2\n0,x 1:1\n", 2, "unparsable label id 'x'"),
    ("1 5 2\n0 1:1 2\n", 2, "unparsable token '2'"),
]


@pytest.mark.parametrize(("text", "line", "msg"), BAD_CASES, ids=[c[2][:30] for c in BAD_CASES])
def test_malformed_xc_names_line_and_fault(tmp_path: Path, text: str, line: int, msg: str) -> None:
    p = _write(tmp_path, text)
    with pytest.raises(DataFormatError) as ei:
        read_xc(p)
    e = ei.value
    assert e.line == line, str(e)
    assert msg in e.message, str(e)
    assert str(e).startswith(f"{p}:{line}: ")


def test_missing_file_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="cannot open"):
        read_xc(tmp_path / "nope.txt")


def test_binary_garbage_is_a_data_error(tmp_path: Path) -> None:
    p = tmp_path / "g.txt"
    p.write_bytes(b"1 5 2\n0 1:\xff\xfe\n")
    with pytest.raises(DataFormatError) as ei:
        read_xc(p)
    assert ei.value.line == 2 and "unparsable value" in ei.value.message


# ----------------------------------------------------------------------------- round trip


@st.composite
def xc_matrices(draw: st.DrawFn) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    n = draw(st.integers(1, 12))
    d = draw(st.integers(1, 30))
    n_labels = draw(st.integers(1, 8))
    finite = st.floats(allow_nan=False, allow_infinity=False, width=32).filter(lambda v: v != 0)
    xs = np.zeros((n, d), np.float32)
    ys = np.zeros((n, n_labels), np.float32)
    for i in range(n):
        cols = draw(st.sets(st.integers(0, d - 1), max_size=d))
        for c in cols:
            xs[i, c] = draw(finite)
        labs = draw(st.sets(st.integers(0, n_labels - 1), max_size=n_labels))
        ys[i, list(labs)] = 1
    return sp.csr_matrix(xs), sp.csr_matrix(ys)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=xc_matrices())
def test_write_read_round_trip_is_exact(tmp_path: Path, m: tuple[sp.csr_matrix, sp.csr_matrix]) -> None:
    X, Y = m
    p = tmp_path / "rt.txt"
    write_xc(p, X, Y)
    ds = read_xc(p)
    assert ds.X is not None
    assert ds.X.shape == X.shape and ds.Y.shape == Y.shape
    assert np.array_equal(ds.X.toarray(), X.toarray())
    assert np.array_equal(ds.Y.toarray(), Y.toarray())


def test_write_rejects_mismatched_rows(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rows"):
        write_xc(tmp_path / "x.txt", sp.csr_matrix((2, 3)), sp.csr_matrix((3, 2)))


# ----------------------------------------------------------------------------- JSONL


def _jsonl(tmp_path: Path, rows: list[object], name: str = "d.jsonl") -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    return _write(tmp_path, "\n".join(lines) + "\n", name)


def test_jsonl_builds_vocabulary_in_first_seen_order(tmp_path: Path) -> None:
    p = _jsonl(tmp_path, [{"text": "a b", "labels": ["z", "y"]}, "", {"text": "c", "labels": []},
                          {"text": "d", "labels": ["y", "x"], "id": 7}, {"text": "e"}])
    ds = read_jsonl(p)
    assert ds.is_text and ds.texts == ["a b", "c", "d", "e"]
    assert ds.label_names == ["z", "y", "x"] and ds.n_labels == 3
    assert ds.Y.toarray().tolist() == [[1, 1, 0], [0, 0, 0], [0, 1, 1], [0, 0, 0]]


def test_jsonl_with_vocabulary_uses_its_ids(tmp_path: Path) -> None:
    p = _jsonl(tmp_path, [{"text": "a", "labels": ["b"]}])
    ds = read_jsonl(p, label_names=["a", "b", "c"])
    assert ds.n_labels == 3 and ds.Y.toarray().tolist() == [[0, 1, 0]]


JSONL_BAD = [
    (['{"text": "a", "labels": []}', '{"text": "b", "labels": [}'], 2, "invalid JSON"),
    (['["text"]'], 1, "expected a JSON object, got list"),
    ([{"labels": ["a"]}], 1, "missing key 'text'"),
    ([{"text": "   ", "labels": ["a"]}], 1, "'text' is empty"),
    ([{"text": 3, "labels": ["a"]}], 1, "'text' must be a string, got int"),
    ([{"text": "a", "labels": "a"}], 1, "'labels' must be a list of strings, got str"),
    ([{"text": "a", "labels": ["a", 1]}], 1, "'labels' must be a list of strings; found 1"),
    ([{"text": "a", "labels": ["a", "a"]}], 1, "duplicate label 'a'"),
    ([{"text": "a", "labels": [""]}], 1, "blank label name ''"),
    ([{"text": "a", "labels": ["x"]}, {"text": "b", "labels": [" \t "]}], 2, "blank label name ' \\t '"),
    ([{"text": "a", "labels": ["x" * (MAX_LABEL_NAME + 1)]}], 1,
     f"label name 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... is {MAX_LABEL_NAME + 1} characters long; "
     f"at most {MAX_LABEL_NAME}"),
    ([{"text": "a", "label": ["x"]}], 1, "unknown key(s) ['label']"),
    ([], 1, "empty file"),
]


@pytest.mark.parametrize(("rows", "line", "msg"), JSONL_BAD, ids=[c[2][:30] for c in JSONL_BAD])
def test_malformed_jsonl_names_line_and_fault(
        tmp_path: Path, rows: list[object], line: int, msg: str) -> None:
    p = _jsonl(tmp_path, rows)
    with pytest.raises(DataFormatError) as ei:
        read_jsonl(p)
    assert ei.value.line == line, str(ei.value)
    assert msg in ei.value.message, str(ei.value)


def test_jsonl_label_names_up_to_the_limit_and_of_any_character_are_kept(tmp_path: Path) -> None:
    names = ["x" * MAX_LABEL_NAME, "two\nlines", "tab\there", " padded "]
    ds = read_jsonl(_jsonl(tmp_path, [{"text": "a", "labels": names}]))
    assert ds.label_names == names


def test_jsonl_unknown_label_against_vocabulary(tmp_path: Path) -> None:
    p = _jsonl(tmp_path, [{"text": "a", "labels": ["a"]}, {"text": "b", "labels": ["q"]}])
    with pytest.raises(DataFormatError) as ei:
        read_jsonl(p, label_names=["a", "b"])
    assert ei.value.line == 2 and "unknown label 'q'" in ei.value.message


def test_jsonl_non_utf8_is_a_data_error(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n')
    with pytest.raises(DataFormatError, match="not UTF-8"):
        read_jsonl(p)


# ----------------------------------------------------------------------------- sniffing, compatibility


def test_read_dataset_sniffs_format(tmp_path: Path) -> None:
    assert read_dataset(_jsonl(tmp_path, ["", {"text": "a", "labels": ["x"]}])).is_text
    assert not read_dataset(_write(tmp_path, "1 2 1\n0 1:1\n", "x.txt")).is_text
    assert "empty file" in _err(_write(tmp_path, "\n \n", "blank.txt")).message


def test_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    p = tmp_path / "bom.txt"
    p.write_bytes(b"\xef\xbb\xbf1 3 2\n1 2:1\n")
    assert read_dataset(p).n_features == 3
    q = tmp_path / "bom.jsonl"
    q.write_bytes(b'\xef\xbb\xbf{"text": "hi", "labels": ["a"]}\n')
    assert read_dataset(q).texts == ["hi"]


def test_check_compatible_widens_smaller_test_set(tmp_path: Path) -> None:
    train = read_xc(_write(tmp_path, "1 10 5\n4 9:1\n", "tr.txt"))
    test = read_xc(_write(tmp_path, "1 6 3\n2 5:1\n", "te.txt"))
    out = check_compatible(train, test)
    assert out.X is not None and out.X.shape == (1, 10) and out.Y.shape == (1, 5)
    assert out.Y.indices.tolist() == [2]


@pytest.mark.parametrize(("header", "msg"), [("1 11 5", "D=11 features but the training set has 10"),
                                             ("1 10 6", "L=6 labels but the training set has 5")])
def test_check_compatible_rejects_larger_test_set(tmp_path: Path, header: str, msg: str) -> None:
    train = read_xc(_write(tmp_path, "1 10 5\n4 9:1\n", "tr.txt"))
    test = read_xc(_write(tmp_path, f"{header}\n0 1:1\n", "te.txt"))
    with pytest.raises(DataFormatError, match=msg):
        check_compatible(train, test)


def test_check_compatible_remaps_jsonl_labels_and_appends_unknown_ones(tmp_path: Path) -> None:
    """A test label the training set lacks is one the model never predicts: it gets a column after the
    training labels (a miss, as in XC evaluation), and the set says how many there are and on which rows."""
    train = read_jsonl(_jsonl(tmp_path, [{"text": "a", "labels": ["x", "y"]}, {"text": "b", "labels": ["z"]}],
                              "tr.jsonl"))
    test = read_jsonl(_jsonl(tmp_path, [{"text": "c", "labels": ["z"]}, {"text": "d", "labels": ["x"]}],
                             "te.jsonl"))
    out = check_compatible(train, test)
    assert out.label_names == ["x", "y", "z"] and out.Y.toarray().tolist() == [[0, 0, 1], [1, 0, 0]]
    assert "unseen_labels" not in out.meta and data.unseen_labels_note(out, "the test set") is None
    rows = [{"text": "c", "labels": ["x"]}, {"text": "d", "labels": ["w", "z"]},
            {"text": "e", "labels": ["v"]}, {"text": "f", "labels": ["w"]}]
    unseen = check_compatible(train, read_jsonl(_jsonl(tmp_path, rows, "unseen.jsonl")))
    assert unseen.label_names == ["x", "y", "z", "w", "v"] and unseen.n_labels == 5
    assert unseen.Y.toarray().tolist() == [[1, 0, 0, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 1], [0, 0, 0, 1, 0]]
    assert (unseen.meta["unseen_labels"], unseen.meta["unseen_rows"]) == (2, 3)
    assert data.unseen_labels_note(unseen, "the test set") == (
        f"warning: the test set {tmp_path / 'unseen.jsonl'} holds 2 label(s) the model has not trained on, "
        "on 3 of its 4 rows: the model never predicts them, so they count as misses")
    xc = read_xc(_write(tmp_path, "1 2 1\n0 1:1\n", "x.txt"))
    with pytest.raises(DataFormatError, match="trained on text"):
        check_compatible(train, xc)


# ----------------------------------------------------------------------------- real data


@pytest.mark.skipif(not (SHARED / "bibtex_train.txt").exists(), reason="../shared/data not present")
@pytest.mark.parametrize("name", ["bibtex_train", "bibtex_test", "corel5k_train"])
def test_real_files_match_their_headers(name: str) -> None:
    path = SHARED / f"{name}.txt"
    with open(path) as fh:
        n, d, n_labels = (int(v) for v in fh.readline().split())
        body = fh.read().splitlines()
    ds = read_xc(path)
    assert (ds.n_rows, ds.n_features, ds.n_labels) == (n, d, n_labels)
    assert ds.X is not None
    # nnz equals the number of f:v tokens / label ids in the text, counted independently
    assert ds.X.nnz == sum(line.count(":") for line in body)
    assert ds.Y.nnz == sum(len(line.split()[0].split(",")) for line in body
                           if line.strip() and ":" not in line.split()[0])


def _assert_parses_like_the_reference(p: Path, rows: list[str]) -> None:
    """`read_xc` of these rows (header: 12 features, 6 labels) equals `_check_row` applied row by row:
    the same arrays, or the same first fault (its line and message)."""
    p.write_text(f"{len(rows)} 12 6\n" + "\n".join(rows) + "\n")
    try:
        ds = read_xc(p)
    except DataFormatError as e:
        assert "no single fault" not in e.message
        with pytest.raises(DataFormatError) as ref:
            for i, row in enumerate(rows):
                data._check_row(row.encode(), i + 2, str(p), 12, 6)
        assert (ref.value.line, ref.value.message) == (e.line, e.message)
        return
    assert ds.X is not None
    for i, row in enumerate(rows):
        labels, ids, vals = data._check_row(row.encode(), i + 2, str(p), 12, 6)
        assert sorted(labels) == ds.Y[i].indices.tolist()
        order = np.argsort(ids)
        assert np.asarray(ids)[order].tolist() == ds.X[i].indices.tolist()
        assert np.array_equal(np.asarray(vals, np.float32)[order], ds.X[i].data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.text(alphabet="0123456789:,. \t\r\x0b-einfa²+_", max_size=14),
                     min_size=1, max_size=6))
def test_fuzzed_rows_either_parse_like_the_reference_or_raise_data_errors(
        tmp_path: Path, rows: list[str]) -> None:
    """The vectorised fast path must agree with the line-by-line reference parser on any input."""
    _assert_parses_like_the_reference(tmp_path / "fz.txt", rows)


FRAGMENTS = ["0", "3", "0,2", "5,1,4", "1,1", "0,", "2:1", "5:0.25", "7:1e-3", "3:-2", "1:.5", "4:1.",
             "11:3", ":1", "2:", "-1:3", "x", "9:nan", "8:+7", "6:0.000001", "10:123456789.125",
             "12:1", "3:2.5.1", "0:1:1", "4:1,5"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.lists(st.sampled_from(FRAGMENTS), max_size=6).map(" ".join), min_size=1, max_size=8),
       lead=st.sampled_from(["", " ", "\t"]))
def test_fuzzed_token_rows_agree_with_the_reference(tmp_path: Path, rows: list[str], lead: str) -> None:
    """Mostly well-formed rows: exercises the vectorised path on valid input, not just on garbage."""
    _assert_parses_like_the_reference(tmp_path / "fz2.txt", [lead + r for r in rows])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.text(min_size=1).filter(lambda t: t.strip() != ""),
                               st.lists(st.text(min_size=1, max_size=5).filter(lambda t: t.strip() != ""),
                                        unique=True, max_size=4)),
                     min_size=1, max_size=8))
def test_jsonl_round_trip(tmp_path: Path, rows: list[tuple[str, list[str]]]) -> None:
    """Any texts and non-blank label names (unicode, quotes, newlines inside strings) come back as
    written."""
    p = tmp_path / "rt.jsonl"
    p.write_text("".join(json.dumps({"text": t, "labels": labs}) + "\n" for t, labs in rows),
                 encoding="utf-8")
    ds = read_jsonl(p)
    assert ds.texts == [t for t, _ in rows]
    assert ds.label_names is not None
    for i, (_, labs) in enumerate(rows):
        got = {ds.label_names[j] for j in ds.Y[i].indices}
        assert got == set(labs)


def test_label_counts() -> None:
    Y = sp.csr_matrix(np.array([[1, 0, 1], [1, 0, 0]], dtype=np.float32))
    assert data.label_counts(Y).tolist() == [2, 0, 1]
