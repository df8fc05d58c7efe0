"""Training checkpoints, sharded by rank: resume after a kill, on the same or a different number of ranks.

Layout of `<checkpoint_dir>`:
  latest.json                  {"checkpoint": "step-NNN", "step": N}: the last complete checkpoint
  step-NNN/manifest.json       step, epoch, position, model shape, world size, each rank's label rows
  step-NNN/rank-RRRRR.safetensors
                               that rank's label rows of every label table (head, loss-owned heads, their
                               optimizer state, the kept best epoch's copy) and its RNG streams; rank 0's
                               file also holds what every rank has the same copy of (encoder, dense state,
                               a label tower's cache of text rows)

Each rank writes its file durably (`trainer.durable`) to a temporary name and renames it; rank 0 writes
the manifest once every rank has written, renames the directory into place and only then moves
`latest.json` (os.replace), each step flushed to disk first: a rank or the machine stopped at any
moment leaves the previous checkpoint complete and current. Loading reads, for this rank's label rows,
the slices of the saved shards that overlap them (safetensors slices: a rank never reads the whole head),
so a run resumes on any number of ranks. RNG streams are restored when the world size is
unchanged; with a different one the ranks draw fresh streams (the same law, another sample).
Safetensors + JSON only, never pickle.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open

from trainer.durable import commit_file, fsync_path, write_safetensors
from trainer.errors import ParamsError, write_error
from trainer.label_tower import tower_of

if TYPE_CHECKING:
    from trainer.step import Stepper

LATEST = "latest.json"
MANIFEST = "manifest.json"
PARTIAL = ".step-*.partial"  # a checkpoint being written; renamed to step-NNN once every rank has written


def is_label_rows(key: str) -> bool:
    """Whether a checkpoint tensor is one row per label (sharded) rather than replicated on every rank."""
    kind, _, name = key.partition(".")
    if kind in ("model", "best"):
        return name == "head" or name.startswith("extra.")
    if kind in ("optim", "toptim"):
        return (name.startswith("head.") or name.startswith("extra.")) and not name.endswith(".step")
    return False


def _rng(state: torch.Tensor) -> torch.Tensor:
    return state.clone().to(torch.uint8)


def _state_tensors(stepper: Stepper, sampler_state: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for name, t in stepper.model.state_dict().items():
        tensors[f"model.{name}"] = t
    for name, t in stepper.optim.state_tensors().items():
        tensors[f"optim.{name}"] = t
    if stepper.table_optim is not stepper.optim:
        for name, t in stepper.table_optim.state_tensors().items():
            tensors[f"toptim.{name}"] = t
    for name, t in stepper.best.state.items():
        tensors[f"best.{name}"] = t
    if stepper.hard is not None and stepper.hard.table is not None:  # mined at the epoch's start
        tensors["hard.table"] = stepper.hard.table
    tower = tower_of(stepper.model)
    if tower is not None and tower.cache is not None:  # made at the epoch's start, updated by its steps
        tensors["tower.cache"] = tower.cache
    tensors["rng.torch"] = _rng(torch.get_rng_state())
    tensors["rng.sampler"] = _rng(stepper.sampler.get_state() if sampler_state is None else sampler_state)
    if torch.cuda.is_available():
        tensors["rng.cuda"] = _rng(torch.cuda.get_rng_state())
    return {k: v.detach().cpu().contiguous() for k, v in tensors.items()}


def _rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.safetensors"


def save_checkpoint(
    ckpt_dir: Path, stepper: Stepper, step: int, epoch: int, pos: int, extra: dict[str, Any],
    sampler_state: torch.Tensor | None = None,
) -> Path:
    """Collective: every rank of `stepper.group` calls it at the same step. A failed write (a full disk)
    is an error saying so; the previous checkpoint stays the one to resume from. `sampler_state`: the
    sampler's state after this step's draws, when later steps were drawn ahead (`trainer.ahead`)."""
    partial = ckpt_dir / f".step-{step:09d}.partial"
    try:
        return _save_checkpoint(ckpt_dir, partial, stepper, step, epoch, pos, extra, sampler_state)
    except OSError as exc:
        if stepper.group.world == 1:  # the half-written one gives its space back (with ranks, the launcher
            shutil.rmtree(partial, ignore_errors=True)  # does once none of them still writes)
        raise write_error(str(ckpt_dir), exc, f"the checkpoint of step {step}") from None


def remove_partials(ckpt_dir: Path) -> None:
    """Remove the half-written checkpoints under `ckpt_dir` (and its phases' directories, e.g. a refit's
    select/ and refit/): they hold space and are never resumed from. Only while no rank of a run writes
    there, i.e. once the ranks of a failed run have all stopped."""
    for partial in [*ckpt_dir.glob(PARTIAL), *ckpt_dir.glob(f"*/{PARTIAL}")]:
        shutil.rmtree(partial, ignore_errors=True)


def _save_checkpoint(ckpt_dir: Path, partial: Path, stepper: Stepper, step: int, epoch: int, pos: int,
                     extra: dict[str, Any], sampler_state: torch.Tensor | None) -> Path:
    group, shard = stepper.group, stepper.shard
    name = f"step-{step:09d}"
    if group.is_main:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir()
    group.barrier()
    tensors = {
        k: v for k, v in _state_tensors(stepper, sampler_state).items()
        if group.is_main or is_label_rows(k) or k.startswith("rng.")
    }
    target = partial / _rank_file(group.rank)
    tmp = target.with_name(target.name + ".tmp")
    write_safetensors(tmp, tensors)
    commit_file(tmp, target)
    bounds = group.gather_rows(torch.tensor([[shard.lo, shard.hi]], dtype=torch.int64, device=group.device))
    group.barrier()
    final = ckpt_dir / name
    if group.is_main:
        manifest = {
            "step": step, "epoch": epoch, "pos": pos, "shape": stepper.model.shape.to_json(),
            "world": group.world,
            "shards": [
                {"rank": r, "lo": int(lo), "hi": int(hi), "file": _rank_file(r)}
                for r, (lo, hi) in enumerate(bounds.cpu().tolist())
            ],
            **stepper.best.meta(), **extra,
        }
        (partial / MANIFEST).write_text(json.dumps(manifest))
        fsync_path(partial / MANIFEST)
        fsync_path(partial)
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        latest_tmp = ckpt_dir / f".{LATEST}.tmp"
        latest_tmp.write_text(json.dumps({"checkpoint": name, "step": step}))
        commit_file(latest_tmp, ckpt_dir / LATEST)  # with the new directory's rename, before the old go
        for old in [*ckpt_dir.glob("step-*"), *ckpt_dir.glob(PARTIAL)]:  # partial: of a killed run
            if old.name != name and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
    group.barrier()
    return final


def _manifest(path: Path) -> dict[str, Any]:
    if not (path / MANIFEST).is_file():
        raise ParamsError(f"checkpoint {path.name} has no {MANIFEST}: it was not written by this version; "
                          "remove the checkpoint directory to start the run over")
    manifest: dict[str, Any] = json.loads((path / MANIFEST).read_text())
    return manifest


def load_checkpoint(ckpt_dir: Path, stepper: Stepper) -> dict[str, Any] | None:
    """Restore the latest checkpoint into `stepper` (this rank's rows); None when there is none."""
    latest = ckpt_dir / LATEST
    if not latest.exists():
        return None
    path = ckpt_dir / json.loads(latest.read_text())["checkpoint"]
    meta = _manifest(path)
    if meta["shape"] != stepper.model.shape.to_json():
        raise ParamsError(
            f"checkpoint {path} was made for model shape {meta['shape']}, not {stepper.model.shape.to_json()}"
        )
    group, shard = stepper.group, stepper.shard
    same_world = int(meta["world"]) == group.world
    own_file = path / meta["shards"][group.rank]["file"] if same_world else None
    tensors: dict[str, torch.Tensor] = {}
    with safe_open(str(path / meta["shards"][0]["file"]), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            if not is_label_rows(key) and not key.startswith("rng."):
                tensors[key] = f.get_tensor(key)
    sharded: dict[str, list[torch.Tensor]] = {}
    for entry in meta["shards"]:
        a, b = max(shard.lo, int(entry["lo"])), min(shard.hi, int(entry["hi"]))
        if a >= b:
            continue
        with safe_open(str(path / entry["file"]), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118
                if is_label_rows(key):
                    rows = f.get_slice(key)[a - int(entry["lo"]) : b - int(entry["lo"])]
                    sharded.setdefault(key, []).append(rows)
    tensors.update({k: torch.cat(parts) for k, parts in sharded.items()})
    if own_file is not None:
        with safe_open(str(own_file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118
                if key.startswith("rng."):
                    tensors[key] = f.get_tensor(key)
    _restore(stepper, meta, tensors)
    return meta


def _restore(stepper: Stepper, meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    device = stepper.model.head.device

    def part(prefix: str) -> dict[str, torch.Tensor]:
        return {k[len(prefix) :]: v.to(device) for k, v in tensors.items() if k.startswith(prefix)}

    stepper.model.load_state_dict(part("model."))
    stepper.optim.load_state_tensors(part("optim."))
    if stepper.table_optim is not stepper.optim:
        stepper.table_optim.load_state_tensors(part("toptim."))
    stepper.best.load(meta, {k: v.to(device) for k, v in tensors.items() if k.startswith("best.")})
    if stepper.hard is not None and "hard.table" in tensors:
        stepper.hard.table = tensors["hard.table"].cpu()
    tower = tower_of(stepper.model)
    if tower is not None and "tower.cache" in tensors:
        tower.cache = tensors["tower.cache"].to(device)
    if "rng.torch" in tensors:
        torch.set_rng_state(tensors["rng.torch"])
        stepper.sampler.set_state(tensors["rng.sampler"])
        if "rng.cuda" in tensors and torch.cuda.is_available():
            torch.cuda.set_rng_state(tensors["rng.cuda"])
