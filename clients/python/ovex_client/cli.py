"""`ovex-client`: the terminal front of the SDK (predict, train with a progress bar, jobs, models, datasets).

Exit codes: 0 success, 1 the server refused or the job did not succeed (or had ended before a cancel),
2 bad usage, input file or trainer option, 3 the server could not be reached, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import httpx

from . import _api
from .client import Client
from .errors import APIError, Conflict, OvexClientError, RequestTimeout, TransportError
from .models import (
    DatasetInfo,
    Job,
    JobEvent,
    JobProgress,
    LabelScore,
    ModelInfo,
    ModelVersion,
    PredictResponse,
    input_to_wire,
)
from .params_schema import param_errors, train_params_schema


class UsageError(Exception):
    """A bad flag or input file: reported as `path:line: message`, exit code 2."""


# -- parsing --------------------------------------------------------------------------------------


def _connection_flags(p: argparse.ArgumentParser, defaults: bool) -> None:
    """The flags every command takes; accepted before or after the command name."""

    def d(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    p.add_argument("--url", default=d(None), help="server URL (default: $OVEX_URL or http://127.0.0.1:8000)")
    p.add_argument("--api-key", default=d(None), help="API key (default: $OVEX_API_KEY)")
    p.add_argument("--timeout", type=float, default=d(30.0), help="seconds per request (default 30)")
    p.add_argument("--json", action="store_true", default=d(False), help="print raw JSON answers")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ovex-client", description="Talk to an ovex server.")
    _connection_flags(p, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _connection_flags(common, defaults=False)
    sub = p.add_subparsers(dest="command", required=True)

    def add(group: Any, name: str, **kw: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = group.add_parser(name, parents=[common], **kw)
        return parser

    pr = add(sub, "predict", help="top labels for a text, or for every row of a JSONL file")
    pr.add_argument("text", nargs="*", help="input text(s); each is one input")
    pr.add_argument("--file", type=Path, help='JSONL file, one {"text": ...} or {"features": {...}} per line')
    pr.add_argument("--model", help="model name (default: the active default model)")
    pr.add_argument("--top-k", type=int, default=None)
    pr.add_argument("--normalization", choices=["sparsemax", "evsoftmax", "softmax", "none"], default=None)
    pr.add_argument("--exact", action="store_true", help="score every label instead of the index")
    pr.add_argument("--batch-size", type=int, default=64, help="rows per request with --file (default 64)")
    pr.add_argument("--out", type=Path, help="write JSONL answers here instead of stdout (with --file)")
    pr.add_argument("--explain", action="store_true",
                    help="show under each label the input words (or feature ids) adding most to its score")

    tr = add(sub, "train", help="upload a dataset, submit a training job, optionally follow it")
    tr.add_argument("--dataset", required=True, help="training file (XC format or JSONL), or an uploaded id")
    tr.add_argument("--test-dataset", help="test file or uploaded id (metrics each epoch)")
    tr.add_argument("--model", required=True, help="name of the model to train a new version of")
    tr.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                    help="trainer option, e.g. --param epochs=3 --param dim=64 (repeatable)")
    tr.add_argument("--params", default=None, help="trainer options as one JSON object")
    tr.add_argument("--activate", action="store_true", help="serve the new version as soon as it is trained")
    tr.add_argument("--follow", action="store_true", help="show a progress bar until the job finishes")
    tr.add_argument("--base", nargs="?", const="", default=None, metavar="VERSION",
                    help="continue a stored version (default: the active one) instead of training from "
                    "scratch: labels keep their ids, new ones are appended (like `ovex train --init-from`)")
    tr.add_argument("--base-model", help="with --base: a version of this model (default: --model)")
    tr.add_argument("--replay-dataset", help="with --base: rows the base trained on, replayed against "
                    "forgetting (file or uploaded id; default: the dataset that trained the base)")

    jobs = add(sub, "jobs", help="list, show, cancel, follow, delete training jobs or read their logs")
    jsub = jobs.add_subparsers(dest="action", required=True)
    jl = add(jsub, "list", help="every job (all pages), newest first")
    jl.add_argument("--state", default=None)
    jl.add_argument("--model", default=None)
    for name in ("show", "cancel", "logs", "watch", "delete"):
        add(jsub, name).add_argument("job_id")

    models = add(sub, "models", help="list, show, activate, deactivate or delete models; the default model")
    msub = models.add_subparsers(dest="action", required=True)
    add(msub, "list", help="every model: its active version and newest versions")
    add(msub, "show", help="one model and its versions (created, lineage, metrics)").add_argument("name")
    mv = add(msub, "activate", help="serve one version (hot swap)")
    mv.add_argument("name")
    mv.add_argument("version")
    md = add(msub, "delete", help="delete a model with every version, or only VERSION")
    md.add_argument("name")
    md.add_argument("version", nargs="?", default=None, help="only this version (not the active one)")
    md.add_argument("--force", action="store_true",
                    help="cancel the queued and running jobs that use the model instead of refusing")
    add(msub, "deactivate", help="stop serving a model; its versions stay").add_argument("name")
    mdef = add(msub, "default", help="show the model behind predict without --model, or set it")
    mdef.add_argument("name", nargs="?", default=None, help="make this model the default")
    mdef.add_argument("--clear", action="store_true", help="back to the automatic choice")

    lab = add(sub, "labels", help="add labels by their texts to a model trained with label texts")
    lsub = lab.add_subparsers(dest="action", required=True)
    la = add(lsub, "add", help="write the model's next version with these labels appended")
    la.add_argument("model", help="the model (trained with label texts)")
    la.add_argument("--file", type=Path, required=True,
                    help='JSONL file, one {"name": ..., "text": ...} per line')
    la.add_argument("--activate", action="store_true", help="serve the new version at once")
    la.add_argument("--base-version", help="the version to extend (default: the active one)")

    ds = add(sub, "datasets", help="upload, list, show or delete datasets")
    dsub = ds.add_subparsers(dest="action", required=True)
    up = add(dsub, "upload")
    up.add_argument("file", type=Path)
    up.add_argument("--kind", choices=["data", "label_texts"], default=None,
                    help="what the file is (default: told by the server from its first line)")
    add(dsub, "list", help="every dataset (all pages), newest first")
    for name in ("show", "delete"):
        add(dsub, name).add_argument("dataset_id")

    add(sub, "health", help="liveness and readiness of the server")
    return p


def parse_params(pairs: Sequence[str], raw_json: str | None) -> dict[str, Any]:
    """`KEY=VALUE` flags (values read as JSON when they parse, else as strings) over an optional JSON."""
    params: dict[str, Any] = {}
    if raw_json:
        try:
            loaded = json.loads(raw_json)
        except ValueError as exc:
            raise UsageError(f"--params: not valid JSON: {exc}") from exc
        if not isinstance(loaded, dict):
            raise UsageError("--params: must be a JSON object")
        params.update(loaded)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--param {pair!r}: expected KEY=VALUE")
        try:
            params[key.strip()] = json.loads(value)
        except ValueError:
            params[key.strip()] = value
    return params


def check_params(client: Client, params: dict[str, Any]) -> None:
    """Refuse options the server's TrainParams schema rejects (unknown name, wrong type, out of bounds)
    before anything is uploaded; a server that publishes no schema leaves the checks to the job request."""
    if not params:
        return
    try:
        schema = train_params_schema(client.openapi())
    except APIError:
        return
    if schema is None:
        return
    errors = param_errors(params, schema)
    if errors:
        raise UsageError("trainer options refused, nothing uploaded: " + "; ".join(errors))


def read_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Inputs from a JSONL file, streamed; blank lines are skipped; a bad line is a `path:line:` error."""
    try:
        fh = path.open("rb")  # bytes, decoded line by line, so a bad byte is reported on its own line
    except OSError as exc:
        raise UsageError(f"{path}: cannot open: {exc.strerror}") from exc
    with fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise UsageError(f"{path}:{lineno}: not UTF-8 text ({exc.reason})") from exc
            if line.strip():
                yield _row(path, lineno, line)


def _row(path: Path, lineno: int, line: str) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
    if not isinstance(obj, dict):
        raise UsageError(f"{path}:{lineno}: expected a JSON object")
    row = {k: obj[k] for k in ("text", "features") if k in obj}
    try:
        return input_to_wire(row)
    except TypeError as exc:
        raise UsageError(f"{path}:{lineno}: needs a \"text\" or a \"features\" field") from exc


def chunks(rows: Iterator[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


# -- output ---------------------------------------------------------------------------------------


def table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """Columns padded to their widest cell (the first row is the header), two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def when(value: datetime | None) -> str:
    """A time in the local zone to the second, or '-'."""
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


def size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def dash(value: object) -> str:
    return "-" if value is None else str(value)


def metric_cells(metrics: dict[str, Any], keys: Sequence[str]) -> list[str]:
    return [f"{metrics[k]:.3f}" if isinstance(metrics.get(k), int | float) else "-" for k in keys]


def metric_keys(versions: Sequence[ModelVersion]) -> list[str]:
    """The test metrics to show: p@1 and p@5 where measured, else the first two @k ones (training figures
    such as examples_per_s are not test metrics)."""
    present = {k for v in versions for k, x in v.metrics.items() if isinstance(x, int | float) and "@" in k}
    preferred: list[str] = [k for k in ("p@1", "p@5") if k in present]
    return preferred or sorted(present)[:2]


def print_model(m: ModelInfo, versions: Sequence[ModelVersion], out: TextIO) -> None:
    flags = [f for f, on in (("default", m.default), ("deactivated", m.deactivated)) if on]
    out.write(f"model {m.name}" + (f" ({', '.join(flags)})" if flags else "") + "\n")
    out.write(f"active version {dash(m.active_version)}  labels {dash(m.n_labels)}  features "
              f"{dash(m.n_features)}  dim {dash(m.dim)}  retrieval {dash(m.retrieval)}  created "
              f"{when(m.created_at)}\n")
    if not versions:
        out.write("no versions\n")
        return
    keys = metric_keys(versions)
    rows = [["VERSION", "ACTIVE", "CREATED", "LABELS", "DIM", *(k.upper() for k in keys), "TEST SET",
             "JOB", "DATASET", "LINEAGE"]]
    for v in versions:
        rows.append([v.version, "*" if v.active else "", when(v.created_at), dash(v.n_labels), dash(v.dim),
                     *metric_cells(v.metrics, keys), dash(v.test_dataset), dash(v.job), dash(v.dataset),
                     f"refused: {v.error}" if v.error else dash(v.lineage)])
    table(rows, out)
    if m.n_versions is not None and m.n_versions > len(versions):
        out.write(f"(the newest {len(versions)} of {m.n_versions} versions)\n")


def print_datasets(datasets: Sequence[DatasetInfo], out: TextIO) -> None:
    if not datasets:
        out.write("no datasets\n")
        return
    rows = [["ID", "NAME", "FORMAT", "ROWS", "LABELS", "FEATURES", "SIZE", "CREATED"]]
    for d in datasets:
        rows.append([d.id, dash(d.name), dash(d.format), dash(d.rows), dash(d.labels), dash(d.features),
                     size(d.size_bytes), when(d.created_at)])
    table(rows, out)


def dump(obj: Any, out: TextIO) -> None:
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json")
    elif isinstance(obj, list):
        obj = [o.model_dump(mode="json") if hasattr(o, "model_dump") else o for o in obj]
    out.write(json.dumps(obj, indent=2) + "\n")


def print_prediction(resp: PredictResponse, texts: Sequence[str], out: TextIO) -> None:
    out.write(f"model {resp.model} version {resp.version}\n")
    for text, pred in zip(texts, resp.predictions, strict=False):
        exact = "" if pred.exact is None else (" (exact)" if pred.exact else " (approximate)")
        out.write(f"{text[:70]!r}{exact}\n")
        for lab in pred.labels:
            prob = "" if lab.prob is None else f"{lab.prob:8.4f}"
            name = lab.name if lab.name is not None else str(lab.id)
            mark = "  (from its text)" if lab.from_text else ""
            out.write(f"  {prob}  {lab.score:9.4f}  {name}{mark}\n")
            if lab.explanation is not None:
                print_explanation(lab, out)


def term(word: str | None, feature: int) -> str:
    """A contribution's name: the word, quoted when it is a word pair; `#id` for a feature column."""
    if word is None:
        return f"#{feature}"
    return json.dumps(word, ensure_ascii=False) if " " in word or not word else word


def print_explanation(lab: LabelScore, out: TextIO, terms: int = 5) -> None:
    """The label's bias and its largest contributions, one line: `bias 0.12  kitten +1.83  cat +1.20`."""
    why = lab.explanation
    assert why is not None
    parts = [f"{term(c.word, c.feature)} {c.contribution:+.3f}" for c in why.contributions[:terms]]
    method = "" if why.method == "exact" else f" ({why.method}, approximate)"
    more = why.n_features - len(parts) if why.n_features is not None else 0
    tail = f"  (+{more} more)" if more > 0 else ""
    out.write(f"      why{method}: bias {why.bias:+.3f}  " + "  ".join(parts) + tail + "\n")


def progress_line(job_id: str, state: str | None, prog: JobProgress | None, width: int = 28) -> str:
    parts = [f"job {job_id}", state or ""]
    if prog is not None:
        frac = prog.fraction
        if frac is not None:
            filled = round(frac * width)
            parts.insert(0, f"[{'#' * filled}{'.' * (width - filled)}] {frac * 100:5.1f}%")
        if prog.epoch is not None:
            parts.append(f"epoch {prog.epoch:g}" + (f"/{prog.epochs}" if prog.epochs else ""))
        if prog.loss is not None:
            parts.append(f"loss {prog.loss:.4f}")
        if prog.examples_per_s is not None:
            parts.append(f"{prog.examples_per_s:,.0f} ex/s")
        if prog.metrics:
            parts.extend(f"{k} {v:.3f}" for k, v in list(prog.metrics.items())[:2])
    return "  ".join(p for p in parts if p)


class ProgressView:
    """Redraws one line on a terminal; elsewhere prints a line per state change or at most once a second."""

    def __init__(self, job_id: str, out: TextIO) -> None:
        self.job_id = job_id
        self.out = out
        self.tty = out.isatty()
        self.state: str | None = None
        self.progress: JobProgress | None = None
        self._last = 0.0

    def __call__(self, event: JobEvent) -> None:
        changed = event.state is not None and event.state != self.state
        if event.state is not None:
            self.state = event.state
        if event.progress is not None:
            self.progress = event.progress
        line = progress_line(self.job_id, self.state, self.progress)
        now = time.monotonic()
        if self.tty:
            self.out.write("\r\033[K" + line)
        elif changed or now - self._last >= 1.0:
            self.out.write(line + "\n")
            self._last = now
        self.out.flush()

    def finish(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()


# -- commands -------------------------------------------------------------------------------------


def cmd_predict(client: Client, args: argparse.Namespace) -> int:
    opts: dict[str, Any] = {"model": args.model, "top_k": args.top_k,
                            "normalization": args.normalization, "exact": True if args.exact else None,
                            "explain": True if args.explain else None}
    if args.file is not None:
        if args.text:
            raise UsageError("give either texts or --file, not both")
        if args.batch_size < 1:
            raise UsageError("--batch-size must be at least 1")
        out = args.out.open("w", encoding="utf-8") if args.out else sys.stdout
        try:
            n = 0
            for batch in chunks(read_rows(args.file), args.batch_size):
                resp = client.predict(batch, **opts)
                for pred in resp.predictions:
                    row = {"model": resp.model, "version": resp.version, **pred.model_dump(mode="json")}
                    out.write(json.dumps(row) + "\n")
                n += len(batch)
        finally:
            if args.out:
                out.close()
        if args.out:
            print(f"wrote {n} predictions to {args.out}", file=sys.stderr)
        return 0
    if not args.text:
        raise UsageError("predict needs a text or --file")
    resp = client.predict(list(args.text), **opts)
    if args.json:
        dump(resp, sys.stdout)
    else:
        print_prediction(resp, args.text, sys.stdout)
    return 0


def _base_arg(args: argparse.Namespace) -> dict[str, str] | None:
    """The job's `base` from --base [VERSION] and --base-model (None: a fresh model)."""
    if args.base is None:
        if args.base_model or args.replay_dataset:
            raise UsageError("--base-model and --replay-dataset need --base (the version to continue)")
        return None
    base = {"version": args.base} if args.base.strip() else {}
    if args.base_model:
        base["model"] = args.base_model
    return base


def _dataset_id(client: Client, ref: str) -> str:
    """A path that exists is uploaded; anything else is taken as the id of an uploaded dataset."""
    path = Path(ref)
    if path.is_file():
        info = client.upload_dataset(path)
        what = "already stored" if info.already_stored else "uploaded"
        print(f"{what} {path} as dataset {info.id} ({info.rows} rows, {info.labels} labels)",
              file=sys.stderr)
        return info.id
    if os.sep in ref or ref.endswith((".txt", ".jsonl", ".json")):
        raise UsageError(f"{ref}: no such file")
    return ref


def follow(client: Client, job_id: str) -> Job:
    view = ProgressView(job_id, sys.stderr)
    try:
        job = client.wait_for_job(job_id, on_event=view)
    finally:
        view.finish()
    return job


def report_final(job: Job, out: TextIO | None = None) -> int:
    """The job's end in one line (success on `out`, default stdout); exit 0 only if it succeeded."""
    if job.state == "succeeded":
        version = f" as version {job.model_version}" if job.model_version is not None else ""
        print(f"job {job.id} succeeded: model {job.model}{version}", file=out or sys.stdout)
        return 0
    print(f"job {job.id} {job.state}" + (f": {job.error}" if job.error else ""), file=sys.stderr)
    return 1


def cmd_train(client: Client, args: argparse.Namespace) -> int:
    params = parse_params(args.param, args.params)
    base = _base_arg(args)
    check_params(client, params)
    train_id = _dataset_id(client, args.dataset)
    test_id = _dataset_id(client, args.test_dataset) if args.test_dataset else None
    if base is not None and args.replay_dataset:
        base["replay_dataset"] = _dataset_id(client, args.replay_dataset)
    job = client.submit_job(
        args.model, train_id, test_dataset=test_id, params=params or None, activate=args.activate or None,
        base=base,
    )
    print(f"submitted job {job.id} ({job.state})", file=sys.stderr)
    if not args.follow:
        if args.json:
            dump(job, sys.stdout)
        else:
            print(job.id)
        return 0
    try:
        final = follow(client, job.id)
    except KeyboardInterrupt:
        print(f"\nstopped following; job {job.id} keeps running (ovex-client jobs cancel {job.id})",
              file=sys.stderr)
        return 130
    if args.json:
        dump(final, sys.stdout)  # stdout holds the JSON alone, for a program to read
    return report_final(final, sys.stderr if args.json else None)


def cmd_jobs(client: Client, args: argparse.Namespace) -> int:
    if args.action == "list":
        jobs = list(client.iter_jobs(args.state, model=args.model))
        if args.json:
            dump(jobs, sys.stdout)
        else:
            for j in jobs:
                frac = j.progress.fraction if j.progress else None
                pct = f"{frac * 100:5.1f}%" if frac is not None else "     -"
                version = j.model_version if j.model_version is not None else "-"
                print(f"{j.id}\t{j.state:<10}\t{pct}\t{j.model or '-'}\t{version}")
        return 0
    if args.action == "show":
        dump(client.get_job(args.job_id), sys.stdout)
        return 0
    if args.action == "cancel":
        return cancel(client, args.job_id, args.json)
    if args.action == "logs":
        logs = client.job_logs(args.job_id)
        if args.json:
            dump({"job": args.job_id, "logs": logs}, sys.stdout)
        else:
            sys.stdout.write(logs)
        return 0
    if args.action == "delete":
        client.delete_job(args.job_id)
        if args.json:
            dump({"job": args.job_id, "deleted": True}, sys.stdout)
        else:
            print(f"deleted job {args.job_id}")
        return 0
    final = follow(client, args.job_id)
    if args.json:
        dump(final, sys.stdout)
    return report_final(final, sys.stderr if args.json else None)


def cancel(client: Client, job_id: str, as_json: bool) -> int:
    """Cancel a job and say what happened; a job that had already ended is reported (exit 1), not an error
    dump."""
    try:
        job = client.cancel_job(job_id)
    except Conflict:
        job = client.get_job(job_id)
        if not job.done:
            raise
        if as_json:
            dump(job, sys.stdout)
        else:
            print(f"job {job.id} already ended: {job.state}")
        return 1
    if as_json:
        dump(job, sys.stdout)
    elif job.state == "cancelled":
        print(f"cancelled job {job.id}")
    else:
        print(f"cancelling job {job.id}: it is {job.state} and stops at its next step")
    return 0


def cmd_models(client: Client, args: argparse.Namespace) -> int:
    if args.action == "list":
        models = client.list_models()
        if args.json:
            dump(models, sys.stdout)
        else:
            for m in models:
                versions = ",".join(v.version for v in m.versions)
                if m.n_versions is not None and m.n_versions > len(m.versions):
                    versions += f" (the newest {len(m.versions)} of {m.n_versions})"
                flags = "".join(f"\t{f}" for f, on in (("default", m.default), ("deactivated", m.deactivated))
                                if on)
                print(f"{m.name}\tactive {m.active_version}\tversions {versions}{flags}")
        return 0
    if args.action == "show":
        model = client.get_model(args.name)
        if args.json:
            dump(model, sys.stdout)
        else:
            print_model(model, list(reversed(model.versions)), sys.stdout)  # newest first
        return 0
    if args.action == "delete":
        return delete_model(client, args)
    if args.action == "deactivate":
        gone = client.deactivate_model(args.name)
        if args.json:
            dump(gone, sys.stdout)
        else:
            print(f"deactivated model {args.name}: not served until a version is activated "
                  f"(ovex-client models activate {args.name} VERSION)")
        return 0
    if args.action == "default":
        return default_model(client, args)
    answer = client.activate(args.name, args.version)
    if args.json:
        dump(answer, sys.stdout)
    else:
        print(f"model {args.name}: version {args.version} active")
    return 0


def delete_model(client: Client, args: argparse.Namespace) -> int:
    if args.version is not None:
        if args.force:
            raise UsageError("--force applies to deleting a whole model, not one version")
        client.delete_version(args.name, args.version)
        if args.json:
            dump({"name": args.name, "version": args.version, "deleted": True}, sys.stdout)
        else:
            print(f"deleted version {args.version} of model {args.name}")
        return 0
    gone = client.delete_model(args.name, force=args.force)
    if args.json:
        dump(gone, sys.stdout)
        return 0
    versions = ", ".join(gone.versions) or "none"
    print(f"deleted model {gone.name} (versions {versions})")
    if gone.cancelled_jobs:
        print(f"cancelled jobs {', '.join(gone.cancelled_jobs)}")
    return 0


def default_model(client: Client, args: argparse.Namespace) -> int:
    if args.name is not None and args.clear:
        raise UsageError("give a model name or --clear, not both")
    if args.name is not None or args.clear:
        answer = client.set_default_model(None if args.clear else args.name)
    else:
        answer = client.get_default_model()
    if args.json:
        dump(answer, sys.stdout)
        return 0
    sources = {"setting": "set by OVEX_DEFAULT_MODEL on the server", "api": "set with models default",
               "automatic": "automatic: the demo model, else the oldest"}
    source = sources.get(answer.source or "", answer.source)
    print(f"default model {answer.default or '(none)'} ({source})")
    if args.name is not None and answer.default != args.name:
        print(f"note: {args.name} is recorded, but OVEX_DEFAULT_MODEL on the server keeps {answer.default}",
              file=sys.stderr)
    return 0


def cmd_datasets(client: Client, args: argparse.Namespace) -> int:
    if args.action == "upload":
        if not args.file.is_file():
            raise UsageError(f"{args.file}: no such file")
        info = client.upload_dataset(args.file, kind=args.kind)
        if args.json:
            dump(info, sys.stdout)
        else:
            print_datasets([info], sys.stdout)
            if info.already_stored:
                print(info.note or f"already stored as dataset {info.id} ({info.name}): nothing stored again")
    elif args.action == "list":
        datasets = list(client.iter_datasets())
        if args.json:
            dump(datasets, sys.stdout)
        else:
            print_datasets(datasets, sys.stdout)
    elif args.action == "delete":
        client.delete_dataset(args.dataset_id)
        if args.json:
            dump({"id": args.dataset_id, "deleted": True}, sys.stdout)
        else:
            print(f"deleted dataset {args.dataset_id}")
    else:
        info = client.get_dataset(args.dataset_id)
        if args.json:
            dump(info, sys.stdout)
        else:
            print_datasets([info], sys.stdout)
    return 0


def read_labels(path: Path) -> list[dict[str, str]]:
    """Labels to add from a JSONL file of `{"name", "text"}` objects; a line that is not one is a
    `path:line:` error (the server checks the names and texts themselves)."""
    out: list[dict[str, str]] = []
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise UsageError(f"{path}: cannot open: {exc.strerror}") from exc
    with fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise UsageError(f"{path}:{lineno}: not UTF-8 text ({exc.reason})") from exc
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) \
                    or not isinstance(obj.get("text"), str):
                raise UsageError(f'{path}:{lineno}: expected {{"name": "...", "text": "..."}}')
            out.append({"name": obj["name"], "text": obj["text"]})
    if not out:
        raise UsageError(f"{path}: no labels in the file")
    return out


def cmd_labels(client: Client, args: argparse.Namespace) -> int:
    added = client.add_labels(args.model, read_labels(args.file), activate=args.activate or None,
                              base_version=args.base_version)
    if args.json:
        dump(added, sys.stdout)
    else:
        state = "active" if added.activated else "not activated"
        print(f"model {added.name}: version {added.version} ({state}) has {added.n_labels} labels, "
              f"{added.added} added (ids {added.first_label_id}..{added.first_label_id + added.added - 1})")
    return 0


def cmd_health(client: Client, args: argparse.Namespace) -> int:
    live = client.health()
    ready = client.ready()
    print(json.dumps({"url": client.url, "healthz": live, "ready": ready}))
    return 0 if ready else 1


COMMANDS = {
    "predict": cmd_predict,
    "train": cmd_train,
    "jobs": cmd_jobs,
    "models": cmd_models,
    "datasets": cmd_datasets,
    "labels": cmd_labels,
    "health": cmd_health,
}


def unreachable(exc: TransportError, flag_url: str | None) -> str:
    """One line: which URL was tried, what went wrong, and how to point the client elsewhere."""
    url = _api.resolve_url(flag_url)
    source = "--url" if flag_url else ("OVEX_URL" if os.environ.get("OVEX_URL") else "the default")
    cause = exc.__cause__
    if isinstance(cause, httpx.UnsupportedProtocol):
        return f"cannot use the server URL {url!r} (from {source}): it must start with http:// or https://"
    if isinstance(exc, RequestTimeout):
        what = "did not answer in time (raise --timeout if it is busy)"
    elif isinstance(cause, httpx.ConnectError):
        reason = str(cause).split("] ", 1)[-1] or "connection failed"
        what = f"could not be reached ({reason})"
    else:
        what = f"broke the connection ({str(cause or exc).split('] ', 1)[-1]})"
    return f"the server at {url} (from {source}) {what}; set OVEX_URL or --url to where ovex runs"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with Client(args.url, args.api_key, timeout=args.timeout) as client:
            return COMMANDS[args.command](client, args)
    except UsageError as exc:
        print(f"ovex-client: {exc}", file=sys.stderr)
        return 2
    except APIError as exc:
        print(f"ovex-client: server said {exc.status_code}: {exc.message}", file=sys.stderr)
        return 1
    except TransportError as exc:
        print(f"ovex-client: {unreachable(exc, args.url)}", file=sys.stderr)
        return 3
    except OvexClientError as exc:
        print(f"ovex-client: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
