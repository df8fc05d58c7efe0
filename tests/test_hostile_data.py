"""Hostile dataset files: whatever the bytes, the readers answer a `DataFormatError` naming the line and what
is wrong, never another exception; and what they accept is what every job can use (UTF-8 text and names)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainer.data import MAX_VALUE_CHARS, read_dataset, read_jsonl, read_xc
from trainer.errors import DataFormatError

NINES = "9" * 5000

# (file bytes, 1-based line of the fault, what the message must say)
XC_CASES = [
    pytest.param(f"1 {NINES} 10\n0 1:1\n", 1, "bad header: D='9999", id="header-D-5000-digits"),
    pytest.param(f"{NINES} 5 10\n0 1:1\n", 1, "5,000-digit count of rows", id="header-N-5000-digits"),
    pytest.param(f"1 5 {NINES}\n0 1:1\n", 1, "5,000-digit count of labels", id="header-L-5000-digits"),
    pytest.param(f"1 5 1{'0' * 18}\n0 1:1\n", 1, "19-digit count of labels", id="header-L-19-digits"),
    pytest.param(f"1 5 {2**31 + 1}\n0 1:1\n", 1, "L=2147483649 labels is more than", id="header-L-too-big"),
    pytest.param(f"2 5 10\n0 1:1\n{NINES} 1:1\n", 3, "label id '9999", id="label-id-5000-digits"),
    pytest.param(f"2 5 10\n0 1:1\n1,-{NINES} 1:1\n", 3, "a 5,000-digit number, and ids run from 0 to L-1=9",
                 id="negative-label-id-5000-digits"),
    pytest.param(f"2 5 10\n0 1:1\n1 {NINES}:1\n", 3, "feature id '9999", id="feature-id-5000-digits"),
    pytest.param(f"2 5 10\n0 1:1\n1 {'0' * 5000}5:1\n", 3, "feature id 5 >= D=5",
                 id="feature-id-padded-out-of-range"),
    pytest.param("2 5 10\n0 1:1\n1 1:1e999999\n", 3, "value '1e999999' for feature 1 overflows float32",
                 id="exponent-overflow"),
    pytest.param("2 5 10\n0 1:1\n1 1:" + "1" * 100_000 + "\n", 3, "is 100,000 characters long; at most",
                 id="value-100k-digits"),
    pytest.param("2 5 10\n0 1:1\n1 1:0." + "1" * 100_000 + "\n", 3, "is 100,002 characters long",
                 id="fraction-100k-digits"),
    pytest.param("2 5 10\n0 1:1\n1 2:nan\n", 3, "non-finite value 'nan' for feature 2", id="nan"),
    pytest.param("2 5 10\n0 1:1\n1 2:-inf\n", 3, "non-finite value '-inf' for feature 2", id="inf"),
    pytest.param("2 5 10\n0 1:1\n1 2:1e39\n", 3, "value '1e39' for feature 2 overflows float32", id="f32"),
]


@pytest.mark.parametrize(("text", "line", "says"), XC_CASES)
def test_xc_hostile_numbers_name_the_line(tmp_path: Path, text: str, line: int, says: str) -> None:
    path = tmp_path / "d.txt"
    path.write_text(text)
    with pytest.raises(DataFormatError) as e:
        read_dataset(path)
    assert e.value.line == line and says in e.value.message, e.value.message
    assert len(str(e.value)) < 400  # the message shows a long token cut short, not whole


JSONL_CASES = [
    pytest.param('{"text": "ok"}\n{"text": "a\\udfff", "labels": ["x"]}\n', 2,
                 "'text' holds a lone surrogate '\\udfff' at character 2", id="surrogate-in-text"),
    pytest.param('{"text": "ok", "labels": ["y"]}\n\n{"text": "a", "labels": ["y", "x\\udfff"]}\n', 3,
                 "label name 'x\\udfff' holds a lone surrogate", id="surrogate-in-label"),
    pytest.param('{"text": "a\\ud83d", "labels": ["x"]}\n', 1, "lone surrogate '\\ud83d'",
                 id="high-half-only"),
    pytest.param('{"text": "a\\ude00\\ud83d", "labels": ["x"]}\n', 1, "lone surrogate", id="pair-reversed"),
    pytest.param('{"text": "ok"}\n{"text": "a", "id": ' + NINES + '}\n', 2, "a JSON number with more than",
                 id="id-5000-digits"),
    pytest.param('{"text": "ok", "labels": [""]}\n', 1, "blank label name", id="empty-label"),
    pytest.param('{"text": "ok", "labels": ["' + "x" * 1001 + '"]}\n', 1, "1001 characters long",
                 id="label-too-long"),
    pytest.param("\n\n", 2, "empty file: no JSON rows", id="no-rows"),
]


@pytest.mark.parametrize(("text", "line", "says"), JSONL_CASES)
def test_jsonl_hostile_rows_name_the_line(tmp_path: Path, text: str, line: int, says: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(text)
    with pytest.raises(DataFormatError) as e:
        read_jsonl(path)
    assert e.value.line == line and says in e.value.message, e.value.message


def test_undecodable_byte_names_its_own_line_past_the_decoders_read_ahead(tmp_path: Path) -> None:
    """Text mode decodes ahead of the line it hands out; the error still names the line with the byte,
    counting lines as text mode does (a lone carriage return ends one)."""
    rows = b'{"text": "a"}\r{"text": "b"}\r\n' + b'{"text": "c"}\n' * 3000
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + rows + b'{"text": "\xff"}\n' + b'{"text": "c"}\n' * 3000)
    with pytest.raises(DataFormatError) as e:
        read_jsonl(path)
    assert e.value.line == 3003 and "not UTF-8" in e.value.message, e.value


def test_unusual_but_valid_data_is_still_read(tmp_path: Path) -> None:
    plain, padded = tmp_path / "plain.txt", tmp_path / "padded.txt"
    plain.write_text("2 5 10\n3,1 4:2 1:1.5\n\n")
    padded.write_text(f"2 {'0' * 30}5 0010\n{'0' * 5000}3,{'0' * 20}1 4:2 {'0' * 4400}1:1.50\n\n")
    a, b = read_xc(plain), read_xc(padded)
    assert a.X is not None and b.X is not None
    assert (a.n_features, a.n_labels) == (b.n_features, b.n_labels) == (5, 10)
    assert np.array_equal(a.X.toarray(), b.X.toarray()) and np.array_equal(a.Y.toarray(), b.Y.toarray())
    assert b.Y[0].indices.tolist() == [1, 3] and b.X[0].indices.tolist() == [1, 4]  # sorted in the row
    long_ok = tmp_path / "long.txt"
    long_ok.write_text("1 3 1\n0 1:0." + "5" * (MAX_VALUE_CHARS - 2) + " 2:1e-999\n")
    x = read_xc(long_ok).X
    assert x is not None and x.toarray()[0].tolist() == pytest.approx([0.0, 5 / 9, 0.0])

    names = ["😀", "日本語", "a\nb", "nul\x00x", "\u200bzero-width", "מימין", "e\u0301"]
    text = "naïve café 😀 \x00 \u2028 日本語"
    rows: list[dict[str, object]] = [{"text": text, "labels": names},
            {"text": "x", "labels": ["😀"], "id": 10**40}]
    path = tmp_path / "u.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # ascii: astral characters as escaped pairs
    ds = read_jsonl(path)
    assert ds.label_names == names and ds.texts is not None and ds.texts[0] == text


# ------------------------------------------------------------------------------------------ properties
def _read_all_ways(path: Path) -> None:
    for reader in (read_dataset, read_xc, read_jsonl):
        try:
            ds = reader(path)
        except DataFormatError as e:
            assert e.line >= 0 and e.message
            continue
        for text in [*(ds.texts or []), *(ds.label_names or [])]:
            text.encode("utf-8")  # what a job does with every text and label name


_SETTINGS = settings(max_examples=150, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])


@_SETTINGS
@given(data=st.binary(max_size=400))
def test_arbitrary_bytes_only_ever_give_data_format_errors(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "any"
    path.write_bytes(data)
    _read_all_ways(path)


_XC_BYTES = st.lists(st.sampled_from(
    [b"0", b"1", b"9", b"00", b"9" * 30, b"9" * 4400, b" ", b"\n", b"\r", b"\t", b":", b",", b".", b"-", b"+",
     b"e", b"e999", b"nan", b"inf", b"_", b"\xff", b"\xef\xbb\xbf"]), max_size=60).map(b"".join)


@_SETTINGS
@given(header=st.tuples(*[st.sampled_from([b"0", b"1", b"3", b"10", b"9" * 25, b"0" * 4400 + b"2"])] * 3),
       rows=_XC_BYTES)
def test_xc_like_bytes_only_ever_give_data_format_errors(tmp_path: Path, header: tuple[bytes, ...],
                                                         rows: bytes) -> None:
    path = tmp_path / "d.txt"
    path.write_bytes(b" ".join(header) + b"\n" + rows)
    _read_all_ways(path)


# any code point, lone surrogates included (codec=None), and those that break jobs drawn often
_CHARS = st.characters(codec=None) | st.sampled_from(["\udfff", "\ud83d", "\x00", " ", "a"])
_JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(_CHARS, max_size=8),
    lambda inner: (st.lists(inner, max_size=3)
                   | st.dictionaries(st.sampled_from(["text", "labels", "id", "x"]), inner, max_size=3)),
    max_leaves=8,
)
_ROW = st.fixed_dictionaries(
    {"text": st.text(_CHARS, max_size=12)},
    optional={"labels": st.lists(st.text(_CHARS, max_size=4), max_size=3),
              "id": _JSON_VALUE},
)


@_SETTINGS
@given(lines=st.lists(_ROW | _JSON_VALUE, min_size=0, max_size=5),
       raw=st.lists(st.sampled_from(["", "{", '{"text": 1' + "0" * 4400 + "}", "[" * 100_000, "\r"]),
                    max_size=2))
def test_json_lines_only_ever_give_data_format_errors(tmp_path: Path, lines: list[object],
                                                      raw: list[str]) -> None:
    """Rows as JSON writes them (lone surrogates as \\u escapes), hostile lines among them: a file read
    without error holds only text a job can encode."""
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join([json.dumps(x) for x in lines] + raw) + "\n")
    _read_all_ways(path)


# ------------------------------------------------------------------------------------------ command line
def test_cli_train_on_a_5000_digit_header_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "huge.txt"
    bad.write_text(f"1 {NINES} 10\n0 1:1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", "train", "--train", str(bad), "--out", str(tmp_path / "m")],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: {bad}:1: bad header: D="), proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr) < 400
    assert not (tmp_path / "m").exists()


def test_label_names_file_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    from trainer.cli import with_label_names

    data, names = tmp_path / "d.txt", tmp_path / "names.txt"
    data.write_text("1 3 3\n0 1:1\n")
    names.write_bytes(b"first\r\nsecond\nthi\xffrd\n")
    with pytest.raises(DataFormatError) as e:
        with_label_names(read_xc(data), str(names))
    assert e.value.line == 3 and "not UTF-8" in e.value.message, e.value
