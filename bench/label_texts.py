"""Label texts: `ovex train` with defaults against defaults plus `--label-texts`, on WordNet, Bibtex, Corel5k.

Each run is the console command (`bench/real.py`'s `ovex_train`: `python -m service.cli train ...` as a
subprocess, its wall time from `os.wait4`); the artifact is loaded back and the test rows scored with
`model.topk` by real.py's scorer (`trainer.metrics.evaluate_topk` plus `tail_metrics`), in one label space
(training labels first, test-only ones after), predictions mapped by name.

* `wordnet`: the JSONL files as given; label texts from `wordnet_label_texts.jsonl` (every label, 1,199
  of them in the test rows only). `unseen_hit@5`: over the test rows that carry a label no training row has,
  the share whose top 5 holds one of those labels of the row.
* `wordnet-valid` (on request): WordNet's training rows split 80/20 as its test split was
  (`split_training_rows`); the held-out rows are scored, and the labels only they carry are known by their
  text alone. Defaults that concern such labels (`label_tower_zero_bias`) are chosen here, never on the
  test split.
* `bibtex`, `corel5k`: XC feature files carry no words a label name could match, so each row is rendered as
  text (the names of its features, `NAME_features.txt`) into a JSONL file and both arms train on that; a
  label's text is its name (`NAME_labels.txt`, a `TAG_` prefix dropped, `_` as a space). Bibtex's features
  are words, Corel5k's are visual-word clusters (`Cluster12`) that share no word with a tag name.

`step_ratio`: the run's training examples per second without label texts over those with them (the
steps are the same in number: > 1 means a step with label texts is slower by that factor).

    .venv/bin/python bench/label_texts.py [--sets wordnet bibtex corel5k] [--seeds 0 1 2]
        [--out bench/results/label_texts] [--extra="--label-tower-gain 2"] [--also="--label-tower-every 1"]
        [--zero-shot-scales]

`--also=FLAGS` (repeatable) adds an arm after the label-texts one, trained with its flags and those FLAGS
after them, named `label-texts FLAGS`: a setting compared side by side with the label-texts arm in one run.

`--zero-shot-scales`: each label-texts model is also scored with its text-only labels' rows rescaled after
training (`SCALES`), which shows where the trade between P@1 and unseen hit@5 can sit for that tower.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from real import (  # noqa: E402
    TAIL_MAX,
    K,
    _stats,
    _widen,
    load_set,
    ovex_train,
    tail_metrics,
    warm_ovex,
)
from stamp import RESULTS, finish, stamp, write_results  # noqa: E402

from trainer import metrics as xc_metrics  # noqa: E402
from trainer.data import read_xc  # noqa: E402
from trainer.twins import drop_excluded, most_excluded  # noqa: E402

SETS = ("wordnet", "bibtex", "corel5k")  # by default; `wordnet-valid` on request (`split_training_rows`)
VALID_SHARE = 0.2  # wordnet-valid: the share of WordNet's training rows held out, as its test split is
DEFAULTS, TEXTS = "defaults", "label-texts"
ARMS = (DEFAULTS, TEXTS)
SCALED = ("p@1", "p@5", "psp@5", "unseen_hit@5")  # the zero-shot scales' columns
SHOWN = ("p@1", "p@3", "p@5", "psp@5", "tail_p@1", "tail_p@5", "unseen_hit@5", "train_wall_s",
         "examples_per_s")


def label_text(name: str) -> str:
    """A label's name as its text: a Bibtex `TAG_` prefix dropped, underscores as spaces."""
    return name.removeprefix("TAG_").replace("_", " ").strip() or name


def render_xc(name: str, data_dir: Path, work: Path) -> tuple[Path, Path, Path]:
    """An XC set as JSONL texts (each row: the names of its features) and its label names as label texts."""
    features = (data_dir / f"{name}_features.txt").read_text().splitlines()
    labels = (data_dir / f"{name}_labels.txt").read_text().splitlines()
    out = []
    for split in ("train", "test"):
        ds = read_xc(data_dir / f"{name}_{split}.txt")
        assert ds.X is not None
        x, y = sp.csr_matrix(ds.X), sp.csr_matrix(ds.Y)
        path = work / f"{name}_{split}.jsonl"
        with open(path, "w") as fh:
            for i in range(ds.n_rows):
                words = " ".join(features[j] for j in x.indices[x.indptr[i] : x.indptr[i + 1]])
                fh.write(json.dumps({"text": words or "empty",
                                     "labels": [labels[j] for j in y.indices[y.indptr[i] : y.indptr[i + 1]]]})
                         + "\n")
        out.append(path)
    texts = work / f"{name}_label_texts.jsonl"
    with open(texts, "w") as fh:
        for lab in labels:
            fh.write(json.dumps({"name": lab, "text": label_text(lab)}) + "\n")
    return out[0], out[1], texts


def split_training_rows(data_dir: Path, work: Path) -> tuple[Path, Path]:
    """WordNet's training rows split as its test split was made (a seeded 80/20 by row): the labels of the
    held-out rows alone stand for labels a model meets by their text only. Defaults that concern those
    labels are chosen here, never on the test split."""
    lines = (data_dir / "wordnet_train.jsonl").read_text().splitlines()
    held = np.random.default_rng(0).random(len(lines)) < VALID_SHARE
    out = []
    for name, keep in (("fit", ~held), ("valid", held)):
        path = work / f"wordnet_{name}.jsonl"
        path.write_text("\n".join(line for line, k in zip(lines, keep, strict=True) if k) + "\n")
        out.append(path)
    return out[0], out[1]


def unseen_hit(top: np.ndarray, y: sp.csr_matrix, counts: np.ndarray) -> tuple[float | None, int]:
    """Over the rows carrying a label without training rows: the share whose top 5 holds such a label of
    theirs; and the number of those rows."""
    y = sp.csr_matrix(y)
    unseen = np.zeros(y.shape[1], bool)
    unseen[len(counts):] = True
    unseen[: len(counts)] = np.asarray(counts) == 0
    hit = xc_metrics.hits(np.asarray(top, np.int64)[:, :K], y, K)
    top_unseen = unseen[np.clip(top[:, :K], 0, None)] & (top[:, :K] >= 0)
    row_of = np.repeat(np.arange(y.shape[0]), np.diff(y.indptr))
    rows = np.bincount(row_of[unseen[y.indices]], minlength=y.shape[0]) > 0
    if not rows.any():
        return None, 0
    return float((hit & top_unseen)[rows].any(axis=1).mean()), int(rows.sum())


# (norm factor, bias shift) of the text-only labels' rows, applied after training: (1, 0) first is the
# model as trained, (0, 0) leaves the text-only labels out; then a grid of norms and biases
# (how `label_tower_zero_scale` and `label_tower_zero_bias` are chosen, on wordnet-valid)
SCALES = ((1.0, 0.0), (0.0, 0.0), *(
    (a, b) for a in (0.5, 0.625, 0.75, 0.875, 1.0, 1.125, 1.25)
    for b in (-2.0, -1.0, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0) if (a, b) != (1.0, 0.0)))


def best_scale(rows: list[dict[str, Any]], bar: dict[str, Any]) -> dict[str, Any] | None:
    """The scale whose mean unseen hit@5 is highest among those whose mean P@1 and P@5 are at least the
    run without texts' (`bar`, that arm's summary): the trade label texts are asked to make, gaining labels
    known by their text alone at no cost to the others. None when no scale keeps both."""
    kept = [r for r in rows if r["a"] > 0
            and all(r[k]["mean"] >= bar[k]["mean"] for k in ("p@1", "p@5") if k in bar)]
    return max(kept, key=lambda r: r["unseen_hit@5"]["mean"], default=None)


def _top(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    k = min(k, scores.shape[1])  # fewer text-only labels than k: all of them
    idx = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    val = np.take_along_axis(scores, idx, 1)
    order = np.argsort(-val, 1)
    return np.take_along_axis(idx, order, 1), np.take_along_axis(val, order, 1)


def zero_shot_scales(model: Any, h: np.ndarray, to_shared: np.ndarray, y: sp.csr_matrix, counts: np.ndarray,
                     exclude: list[list[int]], prop: np.ndarray) -> list[dict[str, float]]:
    """P@1, P@5 and unseen hit@5 with the text-only labels' rows rescaled (norm × a, bias + b), post hoc:
    where the trade between the labels seen in training and those known by their text alone can sit.
    The top 5 of the trained labels and the top 5 of the text-only ones (with room for each row's
    excluded labels, left out as served) are taken once; a scale moves only the second set's scores."""
    if model.label_counts is None or not (model.label_counts == 0).any():
        return []
    w, b = model.head_weight, model.head_bias
    only = np.asarray(model.label_counts == 0)
    seen, zero = np.flatnonzero(~only), np.flatnonzero(only)
    b0 = float(np.median(b[zero]))  # the text-only rows' bias as trained (one value for all of them)
    more = most_excluded(exclude)
    parts: list[tuple[np.ndarray, ...]] = []
    for s in range(0, h.shape[0], 2048):
        hh = h[s:s + 2048]
        si, sv = _top(hh @ w[seen].T + b[seen], K + more)
        zi, zv = _top(hh @ w[zero].T, K + more)
        parts.append((seen[si], sv, zero[zi], zv))
    si, sv, zi, zv = (np.concatenate([p[i] for p in parts]) for i in range(4))
    out = []
    for a, shift in SCALES:
        zs = a * zv + b0 + shift if a > 0 else np.full_like(zv, -np.inf)
        ids, vals = np.concatenate([si, zi], 1), np.concatenate([sv, zs], 1)
        order = np.argsort(-vals, 1)
        kept, _, _ = drop_excluded(np.take_along_axis(ids, order, 1), np.take_along_axis(vals, order, 1),
                                exclude, K)
        top = to_shared[kept]
        m = xc_metrics.evaluate_topk(top, y, prop)
        hit, _ = unseen_hit(top, y, counts)
        out.append({"a": a, "b": shift, "p@1": float(m["p@1"]), "p@5": float(m["p@5"]),
                    "psp@5": float(m["psp@5"]),
                    "unseen_hit@5": float(hit) if hit is not None else float("nan")})
    return out


def run(set_name: str, flags: list[str] | None, seed: int, data_dir: Path, work: Path,
        scales: bool = False) -> dict[str, Any]:
    """One arm's run: `flags` None trains without label texts, a list with them and those flags."""
    from trainer.artifact import load_artifact
    from trainer.data import in_label_space, read_jsonl

    if set_name == "wordnet":
        b = load_set("wordnet", data_dir)
        train_path, test, texts = b.train_path, b.test, data_dir / "wordnet_label_texts.jsonl"
        names, counts = b.names, np.asarray(b.y_train.sum(axis=0)).ravel()[: b.n_train_labels]
        y_train = b.y_train
    else:
        if set_name == "wordnet-valid":
            train_path, test_path = split_training_rows(data_dir, work)
            texts = data_dir / "wordnet_label_texts.jsonl"
        else:
            train_path, test_path, texts = render_xc(set_name, data_dir, work)
        tr = read_jsonl(train_path)
        assert tr.label_names is not None
        test = in_label_space(read_jsonl(test_path), tr.label_names)
        assert test.label_names is not None
        names = list(test.label_names)
        counts = np.bincount(tr.Y.indices, minlength=tr.n_labels)
        y_train = tr.Y
    argv = [] if flags is None else ["--label-texts", str(texts), *flags]
    res: dict[str, Any] = ovex_train(train_path, work / "model", seed, argv, work / "train.log")
    model = load_artifact(work / "model")
    x = model.featurizer.transform(test)
    # as served: an input's twins left out where the model excludes them (`trainer.twins`)
    exclude = model.excluded(test.texts or [None] * test.n_rows)
    ids, _ = model.topk(x, K, exclude=exclude)
    index = {n: i for i, n in enumerate(names)}
    to_shared = np.array([index.get(n, -1) for n in model.label_names] + [-1], dtype=np.int64)
    ids = np.asarray(ids, np.int64)
    top = to_shared[np.where(ids >= 0, ids, len(model.label_names))]
    y = sp.csr_matrix(test.Y, dtype=np.float32)
    y = sp.csr_matrix((y.data, y.indices, y.indptr), shape=(y.shape[0], len(names)))
    prop = xc_metrics.propensities(_widen(y_train, len(names)))
    metrics: dict[str, Any] = dict(xc_metrics.evaluate_topk(top, y, prop))
    metrics.update({k: v for k, v in tail_metrics(top, y, counts).items() if k.startswith("tail_p@")})
    metrics["unseen_hit@5"], metrics["unseen_rows"] = unseen_hit(top, y, counts)
    if scales:
        h = model.encode(x)
        res["zero_shot_scales"] = zero_shot_scales(model, h, to_shared, y, counts, exclude, prop)
    res["examples_per_s"] = float(model.metrics.get("examples_per_s", float("nan")))
    res["metrics"] = metrics
    return res


def summarise(runs: list[dict[str, Any]], arms: list[str]) -> dict[str, Any]:
    """Per set: each arm's mean ± std, and for each arm with texts its step ratio against the defaults,
    its zero-shot scales and the best of them (`best_scale`; `arms`, `step_ratio`, `zero_shot_scales` and
    `best_scale` keyed by arm name)."""
    out: dict[str, Any] = {}
    for set_name in dict.fromkeys(r["set"] for r in runs):
        per: dict[str, Any] = {"arms": {}, "step_ratio": {}, "zero_shot_scales": {}, "best_scale": {}}
        for arm in arms:
            rs = [r for r in runs if r["set"] == set_name and r["arm"] == arm]
            if not rs:
                continue
            s: dict[str, Any] = {}
            for key in SHOWN:
                vals = [r["metrics"].get(key, r.get(key)) for r in rs]
                vals = [float(v) for v in vals if v is not None]
                if vals:
                    s[key] = _stats(vals)
            per["arms"][arm] = s
            scaled = [r["zero_shot_scales"] for r in rs if r.get("zero_shot_scales")]
            if scaled:
                keys = SCALED
                per["zero_shot_scales"][arm] = [
                    {"a": row["a"], "b": row["b"],
                     **{k: _stats([float(r[i][k]) for r in scaled]) for k in keys}}
                    for i, row in enumerate(scaled[0])]
            base = per["arms"].get(DEFAULTS, {})
            if scaled and base:
                per["best_scale"][arm] = best_scale(per["zero_shot_scales"][arm], base)
            if arm != DEFAULTS and "examples_per_s" in base and "examples_per_s" in s:
                per["step_ratio"][arm] = base["examples_per_s"]["mean"] / s["examples_per_s"]["mean"]
        out[set_name] = per
    return out


def _cell(s: dict[str, Any], key: str) -> str:
    if key not in s:
        return "–"
    m, sd = s[key]["mean"], s[key]["std"]
    if key.endswith("_s") or key == "examples_per_s":
        return f"{m:,.1f} ± {sd:,.1f}"
    return f"{m:.4f} ± {sd:.4f}"


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# Label texts: `ovex train` defaults vs defaults + `--label-texts`",
        "",
        f"Command: `{result['command']}`  ",
        f"Commit {result['commit'][:12]}{' (dirty)' if result['dirty'] else ''}, {result['date']}; "
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']:.1f} GiB; torch {result['torch']}; load average "
        f"before {result['loadavg_before'][0]:.2f}, after {result['loadavg_after'][0]:.2f}.  ",
        f"Seeds {result['seeds']}: mean ± sample std. Tail = labels with 1–{TAIL_MAX} training rows. "
        "Unseen hit@5: test rows with a label no training row has, share whose top 5 holds one of them. "
        "Bibtex and Corel5k rows are rendered as the names of their features (see bench/label_texts.py); "
        "their figures are not those of the XC files in real.md."
        + (f" Before the timed runs one untimed `ovex train` of a small planted set "
           f"({result['warmup_s']:.1f} s) compiled ovex's numba kernels into their cache."
           if "warmup_s" in result else ""),
        "",
    ]
    for set_name, per in result["summary"].items():
        lines += [f"## {set_name}", "", "| arm | " + " | ".join(SHOWN) + " |",
                  "|---" * (len(SHOWN) + 1) + "|"]
        for arm, stats in per["arms"].items():
            lines.append(f"| {arm} | " + " | ".join(_cell(stats, k) for k in SHOWN) + " |")
        for arm, ratio in per["step_ratio"].items():
            lines += ["", f"Step time ratio ({arm} / defaults): {ratio:.2f}×"]
        for arm, rows in per["zero_shot_scales"].items():
            lines += ["", "Text-only labels rescaled after training (norm × a, bias + b; a = 1, b = 0 is the "
                      f"model as trained, a = 0 leaves them out), the {arm} arm's models:", "",
                      "| a | b | p@1 | p@5 | psp@5 | unseen_hit@5 |", "|---|---|---|---|---|---|"]
            for row in rows:
                lines.append(f"| {row['a']:g} | {row['b']:g} | "
                             + " | ".join(_cell(row, k) for k in SCALED) + " |")
            if arm in per.get("best_scale", {}):
                best = per["best_scale"][arm]
                lines += ["", "Highest unseen hit@5 with P@1 and P@5 at least the defaults' without texts: "
                          + (f"a = {best['a']:g}, b = {best['b']:g} (hit {best['unseen_hit@5']['mean']:.4f}, "
                             f"P@1 {best['p@1']['mean']:.4f}, P@5 {best['p@5']['mean']:.4f})."
                             if best else "none of the grid.")]
        lines.append("")
    for note in result.get("notes", []):
        lines.append(f"- {note}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=(*SETS, "wordnet-valid"))
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--extra", default="", help="more `ovex train` flags for the label-texts arm")
    ap.add_argument("--also", action="append", default=[], metavar="FLAGS",
                    help="one more arm with label texts: the label-texts arm's flags and these after them")
    ap.add_argument("--out", type=Path, default=RESULTS / "label_texts")
    ap.add_argument("--zero-shot-scales", action="store_true",
                    help="also score the label-texts models with their text-only labels rescaled (SCALES)")
    args = ap.parse_args()
    extra = shlex.split(args.extra)
    # (name, flags): None trains without label texts
    arms: list[tuple[str, list[str] | None]] = [(a, None if a == DEFAULTS else extra) for a in args.arms]
    arms += [(f"{TEXTS} {also}", [*extra, *shlex.split(also)]) for also in args.also]
    runs: list[dict[str, Any]] = []
    st = stamp()
    result: dict[str, Any] = {
        **finish(st),
        "seeds": args.seeds,
        "extra": extra,
        "runs": runs,
        "summary": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # as real.py: no seed's step rate pays alone for compiling the numba kernels on a fresh checkout
    result["warmup_s"] = warm_ovex()
    print(f"warm-up (untimed) ovex train: {result['warmup_s']:.1f}s", flush=True)
    for set_name in args.sets:
        for seed in args.seeds:
            for arm, flags in arms:
                with tempfile.TemporaryDirectory(prefix="ovex-label-texts-") as tmp:
                    t0 = time.perf_counter()
                    row = {"set": set_name, "arm": arm, "seed": seed,
                           **run(set_name, flags, seed, args.data_dir, Path(tmp),
                                 scales=args.zero_shot_scales)}
                    row["bench_s"] = time.perf_counter() - t0
                runs.append(row)
                mt = row["metrics"]
                print(f"{set_name:8s} {arm} seed {seed} p@1 {mt['p@1']:.4f} p@5 {mt['p@5']:.4f} "
                      f"unseen {mt['unseen_hit@5']} tail@5 {mt['tail_p@5']} "
                      f"train {row['train_wall_s']:.1f}s {row['examples_per_s']:.0f} ex/s", flush=True)
                result["summary"] = summarise(runs, [a for a, _ in arms])
                write_results(args.out, result, st, markdown)
    print(markdown(result))


if __name__ == "__main__":
    main()
