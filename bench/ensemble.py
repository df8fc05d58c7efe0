"""Pairs of default models: does the sum of two `ovex train` models' scores beat one model, and by what?

For each set, seeds 0 .. 2·pairs−1 are trained with the defaults (`ovex train` as a subprocess, real.py's
`ovex_train`), each scored alone and each pair (0, 1), (2, 3), ... by the sum of its two models' scores.
Since the default encoder is linear, a pair is exactly one model twice as wide (the two input tables and
head rows side by side, the biases added): what an ensemble option would serve. Same scorer and label
space as real.py (`trainer.metrics.evaluate_topk`, test-only labels count as misses). A record of a
decision, not a figure of today's defaults: `make bench ONLY=ensemble`.

    .venv/bin/python bench/ensemble.py [--sets wordnet bibtex corel5k] [--pairs 3]
        [--out bench/results/ensemble]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from label_texts import _top  # noqa: E402
from real import K, _stats, load_set, ovex_train  # noqa: E402
from stamp import RESULTS, finish, stamp  # noqa: E402

from trainer import metrics as xc_metrics  # noqa: E402

SETS = ("wordnet", "bibtex", "corel5k")
SHOWN = ("p@1", "p@3", "p@5", "psp@5")
CHUNK = 2048  # test rows scored at a time: a chunk's [rows, K] scores of every member stay small


def top_of_sum(members: list[tuple[Any, np.ndarray]], to_shared: np.ndarray) -> np.ndarray:
    """The top K label ids (shared space) of the sum of the members' scores, row by row; each member is
    (model, its encoding of the test rows)."""
    out = []
    for s in range(0, members[0][1].shape[0], CHUNK):
        z = sum(h[s:s + CHUNK] @ m.head_weight.T + m.head_bias for m, h in members)
        out.append(_top(z, K)[0])
    return to_shared[np.concatenate(out)]


def run_set(set_name: str, pairs: int, data_dir: Path, work: Path) -> dict[str, Any]:
    from trainer.artifact import load_artifact

    b = load_set(set_name, data_dir)
    prop = xc_metrics.propensities(b.y_train)
    index = ({n: i for i, n in enumerate(b.names)} if set_name == "wordnet"
             else {str(i): i for i in range(b.n_train_labels)})
    models: list[tuple[Any, np.ndarray]] = []  # (model, its encoding of the test rows), one per seed
    walls = []
    for seed in range(2 * pairs):
        out = work / f"m{seed}"
        walls.append(ovex_train(b.train_path, out, seed, [], work / "train.log")["train_wall_s"])
        model = load_artifact(out)
        models.append((model, np.asarray(model.encode(model.featurizer.transform(b.test)))))
        print(f"{set_name} seed {seed}: {walls[-1]:.1f} s", flush=True)
    names = list(models[0][0].label_names)
    assert all(list(m.label_names) == names for m, _ in models)
    to_shared = np.array([index.get(n, -1) for n in names], dtype=np.int64)

    def scored(members: list[tuple[Any, np.ndarray]]) -> dict[str, float]:
        m = xc_metrics.evaluate_topk(top_of_sum(members, to_shared), b.y_test, prop)
        return {k: float(m[k]) for k in SHOWN}

    single = [scored([m]) for m in models]
    pair = [scored(models[i:i + 2]) for i in range(0, len(models), 2)]
    return {
        "single": {k: _stats([r[k] for r in single]) for k in SHOWN},
        "pair": {k: _stats([r[k] for r in pair]) for k in SHOWN},
        "runs": {"single": single, "pair": pair},
        "train_wall_s": _stats(walls),
    }


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# Pairs of default models (scores summed) against one default model",
        "",
        f"Command: `{result['command']}`  ",
        f"Commit {result['commit'][:12]}{' (dirty)' if result['dirty'] else ''}, {result['date']}; "
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']:.1f} GiB; torch {result['torch']}.  ",
        f"Seeds 0..{2 * result['pairs'] - 1}, each alone (single) and in pairs (0, 1), (2, 3), ... (pair): "
        "mean ± sample std. A pair costs two trainings: train wall is per model.",
        "",
        "| set | model | " + " | ".join(SHOWN) + " | train wall s per model |",
        "|---" * (len(SHOWN) + 3) + "|",
    ]
    for set_name, r in result["sets"].items():
        wall = f"{r['train_wall_s']['mean']:.1f} ± {r['train_wall_s']['std']:.1f}"
        for kind in ("single", "pair"):
            cells = " | ".join(f"{r[kind][k]['mean']:.4f} ± {r[kind][k]['std']:.4f}" for k in SHOWN)
            lines.append(f"| {set_name} | {kind} | {cells} | {wall} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS / "ensemble")
    args = ap.parse_args()
    st = stamp()
    result: dict[str, Any] = {**finish(st), "pairs": args.pairs, "sets": {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for set_name in args.sets:
        with tempfile.TemporaryDirectory(prefix="ovex-ensemble-") as tmp:
            result["sets"][set_name] = run_set(set_name, args.pairs, args.data_dir, Path(tmp))
        result.update(finish(st))
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
        args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
