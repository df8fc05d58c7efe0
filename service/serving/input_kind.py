"""A model's input kind, text or sparse features, is fixed by its versions: whichever version is
activated, a client that could send a model text keeps being able to."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from service.errors import Conflict
from service.serving.catalog import ModelCatalog, version_key
from trainer.artifact import read_featurizer_kind
from trainer.errors import ArtifactError

InputKind = Literal["text", "sparse"]
KIND_OF_FORMAT: dict[str, InputKind] = {"jsonl": "text", "xc": "sparse"}
_SAYS = {"text": "text (JSONL data)", "sparse": "sparse features (XC data)"}


def artifact_kind(version_dir: Path) -> InputKind | None:
    """What a stored version's featurizer takes, or None where that cannot be read."""
    try:
        kind = read_featurizer_kind(version_dir)
    except ArtifactError:
        return None
    return "text" if kind == "text" else "sparse" if kind == "sparse" else None


def model_kind(catalog: ModelCatalog, name: str) -> tuple[InputKind, str] | None:
    """(kind, version) of the oldest version whose kind can be read; None for a model with none."""
    try:
        versions = [p for p in catalog.model_dir(name).iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return None
    for version in sorted(versions, key=lambda p: version_key(p.name)):
        kind = artifact_kind(version)
        if kind is not None:
            return kind, version.name
    return None


def check_input_kind(catalog: ModelCatalog, model: str, kind: str, what: str) -> None:
    """Refuse a new version of `model` that would take another kind of input than its versions do."""
    found = model_kind(catalog, model)
    if found is None or found[0] == kind:
        return
    has, version = found
    raise Conflict(
        f"model {model!r} takes {_SAYS[has]} since its version {version}, and {what} is {_SAYS[kind]}: "
        "train it as a new model (another model name)",
        field=("model",),
        model=model,
        input_kind=has,
    )
