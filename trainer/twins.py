"""Twins: a label whose text is an input's own text, and the files of a label tower that name them.

A text reader scores an input's twin above every other label, yet on a taxonomy (a row is a thing, its
labels what it is a kind of) the twin is never one of its labels. A run with label texts counts how its
training rows treat their twins (`Twins`); when they never carry them, the saved model leaves an input's
twins out of its answers (`LoadedModel.excluded`, the service's predictor), so an exact text match is
not answered where the data say it is not an answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

# a model trained with label texts holds these beside its artifact
TOWER_CONFIG = "label_tower.json"
TOWER_WEIGHTS = "label_tower.safetensors"
TEXTS_FILE = "label_texts.jsonl"
TEXT_ONLY = "text_only"  # the tower weights' bool [K]: the labels without training rows
# an input's twins are left out of its answers when at least this many training rows have one and fewer
# than one in TWIN_RARELY of them carries it
TWIN_EVIDENCE = 10
TWIN_RARELY = 20


def same_text(text: str) -> str:
    """A text as compared for twins: case and runs of white space do not count."""
    return " ".join(text.split()).casefold()


@dataclass(frozen=True)
class Twins:
    """How the training rows treat their twins; `excluded` decides whether answers leave them out."""

    rows: int  # training rows that have a twin
    labelled: int  # of those, the rows one of whose labels is a twin

    @property
    def excluded(self) -> bool:
        return self.rows >= TWIN_EVIDENCE and self.labelled * TWIN_RARELY < self.rows


def count_twins(row_texts: Sequence[str], index: dict[str, list[int]], y: sp.csr_matrix) -> Twins:
    """Twins of the training rows (labels `y`), counted by a `twin_index`."""
    y = sp.csr_matrix(y)
    rows = labelled = 0
    for r, found in enumerate(twins_of(index, row_texts)):
        if found:
            rows += 1
            own = y.indices[y.indptr[r] : y.indptr[r + 1]]
            labelled += bool(np.isin(found, own).any())
    return Twins(rows, labelled)


def twins_of(index: dict[str, list[int]], texts: Sequence[str | None]) -> list[list[int]]:
    """Each text's twins by a `twin_index` (none for a missing text, a sparse input's)."""
    return [[] if t is None else index.get(same_text(t), []) for t in texts]


def twin_index(names: Sequence[str], texts: dict[str, str]) -> dict[str, list[int]]:
    """A text as `same_text` gives it -> the ids of the labels with that text."""
    out: dict[str, list[int]] = {}
    for k, name in enumerate(names):
        text = texts.get(name)
        if text is not None:
            out.setdefault(same_text(text), []).append(k)
    return out


def most_excluded(exclude: Sequence[Sequence[int]] | None) -> int:
    """The most labels any row excludes: fetch that many beyond k so that k remain."""
    return max((len(e) for e in exclude), default=0) if exclude is not None else 0


def drop_excluded(ids: np.ndarray, scores: np.ndarray, exclude: Sequence[Sequence[int]],
                  k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's top k of `ids`/`scores` (best first, fetched with room for its exclusions) without the
    labels `exclude` names for it (−1 and −inf pad a row that runs out), and per row the best score cut
    off beyond k that was not excluded (−inf: none), which a bound on the labels not returned must cover."""
    ids, scores = np.asarray(ids), np.asarray(scores)
    drop = np.zeros(ids.shape, dtype=bool)
    for r, labels in enumerate(exclude):
        if len(labels):
            drop[r] = np.isin(ids[r], np.asarray(labels, dtype=ids.dtype))
    order = np.argsort(drop, axis=1, kind="stable")
    ids, scores, drop = (np.take_along_axis(a, order, 1) for a in (ids, scores, drop))
    cut = ~drop[:, k:] & (ids[:, k:] >= 0)
    cut_best = np.where(cut, scores[:, k:], -np.inf).max(axis=1, initial=-np.inf).astype(np.float64)
    gone = drop[:, :k]
    return (np.where(gone, -1, ids[:, :k]), np.where(gone, -np.inf, scores[:, :k]).astype(scores.dtype),
            cut_best)


def topk_without(topk: Callable[[int], tuple[np.ndarray, np.ndarray]], k: int,
                 exclude: Sequence[Sequence[int]] | None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's top k (ids, scores) by `topk(n)`, fetched with room for the row's exclusions and
    without the labels `exclude` names for it (`drop_excluded`)."""
    more = most_excluded(exclude)
    ids, scores = topk(k + more)
    if not more or exclude is None:
        return ids, scores
    kept_ids, kept_scores, _ = drop_excluded(ids, scores, exclude, min(k, ids.shape[1]))
    return kept_ids, kept_scores


def excluded_twins(directory: Path, names: Sequence[str]) -> dict[str, list[int]] | None:
    """The saved model's twin index (`twin_index`) when its training rows excluded twins, else None."""
    try:
        config = json.loads((directory / TOWER_CONFIG).read_text())
    except (OSError, ValueError):
        return None
    twins = config.get("twins") if isinstance(config, dict) else None
    if not (isinstance(twins, dict) and twins.get("excluded") is True):
        return None
    return twin_index(names, read_stored_texts(directory))


def read_stored_texts(directory: Path) -> dict[str, str]:
    """The label texts a model was trained with (name -> text; labels without a text are left out)."""
    out: dict[str, str] = {}
    path = directory / TEXTS_FILE
    if not path.is_file():
        return out
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                obj = json.loads(line)
                if isinstance(obj.get("text"), str):
                    out[str(obj["name"])] = obj["text"]
    return out


def has_label_tower(artifact_dir: Path | str) -> bool:
    """Whether the model at `artifact_dir` was trained with label texts (and so can give a label a row
    from its text)."""
    d = Path(artifact_dir)
    return (d / TOWER_CONFIG).is_file() and (d / TOWER_WEIGHTS).is_file()


def text_only_labels(artifact_dir: Path | str, n_labels: int) -> np.ndarray | None:
    """bool [K]: the labels a model with label texts knows by their text alone (no training rows yet:
    named only in its label texts, or added by `POST /labels`), from the tower's flags; None without a
    tower, or with flags that do not match the labels (the model is then served without them)."""
    d = Path(artifact_dir)
    if not has_label_tower(d):
        return None
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(d / TOWER_WEIGHTS), framework="numpy") as fh:
            names = list(fh.keys())  # the handle has no `in`
            if TEXT_ONLY not in names:
                return None
            flags = np.asarray(fh.get_tensor(TEXT_ONLY)).astype(bool).ravel()
    except (OSError, SafetensorError):
        return None
    return flags if flags.shape == (n_labels,) else None
