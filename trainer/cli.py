"""`ovex train | evaluate | predict | synth`: thin argparse wrappers over trainer functions.

Training flags are generated from `TrainParams`, so the CLI, API jobs and artifacts share one set of
names and defaults. Each command returns an exit code; `service.cli.main` turns `OvexError` into
`error: ...` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from pydantic import ValidationError

from trainer.data import label_name_problem, undecodable_line
from trainer.errors import DataFormatError, ParamsError
from trainer.params import GROUPS, TrainParams, given_params, group_of, validation_message


def _field_type(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return str, list(typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _field_type(args[0])
    return annotation, None


def add_train_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainParams field (default None = keep the TrainParams default)."""
    from trainer.losses import LOSSES, load_plugins

    load_plugins()
    sections = {g: parser.add_argument_group(f"{g.replace('_', ' ')}: {what}") for g, what in GROUPS.items()}
    for name, info in TrainParams.model_fields.items():
        group = sections[group_of(info)]
        flag = "--" + name.replace("_", "-")
        typ, choices = _field_type(info.annotation)
        if name == "loss":  # a free string in TrainParams (plug-ins may add losses): list what is there
            choices = sorted(LOSSES)
        helptext = f"{info.description or name} (default: {info.default})"
        if typ is bool:
            group.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=helptext
            )
        else:
            group.add_argument(flag, dest=name, type=typ, choices=choices, default=None, help=helptext)


def params_from_args(args: argparse.Namespace, base: bool = False) -> TrainParams:
    """The flags given, as TrainParams. With a base model (`base`) the checks between fields (sampler and
    group_size, stop_epoch and epochs) wait for the base's parameters: the other side comes from it, so
    `trainer.continual.continual_params` checks them on the merged set."""
    given = {n: getattr(args, n) for n in TrainParams.model_fields if getattr(args, n, None) is not None}
    try:
        return given_params(given, continuing=base)
    except ValidationError as exc:  # name the flag
        raise ParamsError(f"invalid flags: {validation_message(exc, flags=True)}") from None


class _CliHooks:
    """Training messages to stderr (the progress bar, when there is one, is drawn by train())."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def on_progress(self, progress: Any) -> None:
        pass

    def on_log(self, message: str) -> None:
        if not self.quiet:
            print(message, file=sys.stderr, flush=True)

    def should_stop(self) -> bool:
        return False


# ------------------------------------------------------------------------------------ commands


def cmd_train(args: argparse.Namespace) -> int:
    from trainer.data import read_dataset
    from trainer.train import train

    for flag, value in (("--out", args.out), ("--init-from", args.init_from),
                        ("--checkpoint-dir", args.checkpoint_dir)):
        if value is not None and not value.strip():  # a blank path names the working directory
            raise ParamsError(f"{flag} is empty: give a directory")
    params = params_from_args(args, base=args.init_from is not None)
    if args.replay_data and not args.init_from:
        raise ParamsError("--replay-data needs --init-from (it holds rows the base model trained on)")
    train_ds = read_dataset(args.train)
    if args.label_names:
        train_ds = with_label_names(train_ds, args.label_names)
    # test labels are matched by name inside train(), against the grown label set when there is a base
    test_ds = read_dataset(args.test) if args.test else None
    replay_ds = read_dataset(args.replay_data) if args.replay_data else None
    if args.label_names:  # XC test and replay files share the training file's label ids, so its names
        test_ds = _named_like(test_ds, train_ds, args.label_names)
        replay_ds = _named_like(replay_ds, train_ds, args.label_names)
    label_texts = None
    if args.label_texts:
        from trainer.label_texts import read_label_texts

        label_texts = read_label_texts(args.label_texts)
    result = train(
        params,
        train_ds,
        test_ds,
        out_dir=args.out,
        hooks=_CliHooks(args.quiet),
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        base=args.init_from,
        replay_ds=replay_ds,
        label_texts=label_texts,
    )
    if result.metrics and os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0 answers
        print(json.dumps(result.metrics))
    return 0


def with_label_names(ds: Any, path: str) -> Any:
    """Name the labels of an XC data set from a file with one name per line (line i names label i-1),
    so the model answers names instead of ids."""
    if ds.is_text:
        raise ParamsError("--label-names is for XC data; JSONL rows already name their labels")
    try:
        with open(path, encoding="utf-8") as fh:
            names = [line.rstrip("\r\n") for line in fh]
    except OSError as exc:
        raise ParamsError(f"--label-names: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise DataFormatError(path, undecodable_line(path, 1), f"not UTF-8 text: {exc.reason}") from None
    while names and not names[-1].strip():
        names.pop()
    if len(names) != ds.n_labels:
        raise DataFormatError(path, len(names), f"{len(names)} names for {ds.n_labels} labels (one a line)")
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        problem = label_name_problem(name)
        if problem:
            raise DataFormatError(path, i + 1, problem)
        if name in seen:
            raise DataFormatError(path, i + 1, f"label name {name!r} repeats line {seen[name] + 1}")
        seen[name] = i
    return replace(ds, label_names=names)


def _named_like(ds: Any, train_ds: Any, path: str) -> Any:
    """An XC file named by the training file's `--label-names` (label i of both is the same label)."""
    if ds is None or ds.is_text:
        return ds  # JSONL names its own labels (and cannot go with --label-names training data anyway)
    names = train_ds.label_names
    if ds.n_labels > len(names):
        raise DataFormatError(ds.path, 1, f"declares L={ds.n_labels} labels but --label-names {path} names "
                              f"{len(names)}")
    return replace(ds, label_names=names[: ds.n_labels])


def _features_for(model: Any, path: str, labels: bool = True) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Read a data file and featurize it the way the model was trained, its labels (`labels`) in the
    model's ids: a JSONL label the model lacks gets a column after them (it counts as a miss), with a
    warning on stderr; XC ids must be the model's. Without `labels` they are not looked at."""
    from trainer.data import in_label_space, read_dataset, unseen_labels_note

    ds = read_dataset(path)
    x = sp.csr_matrix(model.featurizer.transform(ds), dtype=np.float32)
    if not labels:
        return x, sp.csr_matrix((x.shape[0], 0), dtype=np.float32)
    if ds.is_text:
        ds = in_label_space(ds, model.label_names)
        note = unseen_labels_note(ds, "the data")
        if note:
            print(note, file=sys.stderr)
    elif ds.n_labels > model.n_labels:
        raise DataFormatError(path, 1, f"L={ds.n_labels} labels but the model has {model.n_labels}")
    y = sp.csr_matrix(ds.Y, dtype=np.float32)
    if y.shape[1] < model.n_labels:
        y = sp.csr_matrix((y.data, y.indices, y.indptr), shape=(y.shape[0], model.n_labels))
    return x, y


def cmd_evaluate(args: argparse.Namespace) -> int:
    from trainer.artifact import load_artifact
    from trainer.metrics import evaluate_topk

    model = load_artifact(args.model_dir)
    x, y = _features_for(model, args.data)
    top, _ = model.topk(x, 5)
    print(json.dumps(evaluate_topk(top, y, model.propensities(n_labels=y.shape[1]))))
    return 0


def _prediction_lines(
    model: Any, x: sp.csr_matrix, top_k: int, normalization: str | None
) -> Iterator[str]:
    """One JSON object per row: label ids, scores and names best first (+ probs/exact when normalised)."""
    names = model.label_names
    chunk = 4096
    for start in range(0, x.shape[0], chunk):
        xs = x[start : start + chunk]
        dist = None
        if normalization:  # probs over the k returned labels + exactness flag (trainer.normalize)
            from trainer.normalize import predict_topk

            ids, scores, dist = predict_topk(model, xs, top_k, normalization)
        else:
            ids, scores = model.topk(xs, top_k)
        for i, (row_ids, row_scores) in enumerate(zip(ids.tolist(), scores.tolist(), strict=True)):
            rec: dict[str, Any] = {"labels": row_ids, "scores": row_scores}
            rec["names"] = [names[j] for j in row_ids]
            if dist is not None:
                rec.update(probs=dist.probs[i].tolist(), exact=bool(dist.exact[i]))
            yield json.dumps(rec, ensure_ascii=False) + "\n"


def cmd_predict(args: argparse.Namespace) -> int:
    from trainer.artifact import load_artifact

    if args.top_k < 1:
        raise ParamsError("--top-k must be >= 1")
    model = load_artifact(args.model_dir)
    x, _ = _features_for(model, args.data, labels=False)
    lines = _prediction_lines(model, x, args.top_k, args.normalization)
    if args.out in (None, "-"):
        for line in lines:
            sys.stdout.write(line)
        sys.stdout.flush()
        return 0
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")  # a reader never sees half a file
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(lines)
    tmp.replace(out)
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    from trainer.synth import write_label_texts, write_synth

    try:
        write_synth(
            args.out,
            args.labels,
            args.features,
            args.rows,
            seed=args.seed,
            test_path=args.test_out,
            test_rows=args.test_rows if args.test_out else 0,
            fmt=args.format,
        )
        if args.label_texts:
            write_label_texts(args.label_texts, args.labels, args.features, seed=args.seed)
    except ValueError as exc:
        raise ParamsError(str(exc)) from None
    return 0


def add_commands(subparsers: Any) -> None:
    """Register train, evaluate, predict and synth on an argparse subparsers object."""
    p = subparsers.add_parser("train", help="train a model and write its artifact directory")
    p.add_argument("--train", required=True, help="training data (XC format or JSONL)")
    p.add_argument("--test", help="test data, evaluated every epoch")
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument(
        "--init-from",
        metavar="MODEL_DIR",
        help="continue this model: its featurizer, encoder and head; labels matched by name, new ones "
        "appended; flags not given come from it (epochs: --continual-epochs)",
    )
    p.add_argument(
        "--replay-data",
        metavar="FILE",
        help="with --init-from: rows the base trained on, replayed against forgetting (e.g. its training "
        "set; --replay sets how many per epoch)",
    )
    p.add_argument("--checkpoint-dir", help="save checkpoints here and resume from the latest one")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0 = never)")
    p.add_argument("--quiet", action="store_true", help="no log messages on stderr")
    p.add_argument(
        "--label-names",
        metavar="FILE",
        help="XC data: label names, one a line (line i names label i-1), served instead of ids",
    )
    p.add_argument(
        "--label-texts",
        metavar="FILE",
        help="JSONL of {\"name\": ..., \"text\": ...}: every named label joins the label space (rows or not) "
        "and its row is learned from its text as well as its rows (text training sets)",
    )
    add_train_flags(p)
    p.set_defaults(func=cmd_train)

    p = subparsers.add_parser("evaluate", help="print P@k, nDCG@k, PSP@k of a model on a data file as JSON")
    p.add_argument("model_dir", help="a model directory written by `ovex train` (models/<name>/<version>)")
    p.add_argument("data", help="labelled data in the model's format (XC or JSONL)")
    p.set_defaults(func=cmd_evaluate)

    p = subparsers.add_parser(
        "predict",
        help="the top-k labels of each row as JSON lines on stdout",
        description='one JSON line per input row: {"labels": [ids], "scores": [...], "names": [...]}, '
        "best first",
    )
    p.add_argument("model_dir", help="a model directory written by `ovex train` (models/<name>/<version>)")
    p.add_argument("data", help="rows to label, in the model's format (XC or JSONL; labels are ignored)")
    p.add_argument("--top-k", type=int, default=5, help="labels per row (default: 5)")
    p.add_argument(
        "--normalization",
        choices=["sparsemax", "evsoftmax", "softmax"],
        help='add "probs" (distribution over the k returned labels) and "exact" (equals the map over all K)',
    )
    p.add_argument("--out", default=None, help="write to this .jsonl file instead of stdout (atomically)")
    p.set_defaults(func=cmd_predict)

    p = subparsers.add_parser("synth", help="generate XC-format (or JSONL text) data with planted structure")
    p.add_argument("--labels", type=int, required=True, help="number of labels L")
    p.add_argument("--features", type=int, required=True, help="number of features D")
    p.add_argument("--rows", type=int, required=True, help="number of training rows N")
    p.add_argument("--out", required=True, help="data file to write")
    p.add_argument("--format", choices=["xc", "jsonl"], default="xc",
                   help="xc (default), or jsonl: text rows, feature f as the word w<f> repeated by its count")
    p.add_argument("--label-texts", metavar="OUT",
                   help="also write each label's text (its planted prototype words) as JSONL {name, text}")
    p.add_argument("--seed", type=int, default=0, help="same seed, same data (default: 0)")
    p.add_argument("--test-out", help="also write a test split from the same planted structure")
    p.add_argument("--test-rows", type=int, default=1000, help="rows in the test split (default: 1000)")
    p.set_defaults(func=cmd_synth)
