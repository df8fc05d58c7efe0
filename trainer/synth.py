"""Synthetic multi-label data with planted structure, at any scale (10^3 … 10^6 labels).

Why: tests, demos and benchmarks need data whose right answers are known and whose size can be
dialled up without downloading anything. The generative story:

- label frequencies follow a Zipf law (rank r has weight (r+1)^-zipf; ranks are shuffled onto ids);
- each row draws `labels_per_row` labels (uniform in [lo, hi], duplicates merged);
- each label owns a sparse *prototype*: `proto_size` feature ids fixed by the seed;
- a row's `draws_per_row` feature draws come, with probability `signal`, from the prototype of one of
  its labels, otherwise from a Zipf "background vocabulary" (noise); repeated draws add up, so
  values are counts, like bag-of-words data.

Everything is a pure function of (seed, part, block), vectorised in blocks of rows, so a million
rows cost seconds and CSR-sized memory, and the same call always gives the same bytes. `part`
separates train and test rows drawn from the *same* planted structure (same seed).

Rows can also be written as text (JSONL: feature f is the word `w<f>`, repeated by its count), and each
label's prototype words as its label text (`write_label_texts`): planted data whose labels say what they
are, for models trained with label texts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

import numpy as np
import scipy.sparse as sp

from trainer.data import Dataset, write_xc_rows
from trainer.errors import ParamsError

__all__ = ["SynthConfig", "planted_prototypes", "synth", "synth_dataset", "write_label_texts", "write_synth"]

_BLOCK = 65536  # rows per generated block; fixed so results do not depend on the total row count
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True)
class SynthConfig:
    """Knobs of the generative story (defaults: 60 draws ≈ 50 distinct non-zeros, 1-5 labels per row)."""

    labels_per_row: tuple[int, int] = (1, 5)
    draws_per_row: int = 60
    proto_size: int = 30
    signal: float = 0.5
    zipf: float = 1.0
    feature_zipf: float = 1.0

    def validate(self, labels: int, features: int, rows: int) -> None:
        lo, hi = self.labels_per_row
        checks = [
            (labels >= 1, f"labels must be >= 1, got {labels}"),
            (features >= 1, f"features must be >= 1, got {features}"),
            (rows >= 0, f"rows must be >= 0, got {rows}"),
            (1 <= lo <= hi, f"labels_per_row must satisfy 1 <= lo <= hi, got {self.labels_per_row}"),
            (self.draws_per_row >= 1, f"draws_per_row must be >= 1, got {self.draws_per_row}"),
            (self.proto_size >= 1, f"proto_size must be >= 1, got {self.proto_size}"),
            (0.0 <= self.signal <= 1.0, f"signal must be in [0, 1], got {self.signal}"),
            (self.zipf >= 0 and self.feature_zipf >= 0, "zipf exponents must be >= 0"),
            (labels * max(features, 1) < 2**62 and rows * features < 2**62, "sizes too large"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ParamsError(msg)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A fast, well-mixed 64-bit hash (Steele et al.'s SplitMix64 finaliser), elementwise."""
    with np.errstate(over="ignore"):
        z = (x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
        return z ^ (z >> np.uint64(31))


def _proto_features(label: np.ndarray, slot: np.ndarray, features: int, proto_size: int, seed: int
                    ) -> np.ndarray:
    """Feature id at `slot` of each label's prototype: a hash, so no K×P table is stored."""
    salt = _splitmix64(np.array([seed], dtype=np.uint64))[0]
    key = (label.astype(np.uint64) * np.uint64(proto_size) + slot.astype(np.uint64)) ^ salt
    return (_splitmix64(key) % np.uint64(features)).astype(np.int64)


def planted_prototypes(labels: int, features: int, seed: int, config: SynthConfig | None = None
                       ) -> sp.csr_matrix:
    """K×D matrix of each label's prototype (slot counts): the structure the generator planted."""
    cfg = config or SynthConfig()
    lab = np.repeat(np.arange(labels, dtype=np.int64), cfg.proto_size)
    slot = np.tile(np.arange(cfg.proto_size, dtype=np.int64), labels)
    feat = _proto_features(lab, slot, features, cfg.proto_size, seed)
    m = sp.csr_matrix((np.ones(lab.size, np.float32), (lab, feat)), shape=(labels, features))
    m.sum_duplicates()
    return m


class _Structure:
    """The seed-determined part: label ranks, and the background feature distribution."""

    def __init__(self, labels: int, features: int, seed: int, cfg: SynthConfig) -> None:
        rng = np.random.default_rng([seed, 0])
        self.label_of_rank = rng.permutation(labels)
        w = np.power(np.arange(1, labels + 1, dtype=np.float64), -cfg.zipf)
        self.label_cdf = np.cumsum(w)
        self.label_cdf /= self.label_cdf[-1]
        self.feature_of_rank = rng.permutation(features)
        fw = np.power(np.arange(1, features + 1, dtype=np.float64), -cfg.feature_zipf)
        self.feature_cdf = np.cumsum(fw)
        self.feature_cdf /= self.feature_cdf[-1]


def _block(struct: _Structure, labels: int, features: int, n: int, seed: int, part: int, block: int,
           cfg: SynthConfig) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    rng = np.random.default_rng([seed, 1 + part, block])
    lo, hi = cfg.labels_per_row
    # labels: hi Zipf draws per row, keep the first c, merge duplicates
    n_lab = rng.integers(lo, hi + 1, size=n)
    ranks = np.searchsorted(struct.label_cdf, rng.random((n, hi)), side="right")
    lab = struct.label_of_rank[np.minimum(ranks, labels - 1)]
    lab = np.where(np.arange(hi)[None, :] < n_lab[:, None], lab, labels)  # `labels` = unused slot
    lab.sort(axis=1)
    keep = lab < labels
    keep[:, 1:] &= lab[:, 1:] != lab[:, :-1]
    y_counts = keep.sum(axis=1)
    y_idx = lab[keep]
    y_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(y_counts, out=y_ptr[1:])
    Y = sp.csr_matrix((np.ones(y_idx.size, np.float32), y_idx.astype(np.int32), y_ptr), shape=(n, labels))
    # features: m draws per row, signal draws from one of the row's labels' prototypes
    m = cfg.draws_per_row
    rows = np.repeat(np.arange(n, dtype=np.int64), m)
    is_signal = rng.random(n * m) < cfg.signal
    pick = (rng.random(n * m) * y_counts[rows]).astype(np.int64)
    which = y_idx[y_ptr[rows] + np.minimum(pick, y_counts[rows] - 1)]
    slot = rng.integers(0, cfg.proto_size, size=n * m)
    sig_feat = _proto_features(which, slot, features, cfg.proto_size, seed)
    franks = np.searchsorted(struct.feature_cdf, rng.random(n * m), side="right")
    noise_feat = struct.feature_of_rank[np.minimum(franks, features - 1)]
    feat = np.where(is_signal, sig_feat, noise_feat)
    keys, counts = np.unique(rows * np.int64(features) + feat, return_counts=True)
    r = keys // features
    X = sp.csr_matrix((counts.astype(np.float32), (keys - r * features).astype(np.int32),
                       np.searchsorted(r, np.arange(n + 1))), shape=(n, features))
    X.has_sorted_indices = True
    return X, Y


def _blocks(rows: int) -> list[tuple[int, int]]:
    """(block index, rows in block): fixed-size blocks, each with its own random stream."""
    return [(b, min(_BLOCK, rows - b * _BLOCK)) for b in range((rows + _BLOCK - 1) // _BLOCK)]


def synth(labels: int, features: int, rows: int, seed: int = 0, *, part: int = 0,
          config: SynthConfig | None = None) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Generate (X: rows×features float32 counts, Y: rows×labels 0/1) with planted structure.

    Same (labels, features, seed, config) → same structure; `part` picks an independent set of rows
    from it (use part=0 for train, part=1 for test).
    """
    cfg = config or SynthConfig()
    cfg.validate(labels, features, rows)
    struct = _Structure(labels, features, seed, cfg)
    xs, ys = [], []
    for b, n in _blocks(rows):
        X, Y = _block(struct, labels, features, n, seed, part, b, cfg)
        xs.append(X)
        ys.append(Y)
    if not xs:
        return sp.csr_matrix((0, features), dtype=np.float32), sp.csr_matrix((0, labels), dtype=np.float32)
    X = sp.vstack(xs, format="csr") if len(xs) > 1 else xs[0]
    Y = sp.vstack(ys, format="csr") if len(ys) > 1 else ys[0]
    return sp.csr_matrix(X), sp.csr_matrix(Y)


def synth_dataset(labels: int, features: int, rows: int, seed: int = 0, *, part: int = 0,
                  config: SynthConfig | None = None) -> Dataset:
    """`synth` wrapped as a `Dataset` (what the trainer consumes)."""
    X, Y = synth(labels, features, rows, seed, part=part, config=config)
    return Dataset(Y=Y, n_features=features, n_labels=labels, X=X, path=f"<synth seed={seed} part={part}>")


def word(feature: int) -> str:
    """The word standing for a feature id in text output."""
    return f"w{feature}"


def write_jsonl_rows(fh: IO[str], X: sp.csr_matrix, Y: sp.csr_matrix) -> None:
    """Rows as JSONL text: each feature's word repeated by its count, labels named by their ids."""
    lines = []
    for i in range(X.shape[0]):
        a, b = X.indptr[i], X.indptr[i + 1]
        words = " ".join(" ".join([word(int(f))] * max(1, round(float(v))))
                         for f, v in zip(X.indices[a:b], X.data[a:b], strict=True))
        names = [str(int(k)) for k in Y.indices[Y.indptr[i] : Y.indptr[i + 1]]]
        lines.append(json.dumps({"text": words, "labels": names}) + "\n")
    fh.write("".join(lines))


def write_label_texts(path: str | Path, labels: int, features: int, seed: int = 0, *,
                      config: SynthConfig | None = None, first: int = 0) -> None:
    """Label texts of labels `first`.. `labels`-1: each label's prototype words (in slot order, without
    repeats), named by its id as the rows name it: the text that says what its rows are about."""
    cfg = config or SynthConfig()
    cfg.validate(labels, features, 0)
    with open(path, "w", encoding="ascii", newline="\n") as fh:
        for s in range(first, labels, _BLOCK):
            e = min(s + _BLOCK, labels)
            lab = np.repeat(np.arange(s, e, dtype=np.int64), cfg.proto_size)
            slot = np.tile(np.arange(cfg.proto_size, dtype=np.int64), e - s)
            feat = _proto_features(lab, slot, features, cfg.proto_size, seed).reshape(e - s, cfg.proto_size)
            texts = (" ".join(word(f) for f in dict.fromkeys(row)) for row in feat.tolist())
            fh.write("".join(json.dumps({"name": str(k), "text": t}) + "\n"
                             for k, t in zip(range(s, e), texts, strict=True)))


def write_synth(path: str | Path, labels: int, features: int, rows: int, seed: int = 0, *,
                part: int = 0, config: SynthConfig | None = None, test_path: str | Path | None = None,
                test_rows: int = 0, fmt: Literal["xc", "jsonl"] = "xc") -> None:
    """Write `synth` rows to an XC file (or JSONL text, `fmt`) block by block (memory stays one block,
    whatever `rows`).

    With `test_path`, also writes `test_rows` rows of part+1 from the same planted structure.
    """
    if fmt not in ("xc", "jsonl"):
        raise ParamsError(f"format must be xc or jsonl, got {fmt!r}")
    cfg = config or SynthConfig()
    cfg.validate(labels, features, rows)
    struct = _Structure(labels, features, seed, cfg)
    targets: list[tuple[str | Path, int, int]] = [(path, rows, part)]
    if test_path is not None:
        cfg.validate(labels, features, test_rows)
        targets.append((test_path, test_rows, part + 1))
    for out, n_rows, p in targets:
        with open(out, "w", encoding="ascii", newline="\n") as fh:
            if fmt == "xc":
                fh.write(f"{n_rows} {features} {labels}\n")
            for b, n in _blocks(n_rows):
                X, Y = _block(struct, labels, features, n, seed, p, b, cfg)
                if fmt == "xc":
                    write_xc_rows(fh, X, Y)
                else:
                    write_jsonl_rows(fh, X, Y)
