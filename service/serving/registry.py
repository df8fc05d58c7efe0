"""The model registry: which versions exist (`ModelCatalog`, the layout on disk), which one serves.

A served version is an immutable `ServedModel` (loaded artifact + index + predictor). Activation builds
and warms the new one completely, then swaps one dict entry; a request pins the object it read when it
arrived, so during a swap every request is answered entirely by the old or entirely by the new version.
A version that fails to load is refused with a log line and never replaces the one serving.

Which version is active is not this process's decision: it is a row of the shared database
(`service.serving.active`). Activation loads and warms the version here, then records it; every other process
and replica polls the rows (`active_poll_s`) and follows. The other serving processes of the same
`ovex serve --workers N` are asked to follow at once, and the activation answers once they have
(`service.serving.peers`).
A model nobody activated gets the highest version that loads, and that first choice is recorded too, so a
restart, a second serving process or a second replica serves the same version instead of re-deciding from what
is on disk.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from service.errors import Conflict, DomainError, NotFound, Unavailable
from service.metrics import Metrics
from service.serving.active import ActiveVersions, Flags
from service.serving.catalog import ModelCatalog, remove_hidden, version_key
from service.serving.peers import Siblings, this_process
from service.serving.predictor import Predictor
from service.serving.quantized_scan import Check, no_check
from service.serving.retrieval import (
    ExactScorer,
    RetrievalConfig,
    Retriever,
    build_retriever,
    configure_threads,
)
from service.settings import Settings

log = logging.getLogger("ovex.registry")

# how long an activation waits for the other serving processes to follow it, beyond the time its own load took
# (they load the same version)
CONFIRM_S = 10.0
# the model `ovex demo` trains: the default when none was set
DEMO = "demo"


@dataclass(frozen=True)
class ServedModel:
    """One loaded, warmed version. Never mutated: hot swap replaces the object."""

    name: str
    version: str
    path: Path
    predictor: Predictor
    config: dict[str, Any]
    metrics: dict[str, Any]
    retrieval: str
    loaded_at: float = field(default_factory=time.time)

    @property
    def n_labels(self) -> int:
        return self.predictor.n_labels

    @property
    def n_features(self) -> int:
        return self.predictor.n_features

    @property
    def dim(self) -> int:
        return int(self.predictor.model.dim)


def load_served(name: str, version: str, path: Path, settings: Settings) -> ServedModel:
    """Load an artifact, build or load its index, warm it up. Raises on any problem (caller refuses)."""
    from trainer.artifact import load_artifact

    t0 = time.perf_counter()
    configure_threads(settings.threads)  # per thread for OpenMP: loads run in worker threads
    loaded = load_artifact(path)
    exact, retr = _retrievers(loaded, path, settings)
    pred = Predictor(loaded, retr, exact)
    if settings.warmup:
        pred.warmup()
    served = ServedModel(name, version, path, pred, dict(loaded.config), dict(loaded.metrics), retr.kind)
    log.info(
        "model version loaded",
        extra={
            "model": name,
            "version": version,
            "labels": served.n_labels,
            "retrieval": retr.kind,
            "seconds": round(time.perf_counter() - t0, 2),
        },
    )
    return served


def _retrievers(
    loaded: Any, path: Path, settings: Settings, check: Check = no_check
) -> tuple[ExactScorer, Retriever]:
    """The exact scorer and the retriever that serves `loaded` (its index read from the artifact's
    cache, or built and cached there; `check` may abandon the build)."""
    weight, bias = loaded.head_weight, loaded.head_bias
    gate = getattr(getattr(loaded, "model", None), "extra", {}).get("dropmax")
    if gate is not None:  # DropMax: scores f_k + log σ(g_k) — no index can serve them, score exactly
        g = gate.detach().cpu().numpy()
        d = weight.shape[1]
        exact = ExactScorer(weight, bias, settings.exact_block_rows, g[:, :d], g[:, d])
        return exact, exact
    exact = ExactScorer(weight, bias, settings.exact_block_rows)
    return exact, build_retriever(weight, bias, RetrievalConfig.from_settings(settings), path, exact, check)


def build_serving_index(path: Path, settings: Settings, check: Check = no_check) -> str:
    """Build the index the service would serve the artifact at `path` from, into its cache, and say
    which kind it is ("exact": nothing to build). A training job calls this before it publishes, so
    the service loads the new version from the cache instead of building the index (k-means over
    every label row: minutes at 10^7 labels) on a replica that is serving. `check` is called between
    chunks of the build and may raise to abandon it (a job cancelled meanwhile)."""
    from trainer.artifact import load_artifact

    configure_threads(settings.threads)
    return _retrievers(load_artifact(path), path, settings, check)[1].kind


class ModelRegistry:
    """Thread-safe: loads run under one lock (one at a time); reads are single dict lookups."""

    def __init__(
        self,
        settings: Settings,
        store: ActiveVersions,
        metrics: Metrics | None = None,
        peers: Siblings | None = None,
    ) -> None:
        self.settings = settings
        self.catalog = ModelCatalog(Path(settings.models_dir))
        self.store = store
        self.metrics = metrics
        # the other serving processes of this server, asked to follow an activation before it answers
        self.peers = peers if peers is not None else this_process()
        self._active: dict[str, ServedModel] = {}
        self._refused: dict[tuple[str, str], str] = {}
        self._flags = Flags()  # deactivated models and the default set through the API, as last read
        self._auto_default: str | None = None  # the default when none is set, as of the last refresh
        self._refused_at: dict[tuple[str, str], float] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None
        self.started = threading.Event()  # the start-up scan finished (loaded or not)
        # called while a version is deleted, in the transaction holding its lock; raises to keep it (the job
        # system keeps the bases of its jobs)
        self.before_delete: Callable[[Session, str, str], None] | None = None
        # called while a whole model is deleted, in the transaction holding its versions' locks: raises to
        # keep it while a job uses it (jobs whose cancel was requested count only when the flag is False)
        self.before_model_delete: Callable[[Session, str, bool], None] | None = None
        # cancels the queued and running jobs that use a model (`DELETE ...?force=true`); their ids
        self.cancel_model_jobs: Callable[[str], list[str]] | None = None

    # -- discovery -------------------------------------------------------------------------------
    def scan(self) -> dict[str, list[str]]:
        """Model name → versions (ascending) present on disk (`ModelCatalog.scan`)."""
        return self.catalog.scan()

    # -- loading -----------------------------------------------------------------------------------
    def _load(self, name: str, version: str) -> ServedModel:
        path = self.catalog.version_dir(name, version)
        try:
            served = load_served(name, version, path, self.settings)
        except Exception as exc:
            if not path.is_dir():  # deleted while it loaded: nothing to refuse
                raise NotFound(
                    f"version {version!r} of model {name!r} no longer exists (deleted meanwhile); "
                    "nothing was activated"
                ) from exc
            msg = (str(exc) or "its files could not be read").replace(str(path), f"{name}/{version}")
            self._refused[(name, version)] = msg
            self._refused_at[(name, version)] = time.monotonic()
            if self.metrics is not None:
                self.metrics.load_failures.labels(name).inc()
            keeps = self._active.get(name)
            log.error(
                "model version refused",
                extra={
                    "model": name,
                    "version": version,
                    "error": msg,
                    "still_serving": keeps.version if keeps else None,
                },
            )
            raise
        self._refused.pop((name, version), None)
        self._refused_at.pop((name, version), None)
        return served

    def _recently_refused(self, name: str, version: str) -> bool:
        """A refused version is not retried on every poll; after `refused_retry_s` it is (files on a
        shared volume may have been still arriving)."""
        at = self._refused_at.get((name, version))
        return at is not None and time.monotonic() - at < self.settings.refused_retry_s

    def _swap(self, served: ServedModel) -> str | None:
        prev = self._active.get(served.name)
        self._active[served.name] = served
        if self.metrics is not None:
            self.metrics.set_active(served.name, served.version, prev.version if prev else None)
        log.info(
            "model version active",
            extra={
                "model": served.name,
                "version": served.version,
                "previous": prev.version if prev else None,
            },
        )
        return prev.version if prev else None

    def _load_best(self, name: str, versions: list[str], chosen: str | None) -> None:
        """Nothing serves `name` here yet: load the recorded version, or else the highest that loads and
        record it (first choice wins across processes); fall back downwards when a version fails."""
        order = sorted(versions, key=version_key, reverse=True)
        if chosen in order:
            order.remove(chosen)
            order.insert(0, chosen)
        for v in order:
            if self._recently_refused(name, v):
                continue
            try:
                served = self._load(name, v)
            except Exception:
                continue
            if chosen is None:
                try:
                    recorded = self.store.record_first(name, v, self._present(name, v))
                except NotFound:  # deleted since it was listed: the next one down
                    continue
                if recorded != v and recorded in versions:  # another process chose first: follow it
                    with contextlib.suppress(Exception):  # refused and logged; serve ours meanwhile
                        served = self._load(name, recorded)
            self._swap(served)
            return
        log.error("no loadable version", extra={"model": name, "versions": versions})

    def start(self) -> None:
        """Load every model's active version, then follow the database (run in a background thread:
        /healthz is up meanwhile). Waits for the database: serving without the truth would guess."""
        self._sweep_deleted()
        try:
            while not self._stop.is_set():
                try:
                    self.store.migrate()
                    self.store.import_legacy_file(self.catalog.root)
                    break
                except Exception as exc:
                    log.warning("active-version store unreachable; retrying", extra={"error": str(exc)})
                    self._stop.wait(2.0)
            stamp = time.monotonic_ns()
            self.refresh()
            if self.peers is not None:
                self.peers.followed(stamp)
        finally:
            self.started.set()
        self._follower = threading.Thread(target=self._follow, name="ovex-active-follower", daemon=True)
        self._follower.start()

    def stop(self) -> None:
        self._stop.set()
        if self.peers is not None:
            self.peers.wake()
        if self._follower is not None:
            self._follower.join(timeout=10)
        self.store.close()

    def _follow(self) -> None:
        """Refresh every `active_poll_s`, and at once when another serving process of this server asks; then
        tell it from when on this one follows (`Siblings.followed`)."""
        while not self._wait_for_news():
            stamp = time.monotonic_ns()  # before the read: what was committed earlier is seen
            try:
                self.refresh()
            except Exception as exc:
                log.warning("following the active versions failed", extra={"error": str(exc)})
                continue
            if self.peers is not None:
                self.peers.followed(stamp)

    def _wait_for_news(self) -> bool:
        """Wait a poll period or until asked; True once the registry is stopping."""
        if self.peers is None:
            return self._stop.wait(self.settings.active_poll_s)
        self.peers.wait(self.settings.active_poll_s)
        return self._stop.is_set()

    def refresh(self) -> None:
        """Make this process serve what the database says: models with nothing serving get their
        recorded (or best) version; a recorded version that differs from the one serving is loaded and
        swapped in. A version refused here is retried only after `refused_retry_s`."""
        with self._lock:
            choices = self.store.all()
            self._flags = flags = self.store.flags()
            scanned = self.scan()
            for name in [n for n in self._active if n not in scanned or n in flags.deactivated]:
                self._drop(name)
            self._auto_default = self._pick_default(scanned, flags)
            for name, versions in scanned.items():
                if name in flags.deactivated:
                    continue
                chosen = choices.get(name)
                current = self._active.get(name)
                if current is None:
                    self._load_best(name, versions, chosen)
                elif chosen is not None and chosen != current.version and chosen in versions:
                    if self._recently_refused(name, chosen):
                        continue
                    try:
                        self._swap(self._load(name, chosen))
                    except Exception:
                        continue

    def load_version(self, name: str, version: str, activate: bool = False) -> ServedModel:
        """Load (and check) a version that just appeared, e.g. from a training job; activate if asked, then
        wait (bounded) for the other serving processes of this server to follow. Raises `NotFound` for an
        unknown directory and `Conflict` when it fails to load."""
        t0 = time.monotonic()
        served, asked = self._load_version(name, version, activate)
        if asked is not None:  # a job's activation: recorded, so the stragglers follow by poll
            self._confirm(name, version, asked, time.monotonic() - t0, strict=False)
        return served

    def _load_version(self, name: str, version: str, activate: bool) -> tuple[ServedModel, int | None]:
        """`load_version` here, under the lock; with the time the other serving processes were asked to follow
        an activation (None: nobody to ask, or no activation)."""
        with self._lock:
            if version not in self.scan().get(name, []):
                raise NotFound(f"model {name!r} has no version {version!r}")
            current = self._active.get(name)
            if current is not None and current.version == version:
                if activate:
                    self._record(name, version)
                    return current, self._ask_peers()
                return current, None
            try:
                served = self._load(name, version)
            except NotFound:
                raise
            except Exception as exc:
                raise Conflict(
                    f"version {version!r} of model {name!r} failed to load and was refused: "
                    f"{self._refused.get((name, version))}; the active version keeps serving"
                ) from exc
            if activate:  # recorded first: a choice the database did not take must not serve here
                self._record(name, version)
                self._flags = self.store.flags()  # activation serves a deactivated model again
                self._auto_default = self._pick_default(self.scan(), self._flags)  # and it may be default
                self._swap(served)
                return served, self._ask_peers()
            if current is None and name not in self.store.flags().deactivated:
                recorded = self.store.record_first(name, version, self._present(name, version))
                if recorded == version:
                    self._swap(served)
                else:  # another process already chose for this model: the next refresh follows it
                    self.refresh()
            return served, None

    def _ask_peers(self) -> int | None:
        """Ask the other serving processes of this server to follow the database now (called once an
        activation is recorded); the time to confirm against, or None when this process serves alone."""
        return self.peers.ask() if self.peers is not None else None

    def _confirm(self, name: str, version: str, asked: int, took_s: float, strict: bool) -> None:
        """Wait, off the lock (a sibling following needs its own lock, and may be activating too), until every
        live serving process of this server serves what was recorded at `asked`. Those that do not confirm in
        time are logged, and with `strict` the caller is told: recorded, but not yet served everywhere."""
        assert self.peers is not None
        timeout_s = CONFIRM_S + took_s
        serving, alive = self.peers.confirm(asked, timeout_s)
        if serving == alive:
            return
        message = (
            f"version {version!r} of model {name!r} is recorded as active and serves in {serving} of this "
            f"server's {alive} workers; the others did not confirm within {timeout_s:.0f} s and follow it "
            "as soon as they can: activate it again to wait for them"
        )
        log.warning("activation not confirmed by every serving process",
                    extra={"model": name, "version": version, "serving": serving, "processes": alive})
        if strict:
            raise Unavailable(message, retry_after=1)

    def _drop(self, name: str) -> None:
        """Stop serving `name` here (deleted or deactivated); requests that pinned it finish on it."""
        prev = self._active.pop(name, None)
        if prev is not None:
            if self.metrics is not None:
                self.metrics.set_inactive(name, prev.version)
            log.info("model no longer served", extra={"model": name, "previous": prev.version})

    def _pick_default(self, scanned: dict[str, list[str]], flags: Flags) -> str | None:
        """The default when none is set: the demo model if present, else the model whose first version was
        created first (a model trained later never takes its place). Deactivated models are passed over."""
        names = [n for n in scanned if n not in flags.deactivated]
        if DEMO in names:
            return DEMO
        if not names:
            return None
        return min(names, key=lambda n: (self.created_at(n, scanned[n][0]), n))

    def created_at(self, name: str, version: str) -> float:
        return self.catalog.created_at(name, version)

    def _present(self, name: str, version: str) -> Callable[[], bool]:
        return self.catalog.present(name, version)

    def _record(self, name: str, version: str) -> None:
        """Recorded under the version's lock, and only if it is still on disk then: a delete in another
        process either finds it recorded (and refuses) or has already renamed it (and this refuses)."""
        self.store.set(name, version, self._present(name, version))

    def activate(self, name: str, version: str) -> tuple[ServedModel, str | None]:
        """Hot swap: load + warm the version here, record the choice for every other process and replica to
        follow, make it active here, and return once every serving process of this server serves it (replicas
        follow within `active_poll_s`). `Unavailable` when a serving process did not confirm in time: the
        choice is recorded and that serving process follows it as soon as it can."""
        t0 = time.monotonic()
        with self._lock:
            if name not in self.scan():
                raise NotFound(f"unknown model {name!r}")
            prev = self._active.get(name)
            served, asked = self._load_version(name, version, activate=True)
        if asked is not None:
            self._confirm(name, version, asked, time.monotonic() - t0, strict=True)
        return served, (prev.version if prev else None)

    def delete_version(self, name: str, version: str) -> None:
        """Remove a version's directory; refused for the active version (serving here, or recorded as
        active for every replica: activate another first), and while `before_delete` refuses. Both are
        checked under the version's lock (`ActiveVersions.version_lock`), held until the directory is
        renamed out of sight (a hidden name the scan skips): an activation or a job recorded in any
        process meanwhile waits for it, then finds the version gone."""
        with self._lock:
            if version not in self.scan().get(name, []):
                raise NotFound(f"model {name!r} has no version {version!r}")
            outcome = f"version {version!r} of model {name!r} was not deleted"
            with self.store.version_lock(name, version, outcome) as s:
                served = self._active.get(name)
                # the database's choice counts too: this process may not have followed an activation yet
                if version in (served.version if served is not None else None, self.store.recorded(s, name)):
                    raise Conflict(f"version {version!r} of model {name!r} is the active one: "
                                   "activate another version first")
                if self.before_delete is not None:
                    self.before_delete(s, name, version)
                gone = self.catalog.hide_version(name, version)
            self._refused.pop((name, version), None)
            try:
                remove_hidden(gone)
            except OSError as exc:  # deleted as far as anyone can see; the files are left to remove by hand
                log.warning("files of a deleted version remain", extra={"model": name, "version": version,
                                                                        "error": str(exc)})

    def _sweep_deleted(self) -> None:
        """Remove what a deletion cut short (by a crash) left: versions and models already renamed out of
        sight."""
        for gone in self.catalog.hidden():
            try:
                remove_hidden(gone)
            except OSError as exc:
                log.warning("files of a deleted version remain",
                            extra={"model": gone.parent.name, "error": str(exc)})
                continue
            log.info("removed the files of a deleted version", extra={"model": gone.parent.name})

    # -- reads -------------------------------------------------------------------------------------
    def serving(self, name: str) -> ServedModel | None:
        """The version serving `name` now, if any: read from memory, no directory listed, nothing copied."""
        return self._active.get(name)

    def get(self, name: str) -> ServedModel:
        served = self.serving(name)
        if served is not None:
            return served
        versions = self.scan().get(name)
        if versions and name in self._flags.deactivated:
            raise Conflict(f"model {name!r} is deactivated: its versions are kept but none serves; activate "
                           f"one to serve it again (POST /v1/models/{name}/versions/{versions[-1]}/activate)")
        if versions:
            untried = any((name, v) not in self._refused for v in versions)
            if not self.started.is_set() or untried:  # a new version is found by the next refresh
                raise Unavailable(f"model {name!r} is still loading", retry_after=1)
            raise Unavailable(f"model {name!r} has no version that loads (see the server log)")
        raise NotFound(f"unknown model {name!r}")

    def loading(self) -> list[str]:
        """Models that are to serve here and do not yet: on disk, not deactivated, nothing serving, and a
        version not yet tried (the next refresh loads it)."""
        flags, refused = self._flags, self._refused
        return [
            name for name, versions in self.scan().items()
            if name not in self._active and name not in flags.deactivated
            and any((name, v) not in refused for v in versions)
        ]

    def ready(self) -> bool:
        """Ready for inference, the one rule of /readyz and /v2/health/ready (the KServe V2 "server ready":
        its models are ready): the start-up scan is over, a model serves, and none that is to serve is still
        loading. A deactivated model is not to serve; a model none of whose versions loads is refused, says
        so on its own readiness, and does not keep the models that serve out of rotation."""
        return self.started.is_set() and bool(self._active) and not self.loading()

    def default_name(self) -> str | None:
        """The model behind /v1/predict: OVEX_DEFAULT_MODEL, else the one set through the API, else the
        demo model, else the oldest (`_pick_default`, as of the last refresh)."""
        return self.settings.default_model or self._flags.default or self._auto_default

    def default_source(self) -> str:
        """Why `default_name` is what it is: "setting", "api" or "automatic"."""
        if self.settings.default_model:
            return "setting"
        return "api" if self._flags.default else "automatic"

    def is_deactivated(self, name: str) -> bool:
        return name in self._flags.deactivated

    def set_default(self, name: str | None) -> str | None:
        """Record `name` as the default for every serving process and replica (None: the automatic choice
        again), then wait until this server's serving processes follow; returns the default now in force."""
        if name is not None and name not in self.scan():
            raise NotFound(f"unknown model {name!r}")
        self.store.set_default(name)
        self._follow_now()
        return self.default_name()

    def deactivate(self, name: str) -> None:
        """Stop serving `name` in every worker and replica; its versions stay (activating one serves it)."""
        if name not in self.scan():
            raise NotFound(f"unknown model {name!r}")
        self.store.deactivate(name)
        self._follow_now()

    def _follow_now(self) -> None:
        """Follow the database here at once, and wait until this server's other workers have too."""
        t0 = time.monotonic()
        self.refresh()
        asked = self._ask_peers()
        if asked is not None:
            serving, alive = self.peers.confirm(asked, CONFIRM_S) if self.peers is not None else (1, 1)
            if serving != alive:
                raise Unavailable(
                    f"recorded; {serving} of this server's {alive} workers follow it, the others did not "
                    f"confirm within {CONFIRM_S + time.monotonic() - t0:.0f} s and follow it as soon as "
                    "they can",
                    retry_after=1,
                )

    def delete_model(self, name: str, force: bool = False) -> list[str]:
        """Remove a model with every version. Refused (`Conflict` naming them) while a queued or running
        job continues one of its versions or trains into it; with `force` those jobs are cancelled first
        (returns their ids). Checked under the locks of all its versions, held until the model's directory
        is renamed out of sight, so a job recorded or a version activated meanwhile waits, then finds the
        model gone."""
        if name not in self.scan():
            raise NotFound(f"unknown model {name!r}")
        cancelled = self.cancel_model_jobs(name) if force and self.cancel_model_jobs is not None else []
        with self._lock:
            versions = self.scan().get(name)
            if not versions:
                raise NotFound(f"unknown model {name!r}")
            outcome = f"model {name!r} was not deleted"
            with self.store.versions_lock(name, versions, outcome) as s:
                if self.before_model_delete is not None:
                    self.before_model_delete(s, name, force)
                self.store.forget(s, name)
                gone, highest = self.catalog.hide_model(name)
                self._keep_numbers(name, highest)
            for v in versions:
                self._refused.pop((name, v), None)
                self._refused_at.pop((name, v), None)
            self._drop(name)
        try:
            remove_hidden(gone)
        except OSError as exc:  # deleted as far as anyone can see; the files are left to remove by hand
            log.warning("files of a deleted model remain", extra={"model": name, "error": str(exc)})
        self._follow_now()
        return cancelled

    def _keep_numbers(self, name: str, highest: int) -> None:
        """A model made again under a deleted one's name numbers its versions above the old ones, so a
        replica still serving the old `name/1` is never handed a different `name/1` under that name."""
        try:
            self.catalog.keep_numbers(name, highest)
        except (OSError, DomainError) as exc:  # the delete stands; only the numbering may start over
            log.warning("the version numbers of a deleted model were not kept",
                        extra={"model": name, "error": str(exc)})

    def default(self) -> ServedModel:
        name = self.default_name()
        if name is None:
            if not self.started.is_set():
                raise Unavailable("models are still loading", retry_after=1)
            raise Unavailable("no model is served: the models directory holds none")
        return self.get(name)

    def active(self) -> dict[str, ServedModel]:
        return dict(self._active)

    def refused(self, name: str, version: str) -> str | None:
        return self._refused.get((name, version))

    def version_summary(self, name: str, version: str) -> dict[str, Any]:
        """config/metrics of a version from its JSON files, without loading its weights."""
        return self.catalog.summary(name, version)


