"""The model artifact: the contract between trainer and service.

Layout of a model directory:
  config.json          schema_version, format, params, n_features, n_labels, dim, shape, n_train_rows, tensors
  weights.safetensors  input.weight [D,d], input.bias [d], head [K,d+1] (bias as the last column),
                       hidden.* (dense layers), extra.<name> [K,d+1] (loss-owned heads)
                       (schema 1 stored the head as head.weight [K,d] + head.bias [K]; still read)
  labels.txt           one label name per line, each a JSON string (names may hold any character)
  featurizer/          the fitted featurizer (trainer.featurize)
  metrics.json         evaluation and training figures
weights.safetensors may also hold stats.label_counts [K] and stats.row_hashes [N] (sorted fingerprints of
the rows trained on, so a continual run can tell new rows from replayed ones).
It is written to a temp dir beside the target and renamed into place, so readers never see half a model.

Loading memory-maps the big tables (input projection, head, extra heads) read-only straight from the file
in the model's own layout: no copy is made, so N serving processes share one copy through the page cache
and a load costs about the file's size in page cache, not several private copies.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from safetensors import SafetensorError

from trainer.durable import fsync_path, fsync_tree, write_safetensors
from trainer.errors import ArtifactError, OvexError, write_error
from trainer.model import ModelShape, XCModel
from trainer.params import TrainParams
from trainer.twins import excluded_twins, has_label_tower, text_only_labels, topk_without, twins_of

SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)
FORMAT = "ovex-model"
COUNTS = "stats.label_counts"  # optional [K] float32: training rows per label (for PSP@k)
HASHES = "stats.row_hashes"  # optional [N] int64: fingerprints of the training rows (trainer.continual)
REQUIRED_FILES = ("config.json", "weights.safetensors", "labels.txt", "metrics.json")


def _model_tensors(model: XCModel) -> dict[str, torch.Tensor]:
    out = {
        "input.weight": model.input_weight.detach(),
        "input.bias": model.input_bias.detach(),
        "head": model.head.detach(),
    }
    for name, t in model.hidden.state_dict().items():
        out[f"hidden.{name}"] = t.detach()
    for name, t in model.extra.items():
        out[f"extra.{name}"] = t.detach()
    # contiguous CPU tensors as they are (the writer streams their bytes; a K×d head copied once more
    # costs as much as the write itself), anything else copied once
    return {k: v.cpu().contiguous() for k, v in out.items()}


def artifact_tensors(
    model: XCModel, label_counts: np.ndarray | None, where: str, row_hashes: np.ndarray | None = None
) -> dict[str, torch.Tensor]:
    """The tensors of `weights.safetensors` (label counts as float32 and the training rows' fingerprints
    when given); the model's own CPU tensors are lent, not copied: writers only read them."""
    tensors = _model_tensors(model)
    if label_counts is not None:
        counts = np.asarray(label_counts, dtype=np.float32)
        if counts.shape != (model.shape.n_labels,):
            raise ArtifactError(where, f"label_counts has shape {counts.shape}")
        tensors[COUNTS] = torch.from_numpy(counts.copy())
    if row_hashes is not None:
        tensors[HASHES] = torch.from_numpy(np.unique(np.asarray(row_hashes, dtype=np.int64)))
    return tensors


# writes weights.safetensors at the given path from the given tensors; returns each tensor's shape
WeightsWriter = Callable[[Path, dict[str, torch.Tensor]], dict[str, list[int]]]


def _expected_shapes(model: XCModel) -> dict[str, list[int]]:
    """Names and shapes of the saved tensors, read off the (unfilled) model without copying it."""
    out = {
        "input.weight": list(model.input_weight.shape),
        "input.bias": list(model.input_bias.shape),
        "head": list(model.head.shape),
    }
    out.update({f"hidden.{k}": list(v.shape) for k, v in model.hidden.state_dict().items()})
    out.update({f"extra.{k}": list(v.shape) for k, v in model.extra.items()})
    return out


def prepare_out_dir(out: Path) -> None:
    """Check that `out` may take a model (it is absent, empty or a model directory: anything else would
    be lost) and create its parent directory, as saving needs. Training calls this before its first step
    too, so a wrong `--out` does not cost a whole run."""
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "config.json").exists())):
        raise ArtifactError(str(out), "exists and is not an ovex model directory; refusing to replace it")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArtifactError(str(out), f"cannot create its directory {out.parent}: {exc.strerror}") from None


def save_artifact(
    out_dir: str | Path,
    model: XCModel,
    featurizer: Any,
    label_names: list[str],
    params: TrainParams,
    metrics: dict[str, Any],
    *,
    label_counts: np.ndarray | None = None,
    n_train_rows: int = 0,
    write_weights: WeightsWriter | None = None,
    row_hashes: np.ndarray | None = None,
    extra_files: Callable[[Path], None] | None = None,
) -> Path:
    """Write the model directory atomically and durably (`trainer.durable`); an existing model at
    `out_dir` is replaced.

    `label_counts`/`n_train_rows` (training label frequencies) let evaluation compute PSP@k later.
    `write_weights` replaces the plain safetensors writer (ranks of a sharded head write their rows).
    `extra_files` writes more files into the directory before it is published (a label tower's).
    """
    out = Path(out_dir)
    if len(label_names) != model.shape.n_labels:
        raise ArtifactError(str(out), f"{len(label_names)} label names for {model.shape.n_labels} labels")
    prepare_out_dir(out)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as exc:
        raise write_error(str(out), exc, "the model") from None
    try:
        tensors = artifact_tensors(model, label_counts, str(out), row_hashes)
        if write_weights is None:
            shapes = write_safetensors(tmp / "weights.safetensors", tensors)
        else:
            shapes = write_weights(tmp / "weights.safetensors", tensors)
        del tensors
        config = {
            "schema_version": SCHEMA_VERSION,
            "format": FORMAT,
            "params": params.to_json_dict(),
            "n_features": model.shape.n_features,
            "n_labels": model.shape.n_labels,
            "dim": model.shape.dim,
            "shape": model.shape.to_json(),
            "n_train_rows": int(n_train_rows),
            "tensors": shapes,
        }
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        (tmp / "labels.txt").write_text(labels_text(label_names), encoding="utf-8")
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2))
        featurizer.save(tmp / "featurizer")
        if extra_files is not None:
            extra_files(tmp)
        fsync_tree(tmp)  # on disk before the rename publishes it (a crash must not leave empty weights)
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / "model")
        try:
            os.replace(tmp, out)
        except BaseException:
            if old is not None:  # the previous model goes back where it was
                os.replace(old / "model", out)
                old.rmdir()
            raise
        fsync_path(out.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise write_error(str(out), exc, "the model") from None
        raise
    return out


@dataclass
class LoadedModel:
    """A model ready to serve: numpy views of the head plus a torch encoder in eval mode."""

    path: Path
    config: dict[str, Any]
    params: TrainParams
    label_names: list[str]
    metrics: dict[str, Any]
    featurizer: Any
    model: XCModel
    label_counts: np.ndarray | None = None
    row_hashes: np.ndarray | None = None  # sorted int64 fingerprints of the training rows
    # with label texts whose training rows never carry their twins: text -> the labels left out of its answers
    twins: dict[str, list[int]] | None = None
    # with label texts: bool [K], the labels known by their text alone (no training rows yet)
    text_only: np.ndarray | None = None

    def excluded(self, texts: Sequence[str | None]) -> list[list[int]]:
        """The labels left out of each input's answers: a text input's twins (`trainer.twins.Twins`)
        when the model excludes them; none for a sparse input or another model."""
        if not self.twins:
            return [[] for _ in texts]
        return twins_of(self.twins, texts)

    def propensities(self, a: float = 0.55, b: float = 1.5, n_labels: int | None = None) -> np.ndarray | None:
        """Jain et al. (2016) propensities from the training label counts (None if not recorded); with
        `n_labels`, labels past the model's (evaluation labels it lacks) as labels without training rows."""
        n = int(self.config.get("n_train_rows", 0))
        if self.label_counts is None or n <= 0:
            return None
        counts = self.label_counts.astype(np.float64)
        if n_labels is not None and n_labels > counts.size:
            counts = np.concatenate([counts, np.zeros(n_labels - counts.size)])
        c = (np.log(n) - 1.0) * (b + 1.0) ** a
        out: np.ndarray = 1.0 / (1.0 + c * np.power(counts + b, -a))
        return out

    @property
    def n_features(self) -> int:
        return self.model.shape.n_features

    @property
    def n_labels(self) -> int:
        return self.model.shape.n_labels

    @property
    def dim(self) -> int:
        return self.model.shape.dim

    @property
    def head_weight(self) -> np.ndarray:
        return self.model.head_weight.detach().cpu().numpy()

    @property
    def head_bias(self) -> np.ndarray:
        return self.model.head_bias.detach().cpu().numpy()

    def encode(self, x: sp.spmatrix) -> np.ndarray:
        """h(x) for already-featurized rows (float32 [n, d])."""
        csr = sp.csr_matrix(x, dtype=np.float32)
        if csr.shape[1] != self.n_features:
            raise ValueError(f"input has {csr.shape[1]} features, the model expects {self.n_features}")
        with torch.no_grad():
            return self.model.encode(csr).cpu().numpy().astype(np.float32, copy=False)

    def scores(self, x: sp.spmatrix) -> np.ndarray:
        """Exact scores f_k(x) for all K labels (float32 [n, K])."""
        h = torch.from_numpy(self.encode(x))
        with torch.no_grad():
            return self.model.score(h).numpy()

    def topk(self, x: sp.spmatrix, k: int,
             exclude: Sequence[Sequence[int]] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k (ids, scores) per row, best first, by blocked products; without the labels
        `exclude` names for each row (`excluded`)."""
        csr = sp.csr_matrix(x, dtype=np.float32)
        return topk_without(lambda n: self.model.topk(csr, n), k, exclude)


def _read_json(path: Path, root: Path) -> Any:
    """A JSON file of a model directory; the error says what is wrong with it, never where it lies
    beyond `root` (a server shows these messages under the model's name)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(str(root), f"missing {path.relative_to(root)}") from None
    except OSError as exc:
        raise ArtifactError(str(root), f"{path.relative_to(root)} cannot be read: "
                                       f"{exc.strerror or 'I/O error'}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(str(root), f"{path.relative_to(root)} is not valid JSON: {exc}") from None


def read_params(path: str | Path, name: str | None = None) -> tuple[TrainParams, str]:
    """The training parameters a model directory records and its featurizer's kind ("sparse" or "text"),
    without reading its weights or vocabulary; errors name the model as `name` (default: its path)."""
    root = Path(path)
    try:
        params = _read_config(root)[1]
        return params, _featurizer_kind(root)
    except ArtifactError as exc:
        raise ArtifactError(name or str(path), exc.message) from None


def read_shape(path: str | Path, name: str | None = None) -> ModelShape:
    """The model shape (features, labels, width d, encoder) a model directory's config.json records,
    without reading its weights, its other files or its params; errors name the model as `name`."""
    root = Path(path)
    try:
        return _shape_of(_config_json(root), root)
    except ArtifactError as exc:
        raise ArtifactError(name or str(path), exc.message) from None


def read_featurizer_kind(path: str | Path, name: str | None = None) -> str:
    """What a model directory's featurizer takes, "text" or "sparse", from featurizer/featurizer.json
    alone; errors name the model as `name` (default: its path)."""
    try:
        return _featurizer_kind(Path(path))
    except ArtifactError as exc:
        raise ArtifactError(name or str(path), exc.message) from None


def _featurizer_kind(root: Path) -> str:
    featurizer = _read_json(root / "featurizer" / "featurizer.json", root)
    if not isinstance(featurizer, dict) or not isinstance(featurizer.get("kind"), str):
        raise ArtifactError(str(root), "featurizer/featurizer.json does not say its kind")
    return str(featurizer["kind"])


def _config_json(root: Path) -> dict[str, Any]:
    """config.json as a JSON object of a schema this ovex reads."""
    config = _read_json(root / "config.json", root)
    if not isinstance(config, dict):
        raise ArtifactError(str(root), "config.json must hold a JSON object")
    version = config.get("schema_version")
    if version not in READABLE_SCHEMAS:
        raise ArtifactError(
            str(root),
            f"unsupported schema_version {version!r} (this ovex reads versions "
            f"{', '.join(map(str, READABLE_SCHEMAS))})",
        )
    return config


def _shape_of(config: dict[str, Any], root: Path) -> ModelShape:
    """The model shape config.json records, checked against its own n_features/n_labels/dim."""
    for key in ("n_features", "n_labels", "dim", "shape"):
        if key not in config:
            raise ArtifactError(str(root), f"config.json lacks {key!r}")
    try:
        shape = ModelShape.from_json(config["shape"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ArtifactError(str(root), f"config.json has invalid params/shape: {exc}") from None
    dims = (config["n_features"], config["n_labels"], config["dim"])
    if (shape.n_features, shape.n_labels, shape.dim) != dims:
        raise ArtifactError(str(root), "config.json: shape disagrees with n_features/n_labels/dim")
    return shape


def _read_config(root: Path) -> tuple[dict[str, Any], TrainParams, ModelShape]:
    """config.json of a model directory, checked against itself: (config, its params, its model shape)."""
    if not root.is_dir():
        raise ArtifactError(str(root), "not a model directory (does not exist or is not a directory)")
    for name in REQUIRED_FILES:
        if not (root / name).is_file():
            raise ArtifactError(str(root), f"missing {name}")
    if not (root / "featurizer").is_dir():
        raise ArtifactError(str(root), "missing featurizer/")
    config = _config_json(root)
    if "params" not in config:  # the shape's own keys are checked by `_shape_of`
        raise ArtifactError(str(root), "config.json lacks 'params'")
    try:
        params = TrainParams.from_json_dict(config["params"])
    except (OvexError, KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(str(root), f"config.json has invalid params/shape: {exc}") from None
    return config, params, _shape_of(config, root)


def load_artifact(path: str | Path) -> LoadedModel:
    """Load and validate a model directory; every problem is an `ArtifactError` naming what is wrong."""
    root = Path(path)
    config, params, shape = _read_config(root)
    version = config["schema_version"]
    try:
        tensors = map_safetensors(root / "weights.safetensors")
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ArtifactError(str(root), f"weights.safetensors is unreadable: {exc}") from None
    try:
        model = XCModel(shape, init=False)
    except OvexError as exc:
        raise ArtifactError(str(root), f"cannot build the model: {exc}") from None
    expected = _expected_shapes(model)
    if version == 1:  # the head was stored as two tensors; this layout is copied, not mapped
        del expected["head"]
        expected["head.weight"] = [shape.n_labels, shape.dim]
        expected["head.bias"] = [shape.n_labels]
    for name, want in expected.items():
        if name not in tensors:
            raise ArtifactError(str(root), f"weights.safetensors lacks tensor {name!r}")
        got = list(tensors[name].shape)
        if got != want:
            raise ArtifactError(str(root), f"tensor {name!r} has shape {got}, expected {want}")
    counts = tensors.pop(COUNTS, None)
    if counts is not None and list(counts.shape) != [shape.n_labels]:
        raise ArtifactError(
            str(root), f"tensor {COUNTS!r} has shape {list(counts.shape)}, expected [{shape.n_labels}]"
        )
    hashes = tensors.pop(HASHES, None)
    if hashes is not None and (hashes.dim() != 1 or hashes.dtype != torch.int64):
        raise ArtifactError(str(root), f"tensor {HASHES!r} must be a 1-d int64 tensor")
    unknown = sorted(set(tensors) - set(expected))
    if unknown:
        raise ArtifactError(str(root), f"weights.safetensors has unexpected tensors {unknown[:5]}")
    for name, t in tensors.items():
        if t.is_floating_point() and not _all_finite(t):
            raise ArtifactError(str(root), f"tensor {name!r} holds non-finite values")
    _load_weights(model, tensors)
    model.eval()

    label_names = _read_labels(root, shape.n_labels)
    metrics = _read_json(root / "metrics.json", root)
    if not isinstance(metrics, dict):
        raise ArtifactError(str(root), "metrics.json must hold a JSON object")
    featurizer = _load_featurizer(root, shape.n_features)
    counts_np = None if counts is None else counts.numpy().astype(np.float64)
    hashes_np = None if hashes is None else hashes.numpy()
    twins = excluded_twins(root, label_names) if has_label_tower(root) else None
    return LoadedModel(root, config, params, label_names, metrics, featurizer, model, counts_np, hashes_np,
                       twins, text_only_labels(root, shape.n_labels))


_DTYPES: dict[str, np.dtype[Any]] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_MAX_HEADER = 100 << 20


def map_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file as a read-only view of one memory map of the file.

    The format is an 8-byte little-endian header length, a JSON header (name → dtype, shape, byte
    range), then the raw bytes; parsing it here (no pickle) lets tensors alias the mapped pages, which
    `safetensors.torch.load_file` would copy into private memory. Writing to these tensors faults.
    """
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ValueError("file shorter than its 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, _MAX_HEADER):
            raise ValueError(f"header length {n} exceeds the file")
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    header.pop("__metadata__", None)
    start = 8 + n
    mm = np.memmap(path, dtype=np.uint8, mode="r") if size > start else np.zeros(0, np.uint8)
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        try:
            dtype = _DTYPES[info["dtype"]]
            shape = [int(x) for x in info["shape"]]
            lo, hi = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"tensor {name!r}: bad dtype/shape/data_offsets in the header") from None
        count = int(np.prod(shape)) if shape else 1
        fits = 0 <= lo <= hi <= size - start and hi - lo == count * dtype.itemsize
        if min(shape, default=0) < 0 or not fits:
            raise ValueError(f"tensor {name!r}: byte range [{lo}, {hi}) does not fit its shape or the file")
        arr = mm[start + lo : start + hi].view(dtype).reshape(shape)
        if (start + lo) % dtype.itemsize:  # unaligned (not written by safetensors): copy this one
            arr = arr.copy()
        with warnings.catch_warnings():  # torch warns that the array is not writable: that is the point
            warnings.simplefilter("ignore", UserWarning)
            out[str(name)] = torch.from_numpy(arr)
    return out


def _all_finite(t: torch.Tensor, block: int = 1 << 16) -> bool:
    """A float32 sum first (vectorised, no temporary): finite whenever every element is, since NaN and
    ±inf propagate. Only a non-finite sum (bad values, or finite ones overflowing) pays for the exact
    element-wise check, in row blocks so no temporary grows with the mapped table."""
    if t.numel() == 0 or bool(torch.isfinite(t.sum())):
        return True
    flat = t.reshape(t.shape[0], -1) if t.dim() > 1 else t.reshape(-1, 1)
    return all(bool(torch.isfinite(flat[s : s + block]).all()) for s in range(0, flat.shape[0], block))


def _load_weights(model: XCModel, tensors: dict[str, torch.Tensor]) -> None:
    """The big tables become the mapped tensors themselves (no copy); small ones are copied in."""
    d = model.shape.dim
    with torch.no_grad():
        model.input_weight = torch.nn.Parameter(tensors.pop("input.weight"), requires_grad=False)
        model.input_bias.copy_(tensors.pop("input.bias"))
        if "head" in tensors:
            model.head = torch.nn.Parameter(tensors.pop("head"), requires_grad=False)
        else:  # schema 1: two tensors, assembled into the [K, d+1] table by a copy
            model.head = torch.nn.Parameter(torch.empty(model.shape.n_labels, d + 1), requires_grad=False)
            model.head[:, :d].copy_(tensors.pop("head.weight"))
            model.head[:, d].copy_(tensors.pop("head.bias"))
        hidden = {k[len("hidden.") :]: tensors.pop(k) for k in list(tensors) if k.startswith("hidden.")}
        model.hidden.load_state_dict(hidden)
        for name in list(model.extra):
            model.extra[name] = torch.nn.Parameter(tensors.pop(f"extra.{name}"), requires_grad=False)


def labels_text(label_names: list[str]) -> str:
    """labels.txt: one JSON string a line, by one C-encoded dump of the list with a newline between
    items (a JSON string never holds a raw newline), not a Python call per name."""
    if not label_names:
        return ""
    return json.dumps(list(label_names), ensure_ascii=False, separators=("\n", ":"))[1:-1] + "\n"


def _read_labels(root: Path, n_labels: int) -> list[str]:
    """One JSON string a line. Parsed as one JSON array, with no Python pass over the lines (a label
    space of millions loads in seconds); only a file that fails that is read again line by line, to name
    the line at fault."""
    try:
        text = (root / "labels.txt").read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ArtifactError(str(root), "labels.txt is not UTF-8") from None
    body = text[:-1] if text.endswith("\n") else text
    n_lines = body.count("\n") + 1 if body else 0
    try:  # an empty line makes ",," and fails; a line of two names leaves more names than lines
        names = json.loads("[" + body.replace("\n", ",") + "]") if body else []
    except json.JSONDecodeError:
        names = None
    if names is None or len(names) != n_lines or set(map(type, names)) - {str}:
        for lineno, line in enumerate(body.split("\n"), 1):
            try:
                name = json.loads(line)
            except json.JSONDecodeError:
                raise ArtifactError(str(root), f"labels.txt:{lineno}: not a JSON string") from None
            if not isinstance(name, str):
                raise ArtifactError(str(root), f"labels.txt:{lineno}: not a JSON string")
        raise ArtifactError(str(root), "labels.txt: not one JSON string per line")
    if len(names) != n_labels:
        raise ArtifactError(str(root), f"labels.txt has {len(names)} names, expected {n_labels}")
    return names


def _load_featurizer(root: Path, n_features: int) -> Any:
    from trainer.featurize import Featurizer

    try:
        featurizer = Featurizer.load(root / "featurizer")
    except OvexError as exc:
        raise ArtifactError(str(root), f"featurizer/ cannot be loaded: {exc}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(str(root), f"featurizer/ cannot be loaded: {exc}") from None
    if int(featurizer.n_features) != n_features:
        raise ArtifactError(
            str(root), f"featurizer produces {featurizer.n_features} features, the model expects {n_features}"
        )
    return featurizer
