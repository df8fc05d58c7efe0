"""Adding labels to a model by their texts: version n+1 is version n with rows appended.

A model trained with label texts can compute a label's head row from its text alone (its label tower,
`trainer.label_texts.label_rows`). Adding labels writes a new version whose every label-count-dependent
file is version n's extended by the new labels (weights: head, loss-owned heads and label counts; config;
labels.txt; label_texts.jsonl) and whose other files are copies, in a hidden staging directory renamed
into place: the same commit point as a job's publish, so readers never see half a version and version n
is only ever read. The int8 scan's cache is extended too (new rows join the nearest cells, whose bounds
widen: `service.serving.retrieval.extend_int8_cache`), so the new version loads in seconds, not after k-means.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from service.errors import Conflict, InputError, Invalid, NotFound, writing
from service.serving.catalog import copy_tree, version_key
from service.serving.registry import ModelRegistry, build_serving_index
from service.serving.retrieval import RetrievalConfig, choose_kind, extend_int8_cache
from trainer.durable import fsync_tree, write_safetensors
from trainer.errors import ArtifactError, OvexError
from trainer.twins import TEXT_ONLY

log = logging.getLogger("ovex.labels")

STAGING = ".adding-"  # a hidden name: no scan lists a version being written
# files rewritten (extended) in the new version rather than copied; `index/` is rebuilt or extended and
# a job's marker does not describe a version no job published
_REWRITTEN = frozenset({"weights.safetensors", "config.json", "labels.txt", "label_texts.jsonl", "index",
                        "published_by.json", "labels_added.json", "label_tower.safetensors"})
ADDED = "labels_added.json"  # in the new version: its base and the first id of the labels added
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


@dataclass(frozen=True)
class AddedLabels:
    """What an add wrote: the new version, its base, its label count, and how its index came to be
    (`appended`: the base's int8 cells extended; `built`: built from scratch; `exact`: none needed)."""

    model: str
    version: str
    base_version: str
    n_labels: int
    added: int
    first_label_id: int
    index: str
    activated: bool
    seconds: float


def check_labels(labels: Sequence[tuple[str, str]], max_labels: int) -> None:
    """The request's own problems, all at once with each label's index: a count over `max_labels`, a
    bad name or text (`trainer.label_texts.check_label_text`), a name given twice."""
    from trainer.label_texts import name_problem, text_problem

    if not labels:
        raise Invalid("no labels to add: send at least one {\"name\", \"text\"}", field=("labels",))
    if len(labels) > max_labels:
        raise Invalid(f"{len(labels):,} labels in one request; at most {max_labels:,} are allowed: send "
                      "them in several requests", field=("labels",))
    errors: list[tuple[Sequence[str | int], str]] = []
    first: dict[str, int] = {}
    for i, (name, text) in enumerate(labels):
        bad_name, bad_text = name_problem(name), text_problem(text)
        if bad_name is not None:
            errors.append((("labels", i, "name"), bad_name))
        if bad_text is not None:
            errors.append((("labels", i, "text"), bad_text))
        if bad_name is None and name in first:
            errors.append((("labels", i, "name"),
                           f"label name {name[:80]!r} is given twice (also at index {first[name]})"))
        elif bad_name is None:
            first[name] = i
        if len(errors) >= 20:
            break
    if errors:
        raise InputError(errors)


def _model_lock(name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(name, threading.Lock())


def _base_version(registry: ModelRegistry, name: str, asked: str | None) -> str:
    """The version to extend: the one asked for, else the active one (serving here, or recorded for the
    model), else the highest on disk."""
    versions = registry.scan().get(name)
    if not versions:
        raise NotFound(f"unknown model {name!r}")
    if asked is not None:
        if asked not in versions:
            raise NotFound(f"model {name!r} has no version {asked!r}", field=("base_version",))
        return asked
    served = registry.serving(name)
    if served is not None and served.version in versions:
        return served.version
    try:
        recorded = registry.store.all().get(name)
    except Exception:  # the database's answer is a preference here: the highest version is a fine base
        recorded = None
    if recorded in versions:
        return str(recorded)
    return max(versions, key=version_key)


def add_labels(
    registry: ModelRegistry,
    name: str,
    labels: Sequence[tuple[str, str]],
    *,
    base_version: str | None = None,
    activate: bool = False,
    max_labels: int = 10_000,
) -> AddedLabels:
    """Write version n+1 of `name` with `labels` ((name, text) pairs) appended to version n (the active
    one, or `base_version`), and activate it when asked. Refusals: `Invalid` for the request's own
    problems, `NotFound` for an unknown model or version, `Conflict` for a model without a label tower
    or a name it already has; a full or read-only disk is its kind (`writing`), with nothing left."""
    t0 = time.perf_counter()
    check_labels(labels, max_labels)
    with _model_lock(name):
        base = _base_version(registry, name, base_version)
        written = _write_version(registry, name, base, labels)
    version, n_labels, index = written
    log.info("labels added", extra={"model": name, "version": version, "base": base, "added": len(labels),
                                    "index": index, "seconds": round(time.perf_counter() - t0, 2)})
    activated = False
    if activate:
        registry.activate(name, version)
        activated = True
    return AddedLabels(name, version, base, n_labels, len(labels), n_labels - len(labels), index, activated,
                       time.perf_counter() - t0)


def _write_version(
    registry: ModelRegistry, name: str, base: str, labels: Sequence[tuple[str, str]]
) -> tuple[str, int, str]:
    """Stage the new version beside the others and rename it into place: (version, its labels, index)."""
    from trainer.artifact import load_artifact
    from trainer.label_tower import has_label_tower, label_rows

    src = registry.catalog.version_dir(name, base)
    if not has_label_tower(src):
        raise Conflict(f"version {base!r} of model {name!r} was trained without label texts, so a label "
                       "cannot be given a row from its text: train it with label texts (a job's "
                       "`label_texts`, or `ovex train --label-texts`), then add labels to that version")
    try:
        loaded = load_artifact(src)
    except ArtifactError as exc:
        raise Conflict(f"version {base!r} of model {name!r} cannot be read: "
                       f"{exc.message.replace(str(src), f'{name}/{base}')}") from None
    have = set(loaded.label_names)
    taken = [(i, n) for i, (n, _) in enumerate(labels) if n in have]
    if taken:
        shown = ", ".join(repr(n[:80]) for _, n in taken[:5])
        more = f" and {len(taken) - 5} more" if len(taken) > 5 else ""
        raise Conflict(f"model {name!r} (version {base}) already has label(s) {shown}{more}: choose other "
                       "names", field=("labels", taken[0][0], "name"))
    try:
        rows, biases = label_rows(src, [t for _, t in labels])
    except ArtifactError as exc:
        raise Conflict(f"version {base!r} of model {name!r} cannot compute label rows: "
                       f"{exc.message.replace(str(src), f'{name}/{base}')}") from None
    except OvexError as exc:
        raise Invalid(f"the label texts cannot be featurized: {exc}", field=("labels",)) from None
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    biases = np.ascontiguousarray(biases, dtype=np.float32).reshape(-1)
    if rows.shape != (len(labels), loaded.dim) or biases.shape != (len(labels),):
        raise OvexError(f"label rows of shape {rows.shape} for {len(labels)} labels of dim {loaded.dim}")
    if not (np.isfinite(rows).all() and np.isfinite(biases).all()):
        raise OvexError("the label tower gave non-finite rows")
    stage: Path | None = None
    try:
        with writing("the new version"):
            stage = registry.catalog.staging_dir(name, STAGING)
            stage.mkdir()
            weight, bias = _stage(src, stage, loaded, labels, rows, biases, base)
            index = _index(registry, src, loaded, stage, weight, bias)
            fsync_tree(stage)  # on disk before the rename publishes it
            version = registry.catalog.commit_staged(stage, name)
            stage = None
        return version, int(weight.shape[0]), index
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)


def _stage(
    src: Path, stage: Path, loaded: Any, labels: Sequence[tuple[str, str]], rows: np.ndarray,
    biases: np.ndarray, base: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Write the new version's files into `stage`; the new head's weight and bias (views of nothing the
    base owns)."""
    from trainer.artifact import COUNTS, labels_text, map_safetensors
    from trainer.label_tower import TEXTS_FILE

    for entry in sorted(src.iterdir()):
        if entry.name in _REWRITTEN or entry.name.startswith("."):
            continue
        if entry.is_dir() and not entry.is_symlink():
            copy_tree(entry, stage / entry.name)
        elif entry.is_file():
            shutil.copy2(entry, stage / entry.name)
    k0, m, d = loaded.n_labels, len(labels), loaded.dim
    tensors = dict(map_safetensors(src / "weights.safetensors"))
    if "head" not in tensors:  # schema 1: written in the current layout
        tensors["head"] = torch.cat([tensors.pop("head.weight"), tensors.pop("head.bias")[:, None]], dim=1)
    new_rows = torch.from_numpy(np.hstack([rows, biases[:, None]]))
    tensors["head"] = torch.cat([tensors["head"], new_rows])
    for key in [k for k in tensors if k.startswith("extra.")]:  # loss-owned heads: zero, as in growth
        table = tensors[key]
        tensors[key] = torch.cat([table, torch.zeros((m, table.shape[1]), dtype=table.dtype)])
    if COUNTS in tensors:  # no training rows yet
        tensors[COUNTS] = torch.cat([tensors[COUNTS], torch.zeros(m, dtype=tensors[COUNTS].dtype)])
    shapes = write_safetensors(stage / "weights.safetensors", tensors)
    head = tensors["head"].numpy()
    del tensors
    config = dict(loaded.config)
    config["schema_version"] = max(2, int(config.get("schema_version", 2)))
    config["n_labels"] = k0 + m
    config["shape"] = {**config["shape"], "n_labels": k0 + m}
    config["tensors"] = shapes
    (stage / "config.json").write_text(json.dumps(config, indent=2))
    names = [n for n, _ in labels]
    _extend_text(src / "labels.txt", stage / "labels.txt", labels_text(names))
    if (src / TEXTS_FILE).is_file():
        lines = "".join(json.dumps({"name": n, "text": t}, ensure_ascii=False) + "\n" for n, t in labels)
        _extend_text(src / TEXTS_FILE, stage / TEXTS_FILE, lines)
    _extend_tower(src, stage, m)
    (stage / ADDED).write_text(json.dumps({"base_version": base, "first_label_id": k0, "added": m}) + "\n")
    return head[:, :d], head[:, d]


def _extend_tower(src: Path, stage: Path, m: int) -> None:
    """The tower's weights with the new labels flagged as text-only (they have no training rows yet);
    its other tensors, which do not depend on the labels, as they are."""
    from trainer.artifact import map_safetensors
    from trainer.label_tower import TOWER_WEIGHTS

    tensors = dict(map_safetensors(src / TOWER_WEIGHTS))
    flags = tensors.get(TEXT_ONLY)
    if flags is not None:
        tensors[TEXT_ONLY] = torch.cat([flags, torch.ones(m, dtype=flags.dtype)])
    write_safetensors(stage / TOWER_WEIGHTS, tensors)


def _extend_text(src: Path, dst: Path, more: str) -> None:
    """`dst` := `src`'s bytes (a final newline ensured) followed by `more`."""
    data = src.read_bytes()
    if data and not data.endswith(b"\n"):
        data += b"\n"
    dst.write_bytes(data + more.encode("utf-8"))


def _index(
    registry: ModelRegistry, src: Path, loaded: Any, stage: Path, weight: np.ndarray, bias: np.ndarray
) -> str:
    """The new version's serving index: the base's int8 cells extended when it has them, else built
    (the service would build it at load otherwise, while serving); "exact" needs none."""
    cfg = RetrievalConfig.from_settings(registry.settings)
    if loaded.model.extra.get("dropmax") is not None:
        return "exact"  # DropMax heads are scored exactly: no index
    kind = choose_kind(int(weight.shape[0]), int(weight.shape[1]), cfg)
    if kind in ("exact", "flat"):
        return "exact"
    base_weight, base_bias = loaded.head_weight, loaded.head_bias
    if kind == "int8" and extend_int8_cache(src, base_weight, base_bias, stage, weight, bias, cfg):
        return "appended"
    build_serving_index(stage, registry.settings)
    return "built"
