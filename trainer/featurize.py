"""Featurizers: turn texts or raw sparse features into the model's input rows.

Fitted on the training split and saved inside the model artifact (JSON + safetensors, never pickle),
so the service featurizes a request exactly as training did. Text: lowercase word tokens (optionally
plus bigrams) → vocabulary (min_df, size cap) or signed/unsigned hashing → sublinear tf-idf (idf from
the training split) → L2. Sparse features: optional idf weighting and optional L2 row normalisation.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp
from safetensors.numpy import load_file, save_file

from trainer.data import Dataset
from trainer.errors import ArtifactError, DataFormatError, ParamsError
from trainer.params import MAX_LEAD_WORDS, TrainParams, fields_in

__all__ = ["FEATURIZER_VERSION", "Featurizer", "FeaturizerConfig", "tokenize"]

FEATURIZER_VERSION = 1
_JSON_NAME = "featurizer.json"
_TENSORS_NAME = "featurizer.safetensors"
_TOKEN_RE = re.compile(r"\w\w+")
_CLAUSE_END_RE = re.compile(r"[.;:!?](?:\s+|$)")  # a sentence or clause ends here
LEAD_MARK = "^"  # marks a clause's leading word as a term of its own; no word token holds it
_HASH_CACHE_MAX = 1 << 20
_SMALL_BATCH = 8  # fewer texts than this take the dict route (lower latency for one request)


def _training_default(name: str) -> Any:
    """The default of a `TrainParams` featurizer field: the library's default of the same option is
    that one, so each default is written once."""
    return TrainParams.model_fields[name].default


@dataclass(frozen=True)
class FeaturizerConfig:
    """Featurizer options, named as `TrainParams`' featurizer group names them, with the same defaults
    (but `ngrams` and `lead_words`: the library keeps to single words, training adds word pairs and marked
    leading words, and a featurizer saved before `lead_words` existed reads as 0), plus two that only the
    library sets. JSON round trip via `to_dict` / `from_dict` (unknown keys rejected; a featurizer saved
    under the names of earlier versions reads as it was fit). `tfidf` and `l2` apply to whichever input
    the featurizer is fit on, texts or sparse features."""

    ngrams: int = 1
    lead_words: int = 0
    min_df: int = _training_default("min_df")
    max_vocab: int = _training_default("max_vocab")
    hash_size: int = _training_default("hash_size")  # 0: a vocabulary; more: that many hash buckets
    tfidf: bool = _training_default("tfidf")
    l2: bool = _training_default("l2")
    signed_hash: bool = True
    sublinear_tf: bool = True

    def __post_init__(self) -> None:
        problems = []
        if self.ngrams not in (1, 2):
            problems.append(f"ngrams must be 1 or 2, got {self.ngrams}")
        if not 0 <= self.lead_words <= MAX_LEAD_WORDS:
            problems.append(f"lead_words must be in [0, {MAX_LEAD_WORDS}], got {self.lead_words}")
        if self.min_df < 1:
            problems.append(f"min_df must be >= 1, got {self.min_df}")
        if self.max_vocab < 1:
            problems.append(f"max_vocab must be >= 1, got {self.max_vocab}")
        if not 0 <= self.hash_size < 2**31:
            problems.append(f"hash_size must be in [0, 2^31), got {self.hash_size}")
        if problems:
            raise ParamsError("; ".join(problems))

    @property
    def hashed(self) -> bool:
        """Texts go to signed hash buckets rather than a vocabulary."""
        return self.hash_size > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_params(cls, params: TrainParams) -> FeaturizerConfig:
        """The featurizer a training run with these params fits: its featurizer group, field by field."""
        return cls(**{name: getattr(params, name) for name in fields_in("featurizer")})

    @classmethod
    def from_dict(cls, d: dict[str, Any], kind: str | None = None) -> FeaturizerConfig:
        """Options by name; the names of earlier versions too, read for a featurizer of `kind`."""
        d = _current_names(d, kind)
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ParamsError(f"unknown featurizer option(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)


def _current_names(d: dict[str, Any], kind: str | None) -> dict[str, Any]:
    """Options saved before they took `TrainParams`' names: `max_features`, `text_mode` with
    `hash_features`, and `text_*`/`sparse_*` pairs of which the featurizer's kind used one."""
    d = dict(d)
    if "max_features" in d:
        d.setdefault("max_vocab", d.pop("max_features"))
    if "text_mode" in d or "hash_features" in d:
        mode, buckets = d.pop("text_mode", "vocab"), d.pop("hash_features", 1 << 18)
        d.setdefault("hash_size", buckets if mode == "hash" else 0)
    for old, new in (("idf", "tfidf"), ("l2", "l2")):
        text, sparse = d.pop(f"text_{old}", None), d.pop(f"sparse_{old}", None)
        # the featurizer's own kind's option where it was saved, else whichever of the pair was
        mine = sparse if kind == "sparse" else text if kind else None
        value = next((v for v in (mine, text, sparse) if v is not None), None)
        if value is not None:
            d.setdefault(new, value)
    return d


def tokenize(text: str, ngrams: int = 1, lead_words: int = 0) -> list[str]:
    """Lowercase word tokens of two or more word characters, plus adjacent bigrams if ngrams=2, plus the
    first `lead_words` tokens of each sentence or clause once more, marked (`^word`).

    Why the marked copies: a description names what it is about first ("a state of extreme confusion"),
    and a leading word as a term of its own weighs apart from the same word further on.
    """
    low = text.lower()
    lead: list[str] = []
    if lead_words > 0:
        toks: list[str] = []
        for clause in _CLAUSE_END_RE.split(low):
            words = _TOKEN_RE.findall(clause)
            toks += words
            lead += [LEAD_MARK + w for w in words[:lead_words]]
    else:
        toks = _TOKEN_RE.findall(low)
    if ngrams == 2 and len(toks) > 1:
        toks = toks + [f"{a} {b}" for a, b in pairwise(toks)]
    return toks + lead


def _hash64(term: str) -> int:
    return int.from_bytes(hashlib.blake2b(term.encode("utf-8"), digest_size=8).digest(), "little")


def _l2_rows(X: sp.csr_matrix) -> None:
    """Scale each row of X (in place) to unit L2 norm; empty rows stay empty."""
    counts = np.diff(X.indptr)
    rows = np.repeat(np.arange(X.shape[0]), counts)
    norms = np.sqrt(np.bincount(rows, weights=X.data.astype(np.float64) ** 2, minlength=X.shape[0]))
    scale = np.where(norms > 0, 1.0 / np.where(norms > 0, norms, 1.0), 0.0)
    X.data = (X.data * np.repeat(scale, counts)).astype(np.float32)


class _FitMethod:
    """`fit` as an instance method, or on the class as a factory: `Featurizer.fit(ds, **options)`."""

    def __get__(self, obj: Featurizer | None, cls: type[Featurizer]) -> Callable[..., Featurizer]:
        if obj is not None:
            return obj._fit

        def factory(ds: Dataset, config: FeaturizerConfig | None = None, **options: Any) -> Featurizer:
            cfg = config if config is not None else FeaturizerConfig.from_dict(options)
            return cls(cfg)._fit(ds)
        return factory


class Featurizer:
    """Fit on a training `Dataset`, then transform any split or request the same way."""

    def __init__(self, config: FeaturizerConfig | None = None) -> None:
        self.config = config or FeaturizerConfig()
        self.kind: Literal["text", "sparse"] | None = None
        self._n_features = 0
        self.vocab: dict[str, int] | None = None
        self.idf: np.ndarray | None = None  # float32, one weight per output column
        self.n_docs = 0
        self._hash_cache: dict[str, tuple[int, float]] = {}

    # ------------------------------------------------------------------ properties

    @property
    def n_features(self) -> int:
        """Width of the rows this featurizer outputs (the model's input dimension)."""
        return self._n_features

    @property
    def fitted(self) -> bool:
        return self.kind is not None

    # ------------------------------------------------------------------ fitting

    fit = _FitMethod()

    def _fit(self, ds: Dataset) -> Featurizer:
        """Learn the vocabulary / idf from the training split; returns self.

        Reached as `featurizer.fit(ds)`, or on the class with options,
        `Featurizer.fit(ds, tfidf=True, l2=True, ...)` (`FeaturizerConfig`'s options).
        """
        if ds.is_text:
            assert ds.texts is not None
            self._fit_texts(ds.texts)
        else:
            if ds.X is None:
                raise ParamsError("dataset has neither texts nor features")
            self._fit_sparse(sp.csr_matrix(ds.X), ds.n_features)
        return self

    def fit_transform(self, ds: Dataset) -> sp.csr_matrix:
        """`fit(ds)`, then `transform(ds)`, to the bit: a text set is tokenized once, not twice."""
        if not ds.is_text:
            return self._fit(ds).transform(ds)
        assert ds.texts is not None
        return self._weight(self._fit_texts(ds.texts), self.config.l2)

    def _fit_texts(self, texts: Sequence[str]) -> sp.csr_matrix:
        """Learn the vocabulary (or the hash buckets' df) and idf; returns the texts' term weights before
        idf, in the fitted columns: what `_raw_texts` gives for them, from the one tokenization."""
        cfg = self.config
        self.kind = "text"
        self.n_docs = n = len(texts)
        self._hash_cache.clear()
        if cfg.hashed:
            self.vocab = None
            self._n_features = cfg.hash_size
            raw = self._raw_texts(texts)
            dfa = np.bincount(raw.indices, minlength=self._n_features).astype(np.float64)
            self.idf = self._idf(dfa, self.n_docs) if cfg.tfidf else None
            return raw
        rows, terms, counts, names = self._term_counts(texts)
        df = np.bincount(terms, minlength=len(names))  # the pairs are distinct: a term's count of texts
        seen = np.flatnonzero(df >= cfg.min_df)
        # by count of texts, then term (numpy orders str by code point, as Python does; no token ends in NUL)
        seen_names = np.array([names[i] for i in seen.tolist()], dtype=str)
        order = np.lexsort((seen_names, -df[seen]))[: cfg.max_vocab]
        if not order.size:
            raise ParamsError(f"empty vocabulary: no token occurs in >= min_df={cfg.min_df} of the "
                              f"{n} training texts; lower min_df or hash them (hash_size > 0)")
        kept = seen[order]
        self.vocab = {names[i]: col for col, i in enumerate(kept.tolist())}
        self._n_features = len(self.vocab)
        self.idf = self._idf(df[kept].astype(np.float64), self.n_docs) if cfg.tfidf else None
        column = np.full(len(names), -1, dtype=np.int64)
        column[kept] = np.arange(kept.size)
        cols = column[terms]
        known = cols >= 0
        rows, cols, counts = rows[known], cols[known], counts[known]
        by_cell = np.argsort(rows * np.int64(self._n_features) + cols, kind="stable")
        return self._csr(rows[by_cell], cols[by_cell], self._tf(counts[by_cell]), n)

    def _fit_sparse(self, X: sp.csr_matrix, n_features: int) -> None:
        self.kind = "sparse"
        self.vocab = None
        self._n_features = int(n_features)
        self.n_docs = int(X.shape[0])
        if self.config.tfidf:
            Xc = sp.csr_matrix(X)
            Xc.eliminate_zeros()
            dfa = np.bincount(Xc.indices, minlength=self._n_features).astype(np.float64)
            self.idf = self._idf(dfa, self.n_docs)
        else:
            self.idf = None

    def extended(self, texts: Sequence[str]) -> Featurizer:
        """A copy whose vocabulary also holds the terms of `texts` it lacks (same min_df; the total stays
        within max_vocab), appended after the old ones.

        Why: a continual run on new texts should learn their new words. Old terms keep their columns
        and idf weights, so a text without new words featurizes exactly as before; a new term's idf is
        taken over `texts`. A hashing featurizer has no vocabulary to grow and is returned as it is.
        """
        self._require_fitted()
        if self.vocab is None:
            return self
        cfg = self.config
        df: Counter[str] = Counter()
        for t in texts:
            df.update(set(self._terms(t)))
        room = max(cfg.max_vocab - len(self.vocab), 0)
        kept = sorted(((c, term) for term, c in df.items() if c >= cfg.min_df and term not in self.vocab),
                      key=lambda ct: (-ct[0], ct[1]))[:room]
        out = Featurizer(cfg)
        out.kind = self.kind
        out.vocab = dict(self.vocab)
        for _, term in kept:
            out.vocab[term] = len(out.vocab)
        out._n_features = len(out.vocab)
        out.n_docs = self.n_docs + len(texts)
        if self.idf is not None:
            new_idf = self._idf(np.array([c for c, _ in kept], dtype=np.float64), len(texts))
            out.idf = np.concatenate([self.idf, new_idf]).astype(np.float32)
        return out

    @staticmethod
    def _idf(df: np.ndarray, n_docs: int) -> np.ndarray:
        """Smoothed idf: ln((1 + N) / (1 + df)) + 1, so unseen columns get the largest weight."""
        return (np.log((1.0 + n_docs) / (1.0 + df)) + 1.0).astype(np.float32)

    # ------------------------------------------------------------------ transforming

    def transform(self, ds: Dataset) -> sp.csr_matrix:
        """Featurize a whole split (texts or sparse features, whichever the featurizer was fit on)."""
        self._require_fitted()
        if ds.is_text:
            assert ds.texts is not None
            return self.transform_texts(ds.texts, source=ds.path or "<texts>")
        if ds.X is None:
            raise ParamsError("dataset has neither texts nor features")
        return self.transform_sparse(ds.X, source=ds.path or "<features>")

    def transform_texts(self, texts: Sequence[str], source: str = "<input>") -> sp.csr_matrix:
        """Texts → float32 CSR (n × n_features). Errors name the 1-based row in `source`."""
        self._require_fitted()
        if self.kind != "text":
            raise DataFormatError(source, 1, "this model takes sparse feature vectors, not texts")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise DataFormatError(source, i + 1, f"text must be a string, got {type(t).__name__}")
        X = self._raw_texts(texts)
        return self._weight(X, self.config.l2)

    def transform_sparse(self, X: sp.spmatrix, source: str = "<input>") -> sp.csr_matrix:
        """Sparse rows → float32 CSR (n × n_features) with the fitted weighting; validates ids/values."""
        self._require_fitted()
        if self.kind != "sparse":
            raise DataFormatError(source, 1, "this model takes texts, not sparse feature vectors")
        Xc = sp.csr_matrix(X, dtype=np.float32, copy=True)
        if Xc.nnz:
            bad_val = ~np.isfinite(Xc.data)
            if bad_val.any():
                row = int(np.searchsorted(Xc.indptr, int(np.argmax(bad_val)), side="right")) - 1
                raise DataFormatError(source, row + 1, "non-finite feature value")
            if Xc.indices.size and (int(Xc.indices.max()) >= self._n_features or int(Xc.indices.min()) < 0):
                bad = (Xc.indices >= self._n_features) | (Xc.indices < 0)
                pos = int(np.argmax(bad))
                row = int(np.searchsorted(Xc.indptr, pos, side="right")) - 1
                raise DataFormatError(source, row + 1, f"feature id {int(Xc.indices[pos])} out of range: "
                                      f"the model has n_features={self._n_features}")
        if Xc.shape[1] != self._n_features:
            Xc = sp.csr_matrix((Xc.data, Xc.indices, Xc.indptr), shape=(Xc.shape[0], self._n_features))
        if not Xc.has_canonical_format:
            Xc.sum_duplicates()
        return self._weight(Xc, self.config.l2)

    def _raw_texts(self, texts: Sequence[str]) -> sp.csr_matrix:
        """Term weights before idf: (sublinear) tf per vocabulary column or signed hash bucket.

        Two routes with bit-identical results: a few rows (a request) go through plain dicts, a
        batch maps tokens to integers in Python and does counting, weighting and bucketing in numpy.
        Signed weights sharing a hash bucket are added in ascending order in both, so a row's
        features never depend on which other rows share its batch.
        """
        if len(texts) < _SMALL_BATCH:
            return self._raw_texts_small(texts)
        n = len(texts)
        vocab = self.vocab
        if vocab is not None:
            get = vocab.get
            rows, cols, counts = self._pair_counts(texts, lambda term: get(term, -1))
            return self._csr(rows, cols, self._tf(counts), n)
        r, t, counts, names = self._term_counts(texts)
        w = self._tf(counts)
        hashed = [self._hashed(term) for term in names]
        bucket = np.array([b for b, _ in hashed], dtype=np.int64)[t]
        signed = w * np.array([sg for _, sg in hashed], dtype=np.float64)[t]
        cell = r * np.int64(self._n_features) + bucket
        order = np.lexsort((signed, cell))  # by cell, then ascending value within a cell
        cell, signed = cell[order], signed[order]
        starts = np.flatnonzero(np.r_[cell.size > 0, cell[1:] != cell[:-1]])  # none without tokens
        w = np.bincount(np.repeat(np.arange(starts.size), np.diff(np.r_[starts, cell.size])),
                        weights=signed, minlength=starts.size)  # adds in array order
        cells = cell[starts]
        nonzero = w != 0.0
        return self._csr(cells[nonzero] // self._n_features, cells[nonzero] % self._n_features, w[nonzero], n)

    def _term_counts(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        """`_pair_counts` over the texts' own terms, numbered as the texts first use them; with the terms."""
        local: dict[str, int] = {}
        rows, ids, counts = self._pair_counts(texts, lambda term: local.setdefault(term, len(local)))
        return rows, ids, counts, list(local)

    def _pair_counts(self, texts: Sequence[str], term_id: Callable[[str], int]
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every (text, term id) pair of the texts with its count, sorted by row, then id: (rows, ids,
        counts). Tokens whose id is below 0 (not in a vocabulary) are left out."""
        n = len(texts)
        lens = np.zeros(n, dtype=np.int64)
        flat: list[int] = []
        terms_of = self._terms
        for i, text in enumerate(texts):
            ids = [term_id(t) for t in terms_of(text)]
            lens[i] = len(ids)
            flat.extend(ids)
        terms = np.asarray(flat, dtype=np.int64)
        rows = np.repeat(np.arange(n, dtype=np.int64), lens)
        keep = terms >= 0
        width = np.int64(max(int(terms.max(initial=0)) + 1, 1))
        uniq, counts = np.unique(rows[keep] * width + terms[keep], return_counts=True)
        return uniq // width, uniq % width, counts

    def _csr(self, rows: np.ndarray, cols: np.ndarray, weights: np.ndarray, n: int) -> sp.csr_matrix:
        """Cells sorted by row, then column, as an n-row float32 CSR in this featurizer's columns."""
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
        X = sp.csr_matrix((weights.astype(np.float32), cols.astype(np.int32), indptr),
                          shape=(n, self._n_features))
        X.has_sorted_indices = True
        return X

    def _raw_texts_small(self, texts: Sequence[str]) -> sp.csr_matrix:
        """The dict route of `_raw_texts`, for a handful of rows (no numpy set-up per call)."""
        indptr = [0]
        indices: list[int] = []
        data: list[float] = []
        vocab = self.vocab
        for text in texts:
            tf = Counter(self._terms(text))
            weights = self._tf(np.fromiter(tf.values(), dtype=np.int64, count=len(tf))).tolist()
            if vocab is not None:
                row = {j: wt for term, wt in zip(tf, weights, strict=True)
                       if (j := vocab.get(term)) is not None}
                cols = sorted(row)
                vals = [row[j] for j in cols]
            else:
                parts: dict[int, list[float]] = {}
                for term, wt in zip(tf, weights, strict=True):
                    j, sign = self._hashed(term)
                    parts.setdefault(j, []).append(sign * wt)
                cols, vals = [], []
                for j in sorted(parts):
                    v = 0.0
                    for x in sorted(parts[j]):
                        v += x
                    if v != 0.0:
                        cols.append(j)
                        vals.append(v)
            indices.extend(cols)
            data.extend(vals)
            indptr.append(len(indices))
        X = sp.csr_matrix((np.asarray(data, np.float32), np.asarray(indices, np.int32),
                           np.asarray(indptr, np.int64)), shape=(len(texts), self._n_features))
        X.has_sorted_indices = True
        return X

    def _tf(self, counts: np.ndarray) -> np.ndarray:
        """Term-frequency weight of each count: 1 + ln(c) when sublinear (a math.log table, so the
        weights are the same bits on every machine), else c."""
        if not self.config.sublinear_tf or counts.size == 0:
            return counts.astype(np.float64)
        table = np.array([0.0] + [1.0 + math.log(c) for c in range(1, int(counts.max()) + 1)])
        return table[counts]

    def terms_by_column(self, text: str) -> dict[int, list[str]]:
        """The terms of `text` behind each of its feature columns (an answer names words, not column ids);
        terms the model does not know are left out."""
        self._require_fitted()
        out: dict[int, list[str]] = {}
        for term in dict.fromkeys(self._terms(text)):
            col = self.vocab.get(term) if self.vocab is not None else self._hashed(term)[0]
            if col is not None:
                out.setdefault(int(col), []).append(term)
        return out

    def _terms(self, text: str) -> list[str]:
        """A text's terms under this featurizer's options, repeats kept (their count is the tf)."""
        return tokenize(text, self.config.ngrams, self.config.lead_words)

    def _hashed(self, term: str) -> tuple[int, float]:
        hit = self._hash_cache.get(term)
        if hit is None:
            h = _hash64(term)
            n = self.config.hash_size
            sign = -1.0 if (self.config.signed_hash and (h >> 63) & 1) else 1.0
            hit = (h % n, sign)
            if len(self._hash_cache) >= _HASH_CACHE_MAX:
                self._hash_cache.clear()
            self._hash_cache[term] = hit
        return hit

    def _weight(self, X: sp.csr_matrix, l2: bool) -> sp.csr_matrix:
        if self.idf is not None and X.nnz:
            X.data = (X.data * self.idf[X.indices]).astype(np.float32)
        if l2:
            _l2_rows(X)
        X.data = X.data.astype(np.float32, copy=False)
        return X

    def _require_fitted(self) -> None:
        if not self.fitted:
            raise ParamsError("featurizer is not fitted: call fit() on the training data first")

    # ------------------------------------------------------------------ persistence

    def save(self, directory: str | Path) -> None:
        """Write featurizer.json (+ featurizer.safetensors when there is an idf) into `directory`."""
        self._require_fitted()
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        vocab_list: list[str] | None = None
        if self.vocab is not None:
            vocab_list = [""] * len(self.vocab)
            for term, i in self.vocab.items():
                vocab_list[i] = term
        meta = {
            "format": "ovex-featurizer",
            "version": FEATURIZER_VERSION,
            "kind": self.kind,
            "config": self.config.to_dict(),
            "n_features": self._n_features,
            "n_docs": self.n_docs,
            "has_idf": self.idf is not None,
            "vocab": vocab_list,
        }
        (d / _JSON_NAME).write_text(json.dumps(meta, ensure_ascii=False))
        if self.idf is not None:
            save_file({"idf": np.ascontiguousarray(self.idf)}, str(d / _TENSORS_NAME))

    @classmethod
    def load(cls, directory: str | Path) -> Featurizer:
        """Read a saved featurizer, checking format, version and shapes (ArtifactError otherwise)."""
        d = Path(directory)
        path = d / _JSON_NAME
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ArtifactError(str(path), "missing featurizer.json") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ArtifactError(str(path), f"unreadable featurizer.json: {e}") from None
        if not isinstance(meta, dict) or meta.get("format") != "ovex-featurizer":
            raise ArtifactError(str(path), "not an ovex featurizer (format field missing or wrong)")
        if meta.get("version") != FEATURIZER_VERSION:
            raise ArtifactError(str(path), f"featurizer version {meta.get('version')!r} is not supported "
                                f"(this ovex reads version {FEATURIZER_VERSION})")
        try:
            kind = meta["kind"]
            cfg = FeaturizerConfig.from_dict(meta["config"], kind)
            n_features = int(meta["n_features"])
            n_docs = int(meta["n_docs"])
            has_idf = bool(meta["has_idf"])
            vocab_list = meta["vocab"]
        except (KeyError, TypeError, ValueError, ParamsError) as e:
            raise ArtifactError(str(path), f"invalid featurizer.json: {e}") from None
        if kind not in ("text", "sparse"):
            raise ArtifactError(str(path), f"unknown featurizer kind {kind!r}")
        f = cls(cfg)
        f.kind = kind
        f._n_features = n_features
        f.n_docs = n_docs
        if vocab_list is not None:
            if not isinstance(vocab_list, list) or len(vocab_list) != n_features:
                raise ArtifactError(str(path), f"vocabulary has {len(vocab_list)} entries, expected "
                                    f"n_features={n_features}")
            f.vocab = {term: i for i, term in enumerate(vocab_list)}
        elif kind == "text" and not cfg.hashed:
            raise ArtifactError(str(path), "text featurizer in vocab mode has no vocabulary")
        if has_idf:
            tpath = d / _TENSORS_NAME
            try:
                idf = load_file(str(tpath))["idf"]
            except FileNotFoundError:
                raise ArtifactError(str(tpath), "missing featurizer.safetensors (idf weights)") from None
            except Exception as e:  # safetensors raises its own error types for corrupt files
                raise ArtifactError(str(tpath), f"unreadable idf weights: {e}") from None
            if idf.shape != (n_features,) or idf.dtype != np.float32:
                raise ArtifactError(str(tpath), f"idf has shape {idf.shape} dtype {idf.dtype}, expected "
                                    f"({n_features},) float32")
            f.idf = idf
        return f
