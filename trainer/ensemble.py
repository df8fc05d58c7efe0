"""Ensembles (`ensemble` N > 1): N models trained one after another from seeds seed, seed+1, ..., saved as
one model N·dim wide.

The linear encoder makes that exact: h(x) = x·W + c, so the members' input tables and input biases side by
side give the members' h side by side, and their head rows side by side with the biases added score
Σ_i ⟨w_ik, h_i(x)⟩ + b_ik, the sum of the members' scores. Serving, retrieval and continual runs read an
ordinary model; the members each train exactly as a run of their own seed would.
"""

from __future__ import annotations

import hashlib
import itertools
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.artifact import load_artifact, save_artifact
from trainer.capacity import check_fits
from trainer.collectives import resolve_device
from trainer.data import Dataset
from trainer.errors import ParamsError
from trainer.hooks import Progress, TrainHooks, TrainResult
from trainer.logit_adjust import shift_biases
from trainer.model import XCModel
from trainer.params import TrainParams

# trains one member: `trainer.train.train` with the member's params
TrainOne = Callable[..., TrainResult]
# a trained model's test metrics: `trainer.train.evaluate_test` (model, featurizer, train set, test set)
Evaluate = Callable[[XCModel, Any, Dataset, Dataset], dict[str, float]]


class _MemberHooks:
    """The caller's hooks seen from member i of n: progress counts every member's steps and epochs in
    one run, so a job's progress rises once from 0 to the end instead of n times."""

    def __init__(self, hooks: TrainHooks, i: int, n: int) -> None:
        self.hooks, self.i, self.n = hooks, i, n

    def on_progress(self, progress: Progress) -> None:
        self.hooks.on_progress(replace(
            progress, epoch=progress.epoch + self.i * progress.epochs, epochs=progress.epochs * self.n,
            step=progress.step + self.i * progress.steps_total, steps_total=progress.steps_total * self.n))

    def on_log(self, message: str) -> None:
        self.hooks.on_log(f"member {self.i + 1}/{self.n}: {message}")

    def should_stop(self) -> bool:
        return self.hooks.should_stop()


def check_ensemble(*, base: Any, label_texts: Any) -> None:
    """Refuse what an ensemble does not combine with (the field-level checks are TrainParams')."""
    if base is not None:
        raise ParamsError("ensemble trains new models from scratch and cannot continue a base model; a "
                          "model saved from an ensemble continues as one model of its full width (leave "
                          "ensemble out)")
    if label_texts:
        raise ParamsError("ensemble does not train with label texts yet: a label tower belongs to one "
                          "encoder; leave ensemble out or train without label texts")


def train_ensemble(train_one: TrainOne, evaluate: Evaluate, params: TrainParams, train_ds: Dataset,
                   test_ds: Dataset | None, *, out_dir: str | Path | None, hooks: TrainHooks,
                   checkpoint_dir: str | Path | None, checkpoint_every: int) -> TrainResult:
    """Train the members (each into `.NAME.members/member-i` beside `out_dir`, its checkpoints under
    `checkpoint_dir`/member-i), then write the merged model to `out_dir` and score it on `test_ds`."""
    n = params.ensemble
    check_fits(train_ds, params, resolve_device(params.device))  # the merged model too, before any member
    if out_dir is None:
        work = Path(tempfile.mkdtemp(prefix="ovex-ensemble-"))
    else:  # beside the model, named by it: a killed run's members are cleared by the next run to that model
        work = Path(out_dir).parent / f".{Path(out_dir).name}.members"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    try:
        results = []
        for i in range(n):
            # the merged model's biases take the logit adjustment once, not once per member
            member = params.model_copy(update={"ensemble": 1, "seed": params.seed + i, "logit_adjust": 0.0})
            hooks.on_log(f"ensemble member {i + 1}/{n} (seed {member.seed})")
            ckpt = None if checkpoint_dir is None else Path(checkpoint_dir) / f"member-{i}"
            results.append(train_one(member, train_ds, test_ds, out_dir=work / f"member-{i}",
                                     hooks=_MemberHooks(hooks, i, n), checkpoint_dir=ckpt,
                                     checkpoint_every=checkpoint_every))
        dirs = [work / f"member-{i}" for i in range(n)]
        return _merged_result(results, dirs, params, train_ds, test_ds, out_dir, hooks, evaluate)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _merged_result(results: list[TrainResult], dirs: list[Path], params: TrainParams, train_ds: Dataset,
                   test_ds: Dataset | None, out_dir: str | Path | None, hooks: TrainHooks,
                   evaluate: Evaluate) -> TrainResult:
    if len({featurizer_digest(d / "featurizer") for d in dirs}) != 1:  # fitted from the same rows and params
        raise RuntimeError("ensemble members fitted different featurizers")
    first = load_artifact(dirs[0])
    featurizer, names = first.featurizer, first.label_names
    counts, hashes = first.label_counts, first.row_hashes
    n_rows = int(first.config.get("n_train_rows", 0))
    model = merge_models(itertools.chain([first.model], (load_artifact(d).model for d in dirs[1:])),
                         len(dirs))
    if counts is not None:
        shift_biases(model, counts, params.logit_shift(label_texts=False))
    del first
    metrics = {} if test_ds is None else evaluate(model, featurizer, train_ds, test_ds)
    seconds = sum(r.seconds for r in results)
    steps = sum(r.steps for r in results)
    summary = {**metrics, "train_loss": float(np.mean([r.final_loss for r in results])),
               "examples_per_s": float(np.mean([r.examples_per_s for r in results])),
               "train_seconds": float(seconds),
               "steps": float(steps), "ensemble": float(len(dirs))}
    out_path = None
    if out_dir is not None:
        out_path = save_artifact(out_dir, model, featurizer, names, params, summary, label_counts=counts,
                                 n_train_rows=n_rows, row_hashes=hashes)
        hooks.on_log(f"model written to {out_path} ({len(dirs)} members side by side, dim {model.shape.dim})")
    return TrainResult(out_dir=out_path, metrics=metrics, steps=steps, epochs=results[-1].epochs,
                       seconds=seconds, examples_per_s=summary["examples_per_s"],
                       final_loss=summary["train_loss"],
                       history=[{**h, "member": i} for i, r in enumerate(results) for h in r.history])


def featurizer_digest(directory: Path) -> str:
    """A digest of a saved featurizer's files: members must read their inputs the same way."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(directory)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@torch.no_grad()
def merge_models(models: Iterable[XCModel], n: int) -> XCModel:
    """One model whose scores are the sum of the `n` members' (linear encoders of one input space, label
    space and width): input tables and biases side by side, head rows side by side, biases added. Members
    are taken one at a time, so an iterator of loads holds one member beside the merged model."""
    merged: XCModel | None = None
    d, taken = 0, 0
    for i, m in enumerate(models):
        s = m.shape
        if merged is None:
            if s.encoder != "linear" or s.hidden or s.extra_heads:
                raise ValueError("only linear encoders without hidden layers or extra heads sum as one model")
            d = s.dim
            merged = XCModel(replace(s, dim=d * n), init=False)
            merged.head[:, -1].zero_()
        elif (s.n_features, s.n_labels, s.dim) != (merged.shape.n_features, merged.shape.n_labels, d):
            raise ValueError("ensemble members differ in their input space, label space or width")
        cols = slice(i * d, (i + 1) * d)
        merged.input_weight[:, cols] = m.input_weight.detach().cpu()
        merged.input_bias[cols] = m.input_bias.detach().cpu()
        head = m.head.detach().cpu()
        merged.head[:, cols] = head[:, :d]
        merged.head[:, -1] += head[:, -1]
        taken = i + 1
    if merged is None or taken != n:
        raise ValueError(f"{taken} ensemble members for {n}")
    return merged.eval()
