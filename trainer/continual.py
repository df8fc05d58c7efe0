"""Continual training: grow a trained model with new rows and new labels instead of retraining it.

A continual run starts from a base artifact's featurizer, encoder and head. Labels are matched by name
(XC files: a label's name is its id as a string), labels the base never saw are appended, so every old
label keeps its id. New head rows start at the mean encoding of their positive rows, which already ranks
them near their examples; the rest of the head and the encoder continue from where the base left them.

Which rows a run trains on is decided by row fingerprints: the base artifact keeps a 64-bit hash of every
row it trained on, so rows of the new data the base has not seen are all trained on every epoch, and rows
it has seen (plus an optional replay set, e.g. the base's training set) are sampled as replay, `replay`
times as many as the unseen rows. That keeps the old labels from drifting (training on new rows alone
forgets) at a fraction of a full retrain's cost. When every row was seen (more epochs on the same data)
the run trains on all of them.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from pydantic import ValidationError

from trainer import metrics as xc_metrics
from trainer.capacity import check_fits
from trainer.data import Dataset, in_label_space, label_counts
from trainer.errors import ArtifactError, DataFormatError, ParamsError
from trainer.logit_adjust import unapplied
from trainer.model import init_head_rows
from trainer.params import ARCHITECTURE_FIELDS, RUN_FIELDS, TrainParams, validation_message
from trainer.twins import has_label_tower

__all__ = [
    "WarmStart",
    "check_out_dir",
    "continual_params",
    "row_fingerprints",
    "split_metrics",
    "warm_start",
]

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


# ------------------------------------------------------------------------------------ parameters


def _unused_by(base: TrainParams, featurizer_kind: str | None) -> dict[str, str]:
    """The featurizer fields the base's featurizer has no use for, each with why: a value given for one
    changes nothing, so it is no conflict with the base's and is refused for what it is."""
    if featurizer_kind == "sparse":
        why = "the base model takes sparse features (XC data) and this is a setting of text featurizers"
        return dict.fromkeys(("hash_size", "max_vocab", "min_df", "ngrams"), why)
    if base.hash_size > 0:
        why = f"the base model hashes words into hash_size={base.hash_size} buckets and has no vocabulary"
        return dict.fromkeys(("max_vocab", "min_df"), why)
    return {}


def continual_params(base: TrainParams, given: TrainParams, base_name: str,
                     featurizer_kind: str | None = None) -> TrainParams:
    """The parameters of a continual run: the base's, overridden by the fields the caller set (the
    continual settings themselves are the caller's or the defaults).

    Architecture fields must agree with the base (a different `dim` cannot reuse its weights), so a
    conflicting one is an error naming the field, not a silent fresh model; a featurizer field the base's
    featurizer does not use (`featurizer_kind`: "sparse" or "text", when known) is refused as such. `epochs`
    and `schedule` default to `continual_epochs` and `continual_schedule` when the caller did not set them
    (the learning rates stay the base's; `continual_lr` scales them at run time).
    """
    if base.ensemble > 1:  # the members side by side are one model of their full width (trainer.ensemble)
        base = base.model_copy(update={"dim": base.model_dim, "ensemble": 1})
    set_fields = given.model_fields_set
    unused = _unused_by(base, featurizer_kind)
    for name in ARCHITECTURE_FIELDS:
        if name in set_fields and getattr(given, name) != getattr(base, name):
            if name in unused:
                raise ParamsError(f"{base_name}: {name}={getattr(given, name)!r} does not apply: "
                                  f"{unused[name]} (leave {name} out)")
            raise ParamsError(
                f"{base_name}: {name}={getattr(given, name)!r} differs from the base model's "
                f"{name}={getattr(base, name)!r}; a continual run keeps the base's {name} (leave it out)"
            )
    values = base.model_dump()
    for name in RUN_FIELDS:
        values[name] = TrainParams.model_fields[name].default
    values.update({name: getattr(given, name) for name in set_fields})
    if "epochs" not in set_fields:
        values["epochs"] = values["continual_epochs"]
    if "schedule" not in set_fields:
        values["schedule"] = values["continual_schedule"]
    try:
        return TrainParams(**values)
    except ValidationError as exc:  # the given fields together with the base's (e.g. sampler, group_size)
        raise ParamsError(f"invalid parameters for a continual run from {base_name}: "
                          f"{validation_message(exc)}") from None


# ------------------------------------------------------------------------------------ fingerprints


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        x ^= x >> np.uint64(31)
    return x


def _hash_str(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "little")


def _row_sums(values: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """Per-row wrapping sums of uint64 values (order-free, so sorted or not gives the same hash)."""
    cs = np.zeros(values.size + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        np.cumsum(values, dtype=np.uint64, out=cs[1:])
        return cs[indptr[1:]] - cs[indptr[:-1]]


def row_fingerprints(ds: Dataset) -> np.ndarray:
    """A 64-bit hash of each row (its features or text, and its label names), as int64.

    Labels enter by name, so a row hashes the same in any label id space; XC feature values by their
    float32 bits. Used to tell which rows of a data set a model has already trained on.
    """
    y = sp.csr_matrix(ds.Y)
    # only the names rows carry are hashed: most labels of a large label space have no row here
    used, at = np.unique(y.indices, return_inverse=True)
    own = ds.label_names
    names = np.array([_hash_str(own[i] if own is not None else str(i)) for i in used.tolist()],
                     dtype=np.uint64)
    lab = _row_sums(_mix(names[at.ravel()] ^ _GOLDEN), np.asarray(y.indptr, dtype=np.int64))
    if ds.texts is not None:
        feat = np.array([_hash_str(t) for t in ds.texts], dtype=np.uint64)
    else:
        x = sp.csr_matrix(ds.X, dtype=np.float32)
        bits = np.ascontiguousarray(x.data, dtype=np.float32).view(np.uint32).astype(np.uint64)
        with np.errstate(over="ignore"):
            key = x.indices.astype(np.uint64) * _GOLDEN + bits
        feat = _row_sums(_mix(key), np.asarray(x.indptr, dtype=np.int64))
    with np.errstate(over="ignore"):
        out = _mix(feat + _mix(lab))
    return out.view(np.int64)


# ------------------------------------------------------------------------------------ label space


class _LabelSpace:
    """The grown label space: the base's names, then the names the training data adds, with the index
    of every name. Built once per warm start and shared by every data set moved into it: with millions of
    labels a pass over the names in Python is slow, so the checks pass over them at most once, and data
    sets are mapped through the labels their rows use, not every label they declare."""

    def __init__(self, base_names: list[str]) -> None:
        self.names = list(base_names)
        self.n_base = len(self.names)
        self.index = {n: i for i, n in enumerate(self.names)}

    @functools.cached_property
    def base_ids(self) -> bool:
        """The base names its labels by their ids ('0', '1', ...), as a model trained on XC files does."""
        return _are_ids(self.names[: self.n_base])

    def in_base(self, name: str) -> bool:
        return self.index.get(name, self.n_base) < self.n_base

    def grow(self, ds: Dataset) -> None:
        """Append the data's names the base lacks (id order for XC, first appearance for JSONL)."""
        for n in _names(ds):
            if n not in self.index:
                self.index[n] = len(self.names)
                self.names.append(n)


def _names(ds: Dataset) -> Iterator[str]:
    """A data set's label names, one by one (XC files name a label by its id as a string)."""
    return iter(ds.label_names) if ds.label_names is not None else map(str, range(ds.n_labels))


def _widen_features(ds: Dataset, n_features: int) -> Dataset:
    if ds.X is None or ds.n_features == n_features:
        return ds
    X = sp.csr_matrix((ds.X.data, ds.X.indices, ds.X.indptr), shape=(ds.n_rows, n_features))
    return Dataset(Y=ds.Y, n_features=n_features, n_labels=ds.n_labels, X=X, texts=ds.texts,
                   label_names=ds.label_names, path=ds.path, meta=dict(ds.meta))


def _check_inputs(base: Any, ds: Dataset, base_name: str) -> None:
    """The data must be what the base's featurizer reads: texts for a text model, at most its D features."""
    kind = base.featurizer.kind
    source = ds.path or "<data>"
    if ds.is_text and kind != "text":
        raise DataFormatError(source, 1, f"holds texts (JSONL) but the base model {base_name} takes sparse "
                              "features (XC)")
    if not ds.is_text and kind == "text":
        raise DataFormatError(source, 1, f"holds sparse features (XC) but the base model {base_name} takes "
                              "texts (JSONL)")
    if not ds.is_text and ds.n_features > base.n_features:
        raise DataFormatError(source, 1, f"declares D={ds.n_features} features but the base model "
                              f"{base_name} takes {base.n_features}")


def _grow_checked(base: Any, train_ds: Dataset, space: _LabelSpace, params: TrainParams, base_name: str
                  ) -> None:
    """Grow `space` with the training data's labels, checking once, before a name is made for each label
    an XC header claims, that the grown model fits: its size is the header's L against a base named by
    ids (the ids below the larger of the two), at most the base's labels plus L against one with names;
    labels already named in memory (JSONL, --label-names) are added first and counted exactly."""
    from trainer.collectives import resolve_device

    named = train_ds.label_names is not None
    if named:
        space.grow(train_ds)
    labels = (len(space.names) if named else max(space.n_base, train_ds.n_labels) if space.base_ids
              else space.n_base + train_ds.n_labels)
    check_fits(train_ds, params, resolve_device(params.device), labels=labels, features=base.n_features,
               ranks=params.nproc_per_node, extra_heads=len(base.model.shape.extra_heads),
               base_labels=base.n_labels)
    _check_naming(space, train_ds, base_name)
    if not named:
        space.grow(train_ds)


def _check_header(ds: Dataset, space: _LabelSpace, what: str) -> None:
    """A test or replay XC file's label ids are the grown model's: a header claiming more than the model has
    is refused (as a test file claiming more than a fresh run's training set is), not made room for."""
    used = int(ds.Y.indices.max()) + 1 if ds.Y.nnz else 0
    if ds.label_names is not None or ds.n_labels <= len(space.names) or used > len(space.names):
        return  # a row's label past the model's is named with its line (`in_label_space`)
    raise DataFormatError(ds.path or "<data>", 1, f"the header declares L={ds.n_labels:,} labels but the "
                          f"model has {len(space.names):,} (the base's and the training data's): {what} "
                          f"uses the model's labels, and its rows use label ids below {used:,}; lower L to "
                          "at most the model's")


def _are_ids(names: list[str]) -> bool:
    return names == [str(i) for i in range(len(names))]


def _shares_a_name(space: _LabelSpace, ds: Dataset) -> bool:
    """Whether the data names a label the base has. XC ids are looked up from the base's side: a header
    may claim far more ids than the base has names."""
    if ds.label_names is not None:
        return any(space.in_base(n) for n in ds.label_names)  # stops at the first shared name
    if space.base_ids:
        return ds.n_labels > 0 and space.n_base > 0
    return any(n.isascii() and n.isdigit() and n == str(int(n)) and int(n) < ds.n_labels
               for n in space.names[: space.n_base])


def _check_naming(space: _LabelSpace, ds: Dataset, base_name: str) -> None:
    """XC labels are matched by name: ids against a base with label names (or the reverse) match none,
    append every label as new and double the label space, so either is an error (names that keep some
    of the base's ids, naming only new labels, match those and are fine)."""
    if ds.is_text or _shares_a_name(space, ds):
        return
    data_ids = ds.label_names is None or _are_ids(ds.label_names)
    if data_ids == space.base_ids:
        return
    source = ds.path or "<data>"
    if data_ids:
        shown = ", ".join(repr(n) for n in space.names[:3])
        raise DataFormatError(source, 1, f"labels are ids but the base model {base_name} names its labels "
                              f"({shown}, ...): name this file's labels as the base does (--label-names)")
    raise DataFormatError(source, 1, f"labels are named (--label-names) but the base model {base_name} "
                          "names its labels by their ids ('0', '1', ...): leave out --label-names")


def _check_base(base: Any, name: str) -> None:
    """A base must be consistent in itself: its recorded params build the model its weights fill. Only a
    damaged or hand-edited artifact fails this."""
    from trainer.losses import get_loss

    shape, params = base.model.shape, base.params
    params = params.model_copy(update={"dim": params.model_dim})  # an ensemble's members side by side
    for field in ("dim", "encoder", "hidden", "pieces"):
        if getattr(params, field) != getattr(shape, field):
            raise ArtifactError(name, f"config.json: params give {field}={getattr(params, field)!r} but the "
                                f"weights have {field}={getattr(shape, field)!r}")
    heads = tuple(get_loss(params.loss).extra_heads)
    if heads != tuple(shape.extra_heads):
        raise ArtifactError(name, f"config.json: loss {params.loss!r} owns heads {list(heads)} but the "
                            f"weights have {list(shape.extra_heads)}")


def _check_unique(space: _LabelSpace, name: str) -> None:
    """Labels are matched by name, so a base's names must be unique (a hand-edited labels.txt may not be)."""
    if len(space.index) == space.n_base:
        return
    first: dict[str, int] = {}
    for i, label in enumerate(space.names):
        if label in first:
            raise ArtifactError(name, f"labels.txt names label {label!r} twice (lines {first[label] + 1} and "
                                f"{i + 1}); labels are matched by name, so they must be unique")
        first[label] = i


def check_out_dir(out_dir: str | Path, base_dir: str | Path) -> None:
    """The grown model goes beside its base: never over it, into it, or into a directory holding it (a
    replaced directory is deleted with all it holds), so the base is only ever read."""
    out, base = Path(out_dir).resolve(), Path(base_dir).resolve()
    if out == base:
        where = "is the base model's directory"
    elif base in out.parents:
        where = "is inside the base model's directory"
    elif out in base.parents:
        where = "holds the base model"
    else:
        return
    raise ParamsError(f"the output directory {out_dir} {where} ({base_dir}); the base is never written: "
                      "give another --out")


def _concat(a: Dataset, b: Dataset) -> Dataset:
    """Rows of `a` then rows of `b` (same label space and input kind)."""
    X = None if a.X is None or b.X is None else sp.vstack([a.X, b.X], format="csr")
    texts = None if a.texts is None or b.texts is None else a.texts + b.texts
    return Dataset(Y=sp.vstack([a.Y, b.Y], format="csr"), n_features=a.n_features, n_labels=a.n_labels,
                   X=X, texts=texts, label_names=a.label_names, path=a.path, meta=dict(a.meta))


# ------------------------------------------------------------------------------------ warm start


@dataclass
class WarmStart:
    """Everything `train` needs to continue a base model: its weights, featurizer and label space."""

    base: Any  # trainer.artifact.LoadedModel
    name: str  # how messages name the base (a path on the CLI, "model m version v" in the service)
    label_names: list[str]
    featurizer: Any  # the base's; `featurizer_for` grows its vocabulary with the rows a run trains on
    replay_ds: Dataset | None = None
    params: TrainParams | None = None  # the run's: the caller's merged with the base's (`continual_params`)
    seen: np.ndarray | None = None  # per training row: the base trained on it
    hashes: np.ndarray | None = None  # fingerprints of the training rows
    new_labels: np.ndarray | None = None  # bool [K]: labels the base has no positive row for

    @property
    def n_base_labels(self) -> int:
        return int(self.base.n_labels)

    # -- rows

    def featurizer_for(self, ds: Dataset) -> Any:
        """The base's featurizer, its vocabulary (text models) grown with the words of `ds`: the rows the
        run trains on, never held-out ones, whose words would otherwise get columns and idf weights from
        the rows that judge the model."""
        if ds.texts is None or self.featurizer.vocab is None:
            return self.featurizer
        return self.featurizer.extended(ds.texts)

    def training_rows(self, train_ds: Dataset) -> Dataset:
        """The rows to train on (the given ones plus replay rows they do not already hold); marks which
        the base has seen."""
        hashes = row_fingerprints(train_ds)
        base_hashes = self.base.row_hashes
        seen = (np.isin(hashes, base_hashes) if base_hashes is not None
                else np.zeros(train_ds.n_rows, dtype=bool))
        ds = train_ds
        if self.replay_ds is not None:
            replay = self.replay_ds
            fresh = ~np.isin(row_fingerprints(replay), hashes)
            if fresh.any():
                ds = _concat(train_ds, replay.take(np.flatnonzero(fresh)))
                seen = np.concatenate([seen, np.ones(int(fresh.sum()), dtype=bool)])
                hashes = np.concatenate([hashes, row_fingerprints(replay)[fresh]])
        self.seen, self.hashes = seen, hashes
        return ds

    def forgets(self) -> bool:
        """No row the base trained on is in the run (and the base can tell: it has fingerprints): old
        labels the new rows do not carry are only ever pushed down as their negatives, and are forgotten."""
        assert self.seen is not None
        return self.base.row_hashes is not None and not self.seen.any()

    def epoch_size(self, replay: float) -> int:
        assert self.seen is not None
        n_new = int((~self.seen).sum())
        if n_new == 0:
            return int(self.seen.size)
        return n_new + min(int(self.seen.sum()), round(replay * n_new))

    def epoch_rows(self, seed: int, epoch: int, replay: float) -> np.ndarray:
        """This epoch's rows in training order: every unseen row plus a fresh sample of seen ones."""
        assert self.seen is not None
        rng = np.random.default_rng([seed, epoch])
        new, old = np.flatnonzero(~self.seen), np.flatnonzero(self.seen)
        if new.size == 0:
            return rng.permutation(self.seen.size)
        m = self.epoch_size(replay) - new.size
        picked = rng.choice(old, size=m, replace=False) if m else old[:0]
        return rng.permutation(np.concatenate([new, picked]))

    def epoch_weights(self, rows: np.ndarray, replay: float) -> np.ndarray | None:
        """Loss weights of an epoch's rows: a replayed row stands for the seen rows left out of the sample
        (weight seen / sampled), so an epoch's loss estimates the loss over all rows, and new labels are
        not favoured over old ones only because their rows are all present. None when every row is in."""
        assert self.seen is not None
        n_seen = int(self.seen.sum())
        m = self.epoch_size(replay) - int((~self.seen).sum())
        if m in (0, n_seen):
            return None
        return np.where(self.seen[rows], n_seen / m, 1.0).astype(np.float32)

    def learning(self, counts: np.ndarray, lo: int = 0) -> np.ndarray:
        """bool per label of [lo, lo + counts.size) (one rank's shard; all K on one rank): the new labels
        with a positive row among the training rows (`counts` per label).

        Only these have something to learn from a short run; a new label without a row only ever
        scores low, as any label without rows does."""
        if self.new_labels is None:
            return np.zeros(counts.size, dtype=bool)
        return self.new_labels[lo : lo + counts.size] & (np.asarray(counts) > 0)

    @staticmethod
    def label_lr(learning: np.ndarray, new_label_lr: float, device: torch.device) -> torch.Tensor | None:
        """Per-label learning-rate multiplier of the head: `new_label_lr` for the labels `learning` marks
        (the new ones with rows), 1 for the others (None when it is 1 everywhere)."""
        if new_label_lr == 1.0 or not learning.any():
            return None
        scale = np.where(learning, new_label_lr, 1.0)
        return torch.from_numpy(scale.astype(np.float32)).to(device)

    def artifact_stats(self, y: sp.csr_matrix) -> tuple[np.ndarray, int, np.ndarray]:
        """(label counts, row count, row fingerprints) of everything the grown model has trained on: the
        base's, plus the rows it had not (replay rows it never saw included, as their fingerprints are)."""
        assert self.seen is not None and self.hashes is not None
        base_hashes = self.base.row_hashes
        unseen = np.flatnonzero(~self.seen if base_hashes is None else ~np.isin(self.hashes, base_hashes))
        counts = label_counts(y[unseen]).astype(np.float64)
        base_counts = self.base.label_counts
        if base_counts is not None:
            counts[: base_counts.size] += base_counts
        n_rows = int(self.base.config.get("n_train_rows", 0)) + unseen.size
        hashes = self.hashes if base_hashes is None else np.union1d(base_hashes, self.hashes)
        return counts, n_rows, hashes

    # -- model

    def init_model(self, model: Any, x: sp.csr_matrix, y: sp.csr_matrix, how: str, seed: int,
                   lo: int = 0) -> None:
        """Copy the base's weights into `model` (built with `init=False`; it may have more input rows and
        more labels) and give new label rows their start: `mean` = the mean encoding of their positive
        rows, scaled to score them as trained labels score theirs (`_mean_init`); `random` (and labels
        without a positive row) = the small random rows a fresh model draws for those labels.

        `model` holds the label rows [lo, lo + its rows) of the grown model (one rank's shard; all of them
        on one rank): every rank starts its rows exactly as one process would."""
        src = self.base.model
        k0, d0 = src.shape.n_labels, src.shape.n_features
        d = model.shape.dim
        hi = lo + model.head.shape[0]
        kept = max(0, min(hi, k0) - lo)  # this shard's rows the base has
        with torch.no_grad():
            model.input_weight[:d0].copy_(src.input_weight)
            model.input_weight[d0:].zero_()  # new words start silent: old rows encode exactly as before
            model.input_bias.copy_(src.input_bias)
            model.hidden.load_state_dict(src.hidden.state_dict())
            model.head[:kept].copy_(src.head[lo : lo + kept])
            for name, table in model.extra.items():
                table[:kept].copy_(src.extra[name][lo : lo + kept])
                table[kept:].zero_()
            if hi > lo + kept:
                fresh = init_head_rows(lo + kept, hi, d, seed)
                model.head[kept:].copy_(fresh.to(model.head.device))
            if how == "mean" and self.new_labels is not None:
                _mean_init(model, src, x, y, self.new_labels, lo)


def _mean_init(model: Any, src: Any, x: sp.csr_matrix, y: sp.csr_matrix, new_labels: np.ndarray,
               lo: int = 0) -> None:
    """Head rows of new labels := the direction of their positive rows' mean encoding, long enough that
    their positives score what a trained label's positives score (median over a sample), never longer
    than the median trained row, with the median trained bias (labels without a positive row keep their
    init). Trained rows are the base's (`src`), so each rank of a sharded model, which holds the label
    rows [lo, ...) only, starts its new rows as one process would.

    Why calibrated: a row scaled to the median norm alone scores its own examples too low where encodings
    are short and too high where they are long; why capped: a row longer than the trained ones also
    scores high on unrelated rows, and new labels then crowd old ones out of the top ranks.
    """
    hi = lo + model.head.shape[0]
    new = lo + np.flatnonzero(new_labels[lo:hi])
    yn = sp.csr_matrix(y[:, new])
    rows = np.flatnonzero(np.diff(yn.indptr))
    old = np.flatnonzero(~new_labels[: src.shape.n_labels])
    if rows.size == 0 or old.size == 0:
        return
    yr = sp.csr_matrix(yn[rows])
    counts = np.asarray(yr.sum(axis=0)).ravel()
    has = counts > 0
    yr = sp.csr_matrix(yr[:, np.flatnonzero(has)])
    h = model.encode(x[rows]).cpu().numpy()
    mean = torch.from_numpy(np.asarray(yr.T @ h, dtype=np.float32) / counts[has, None].astype(np.float32))
    d = model.shape.dim
    old_ids = torch.from_numpy(old)
    # norms over the whole head, then picked: no [K_old, d] copy of a large head
    scale = float(torch.linalg.vector_norm(src.head[:, :d], dim=1).index_select(0, old_ids).median())
    bias = float(src.head[:, d].index_select(0, old_ids).median())
    length = mean.norm(dim=1, keepdim=True).clamp_min(1e-12)
    norm: torch.Tensor | float = scale
    target = _positive_score(model, src, x, y, old)
    if target is not None and target > bias:  # mean · direction = length: positives score ≈ target
        norm = ((target - bias) / length).clamp_max(scale)
    ids = torch.from_numpy(new[has] - lo).to(model.head.device)
    model.head[ids, :d] = (mean / length * norm).to(model.head.dtype).to(model.head.device)
    model.head[ids, d] = bias


_CALIBRATION_ROWS = 4096  # rows scored to find a trained label's typical positive score


def _positive_score(model: Any, src: Any, x: sp.csr_matrix, y: sp.csr_matrix,
                    old: np.ndarray) -> float | None:
    """The median score trained labels (`old`, rows of the base `src`) give their own positive rows (a
    seeded sample of rows) under `model`'s encoder, or None."""
    yo = sp.csr_matrix(y[:, old])
    rows = np.flatnonzero(np.diff(yo.indptr))
    if rows.size == 0:
        return None
    if rows.size > _CALIBRATION_ROWS:
        rows = np.sort(np.random.default_rng(0).choice(rows, _CALIBRATION_ROWS, replace=False))
    ys = sp.csr_matrix(yo[rows])
    h = model.encode(x[rows])
    pair_rows = torch.from_numpy(np.repeat(np.arange(rows.size), np.diff(ys.indptr))).to(h.device)
    w = src.head.index_select(0, torch.from_numpy(old[ys.indices])).to(h.device)
    d = model.shape.dim
    scores = (h.index_select(0, pair_rows) * w[:, :d]).sum(1) + w[:, d]
    return float(scores.median())


def split_metrics(top: np.ndarray, y: sp.csr_matrix, new_labels: np.ndarray,
                  prop: np.ndarray | None) -> dict[str, float]:
    """P@k etc. on the test rows carrying a new label (`new.*`) and on rows with only old labels (`old.*`).

    Why separately: overall figures hide forgetting (old rows) behind learning (new rows) and back.
    A test label past `new_labels` (one the model lacks, `trainer.data.in_label_space`) is new too.
    """
    yc = sp.csr_matrix(y)
    is_new = np.ones(yc.shape[1], dtype=bool)
    is_new[: new_labels.size] = new_labels[: yc.shape[1]]
    has_new = np.asarray(yc[:, np.flatnonzero(is_new)].sum(axis=1)).ravel() > 0
    has_any = np.diff(yc.indptr) > 0
    out: dict[str, float] = {}
    for key, mask in (("new", has_new), ("old", has_any & ~has_new)):
        rows = np.flatnonzero(mask)
        out[f"{key}.rows"] = float(rows.size)
        if rows.size:
            for name, value in xc_metrics.evaluate_topk(top[rows], yc[rows], prop).items():
                out[f"{key}.{name}"] = value
    return out


def warm_start(base_dir: str | Path, train_ds: Dataset, test_ds: Dataset | None, *,
               base_name: str | None = None, replay_ds: Dataset | None = None,
               params: TrainParams | None = None) -> tuple[WarmStart, Dataset, Dataset | None]:
    """Load the base, check the data against it and move every data set into the grown label space.

    The grown model must fit the memory of the run (`params`: the caller's parameters, merged with the
    base's; the base's when not given), checked once before its label names are made.

    Returns the warm start plus the training and test sets in that space. Errors name the base as
    `base_name` (default: its path) and the data file at fault.
    """
    from trainer.artifact import load_artifact

    name = base_name or str(base_dir)
    try:
        base = load_artifact(base_dir)
    except ArtifactError as exc:  # named as the caller names the base (the service hides its paths)
        raise ArtifactError(name, exc.message) from None
    _check_base(base, name)
    # the run learns from the base's own biases
    unapplied(base.model, base.label_counts, base.params.logit_shift(has_label_tower(Path(base_dir))))
    space = _LabelSpace(list(base.label_names))
    _check_unique(space, name)
    for ds in (train_ds, test_ds, replay_ds):
        if ds is not None:
            _check_inputs(base, ds, name)
    run = base.params if params is None else continual_params(base.params, params, name, base.featurizer.kind)
    _grow_checked(base, train_ds, space, run, name)
    names, index = space.names, space.index

    def moved(ds: Dataset, refuse: str | None) -> Dataset:
        return in_label_space(_widen_features(ds, base.n_features), names, refuse=refuse, index=index)

    def checked(ds: Dataset, what: str) -> Dataset:
        """A test or replay set, checked against the grown space before it is moved into it."""
        _check_header(ds, space, what)
        _check_naming(space, ds, name)
        return ds

    train_ds = moved(train_ds, "")
    if test_ds is not None:  # a JSONL test label the grown model lacks counts as a miss; XC ids must fit
        test_ds = moved(checked(test_ds, "a test set"), None if test_ds.is_text else "")
    if replay_ds is not None:
        replay_ds = moved(checked(replay_ds, "a replay set"),
                          " (nor in the training data): replay rows are rows the base trained on; rows of a "
                          "new label go in the training data")
    new_labels = np.zeros(len(names), dtype=bool)
    new_labels[base.n_labels:] = True
    if base.label_counts is not None:
        new_labels[: base.n_labels] |= base.label_counts <= 0
    warm = WarmStart(base=base, name=name, label_names=names, featurizer=base.featurizer, replay_ds=replay_ds,
                     params=run, new_labels=new_labels)
    return warm, train_ds, test_ds
