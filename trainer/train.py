"""The training loop: featurize, sample, score candidates, update touched rows, evaluate, checkpoint.

`train(...)` is the one entry point for the CLI, the job worker and the benchmarks; callers observe and
stop it through `TrainHooks`. Checkpoints (safetensors + JSON, never pickle) hold model, optimizer and RNG
state plus the position in the epoch, so a resumed run continues the same step sequence.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from trainer import metrics as xc_metrics
from trainer.ahead import made_ahead
from trainer.artifact import prepare_out_dir
from trainer.capacity import check_fits
from trainer.checkpoints import load_checkpoint, save_checkpoint
from trainer.collectives import RankGroup, in_launched_rank, join_group, rank_device, resolve_device
from trainer.continual import (
    WarmStart,
    check_out_dir,
    row_fingerprints,
    split_metrics,
    warm_start,
)
from trainer.data import Dataset, check_compatible, label_counts, label_names_of, unseen_labels_note
from trainer.ensemble import check_ensemble, train_ensemble
from trainer.errors import ParamsError, TrainingCancelled
from trainer.hard_negatives import HardNegatives
from trainer.hooks import LoggingHooks, Progress, TrainHooks, TrainResult, _Muted
from trainer.label_shards import (
    LabelShard,
    check_shardable,
    shard_bounds,
    shard_topk,
)
from trainer.label_tower import (
    LabelTower,
    SubsetSampler,
    TextRows,
    check_usable,
    fade_weights,
    has_label_tower,
    load_tower_gain,
    load_tower_tensors,
    materialized,
    save_tower,
    with_text_rows,
)
from trainer.launch import train_on_ranks
from trainer.logit_adjust import adjusted
from trainer.losses import get_loss
from trainer.model import ModelShape, XCModel
from trainer.negatives import NegativeSampler
from trainer.params import INPUT_LR_LABELS_PER_DIM, INPUT_LR_STEPS, TrainParams
from trainer.step import (
    EpochData,
    StepInputs,
    StepLosses,
    Stepper,
    _as_csr32,
)
from trainer.twins import count_twins, read_stored_texts, topk_without, twin_index, twins_of

log = logging.getLogger("ovex.train")

EVAL_K = 5
PROGRESS_EVERY_S = 0.5


# ------------------------------------------------------------------------------------ model selection


def split_validation(n_rows: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit rows, validation rows) of the TRAINING set, a seeded random split.

    Model selection must never look at the test split, so the rows that pick the epoch are carved from
    the training data; the split depends only on (n_rows, fraction, seed), so a resumed run and a rerun
    hold out the same rows. At least one row stays on each side.
    """
    if not 0.0 < fraction < 1.0:
        raise ParamsError(f"valid_fraction must be in (0, 1), got {fraction}")
    if n_rows < 2:
        raise ParamsError("valid_fraction needs at least 2 training rows")
    n_val = min(n_rows - 1, max(1, round(n_rows * fraction)))
    perm = np.random.default_rng([seed, 0x5EED]).permutation(n_rows)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def tune_malloc() -> None:
    """Keep freed buffers in the heap (glibc): each step allocates the same few MB-sized tensors, and
    returning them to the OS every time makes the next step pay page faults (measured 5-10x slower ops)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 * 1024 * 1024)  # M_MMAP_THRESHOLD: serve blocks up to 32 MiB from the heap
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: do not hand the heap top back eagerly
        libc.mallopt(-2, 64 * 1024 * 1024)  # M_TOP_PAD
    except (OSError, AttributeError):
        pass


def steps_made_ahead(device: torch.device, group: RankGroup) -> bool:
    """Whether a run's steps have their host part made ahead on a thread (`trainer.ahead`): on a GPU,
    where it overlaps the device part; not with ranks, whose collectives must stay in step order."""
    return device.type == "cuda" and group.world == 1


def lr_at(params: TrainParams, step: int, total: int) -> float:
    """Linear warmup, then cosine / linear decay to 0 (or constant)."""
    warm = int(params.warmup * total)
    if step < warm:
        return params.lr * (step + 1) / warm
    if params.schedule == "constant":
        return params.lr
    frac = (step - warm) / max(total - warm, 1)
    if params.schedule == "linear":
        return params.lr * max(0.0, 1.0 - frac)
    return params.lr * 0.5 * (1.0 + math.cos(math.pi * min(frac, 1.0)))


def input_lr_scale(params: TrainParams, total: int, labels: int) -> float:
    """The input table's peak learning rate as a multiple of `lr`, for a run of `total` steps of a head with
    `labels` trained labels: `input_lr` when given; else √(INPUT_LR_STEPS / total) in a longer run of a head
    with at most INPUT_LR_LABELS_PER_DIM labels a dimension, and 1 otherwise. A slower table regularizes a
    head wide enough to carry the fit, and starves one too narrow to (docs/training.md)."""
    if params.input_lr > 0.0:
        return params.input_lr / params.lr
    if labels > INPUT_LR_LABELS_PER_DIM * params.dim:
        return 1.0
    return min(1.0, math.sqrt(INPUT_LR_STEPS / max(total, 1)))


# ------------------------------------------------------------------------------------ featurizing


def fit_featurizer(params: TrainParams, ds: Dataset) -> tuple[Any, sp.csr_matrix]:
    """Fit the featurizer the params ask for on the training set (saved with the model); with the set's
    rows through it, from one reading of its texts."""
    from trainer.featurize import Featurizer, FeaturizerConfig

    featurizer = Featurizer(FeaturizerConfig.from_params(params))
    return featurizer, featurizer.fit_transform(ds)


# ------------------------------------------------------------------------------------ evaluation


def evaluate_model(
    model: XCModel,
    x: sp.csr_matrix,
    y: sp.csr_matrix,
    prop: np.ndarray | None,
    shard: LabelShard | None = None,
    group: RankGroup | None = None,
    new_labels: np.ndarray | None = None,
    exclude: list[list[int]] | None = None,
) -> dict[str, float]:
    """P@k etc. of the exact top-k over all labels (merged over the ranks' shards when sharded); with
    `new_labels` (a continual run) also on new-label and old-label rows apart; without the labels
    `exclude` names for each row (its twins, `trainer.twins`), as the model will be served."""
    if exclude is not None and any(exclude):
        top, _ = topk_without(lambda n: model.topk(x, n), EVAL_K, exclude)
    elif shard is None or group is None:
        top, _ = model.topk(x, EVAL_K)
    else:
        top, _ = shard_topk(model, x, EVAL_K, shard, group)
    out = xc_metrics.evaluate_topk(top, y, prop)
    if new_labels is not None:
        out.update(split_metrics(top, y, new_labels, prop))
    return out


def train_propensities(y: sp.csr_matrix, test_labels: int | None = None) -> np.ndarray:
    """Propensities from the training rows' labels, over the test set's labels too when it has more (one
    the model lacks counts as a label without training rows)."""
    width = y.shape[1] if test_labels is None else max(y.shape[1], test_labels)
    return xc_metrics.propensities(sp.csr_matrix((y.data, y.indices, y.indptr), shape=(y.shape[0], width)))


def evaluate_test(model: XCModel, featurizer: Any, train_ds: Dataset, test_ds: Dataset) -> dict[str, float]:
    """A trained model's metrics on a test set already in the training label space (`check_compatible`)."""
    yt = _as_csr32(test_ds.Y)
    prop = train_propensities(_as_csr32(train_ds.Y), yt.shape[1])
    return evaluate_model(model, _as_csr32(featurizer.transform(test_ds)), yt, prop)


# ------------------------------------------------------------------------------------ train


def train(
    params: TrainParams,
    train_ds: Dataset,
    test_ds: Dataset | None = None,
    *,
    out_dir: str | Path | None,
    hooks: TrainHooks | None = None,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 0,
    base: str | Path | None = None,
    base_name: str | None = None,
    replay_ds: Dataset | None = None,
    label_texts: list[tuple[str, str]] | None = None,
) -> TrainResult:
    """Train on `train_ds`, evaluate on `test_ds` every `params.eval_every` epochs, write the artifact.

    With `params.nproc_per_node > 1` this starts that many ranks here (`trainer.launch`) and returns rank
    0's result; inside ranks started by torchrun (or by that launcher) it is one rank of the run.

    With `base` (a model directory) the run continues that model (trainer.continual): its featurizer,
    encoder and head, labels matched by name, new ones appended; parameters the caller did not set come
    from the base. `replay_ds` (e.g. the base's training set) adds rows to replay; `base_name` is how
    errors name the base (default: its path).

    With `params.valid_fraction > 0` a seeded share of the training rows is held out (featurizer and
    model never train on it), scored after every epoch, and the weights of the best epoch by P@1 on
    it are the ones saved and reported; `test_ds` is only ever reported, never used to decide. With
    `params.refit` as well, a second run on all training rows stops at that epoch (same schedule) and
    is the one saved: the held-out rows then only choose how long to train, and are not lost.

    With `params.ensemble` N > 1 it trains N models from seeds seed..seed+N-1 (`trainer.ensemble`) and
    writes one model N·dim wide that scores their sum.

    With `label_texts` ((name, text) pairs, `trainer.label_texts.read_label_texts`) every named label joins
    the label space, with training rows or not, and the model learns a label tower (`trainer.label_tower`);
    a base trained with label texts keeps its tower and texts, the given ones added (a name's new text
    replaces its old one).
    """
    hooks = hooks or LoggingHooks()
    if params.ensemble > 1:
        check_ensemble(base=base, label_texts=label_texts)
    if replay_ds is not None and base is None:
        raise ParamsError("replay_ds needs a base model (it holds rows the base trained on)")
    if out_dir is not None:  # before any step: a wrong output directory should not cost a run
        if base is not None:
            check_out_dir(out_dir, base)
        prepare_out_dir(Path(out_dir))
    if params.nproc_per_node > 1 and not in_launched_rank():
        return train_on_ranks(train, params, train_ds, test_ds, out_dir=out_dir, hooks=hooks,
                              checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                              base=base, base_name=base_name, replay_ds=replay_ds)
    texts: dict[str, str] | None = None
    if label_texts or (base is not None and has_label_tower(Path(base))):
        texts = {} if base is None else read_stored_texts(Path(base))
        texts.update(label_texts or [])
        check_usable(train_ds.is_text, get_loss(params.loss).needs_all_labels, params.nproc_per_node)
        train_ds = with_labels(train_ds, list(texts))
    warm: WarmStart | None = None
    if base is not None:
        warm, train_ds, test_ds = warm_start(base, train_ds, test_ds, base_name=base_name,
                                             replay_ds=replay_ds, params=params)
        assert warm.params is not None
        params = warm.params
        hooks.on_log(f"continuing {warm.name}: {warm.n_base_labels} labels, "
                     f"{len(warm.label_names) - warm.n_base_labels} new")
    if test_ds is not None:  # before any step (on each rank): a refit scores it only after a selection run
        test_ds = check_compatible(train_ds, test_ds)
        note = unseen_labels_note(test_ds, "the test set")
        if note:
            hooks.on_log(note)
    if params.ensemble > 1:
        return train_ensemble(train, evaluate_test, params, train_ds, test_ds, out_dir=out_dir,
                              hooks=hooks, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every)
    if params.valid_fraction > 0 and params.refit:
        ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
        # the selection run never sees the test split, not even to report it
        select = _fit(params, train_ds, None, out_dir=None, hooks=hooks, warm=warm,
                      checkpoint_dir=None if ckpt is None else ckpt / "select",
                      checkpoint_every=checkpoint_every, texts=texts)
        assert select.best_epoch is not None and select.metrics_valid_p1 is not None
        hooks.on_log(f"refit on all {train_ds.n_rows} training rows, stop after epoch {select.best_epoch}")
        refit = params.model_copy(
            update={"valid_fraction": 0.0, "refit": False, "patience": 0, "stop_epoch": select.best_epoch}
        )
        result = _fit(refit, train_ds, test_ds, out_dir=out_dir, hooks=hooks, warm=warm,
                      checkpoint_dir=None if ckpt is None else ckpt / "refit",
                      checkpoint_every=checkpoint_every, artifact_params=params,
                      extra_summary={"best_epoch": float(select.best_epoch),
                                     "valid_p@1": float(select.metrics_valid_p1)}, texts=texts)
        result.best_epoch = select.best_epoch
        result.metrics_valid_p1 = select.metrics_valid_p1
        result.history = [{**h, "phase": "select"} for h in select.history] + result.history
        result.seconds += select.seconds
        return result
    return _fit(params, train_ds, test_ds, out_dir=out_dir, hooks=hooks, warm=warm,
                checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, texts=texts)


def with_labels(ds: Dataset, names: list[str]) -> Dataset:
    """`ds` in a label space that also holds `names` (those it lacks appended, without rows)."""
    own = label_names_of(ds)
    known = set(own)
    extra = [n for n in names if n not in known]
    if not extra:
        return ds if ds.label_names is not None else replace(ds, label_names=own)
    width = len(own) + len(extra)
    y = sp.csr_matrix(ds.Y)
    Y = sp.csr_matrix((y.data, y.indices, y.indptr), shape=(ds.n_rows, width))
    return replace(ds, Y=Y, n_labels=width, label_names=own + extra)


def _attach_tower(model: XCModel, featurizer: Any, names: list[str], texts: dict[str, str],
                  counts: np.ndarray, params: TrainParams, warm: WarmStart | None) -> LabelTower:
    """Give `model` its label tower. Labels with a text and no rows start with no free part; a base's
    labels keep their served rows: their free part is the base's row less the tower's."""
    rows = TextRows.from_csr(featurizer.transform_texts([texts.get(n, "") for n in names], "<label texts>"))
    text_only = rows.has_text.numpy() & (np.asarray(counts) <= 0)
    gain = params.label_tower_gain
    tower = LabelTower(rows, gain, text_only, model.shape.dim,
                       weight=fade_weights(counts, params.label_tower_fade),
                       detach=params.label_tower_detach, apart=params.label_tower_mode == "apart",
                       every=params.label_tower_every, zero_bias=params.label_tower_zero_bias,
                       live=params.label_tower_live, zero_scale=params.label_tower_zero_scale)
    if warm is not None and has_label_tower(warm.base.path):  # the base's tower, as it was trained
        with torch.no_grad():
            tower.gain.fill_(load_tower_gain(warm.base.path))
            tower.proj.copy_(load_tower_tensors(warm.base.path)["proj"])
    tower = tower.to(model.head.device)
    d = model.shape.dim
    with torch.no_grad():
        if warm is not None:
            k0 = warm.n_base_labels
            model.head[:k0, :d] -= tower.all_rows(model)[:k0].to(model.head.dtype)
        only = torch.from_numpy(text_only).to(model.head.device)
        model.head[only] = 0.0
    model.tower = tower
    return tower


@contextlib.contextmanager
def served(model: XCModel, counts: np.ndarray, logit_adjust: float,
           lo: int) -> Iterator[tuple[float, float] | None]:
    """Within the block `model` scores as it is saved and served: its label tower's rows materialized and its
    biases logit-adjusted (`trainer.logit_adjust`); what it learns, after. Yields the tower's scale."""
    with materialized(model, counts) as scale, adjusted(model, counts, logit_adjust, lo):
        yield scale


def _fit(
    params: TrainParams,
    train_ds: Dataset,
    test_ds: Dataset | None,
    *,
    out_dir: str | Path | None,
    hooks: TrainHooks,
    checkpoint_dir: str | Path | None,
    checkpoint_every: int,
    artifact_params: TrainParams | None = None,
    extra_summary: dict[str, float] | None = None,
    warm: WarmStart | None = None,
    texts: dict[str, str] | None = None,
) -> TrainResult:
    """One training run (the body of `train`); the artifact records `artifact_params` when given."""
    tune_malloc()
    t_start = time.perf_counter()
    device = resolve_device(params.device)
    group = join_group(device)
    device = rank_device(device, group)
    check_shardable(params.loss, group.world)
    if not group.is_main:
        hooks = _Muted(hooks)
    torch.manual_seed(params.seed)  # the dense layers' init: the same on every rank
    spec = get_loss(params.loss)
    if train_ds.n_labels == 0:
        raise ParamsError(f"{train_ds.path or 'the training set'}: no labels (L=0), nothing to learn")
    # before anything label- or feature-sized is allocated: a header's L or D may be far past what fits
    # (a warm start checked the grown model before making its label names)
    if warm is None:
        check_fits(train_ds, params, device, ranks=group.world, extra_heads=len(spec.extra_heads))

    valid_ds: Dataset | None = None
    if params.valid_fraction > 0:
        fit_rows, valid_rows = split_validation(train_ds.n_rows, params.valid_fraction, params.seed)
        valid_ds = train_ds.take(valid_rows)
        train_ds = train_ds.take(fit_rows)
    if warm is not None:
        featurizer = warm.featurizer_for(train_ds)  # the fit rows' words: before replay rows join them
        train_ds = warm.training_rows(train_ds)
        x_train = featurizer.transform(train_ds)
        if warm.forgets():
            hooks.on_log(f"warning: no training or replay row is one {warm.name} trained on: none of its "
                         "rows is replayed, so labels learned from them will be forgotten (give the base's "
                         "training rows with --replay-data; over the API, base.replay_dataset)")
    else:
        featurizer, x_train = fit_featurizer(params, train_ds)
    x = _as_csr32(x_train)
    y = _as_csr32(train_ds.Y)
    n, k = x.shape[0], train_ds.n_labels
    if n == 0:
        raise ParamsError("the training set has no rows")
    given = params  # what the artifact records: a `batch_size` 0 stays the rule, for a continual run's epoch
    n_epoch = n if warm is None else warm.epoch_size(params.replay)  # rows trained on per epoch
    xt = yt = None
    if test_ds is not None:  # in the training label space (train() checked it), plus its unseen labels
        xt, yt = _as_csr32(featurizer.transform(test_ds)), _as_csr32(test_ds.Y)
    xv = yv = None
    if valid_ds is not None:
        xv, yv = _as_csr32(featurizer.transform(valid_ds)), _as_csr32(valid_ds.Y)
    # over the test set's labels too: one the model lacks is scored as a label without training rows
    prop = train_propensities(y, None if yt is None else yt.shape[1])
    label_names = train_ds.label_names or [str(i) for i in range(k)]

    shape = ModelShape(
        n_features=int(featurizer.n_features),
        n_labels=k,
        dim=params.dim,
        encoder=params.encoder,
        hidden=params.hidden,
        pieces=params.pieces,
        dropout=params.dropout,
        extra_heads=spec.extra_heads,
    )
    shard = shard_bounds(k, group.world, group.rank)
    # a warm start overwrites the big tables, so only its new rows are drawn (init_model)
    model = XCModel(
        shape,
        init_scale=params.init_scale,
        seed=params.seed,
        init=warm is None,
        label_rows=(shard.lo, shard.hi),
    )
    model = model.to(device)
    new_labels = None
    if warm is not None:
        warm.init_model(model, x, y, params.new_label_init, params.seed, lo=shard.lo)
        new_labels = warm.new_labels
    model.train()
    if group.world > 1:
        torch.manual_seed(params.seed + group.rank)  # dropout: each rank masks its own rows
    all_counts = label_counts(y)
    counts = all_counts[shard.lo : shard.hi]
    # every row the model has trained on, a base's included: a label of none has no free part to learn
    model_counts = all_counts if warm is None else warm.artifact_stats(y)[0]
    tower = None
    split_twins: dict[str, list[list[int]]] = {}  # the test and validation rows' twins, when excluded
    if texts is not None:
        tower = _attach_tower(model, featurizer, label_names, texts, model_counts, params, warm)
        if train_ds.texts is not None:
            index = twin_index(label_names, texts)
            tower.twins = count_twins(train_ds.texts, index, y)
            if tower.twins.excluded:
                split_twins = {name: twins_of(index, part.texts)
                               for name, part in (("test", test_ds), ("valid", valid_ds))
                               if part is not None and part.texts is not None}
            if tower.twins.rows:
                hooks.on_log(f"{tower.twins.rows:,} training rows have a label whose text is their own (a "
                             f"twin), {tower.twins.labelled:,} of them as one of their labels: an input's "
                             f"twins are {'left out of' if tower.twins.excluded else 'kept in'} its answers")
    shift = params.logit_shift(label_texts=tower is not None)  # what the saved biases carry
    x_fit, y_fit = x, y  # what the epochs draw from
    if tower is not None and warm is None and params.label_text_rows:
        x_fit, y_fit = with_text_rows(x, y, tower)
        n_epoch = x_fit.shape[0]
    params = params.model_copy(update={"batch_size": params.batch_for(n_epoch)})
    # rank 0 keeps the stream of a one-process run; other ranks draw their own
    seed = params.seed + 1 + 7919 * group.rank
    # a continual run oversamples its new labels with rows as negatives
    focus, share = None, 0.0
    if warm is not None:
        focus, share = warm.learning(counts, shard.lo), params.new_label_negatives
        if group.world > 1:
            share = _shard_focus_share(share, focus, int(warm.learning(all_counts).sum()), shard)
    sampler: Any = NegativeSampler(shard.size, params.sampler, params.alpha, counts, seed=seed, focus=focus,
                                   focus_share=share)
    if tower is not None and tower.text_only.any():  # text-only labels are never sampled as negatives
        keep = np.flatnonzero(~tower.text_only)
        sampler = SubsetSampler(NegativeSampler(
            keep.size, params.sampler, params.alpha, counts[keep], seed=seed,
            focus=None if focus is None else focus[keep], focus_share=share), keep)
    stepper = Stepper(model, spec, params, sampler, group, shard)
    if params.hard_negatives > 0:
        if tower is not None:
            raise ParamsError("hard_negatives does not train with label texts yet; set hard_negatives 0")
        stepper.hard = HardNegatives(k, params.hard_negatives, params.hard_every, params.seed,
                                     negatives=params.negatives)
    if focus is not None:
        stepper.head_lr = WarmStart.label_lr(focus, params.new_label_lr, device)

    bs = params.batch_size
    ahead = steps_made_ahead(device, group)
    lr_scale = 1.0 if warm is None else params.continual_lr
    steps_per_epoch = math.ceil(n_epoch / bs)
    total = steps_per_epoch * params.epochs
    stepper.input_scale = input_lr_scale(params, total, int(np.count_nonzero(model_counts)))
    step, start_epoch, start_pos = 0, 0, 0
    resumed: int | None = None
    ckpt_path = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if ckpt_path is not None:
        meta = load_checkpoint(ckpt_path, stepper)
        if meta is not None:
            step, start_epoch, start_pos = int(meta["step"]), int(meta["epoch"]), int(meta["pos"])
            resumed = step
            hooks.on_log(f"resumed from step {step}")
    hooks.on_log(
        f"training {params.loss} on {n_epoch} rows per epoch, {shape.n_features} features, {k} labels; "
        f"d={params.dim}, {total} steps (batch {bs}) on {device}"
        + (f", the input table at {stepper.input_scale:.3g}x the lr" if stepper.input_scale != 1.0 else "")
        + (f", {group.world} ranks of {shard.size} labels each" if group.world > 1 else "")
    )

    bar = _progress_bar(total, step) if group.is_main else None
    history: list[dict[str, Any]] = []
    last_metrics: dict[str, float] = {}
    losses = StepLosses(eager=device.type == "cpu")
    train_time = 0.0
    examples = 0
    last_report = 0.0
    epochs_run = start_epoch
    best = stepper.best
    last_epoch = params.stop_epoch or params.epochs  # the schedule stays that of params.epochs
    try:
        for epoch in range(start_epoch, last_epoch):
            if xv is not None and params.patience > 0 and best.epoch > 0 and best.stale >= params.patience:
                break  # resumed after the patience ran out
            perm = (np.random.default_rng([params.seed, epoch]).permutation(n_epoch) if warm is None
                    else warm.epoch_rows(params.seed, epoch, params.replay))
            weights = None if warm is None else warm.epoch_weights(perm, params.replay)
            ep = EpochData(x_fit, y_fit, perm, weights, epoch=epoch)
            t_epoch = time.perf_counter()
            epoch_examples = 0
            losses.new_epoch()
            pos0 = start_pos if epoch == start_epoch else 0
            # mined from the trained head: a continual run's at once, a fresh run's after its first epoch
            first_mining = 0 if warm is not None else 1
            if stepper.hard is not None and pos0 == 0 and stepper.hard.due(epoch, first_mining):
                stepper.hard.refresh(model.head, model_counts)
            if tower is not None and pos0 == 0:
                tower.refresh(model)

            def rows(pos: int) -> tuple[int, int]:
                return pos * bs, min(n_epoch, (pos + 1) * bs)

            def inputs_at(pos: int, ep: EpochData = ep) -> StepInputs:
                return stepper.inputs(ep, *rows(pos))

            with made_ahead(inputs_at, range(pos0, steps_per_epoch), stepper.sampler.get_state,
                            threaded=ahead) as made_steps:
                for made in made_steps:
                    if hooks.should_stop():
                        raise TrainingCancelled(f"training stopped at step {step}")
                    i, j = rows(made.pos)
                    lr = lr_at(params, step, total) * lr_scale
                    loss = (stepper.step(ep, i, j, lr) if made.inputs is None
                            else stepper.learn(made.inputs, lr))
                    losses.add(step, loss, j - i)
                    step += 1
                    epoch_examples += j - i
                    if bar is not None:
                        bar.update(1)
                    now = time.perf_counter()
                    # the epoch's last step is reported once, by the epoch's own report after the loop
                    if now - last_report > PROGRESS_EVERY_S and made.pos + 1 < steps_per_epoch:
                        last_report = now
                        loss_ema = losses.read()
                        rate = epoch_examples / max(time.perf_counter() - t_epoch, 1e-9)
                        if bar is not None:
                            bar.set_postfix(loss=f"{loss_ema:.4f}", epoch=epoch + 1)
                        hooks.on_progress(Progress(epoch + 1, params.epochs, step, total, rate, loss_ema))
                    if ckpt_path is not None and checkpoint_every > 0 and step % checkpoint_every == 0:
                        save_checkpoint(ckpt_path, stepper, step, epoch, made.pos + 1,
                                        {"loss": losses.read()}, sampler_state=made.sampler_state)
            losses.read()  # on a GPU: waits for the epoch's last step
            dt = time.perf_counter() - t_epoch
            train_time += dt
            examples += epoch_examples
            rate = epoch_examples / max(dt, 1e-9)
            mean_loss = losses.total / max(epoch_examples, 1)
            record: dict[str, Any] = {"epoch": epoch + 1, "loss": mean_loss, "examples_per_s": rate}
            evaluated = None
            is_last = epoch + 1 == last_epoch
            due = params.eval_every > 0 and (epoch + 1) % params.eval_every == 0
            if xt is not None and yt is not None and (due or is_last):
                with served(model, model_counts, shift, shard.lo):
                    evaluated = evaluate_model(model, xt, yt, prop, shard, group, new_labels,
                                               split_twins.get("test"))
                last_metrics = evaluated
                record["metrics"] = evaluated
            if xv is not None and yv is not None:
                with served(model, model_counts, shift, shard.lo):
                    valid = evaluate_model(model, xv, yv, None, shard, group,
                                           exclude=split_twins.get("valid"))
                record["valid"] = valid
                best.update(epoch + 1, valid["p@1"], model)
            history.append(record)
            epochs_run = epoch + 1
            msg = f"epoch {epoch + 1}/{params.epochs} loss {mean_loss:.4f} {rate:,.0f} examples/s"
            if "valid" in record:
                msg += f" valid p@1 {record['valid']['p@1']:.4f} (best: epoch {best.epoch})"
            if evaluated:
                msg += " " + " ".join(f"{key} {evaluated[key]:.4f}" for key in ("p@1", "p@3", "p@5"))
            hooks.on_log(msg)
            hooks.on_progress(Progress(epoch + 1, params.epochs, step, total, rate, mean_loss, evaluated))
            if xv is not None and params.patience > 0 and best.stale >= params.patience:
                hooks.on_log(f"early stop: no better validation p@1 for {best.stale} epochs")
                break
    finally:
        if bar is not None:
            bar.close()

    best_epoch: int | None = None
    if xv is not None and best.epoch > 0:
        best_epoch = best.epoch
        if best.epoch != epochs_run or not history or "metrics" not in history[-1]:
            best.restore(model)
            if xt is not None and yt is not None:
                with served(model, model_counts, shift, shard.lo):
                    last_metrics = evaluate_model(model, xt, yt, prop, shard, group, new_labels,
                                                  split_twins.get("test"))
        hooks.on_log(f"kept the weights of epoch {best.epoch} (valid p@1 {best.score:.4f})")
    seconds = time.perf_counter() - t_start
    overall_rate = examples / max(train_time, 1e-9)
    final_loss = history[-1]["loss"] if history else losses.read()
    summary = dict(last_metrics)
    if best_epoch is not None:
        summary.update({"best_epoch": float(best_epoch), "valid_p@1": float(best.score)})
    summary.update(extra_summary or {})
    summary.update(
        {
            "train_loss": float(final_loss),
            "examples_per_s": float(overall_rate),
            "train_seconds": float(seconds),
            "steps": float(step),
            "batch_size": float(bs),
        }
    )
    out_path: Path | None = None
    if out_dir is not None:
        counts, n_rows, hashes = (label_counts(y), n, row_fingerprints(train_ds)) if warm is None \
            else warm.artifact_stats(y)
        with served(model, model_counts, shift, shard.lo) as scale:
            extra = None if tower is None or texts is None or scale is None else \
                functools.partial(save_tower, tower=tower, scale=scale, names=label_names, texts=texts)
            out_path = _save_model(
                Path(out_dir), stepper, featurizer, label_names, artifact_params or given, summary,
                counts, n_rows, hashes, extra,
            )
        hooks.on_log(f"model written to {out_path}")
    return TrainResult(
        out_dir=out_path,
        metrics=last_metrics,
        steps=step,
        epochs=epochs_run,
        seconds=seconds,
        examples_per_s=overall_rate,
        final_loss=float(final_loss),
        resumed_from_step=resumed,
        history=history,
        best_epoch=best_epoch,
        metrics_valid_p1=float(best.score) if best_epoch is not None else None,
    )


def _shard_focus_share(share: float, focus: np.ndarray, n_focus: int, shard: LabelShard) -> float:
    """The focus share of one shard's negatives that gives its focus labels the draws one process would:
    `share` of all M draws go to the `n_focus` focus labels, this shard's `focus.sum()` of them get their
    part, and the shard draws about M·size/K negatives in all."""
    if n_focus == 0:
        return 0.0
    return min(1.0, share * int(focus.sum()) / n_focus * shard.n_labels / shard.size)


def _save_model(
    out: Path,
    stepper: Stepper,
    featurizer: Any,
    label_names: list[str],
    params: TrainParams,
    summary: dict[str, float],
    counts: np.ndarray,
    n_rows: int,
    row_hashes: np.ndarray | None,
    extra_files: Callable[[Path], None] | None = None,
) -> Path:
    """The artifact, in one format whatever the number of ranks; with several, every rank writes its
    label rows into the one weights file (`trainer.merged_weights`) and rank 0 writes the rest."""
    from trainer.artifact import artifact_tensors, save_artifact
    from trainer.merged_weights import write_merged_weights

    group, shard, model = stepper.group, stepper.shard, stepper.model
    if group.world == 1:
        return save_artifact(out, model, featurizer, label_names, params, summary,
                             label_counts=counts, n_train_rows=n_rows, row_hashes=row_hashes,
                             extra_files=extra_files)
    if group.is_main:
        def write(file: Path, tensors: dict[str, torch.Tensor]) -> dict[str, list[int]]:
            return write_merged_weights(file, tensors, shard, group)

        path = save_artifact(out, model, featurizer, label_names, params, summary,
                             label_counts=counts, n_train_rows=n_rows, row_hashes=row_hashes,
                             write_weights=write)
    else:
        write_merged_weights(None, artifact_tensors(model, counts, str(out), row_hashes), shard, group)
        path = out
    group.barrier()  # every rank returns once the model directory is in place
    return path


def _progress_bar(total: int, initial: int) -> Any:
    """A tqdm bar on stderr only when it is a terminal (logs stay clean in jobs and CI)."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", file=sys.stderr, dynamic_ncols=True)
