"""Dataset readers and writers: Extreme Classification Repository text format and JSONL.

XC files are read in 1 MB blocks of whole lines, each tokenized and parsed by numpy at once, so
peak memory is about the CSR arrays (not the text) and no Python runs per token. Any anomaly in a
block sends it through an exact line-by-line parser, which is the reference for what is valid and
turns every fault into a `DataFormatError` naming the file, the 1-based line and what is wrong:
a traceback from deep inside numpy tells a user nothing about which row to fix.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import scipy.sparse as sp

from trainer.errors import DataFormatError

__all__ = [
    "MAX_DIMENSION",
    "MAX_LABEL_NAME",
    "Dataset",
    "check_compatible",
    "in_label_space",
    "label_counts",
    "label_name_problem",
    "label_names_of",
    "read_dataset",
    "read_jsonl",
    "read_xc",
    "undecodable_line",
    "unseen_labels_note",
    "write_xc",
    "write_xc_rows",
]

# Bytes parsed per vectorised block: large enough to amortise numpy calls, small enough that the
# per-block temporaries (a few arrays of the block's size) stay small next to the CSR result.
_BLOCK_BYTES = 1 << 20
# Smallest magnitude that rounds to inf in float32 (max float32 plus half an ulp).
_F32_OVERFLOW = 2.0**128 - 2.0**103

_INT_RE = re.compile(rb"[0-9]+")
_SIGNED_INT_RE = re.compile(rb"-?[0-9]+")
_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark some editors put at the start of text files
# Longest label name, in characters: room for any title, category path or product name; a longer one
# is a text in the wrong field, and every answer naming the label would carry it.
MAX_LABEL_NAME = 1000
# Most labels or features a file may declare (the largest 32-bit signed id, plus one): past every label
# or feature space in use (the largest published label spaces are about 10^8), so a header beyond it is
# a typo or a damaged file, refused before anything of its size is allocated.
MAX_DIMENSION = 2**31
# Most significant digits a count or id may have (leading zeros aside): ids are below MAX_DIMENSION (10
# digits) and no file holds 10^18 rows, so a longer number is out of range, which is said without
# converting it (Python refuses to convert one of over 4,300 digits at all).
_MAX_NUMBER_DIGITS = 18
# Longest feature value token, in characters: any float32 is written exactly in under 50 (9 significant
# digits and an exponent suffice), so a longer token is damage, refused before it is converted.
MAX_VALUE_CHARS = 100
# Half of a UTF-16 pair on its own, which a JSON \uXXXX escape can spell but UTF-8 cannot hold: a text or
# label name carrying one fails every job at its first encode (hashing, the model's label file).
_SURROGATE = re.compile("[\ud800-\udfff]")

# Variable-length strings with vectorised concatenation (numpy >= 2); fixed-width unicode before that.
if hasattr(np, "strings") and hasattr(np.dtypes, "StringDType"):
    _STR: Any = np.dtypes.StringDType()
    _str_add: Any = np.strings.add
else:  # pragma: no cover - numpy 1.x
    _STR = str
    _str_add = np.char.add


@dataclass
class Dataset:
    """One split in memory: sparse features (or raw texts before featurizing) and a label matrix.

    `X` is N×D float32 CSR for feature files; JSONL text sets carry `texts` instead and `X` is None
    until a featurizer turns them into features. `Y` is N×L float32 CSR of 1s (rows may be empty).
    """

    Y: sp.csr_matrix
    n_features: int
    n_labels: int
    X: sp.csr_matrix | None = None
    texts: list[str] | None = None
    label_names: list[str] | None = None
    path: str = ""
    meta: dict[str, object] = field(default_factory=dict)

    @property
    def n_rows(self) -> int:
        return int(self.Y.shape[0])

    @property
    def is_text(self) -> bool:
        return self.texts is not None

    def take(self, rows: np.ndarray) -> Dataset:
        """The given rows (features or texts), in the same label and feature space."""
        return Dataset(
            Y=self.Y[rows],
            n_features=self.n_features,
            n_labels=self.n_labels,
            X=None if self.X is None else self.X[rows],
            texts=None if self.texts is None else [self.texts[int(i)] for i in rows],
            label_names=self.label_names,
            path=self.path,
            meta=dict(self.meta),
        )


# ---------------------------------------------------------------------------------------------
# XC format
# ---------------------------------------------------------------------------------------------


class _CsrBuilder:
    """Accumulates CSR pieces block by block (compact numpy arrays), concatenated once at the end,
    so the peak is about twice the final CSR arrays plus one block's temporaries."""

    def __init__(self, n_cols: int) -> None:
        self.idx_dtype = np.int32 if n_cols < 2**31 else np.int64
        self.indices: list[np.ndarray] = []
        self.data: list[np.ndarray] = []
        self.counts: list[np.ndarray] = []

    def add(self, counts: np.ndarray, indices: np.ndarray, data: np.ndarray | None) -> None:
        self.counts.append(counts.astype(np.int32, copy=False))
        self.indices.append(indices.astype(self.idx_dtype, copy=False))
        if data is not None:
            self.data.append(data.astype(np.float32, copy=False))

    def build(self, n_rows: int, n_cols: int, ones: bool) -> sp.csr_matrix:
        counts = np.concatenate(self.counts) if self.counts else np.zeros(0, np.int32)
        nnz = int(counts.sum(dtype=np.int64))
        ptr_dtype = np.int32 if max(nnz, n_cols) < 2**31 else np.int64
        idx_dtype = ptr_dtype if ptr_dtype == np.int64 else self.idx_dtype
        indptr = np.zeros(n_rows + 1, dtype=ptr_dtype)
        np.cumsum(counts, out=indptr[1:])
        indices = (np.concatenate(self.indices) if self.indices else np.zeros(0, idx_dtype)).astype(
            idx_dtype, copy=False)
        self.indices.clear()
        if ones:
            data = np.ones(nnz, dtype=np.float32)
        else:
            data = np.concatenate(self.data) if self.data else np.zeros(0, np.float32)
        self.data.clear()
        m = sp.csr_matrix((data, indices, indptr), shape=(n_rows, n_cols))
        m.has_sorted_indices = True
        return m


def _digits(tok: bytes) -> int:
    """Significant digits of an all-digit token (its sign and leading zeros aside)."""
    return len(tok.lstrip(b"-").lstrip(b"0"))


def _to_int(tok: bytes) -> int:
    """An integer token of at most `_MAX_NUMBER_DIGITS` significant digits; leading zeros are dropped
    first, so they never count against Python's limit on digits converted."""
    digits = tok.lstrip(b"-").lstrip(b"0") or b"0"
    return -int(digits) if tok.startswith(b"-") else int(digits)


def _parse_header(raw: bytes, path: str) -> tuple[int, int, int]:
    parts = raw.split()
    if len(parts) != 3 or not all(_INT_RE.fullmatch(p) for p in parts):
        shown = raw.decode("utf-8", "replace").strip()[:80]
        raise DataFormatError(
            path, 1, f"bad header {shown!r}: expected three non-negative integers 'N D L' "
            "(rows, features, labels)")
    for name, part, what in zip("NDL", parts, ("rows", "features", "labels"), strict=True):
        if _digits(part) > _MAX_NUMBER_DIGITS:
            raise DataFormatError(path, 1, f"bad header: {name}={_show(part)} is a {_digits(part):,}-digit "
                                  f"count of {what}; at most {_MAX_NUMBER_DIGITS} digits are allowed (D and "
                                  f"L at most {MAX_DIMENSION:,})")
    n, d, labels = (_to_int(p) for p in parts)
    if d == 0:
        raise DataFormatError(path, 1, "bad header: feature count D must be positive")
    for name, value, what in (("D", d, "features"), ("L", labels, "labels")):
        if value > MAX_DIMENSION:
            raise DataFormatError(path, 1, f"bad header: {name}={value} {what} is more than the "
                                  f"{MAX_DIMENSION:,} a file may declare; D and L are the feature and label "
                                  "counts, at least one more than the largest id the rows use")
    return n, d, labels


def _show(b: bytes, limit: int = 40) -> str:
    """A token as the user wrote it (for messages), undecodable bytes escaped; a long one cut to its
    first `limit` characters and its length, so a message stays a line whatever the token."""
    text = b.decode("utf-8", "backslashreplace")
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(b):,} bytes)"


def _out_of_range(tok: bytes, what: str, bound: str, size: int) -> str | None:
    """Why an integer id token has too many digits to be an id below `size`, or None."""
    if _digits(tok) <= _MAX_NUMBER_DIGITS:
        return None
    return (f"{what} {_show(tok)} is out of range: a {_digits(tok):,}-digit number, and ids run from 0 to "
            f"{bound}-1={size - 1} from the header")


def _value_problem(val_s: bytes, val: float | None, fid: int) -> str | None:
    """What is wrong with a feature value token (None: fine); `val` is None when it was too long to read."""
    if val is None:
        return (f"value {_show(val_s)} for feature {fid} is {len(val_s):,} characters long; at most "
                f"{MAX_VALUE_CHARS} are allowed (a float32 is written exactly in far fewer)")
    if math.isnan(val) or (math.isinf(val) and b"n" in val_s.lower()):  # nan, inf, infinity
        return f"non-finite value {_show(val_s)} for feature {fid}: values must be finite numbers"
    if abs(val) >= _F32_OVERFLOW:
        return f"value {_show(val_s)} for feature {fid} overflows float32 (largest magnitude about 3.4e38)"
    return None


def _check_row(line: bytes, lineno: int, path: str, n_features: int, n_labels: int
               ) -> tuple[list[int], list[int], list[float]]:
    """Slow, exact parse of one row; the reference the fast path must agree with, and the source of
    the message for the first fault in a chunk. Works on bytes so both paths see the same tokens."""
    tokens = line.split()
    labels: list[int] = []
    if tokens and b":" not in tokens[0]:
        lab_tok = tokens.pop(0)
        for part in lab_tok.split(b","):
            if part == b"":
                raise DataFormatError(path, lineno, f"empty label id in label list {_show(lab_tok)}")
            if not _SIGNED_INT_RE.fullmatch(part):
                raise DataFormatError(path, lineno,
                                      f"unparsable label id {_show(part)} (expected an integer)")
            problem = _out_of_range(part, "label id", "L", n_labels)
            if problem:
                raise DataFormatError(path, lineno, problem)
            lab = _to_int(part)
            if lab < 0:
                raise DataFormatError(path, lineno, f"negative label id {lab}")
            if lab >= n_labels:
                raise DataFormatError(path, lineno, f"label id {lab} >= L={n_labels} from the header")
            labels.append(lab)
        if len(set(labels)) != len(labels):
            dup = next(x for x in labels if labels.count(x) > 1)
            raise DataFormatError(path, lineno, f"duplicate label id {dup}")
    ids: list[int] = []
    vals: list[float] = []
    for tok in tokens:
        if tok.count(b":") != 1:
            raise DataFormatError(path, lineno, f"unparsable token {_show(tok)}: expected feature:value")
        fid_s, val_s = tok.split(b":")
        if not _SIGNED_INT_RE.fullmatch(fid_s):
            raise DataFormatError(path, lineno, f"unparsable feature id {_show(fid_s)} in {_show(tok)}")
        problem = _out_of_range(fid_s, "feature id", "D", n_features)
        if problem:
            raise DataFormatError(path, lineno, problem)
        fid = _to_int(fid_s)
        if fid < 0:
            raise DataFormatError(path, lineno, f"negative feature id {fid}")
        if fid >= n_features:
            raise DataFormatError(path, lineno, f"feature id {fid} >= D={n_features} from the header")
        val: float | None = None
        if len(val_s) <= MAX_VALUE_CHARS:
            try:
                val = float(val_s)
            except ValueError:
                raise DataFormatError(path, lineno, f"unparsable value {_show(val_s)} in {_show(tok)}"
                                      ) from None
        problem = _value_problem(val_s, val, fid)
        if problem:
            raise DataFormatError(path, lineno, problem)
        assert val is not None
        ids.append(fid)
        vals.append(val)
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise DataFormatError(path, lineno, f"duplicate feature id {dup}")
    return labels, ids, vals


def _sorted_rows(counts: np.ndarray, ids: np.ndarray, n_cols: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """Sort ids within each row; report whether any row holds a duplicate id.

    Returns (sorted ids, the permutation applied — empty when the ids were already in order, dup).
    """
    if ids.size == 0:
        return ids, np.zeros(0, np.int64), False
    rows = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    key = rows * np.int64(n_cols) + ids
    step = np.diff(key)
    if step.size == 0 or int(step.min()) > 0:  # the usual case: already sorted, no duplicates
        return ids, np.zeros(0, np.int64), False
    order = np.argsort(key, kind="stable")
    skey = key[order]
    dup = bool(np.any(skey[1:] == skey[:-1]))
    return ids[order], order, dup


# Byte classes for the vectorised tokenizer (bytes.split() whitespace: \t \n \v \f \r and space).
_WS = np.zeros(256, dtype=bool)
_WS[[9, 10, 11, 12, 13, 32]] = True
# bytes that are neither whitespace, digits, ':', ',' nor '.' (rare in clean files: signs, exponents)
_OTHER = ~_WS.copy()
_OTHER[[44, 46, 58]] = False
_OTHER[48:58] = False
_POW10 = 10 ** np.arange(19, dtype=np.int64)
_POW10F = 10.0 ** np.arange(23, dtype=np.float64)
_MAX_INT_DIGITS = 18  # longer ids go to the slow path (which reports them as out of range)
_MAX_FAST_DIGITS = 15  # decimal values with more digits are parsed by float()


def _parse_uint(a: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Integer spelled by each all-digit segment [start, start+len) of `a` (empty segment: 0).

    Segments are right-aligned and consumed one character column at a time (Horner's rule), so the
    work is (longest segment) passes over n small integers, with no (n × width) temporaries.
    """
    val = np.zeros(starts.size, dtype=np.int64)
    if starts.size == 0:
        return val
    width = int(lens.max())
    ends = starts + lens
    for k in range(width):
        idx = ends - width + k
        digit = (a[np.maximum(idx, 0)] - np.uint8(48)).astype(np.int64)
        digit[idx < starts] = 0
        val *= 10
        val += digit
    return val


def _fast_chunk(buf: bytes, n_lines: int) -> tuple[np.ndarray, ...] | None:
    """Tokenize and parse a block of well-formed rows with numpy alone (no per-token Python).

    Returns (label counts, label ids, feature counts, feature ids, values as float64) in file order,
    or None whenever anything is unusual, so that the exact line-by-line parser takes over.
    Range, finiteness and duplicate checks are left to the caller.
    """
    a = np.frombuffer(buf, dtype=np.uint8)
    ws = _WS[a]
    is_nl = a == 10
    if int(np.count_nonzero(is_nl)) != n_lines:
        return None
    edge = np.empty(a.size + 1, dtype=bool)  # edge[i]: whitespace status changes between i-1 and i
    edge[0] = not ws[0]
    edge[-1] = not ws[-1]
    np.not_equal(ws[1:], ws[:-1], out=edge[1:-1])
    bounds = np.flatnonzero(edge)
    tstart, tend = bounds[0::2], bounds[1::2]
    n_tok = tstart.size
    # token index of every byte (meaningful inside tokens) and line index of every token
    tok_of = np.cumsum(edge[:-1] & ~ws, dtype=np.int32) - 1
    tline = np.cumsum(is_nl, dtype=np.int32)[tstart]

    def per_token(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.flatnonzero(mask)
        return pos, np.bincount(tok_of[pos], minlength=n_tok)

    cpos, colons = per_token(a == 58)
    comma_pos, commas = per_token(a == 44)
    dot_pos, dots = per_token(a == 46)
    other_pos, others = per_token(_OTHER[a])
    if n_tok and int(colons.max()) > 1:
        return None
    first = np.ones(n_tok, dtype=bool)
    first[1:] = tline[1:] != tline[:-1]
    is_feat = colons == 1
    is_lab = ~is_feat & first
    if not np.all(is_feat | is_lab) or np.any(commas[is_feat]):
        return None
    # dots and other bytes are only allowed after the colon of a feature token (in the value)
    colon_at = np.full(n_tok, np.iinfo(np.int64).max, dtype=np.int64)
    colon_at[tok_of[cpos]] = cpos
    for pos in (dot_pos, other_pos):
        if pos.size and np.any(pos <= colon_at[tok_of[pos]]):
            return None

    # labels: at most one token per line, first on it; digits and single commas only
    ls, le = tstart[is_lab], tend[is_lab]
    if comma_pos.size and np.any(np.diff(comma_pos) == 1):
        return None
    if ls.size and (np.any(a[ls] == 44) or np.any(a[le - 1] == 44)):
        return None
    run_s = np.sort(np.concatenate([ls, comma_pos + 1]))
    run_e = np.sort(np.concatenate([le, comma_pos]))
    run_len = run_e - run_s
    if run_s.size and int(run_len.max()) > _MAX_INT_DIGITS:
        return None
    lab_ids = _parse_uint(a, run_s, run_len)
    lab_counts = np.bincount(tline[is_lab], weights=commas[is_lab] + 1, minlength=n_lines).astype(np.int64)

    # features: digits ':' value
    fs, fe = tstart[is_feat], tend[is_feat]
    id_len = cpos - fs
    if fs.size and (int(id_len.min()) < 1 or int(id_len.max()) > _MAX_INT_DIGITS
                    or int((fe - cpos).min()) < 2 or int((fe - cpos).max()) > MAX_VALUE_CHARS + 1):
        return None
    feat_ids = _parse_uint(a, fs, id_len)
    feat_counts = np.bincount(tline[is_feat], minlength=n_lines).astype(np.int64)
    vals = np.empty(fs.size, dtype=np.float64)
    if fs.size:
        vs, ve = cpos + 1, fe
        vlen = ve - vs
        vdot = dots[is_feat]
        plain = (vdot <= 1) & (vlen - vdot >= 1) & (vlen - vdot <= _MAX_FAST_DIGITS) & (others[is_feat] == 0)
        if np.any(plain):
            ps, pe = vs[plain], ve[plain]
            dot_at = pe.copy()  # no dot: the integer part is the whole value
            if dot_pos.size:
                feat_tok = np.flatnonzero(is_feat)[plain]
                dot_of_tok = np.full(n_tok, -1, dtype=np.int64)
                dot_of_tok[tok_of[dot_pos]] = dot_pos
                has = vdot[plain] == 1
                dot_at[has] = dot_of_tok[feat_tok[has]]
            frac_len = np.maximum(pe - dot_at - 1, 0)
            mant = _parse_uint(a, ps, dot_at - ps)
            if int(frac_len.max()) > 0:
                mant = mant * _POW10[frac_len] + _parse_uint(a, dot_at + 1, frac_len)
            # both operands are exact in float64, so the quotient is correctly rounded, as float() is
            vals[plain] = mant / _POW10F[frac_len]
        other = np.flatnonzero(~plain)
        if other.size:
            try:
                vals[other] = [float(buf[i:j]) for i, j in zip(vs[other].tolist(), ve[other].tolist(),
                                                                strict=True)]
            except ValueError:
                return None
    return lab_counts, lab_ids, feat_counts, feat_ids, vals


def _parse_chunk(buf: bytes, n_lines: int, first_lineno: int, path: str, n_features: int, n_labels: int,
                 xb: _CsrBuilder, yb: _CsrBuilder) -> None:
    """Vectorised parse of whole lines (`buf` ends with a newline); on any anomaly re-parse line by
    line to report the exact fault."""
    parsed = _fast_chunk(buf, n_lines)
    try:
        if parsed is None:
            raise ValueError
        lab_counts, lab_ids, feat_counts, feat_ids, vals = parsed
        if lab_ids.size and int(lab_ids.max()) >= n_labels:
            raise ValueError
        if feat_ids.size and int(feat_ids.max()) >= n_features:
            raise ValueError
        if vals.size and not (np.all(np.isfinite(vals)) and float(np.abs(vals).max()) < _F32_OVERFLOW):
            raise ValueError
        feat_ids, order, dup_f = _sorted_rows(feat_counts, feat_ids, n_features)
        lab_ids, _, dup_l = _sorted_rows(lab_counts, lab_ids, n_labels)
        if dup_f or dup_l:
            raise ValueError
        vals = vals[order] if order.size else vals
    except (ValueError, OverflowError):
        _slow_chunk(buf, n_lines, first_lineno, path, n_features, n_labels, xb, yb)
        return
    xb.add(feat_counts, feat_ids, vals.astype(np.float32))
    yb.add(lab_counts, lab_ids, None)


def _slow_chunk(buf: bytes, n_lines: int, first_lineno: int, path: str, n_features: int, n_labels: int,
                xb: _CsrBuilder, yb: _CsrBuilder) -> None:
    """Line-by-line parse of a block the fast path declined: the first fault is raised with its line; a
    block without one (rare spellings the fast path leaves alone, such as ids with many leading zeros)
    is added as the exact parser read it."""
    rows = [_check_row(line, first_lineno + j, path, n_features, n_labels)
            for j, line in enumerate(buf.split(b"\n")[:n_lines])]
    feats = [sorted(zip(ids, vals, strict=True)) for _, ids, vals in rows]  # ids are unique in a row
    xb.add(np.array([len(f) for f in feats], np.int64), np.array([i for f in feats for i, _ in f], np.int64),
           np.array([v for f in feats for _, v in f], np.float64))
    yb.add(np.array([len(lab) for lab, _, _ in rows], np.int64),
           np.array([i for lab, _, _ in rows for i in sorted(lab)], np.int64), None)


def _blocks(fh: IO[bytes]) -> Iterator[bytes]:
    """Blocks of whole lines, each ending with a newline (one is added after a final unterminated
    line), read `_BLOCK_BYTES` at a time so memory stays a few blocks whatever the file size."""
    tail = b""
    while True:
        data = fh.read(_BLOCK_BYTES)
        if not data:
            if tail:
                yield tail + b"\n"
            return
        data = tail + data if tail else data
        cut = data.rfind(b"\n")
        if cut < 0:
            tail = data
            continue
        tail = data[cut + 1:]
        yield data[: cut + 1]


def _nth_newline_end(buf: bytes, n: int) -> int:
    """Offset just past the n-th newline of buf (n >= 1)."""
    nl = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == 10)
    return int(nl[n - 1]) + 1


def read_xc(path: str | Path) -> Dataset:
    """Read an Extreme Classification Repository file (`N D L` header, `l1,l2 f:v ...` rows).

    Rows are parsed in vectorised blocks; ids are sorted within each row. Blank lines after the
    N-th row are ignored; a blank line among the rows is a row with no labels and no features.
    """
    spath = str(path)
    try:
        fh = open(spath, "rb")  # noqa: SIM115 - closed in finally; streaming read
    except OSError as e:
        raise DataFormatError(spath, 0, f"cannot open: {e.strerror}") from None
    try:
        header = fh.readline()
        if header.startswith(_BOM):
            header = header[len(_BOM):]
        if not header:
            raise DataFormatError(spath, 1, "empty file: expected a header line 'N D L'")
        n_rows, n_features, n_labels = _parse_header(header, spath)
        xb, yb = _CsrBuilder(n_features), _CsrBuilder(n_labels)
        seen = 0
        lineno = 2  # line number of the first line of the next block
        for block in _blocks(fh):
            n_lines = block.count(b"\n")
            take = min(n_lines, n_rows - seen)
            rest = b""
            if take < n_lines:
                cut = _nth_newline_end(block, take) if take > 0 else 0
                block, rest = block[:cut], block[cut:]
            if take:
                _parse_chunk(block, take, lineno, spath, n_features, n_labels, xb, yb)
                seen += take
            if rest.strip():
                for j, extra in enumerate(rest.split(b"\n")):
                    if extra.strip():
                        raise DataFormatError(spath, lineno + take + j,
                                              f"more rows than N={n_rows} declared in the header")
            lineno += n_lines
        if seen < n_rows:
            raise DataFormatError(spath, lineno, f"file ends after {seen} rows but the header declares "
                                  f"N={n_rows}")
    finally:
        fh.close()
    X = xb.build(n_rows, n_features, ones=False)
    Y = yb.build(n_rows, n_labels, ones=True)
    return Dataset(Y=Y, n_features=n_features, n_labels=n_labels, X=X, path=spath)


def _format_values(values: np.ndarray) -> np.ndarray:
    """Shortest strings that read back to the same float32 (integers without a decimal point)."""
    v = np.asarray(values, dtype=np.float32)
    if v.size and np.all(v == np.round(v)) and np.all(np.abs(v) < 2**24):
        return v.astype(np.int64).astype(_STR)
    return v.astype(_STR)


def write_xc(path: str | Path, X: sp.spmatrix, Y: sp.spmatrix) -> None:
    """Write features and labels in XC format (values written so they read back bit-exactly)."""
    Xc = sp.csr_matrix(X, dtype=np.float32)
    if Xc.shape[0] != Y.shape[0]:
        raise ValueError(f"X has {Xc.shape[0]} rows but Y has {Y.shape[0]}")
    with open(path, "w", encoding="ascii", newline="\n") as fh:
        fh.write(f"{Xc.shape[0]} {Xc.shape[1]} {Y.shape[1]}\n")
        write_xc_rows(fh, Xc, Y)


def write_xc_rows(fh: IO[str], X: sp.spmatrix, Y: sp.spmatrix) -> None:
    """Append rows (no header) to an open text file; lets generators write block by block.

    Each block's text is assembled by numpy (token strings, then one object array laid out as
    labels, " ", token, " ", token, ..., newline) and joined once, not formatted token by token.
    """
    Xc = sp.csr_matrix(X, dtype=np.float32)
    Yc = sp.csr_matrix(Y)
    if Xc.shape[0] != Yc.shape[0]:
        raise ValueError(f"X has {Xc.shape[0]} rows but Y has {Yc.shape[0]}")
    Xc.sort_indices()
    Yc.sort_indices()
    n = Xc.shape[0]
    step = 16384
    for start in range(0, n, step):
        stop = min(n, start + step)
        xs, ys = Xc[start:stop], Yc[start:stop]
        m = stop - start
        toks = _str_add(_str_add(xs.indices.astype(_STR), ":"), _format_values(xs.data))
        labs = ys.indices.astype(str).tolist()
        yp = ys.indptr
        lab_rows = [",".join(labs[yp[i]:yp[i + 1]]) for i in range(m)]
        cnt = np.diff(xs.indptr).astype(np.int64)
        row_len = 2 + 2 * cnt  # labels, (" ", token) per feature, newline
        row_start = np.zeros(m, dtype=np.int64)
        np.cumsum(row_len[:-1], out=row_start[1:])
        out = np.empty(int(row_len.sum()), dtype=object)
        out[row_start] = lab_rows
        row_of = np.repeat(np.arange(m), cnt)
        tok_at = row_start[row_of] + 1 + 2 * (np.arange(xs.nnz) - xs.indptr[row_of])
        out[tok_at] = " "
        out[tok_at + 1] = toks.astype(object)
        out[row_start + row_len - 1] = "\n"
        fh.write("".join(out.tolist()))


# ---------------------------------------------------------------------------------------------
# JSONL
# ---------------------------------------------------------------------------------------------

_JSONL_KEYS = {"text", "labels", "id"}


def read_jsonl(path: str | Path, label_names: list[str] | None = None) -> Dataset:
    """Read `{"text": ..., "labels": [names]}` lines (blank lines skipped, `labels` may be absent).

    Without `label_names` the vocabulary is built in first-seen order; with it (e.g. a test set
    read against the training vocabulary) an unknown name is an error.
    """
    spath = str(path)
    vocab: dict[str, int] = {}
    fixed = label_names is not None
    if label_names is not None:
        for i, name in enumerate(label_names):
            vocab.setdefault(name, i)
    texts: list[str] = []
    indices: list[int] = []
    indptr: list[int] = [0]
    try:
        fh = open(spath, encoding="utf-8-sig")  # noqa: SIM115 - closed below; streaming read
    except OSError as e:
        raise DataFormatError(spath, 0, f"cannot open: {e.strerror}") from None
    lineno = 0
    try:
        with fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataFormatError(spath, lineno, f"invalid JSON: {e.msg} at column {e.colno}"
                                          ) from None
                except RecursionError:  # the C decoder's nesting guard
                    raise DataFormatError(spath, lineno, "JSON nested too deeply") from None
                except ValueError:  # json converts integers itself, up to Python's limit on digits
                    raise DataFormatError(spath, lineno, "a JSON number with more than "
                                          f"{sys.get_int_max_str_digits():,} digits") from None
                texts.append(_jsonl_text(obj, spath, lineno))
                for name in _jsonl_labels(obj, spath, lineno):
                    idx = vocab.get(name)
                    if idx is None:
                        if fixed:
                            raise DataFormatError(spath, lineno, f"unknown label {name!r} (not in the "
                                                  "training label set)")
                        idx = vocab[name] = len(vocab)
                    indices.append(idx)
                indptr.append(len(indices))
    except UnicodeDecodeError as e:  # raised ahead of the line at fault: text is decoded by the block
        raise DataFormatError(spath, undecodable_line(spath, lineno + 1), f"not UTF-8 text: {e.reason}"
                              ) from None
    if not texts:
        raise DataFormatError(spath, max(lineno, 1), "empty file: no JSON rows")
    names = list(label_names) if label_names is not None else list(vocab)
    n_labels = len(names)
    Y = sp.csr_matrix(
        (np.ones(len(indices), np.float32), np.asarray(indices, np.int32), np.asarray(indptr, np.int64)),
        shape=(len(texts), n_labels))
    Y.sort_indices()
    return Dataset(Y=Y, n_features=0, n_labels=n_labels, texts=texts, label_names=names, path=spath)


def undecodable_line(path: str, fallback: int) -> int:
    """The line (counted as text mode counts them: \\n, \\r\\n or a lone \\r ends one) holding the
    first byte that is not UTF-8; `fallback` if none is found. Lines are split at \\n, which no
    multi-byte UTF-8 sequence contains, so each decodes on its own."""
    lineno = 1
    try:
        with open(path, "rb") as fh:
            for i, raw in enumerate(fh):
                if i == 0:
                    raw = raw.removeprefix(_BOM)
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    return lineno + _lone_crs(raw[: e.start])
                lineno += 1 + _lone_crs(raw)
    except OSError:
        pass
    return fallback


def _lone_crs(raw: bytes) -> int:
    """Carriage returns not followed by a newline: each ends a line in text mode."""
    return raw.count(b"\r") - raw.count(b"\r\n")


def _surrogate_problem(text: str, what: str) -> str | None:
    """Where `text` holds a lone surrogate, said as what to fix (None: it has none)."""
    found = _SURROGATE.search(text)
    if found is None:
        return None
    return (f"{what} holds a lone surrogate {found.group()!r} at character {found.start() + 1}: a \\uXXXX "
            "escape that is half of a UTF-16 pair is not text; escape the whole pair or write the "
            "character itself")


def _jsonl_text(obj: object, path: str, lineno: int) -> str:
    if not isinstance(obj, dict):
        raise DataFormatError(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
    extra = set(obj) - _JSONL_KEYS
    if extra:
        raise DataFormatError(path, lineno, f"unknown key(s) {sorted(extra)}; allowed: text, labels, id")
    if "text" not in obj:
        raise DataFormatError(path, lineno, "missing key 'text'")
    text = obj["text"]
    if not isinstance(text, str):
        raise DataFormatError(path, lineno, f"'text' must be a string, got {type(text).__name__}")
    if not text.strip():
        raise DataFormatError(path, lineno, "'text' is empty")
    problem = _surrogate_problem(text, "'text'")
    if problem:
        raise DataFormatError(path, lineno, problem)
    return text


def label_name_problem(name: str) -> str | None:
    """What is wrong with a label name, or None: names are what the model answers, so a blank one (it
    shows as nothing), one over `MAX_LABEL_NAME` characters and one with a lone surrogate (UTF-8 cannot
    hold it) are refused. Any other character is fine: labels.txt holds each name as a JSON string."""
    if not name.strip():
        return f"blank label name {name!r}"
    if len(name) > MAX_LABEL_NAME:
        return (f"label name {name[:40]!r}... is {len(name)} characters long; at most {MAX_LABEL_NAME} are "
                "allowed")
    return _surrogate_problem(name, f"label name {name[:40]!r}")


def _jsonl_labels(obj: dict[str, object], path: str, lineno: int) -> list[str]:
    labels = obj.get("labels", [])
    if not isinstance(labels, list):
        raise DataFormatError(path, lineno,
                              f"'labels' must be a list of strings, got {type(labels).__name__}")
    seen: set[str] = set()
    for lab in labels:
        if not isinstance(lab, str):
            raise DataFormatError(path, lineno, f"'labels' must be a list of strings; found {lab!r}")
        problem = label_name_problem(lab)
        if problem:
            raise DataFormatError(path, lineno, f"{problem} in 'labels'")
        if lab in seen:
            raise DataFormatError(path, lineno, f"duplicate label {lab!r}")
        seen.add(lab)
    return labels


# ---------------------------------------------------------------------------------------------
# Sniffing and compatibility
# ---------------------------------------------------------------------------------------------


def _first_char(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            while True:
                block = fh.read(4096)
                if not block:
                    return ""
                stripped = block.removeprefix(_BOM).lstrip()
                if stripped:
                    return chr(stripped[0])
    except OSError as e:
        raise DataFormatError(path, 0, f"cannot open: {e.strerror}") from None


def read_dataset(path: str | Path, label_names: list[str] | None = None) -> Dataset:
    """Read XC or JSONL, chosen by content: JSONL if the first non-blank character is `{`.

    `label_names` only applies to JSONL (the training vocabulary for a test set).
    """
    spath = str(path)
    first = _first_char(spath)
    if first == "":
        raise DataFormatError(spath, 1, "empty file")
    if first == "{":
        return read_jsonl(spath, label_names=label_names)
    return read_xc(spath)


def check_compatible(train: Dataset, test: Dataset) -> Dataset:
    """Check a test set against the training set and return it in the training set's dimensions.

    XC: a test file may declare fewer features/labels (its matrices are widened), never more.
    JSONL: labels are remapped by name onto the training vocabulary; a name the training set lacks gets
    a column after it (`in_label_space`): the model never predicts it, so it counts as a miss.
    """
    if train.is_text != test.is_text:
        kinds = {True: "text (JSONL)", False: "sparse features (XC)"}
        raise DataFormatError(test.path, 1, f"test set holds {kinds[test.is_text]} but the model was "
                              f"trained on {kinds[train.is_text]}")
    if test.is_text:
        return _remap_labels(train, test)
    assert test.X is not None
    if test.n_features > train.n_features:
        raise DataFormatError(test.path, 1, f"test set declares D={test.n_features} features but the "
                              f"training set has {train.n_features}")
    if test.n_labels > train.n_labels:
        raise DataFormatError(test.path, 1, f"test set declares L={test.n_labels} labels but the "
                              f"training set has {train.n_labels}")
    if test.n_features == train.n_features and test.n_labels == train.n_labels:
        return test
    X = sp.csr_matrix((test.X.data, test.X.indices, test.X.indptr), shape=(test.n_rows, train.n_features))
    Y = sp.csr_matrix((test.Y.data, test.Y.indices, test.Y.indptr), shape=(test.n_rows, train.n_labels))
    return Dataset(Y=Y, n_features=train.n_features, n_labels=train.n_labels, X=X,
                   label_names=train.label_names, path=test.path, meta=dict(test.meta))


def _remap_labels(train: Dataset, test: Dataset) -> Dataset:
    names = train.label_names or []
    test_names = test.label_names or []
    if test_names == names[: len(test_names)] and test.n_labels == train.n_labels:
        return test
    return in_label_space(test, names)


def label_names_of(ds: Dataset) -> list[str]:
    """A data set's label names: XC files name a label by its id as a string."""
    return list(ds.label_names) if ds.label_names is not None else [str(i) for i in range(ds.n_labels)]


def in_label_space(ds: Dataset, names: list[str], refuse: str | None = None,
                   index: dict[str, int] | None = None) -> Dataset:
    """`ds` with its labels moved to the id space `names` (`index`: name -> id, built when not given),
    matched by name (`label_names_of`).

    A label a row carries that `names` lacks is, with `refuse` given, an error naming the first line that
    carries it (`refuse` is appended to the message: why it must be there). With `refuse=None` it gets a
    column after `names`: a label the model has not trained on, which it never predicts, so evaluation
    counts it as a miss (as XC-repository evaluation counts a test label without training rows) instead
    of refusing the whole set; `meta["unseen_labels"]` and `meta["unseen_rows"]` say how many.
    """
    own = ds.label_names
    if own == names:
        return ds
    index = {n: i for i, n in enumerate(names)} if index is None else index
    y = sp.csr_matrix(ds.Y)
    # only the labels rows carry are looked up: most of a large label space has no row here
    used = np.unique(y.indices)
    used_names = [own[j] if own is not None else str(j) for j in used.tolist()]
    ids = np.array([index.get(n, -1) for n in used_names], dtype=np.int64)
    if own is None and ds.n_labels == len(names) and np.array_equal(ids, used):
        return ds  # XC ids that are already the model's
    new_ids = ids[np.searchsorted(used, y.indices)] if y.nnz else np.zeros(0, np.int64)
    missing = new_ids < 0
    extra: list[str] = []
    meta = dict(ds.meta)
    if missing.any():
        if refuse is not None:
            pos = int(np.argmax(missing))
            row = int(np.searchsorted(y.indptr, pos, side="right")) - 1
            line = row + (1 if ds.is_text else 2)  # an XC file's rows follow its header line
            label = used_names[int(np.searchsorted(used, y.indices[pos]))]
            raise DataFormatError(ds.path or "<data>", line, f"label {label!r} is not in the model's label "
                                  f"set{refuse}")
        unseen, at = np.unique(y.indices[missing], return_inverse=True)  # own id order: first seen
        new_ids[missing] = len(names) + at.ravel()
        extra = [used_names[int(i)] for i in np.searchsorted(used, unseen)]
        rows = np.repeat(np.arange(ds.n_rows), np.diff(y.indptr))[missing]
        meta.update(unseen_labels=len(extra), unseen_rows=int(np.unique(rows).size))
    width = len(names) + len(extra)
    Y = sp.csr_matrix((np.ones(new_ids.size, np.float32), new_ids, y.indptr), shape=(ds.n_rows, width))
    Y.sort_indices()
    return Dataset(Y=Y, n_features=ds.n_features, n_labels=width, X=ds.X, texts=ds.texts,
                   label_names=list(names) + extra, path=ds.path, meta=meta)


def unseen_labels_note(ds: Dataset, what: str) -> str | None:
    """A warning when `in_label_space` gave `ds` labels the model has not trained on (None if none)."""
    n, rows = ds.meta.get("unseen_labels"), ds.meta.get("unseen_rows")
    if not n:
        return None
    return (f"warning: {what} {ds.path} holds {n} label(s) the model has not trained on, on {rows} of its "
            f"{ds.n_rows} rows: the model never predicts them, so they count as misses")


def label_counts(Y: sp.spmatrix) -> np.ndarray:
    """Number of rows carrying each label (for propensities and unigram samplers)."""
    Yc = sp.csr_matrix(Y)
    return np.bincount(Yc.indices, minlength=Yc.shape[1]).astype(np.int64)
