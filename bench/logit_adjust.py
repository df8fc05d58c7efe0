"""`--logit-adjust τ` (the saved biases plus τ·log of each label's training rows) beside the defaults.

For each set and seed one model is trained by `ovex train` with the defaults but no shift (`--logit-adjust
0`, through real.py's `run_ovex`) and its test rows are scored again with every τ of the grid applied to its
biases, exactly what `--logit-adjust τ` saves (the shift does not touch training:
tests/test_logit_adjust.py checks that the weights are the same to the bit). For seed 0 one more model is
trained through `ovex train --logit-adjust` itself, and its P@1 is shown beside the rescored one. One
scorer and label space as real.py; test-only labels count as misses. The record of the default's choice:
`make bench ONLY=logit_adjust`.

    .venv/bin/python bench/logit_adjust.py [--sets wordnet bibtex corel5k synth-1e5] [--seeds 0 1 2]
        [--taus 0 -0.1 ...] [--held-out F] [--out bench/results/logit_adjust]

`--held-out F` asks instead whether τ chosen per set, on a share F of the training rows held out, beats the
one default: `--out bench/results/logit_adjust_held_out`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from real import BUCKETS, K, _stats, load_set, run_ovex, tail_metrics  # noqa: E402
from stamp import RESULTS, finish, markdown_line, mean_std, stamp, write_results  # noqa: E402

from trainer import metrics as xc_metrics  # noqa: E402
from trainer.logit_adjust import bias_shift  # noqa: E402
from trainer.params import TrainParams  # noqa: E402

# the sets a rescore reads as trained: without label texts, whose models leave an input's twins out
SETS = ("wordnet", "bibtex", "corel5k", "synth-1e5")
TAUS = (0.0, -0.05, -0.1, -0.15, -0.2, -0.3, -0.4, 0.1)
CHECK_TAU = -0.3  # trained through `ovex train --logit-adjust` for seed 0
SHOWN = ("p@1", "p@5", "psp@5", *(f"p@1[{b}]" for b, _, _ in BUCKETS))


def rescored(model: Any, x: Any, to_shared: np.ndarray, taus: tuple[float, ...]) -> dict[float, np.ndarray]:
    """Top-K ids in the shared space for each τ: the model's scores with its biases shifted by τ·log n_k."""
    h = model.encode(x)
    w, b = model.head_weight, model.head_bias
    shifts = {t: bias_shift(np.asarray(model.label_counts), t) for t in taus}
    tops: dict[float, list[np.ndarray]] = {t: [] for t in taus}
    for s in range(0, h.shape[0], 2048):
        base = h[s:s + 2048] @ w.T + b
        for t in taus:
            scores = base + shifts[t]
            idx = np.argpartition(-scores, K - 1, axis=1)[:, :K]
            idx = np.take_along_axis(idx, np.argsort(-np.take_along_axis(scores, idx, 1), 1), 1)
            tops[t].append(to_shared[idx])
    return {t: np.concatenate(v) for t, v in tops.items()}


def _metrics(top: np.ndarray, b: Any, prop: np.ndarray, counts: np.ndarray) -> dict[str, float]:
    m = dict(xc_metrics.evaluate_topk(top, b.y_test, prop))
    m.update({k: v for k, v in tail_metrics(top, b.y_test, counts).items() if k.startswith("p@1[")})
    return {k: float(m[k]) for k in SHOWN if m.get(k) is not None}


def run_set(set_name: str, seeds: list[int], taus: tuple[float, ...], data_dir: Path,
            work: Path) -> dict[str, Any]:
    from trainer.artifact import load_artifact

    b = load_set(set_name, data_dir)
    prop = xc_metrics.propensities(b.y_train)
    counts = np.asarray(b.y_train.sum(axis=0)).ravel()[: b.n_train_labels]
    index = {name: i for i, name in enumerate(b.names)}
    runs: dict[float, list[dict[str, float]]] = {t: [] for t in taus}
    check: dict[str, float] = {}
    for seed in seeds:
        res = run_ovex(b, set_name, "ovex", seed, ["--logit-adjust", "0"], work)
        model = load_artifact(work / "model")
        to_shared = _shared_ids(model, index)
        x = model.featurizer.transform(b.test)
        for t, top in rescored(model, x, to_shared, taus).items():
            runs[t].append(_metrics(top, b, prop, counts))
        shown = ", ".join(f"τ {t:+.2f} p@1 {runs[t][-1]['p@1']:.4f}" for t in taus)
        print(f"{set_name} seed {seed}: {shown}", flush=True)
        if seed == seeds[0]:
            trained = run_ovex(b, set_name, "ovex", seed, ["--logit-adjust", str(CHECK_TAU)], work)
            check = {"seed": seed, "tau": CHECK_TAU,
                     "p@1 trained": _metrics(trained["top"], b, prop, counts)["p@1"],
                     "p@1 rescored": runs[CHECK_TAU][-1]["p@1"] if CHECK_TAU in runs else float("nan"),
                     "p@1 unshifted": _metrics(res["top"], b, prop, counts)["p@1"]}
    return {"taus": {str(t): {k: _stats([r[k] for r in rs if k in r]) for k in SHOWN if k in rs[0]}
                     for t, rs in runs.items()},
            "runs": {str(t): rs for t, rs in runs.items()}, "check": check}


HELD_OUT_KEYS = ("held out, τ chosen", "held out, τ 0", "all rows, τ 0", "all rows, default τ")


def _shared_ids(model: Any, index: dict[str, int]) -> np.ndarray:
    """The shared label space's id of each of the model's labels (-1 where it has none)."""
    return np.array([index.get(n, -1) for n in model.label_names], dtype=np.int64)


def _p1_by_tau(model: Any, x: Any, y: Any, to_shared: np.ndarray, grid: tuple[float, ...],
               prop: np.ndarray) -> dict[float, float]:
    return {t: float(xc_metrics.evaluate_topk(top, y, prop)["p@1"])
            for t, top in rescored(model, x, to_shared, grid).items()}


def held_out_choice(set_name: str, seeds: list[int], taus: tuple[float, ...], fraction: float,
                    data_dir: Path, work: Path) -> dict[str, Any]:
    """τ chosen per set on a held-out share of the training rows (`--valid-fraction`), against one τ for
    every set: each seed trains once on the fit share and once on all rows, both unshifted, and both are
    rescored over the grid. The chosen τ maximizes P@1 on the held-out rows (the smallest |τ| of a tie)."""
    from trainer.artifact import load_artifact
    from trainer.train import split_validation

    b = load_set(set_name, data_dir)
    prop = xc_metrics.propensities(b.y_train)
    index = {name: i for i, name in enumerate(b.names)}
    default = TrainParams().logit_shift(label_texts=False)
    grid = tuple(sorted({*taus, default, 0.0}, key=abs))
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        run_ovex(b, set_name, "ovex", seed, ["--logit-adjust", "0", "--valid-fraction", str(fraction)], work)
        model = load_artifact(work / "model")
        to_shared = _shared_ids(model, index)
        fit = _p1_by_tau(model, model.featurizer.transform(b.test), b.y_test, to_shared, grid, prop)
        _, held = split_validation(b.train.n_rows, fraction, seed)
        on_held = _p1_by_tau(model, model.featurizer.transform(b.train.take(held)), b.y_train[held],
                             to_shared, grid, prop)
        chosen = max(grid, key=lambda t: on_held[t])
        run_ovex(b, set_name, "ovex", seed, ["--logit-adjust", "0"], work)
        model = load_artifact(work / "model")
        to_shared = _shared_ids(model, index)
        every = _p1_by_tau(model, model.featurizer.transform(b.test), b.y_test, to_shared, grid, prop)
        row = dict(zip(HELD_OUT_KEYS, (fit[chosen], fit[0.0], every[0.0], every[default]), strict=True))
        print(f"{set_name} seed {seed}: held out, τ {chosen:+.2f} chosen: test p@1 {fit[chosen]:.4f}; all "
              f"rows, τ {default:+.2f}: {every[default]:.4f}", flush=True)
        rows.append({"seed": seed, "chosen": chosen, **row,
                     "held-out p@1": {str(t): v for t, v in on_held.items()}})
    return {"fraction": fraction, "default": default, "runs": rows,
            "summary": {k: _stats([r[k] for r in rows]) for k in HELD_OUT_KEYS}}


def markdown_held_out(result: dict[str, Any]) -> str:
    keys = HELD_OUT_KEYS
    lines = [
        "# `--logit-adjust τ` chosen per set on held-out training rows, against one τ for every set",
        "",
        markdown_line(result) + "  ",
        f"Seeds {result['seeds']}: test P@1, mean ± sample std. Held out: the model trained with "
        "`--valid-fraction` on the rest of the training rows, τ chosen by P@1 on the held-out rows; all "
        "rows: the model trained on every training row. Both unshifted, rescored with each τ.",
        "",
        "| set | held-out share | " + " | ".join(keys) + " | τ chosen by seed |",
        "|---" * (len(keys) + 3) + "|",
    ]
    for set_name, r in result["sets"].items():
        cells = " | ".join(mean_std(r["summary"][k]) for k in keys)
        chosen = ", ".join(f"{x['chosen']:+.2f}" for x in r["runs"])
        lines.append(f"| {set_name} | {r['fraction']:.2f} | {cells} | {chosen} |")
    lines += ["", f"The default τ is {TrainParams().logit_shift(label_texts=False):+.2f}."]
    return "\n".join(lines) + "\n"


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# `--logit-adjust τ`: unshifted models rescored with their biases shifted by τ·log(training rows)",
        "",
        markdown_line(result) + "  ",
        f"Seeds {result['seeds']}: mean ± sample std. τ = 0 is no shift (the default is "
        f"{TrainParams().logit_shift(label_texts=False):+.2f}, without label texts). Each seed's model is "
        "trained once by `ovex train` and rescored "
        "with every τ (the shift leaves training as it is). p@1[b]: P@1 over the test rows whose rarest "
        "label has b training rows.",
        "",
        "| set | τ | " + " | ".join(SHOWN) + " |",
        "|---" * (len(SHOWN) + 2) + "|",
    ]
    for set_name, r in result["sets"].items():
        for t, a in r["taus"].items():
            cells = " | ".join(mean_std(a[k]) if k in a else "–" for k in SHOWN)
            lines.append(f"| {set_name} | {float(t):+.2f} | {cells} |")
    lines += ["", "Through the entry point (`ovex train --logit-adjust`, one seed) beside the rescored one:",
              "", "| set | seed | τ | P@1 trained with the flag | P@1 rescored | P@1 unshifted |",
              "|---|---|---|---|---|---|"]
    for set_name, r in result["sets"].items():
        c = r["check"]
        if c:
            lines.append(f"| {set_name} | {c['seed']} | {c['tau']:+.2f} | {c['p@1 trained']:.4f} | "
                         f"{c['p@1 rescored']:.4f} | {c['p@1 unshifted']:.4f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--taus", nargs="+", type=float, default=list(TAUS))
    ap.add_argument("--held-out", type=float, default=0.0, metavar="F",
                    help="instead: choose τ per set on this share of the training rows held out")
    ap.add_argument("--out", type=Path, default=RESULTS / "logit_adjust")
    args = ap.parse_args()
    st = stamp()
    result: dict[str, Any] = {**finish(st), "seeds": args.seeds, "sets": {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    shown = markdown_held_out if args.held_out > 0 else markdown
    for set_name in args.sets:
        with tempfile.TemporaryDirectory(prefix="ovex-logit-adjust-") as tmp:
            taus, work = tuple(args.taus), Path(tmp)
            result["sets"][set_name] = (
                held_out_choice(set_name, args.seeds, taus, args.held_out, args.data_dir, work)
                if args.held_out > 0 else run_set(set_name, args.seeds, taus, args.data_dir, work))
        write_results(args.out, result, st, shown)
    print(shown(result))


if __name__ == "__main__":
    main()
