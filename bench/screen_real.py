"""Screens around the defaults on WordNet: one lever changed at a time, one seed, scored on the test split.

What `docs/training.md` cites for the levers tried on real text (kept or lost). Each row trains with
`trainer.train.train` on the JSONL set (the featurizer `ovex train` fits), evaluates once at the end and
records P@1/3/5, PSP@5, wall and CPU seconds. Rows are default `TrainParams` with the named fields changed,
plus three levers that need code the trainer does not have, patched in here for the screen only:

* `char-affixes`: each word of 5+ letters also gives its 3-5 letter prefixes and suffixes as terms;
* `wordllama`: the mean of the `wordllama` wheel's 256-d token vectors of the text (the vectors ship inside
  the package, read with `tokenizers` and `safetensors`; nothing is downloaded), appended as dense columns;
* `in-batch-group`: the `ove` loss plus one exact group over the labels positive for other rows of the
  batch (log(1 + Σ_{j ∈ S \\ P_b} e^{f_j − f_y}) per positive): still a bound, since that term is ≥ 0.

    .venv/bin/python bench/screen_real.py [--rows base ngrams=1 ...] [--data-dir ../shared/data]
        [--out bench/results/real_screens] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from real import _git, _version, machine  # noqa: E402

# name -> TrainParams fields changed from the defaults
ROWS: dict[str, dict[str, Any]] = {
    "base": {},
    "base-seed1": {"seed": 1},
    "ngrams=1": {"ngrams": 1},
    "min_df=1": {"min_df": 1},
    "group_size=128": {"group_size": 128},
    "negatives=2048,group_size=1024": {"negatives": 2048, "group_size": 1024},
    "dim=256": {"dim": 256},
    "dim=768": {"dim": 768},
    "dropout=0.3": {"dropout": 0.3},
    "epochs=5": {"epochs": 5},
    "epochs=10": {"epochs": 10},
    "lr=0.005": {"lr": 0.005},
    "lr=0.02": {"lr": 0.02},
    "batch_size=1024": {"batch_size": 1024},
    "maxout,hidden=1": {"encoder": "maxout", "hidden": 1},
    "softmax": {"loss": "softmax"},
    "char-affixes": {},
    "wordllama": {},
    "in-batch-group": {},
}
PATCHED = ("char-affixes", "wordllama", "in-batch-group")
RESULTS = ROOT / "bench" / "results"


# ------------------------------------------------------------------------------------ patched levers


def _char_affixes() -> None:
    import trainer.featurize as featurize

    plain = featurize.tokenize

    def tokenize(text: str, ngrams: int = 1) -> list[str]:
        toks = plain(text, ngrams)
        words = featurize._TOKEN_RE.findall(text.lower())
        for w in words:
            if len(w) >= 5:
                toks += [f"<{w[:k]}" for k in (3, 4, 5) if k < len(w)]
                toks += [f"{w[-k:]}>" for k in (3, 4, 5) if k < len(w)]
        return toks

    featurize.tokenize = tokenize


def _wordllama() -> None:
    import numpy as np
    import scipy.sparse as sp
    import wordllama
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    from trainer.featurize import Featurizer

    where = Path(wordllama.__file__).parent
    table = load_file(str(where / "weights" / "l2_supercat_256.safetensors"))["embedding.weight"]
    table = table.astype(np.float32)
    tok = Tokenizer.from_file(str(where / "tokenizers" / "l2_supercat_tokenizer_config.json"))
    width = table.shape[1]

    def embed(texts: list[str]) -> Any:
        out = np.zeros((len(texts), width), np.float32)
        for i, enc in enumerate(tok.encode_batch(texts)):
            ids = [t for t in enc.ids if t > 2]  # 0-2: padding and sequence markers
            if ids:
                v = table[ids].mean(0)
                out[i] = v / (np.linalg.norm(v) + 1e-9)
        return out

    transform = Featurizer.transform

    def with_vectors(self: Featurizer, ds: Any, *args: Any, **kwargs: Any) -> Any:
        x = sp.csr_matrix(transform(self, ds, *args, **kwargs))
        return sp.hstack([x, sp.csr_matrix(embed(list(ds.texts)))], format="csr", dtype=np.float32)

    Featurizer.transform = with_vectors  # type: ignore[method-assign]
    Featurizer.n_features = property(lambda self: self._n_features + width)  # type: ignore[method-assign]


def _in_batch_group() -> str:
    import torch

    import trainer.losses as losses

    def loss(batch: losses.CandidateBatch) -> torch.Tensor:
        c = batch.cand
        base = losses.ove_loss(batch)
        cols = torch.nonzero(c.in_batch_pos).squeeze(1)
        if cols.numel() == 0 or c.pos_rows.numel() == 0:
            return base
        own = c.pos_mask.index_select(1, cols).index_select(0, c.pos_rows)
        z = batch.scores.index_select(1, cols).index_select(0, c.pos_rows)
        z = (z - batch.positive_scores().unsqueeze(1)).masked_fill(own, -math.inf)
        term = torch.logsumexp(torch.cat([z.new_zeros(z.shape[0], 1), z], 1), 1)
        return base + term @ losses.pair_weights(c, z.dtype)

    losses.register_loss("ove-in-batch", losses.LossSpec(loss, grouped=True))
    return "ove-in-batch"


PATCHES: dict[str, Callable[[], Any]] = {"char-affixes": _char_affixes, "wordllama": _wordllama,
                                         "in-batch-group": _in_batch_group}


# ------------------------------------------------------------------------------------ one row


def run_row(name: str, data_dir: Path) -> dict[str, Any]:
    """Train and score one row in this process."""
    import torch

    from trainer.data import read_dataset
    from trainer.hooks import QuietHooks
    from trainer.params import TrainParams
    from trainer.train import train

    fields = dict(ROWS[name])
    if name in PATCHED:
        loss = PATCHES[name]()
        if isinstance(loss, str):
            fields["loss"] = loss
    tr = read_dataset(data_dir / "wordnet_train.jsonl")
    te = read_dataset(data_dir / "wordnet_test.jsonl")
    params = TrainParams(**{**fields, "eval_every": 0})
    w0, c0 = time.perf_counter(), time.process_time()
    result = train(params, tr, te, out_dir=None, hooks=QuietHooks())
    m = result.metrics
    return {"row": name, "changed": ROWS[name], "patched": name in PATCHED,
            **{k: m[k] for k in ("p@1", "p@3", "p@5", "psp@5")},
            "wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0,
            "threads": torch.get_num_threads()}


# ------------------------------------------------------------------------------------ driver


def markdown(result: dict[str, Any]) -> str:
    rows = {r["row"]: r for r in result["rows"]}
    base = rows.get("base")
    lines = [
        "# Screens around the defaults on WordNet",
        "",
        f"Command: `{' '.join(result['command'])}`  ",
        f"Commit {result['commit'][:12]}{' (dirty)' if result['dirty'] else ''}, {result['date']}; "
        f"{result['machine']['cpu']}, {result['machine']['cores']} cores; torch {result['torch']}; "
        f"load average before {result['loadavg_before'][0]:.2f}, after {result['loadavg_after'][0]:.2f}; "
        f"{result['jobs']} rows at a time, so times compare only roughly.  ",
        "One seed (0 unless named), default `TrainParams` with the named change, scored once on the test "
        "split; the three patched rows are levers the trainer does not have (see the script's docstring).",
        "",
        "| row | P@1 | P@1 − base | P@3 | P@5 | PSP@5 | wall s | CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['row']} | {r['error']} |" + " |" * 6)
            continue
        delta = f"{r['p@1'] - base['p@1']:+.4f}" if base and "p@1" in base else "–"
        lines.append(f"| {r['row']} | {r['p@1']:.4f} | {delta} | {r['p@3']:.4f} | {r['p@5']:.4f} | "
                     f"{r['psp@5']:.4f} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--out", type=Path, default=RESULTS / "real_screens")
    ap.add_argument("--jobs", type=int, default=2, help="rows trained at the same time")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:  # a child: one row, its JSON on stdout
        print(json.dumps(run_row(args.one, args.data_dir)))
        return

    result: dict[str, Any] = {
        "command": [sys.executable, *sys.argv], "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain")), "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(), "loadavg_before": list(os.getloadavg()), "torch": _version("torch"),
        "jobs": args.jobs, "rows": [],
    }
    pending = list(args.rows)
    running: list[tuple[str, subprocess.Popen[str]]] = []
    done: dict[str, dict[str, Any]] = {}
    while pending or running:
        while pending and len(running) < args.jobs:
            name = pending.pop(0)
            cmd = [sys.executable, __file__, "--one", name, "--data-dir", str(args.data_dir)]
            running.append((name, subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                                   stderr=subprocess.PIPE, text=True)))
        name, proc = running.pop(0)
        out, err = proc.communicate()
        if proc.returncode == 0:
            done[name] = json.loads(out.strip().splitlines()[-1])
        else:
            last = [ln for ln in err.splitlines() if ln.strip()] or ["(no output)"]
            done[name] = {"row": name, "error": f"failed: {last[-1][:200]}"}
        print(json.dumps(done[name]), flush=True)
        result["rows"] = [done[n] for n in args.rows if n in done]
        result["loadavg_after"] = list(os.getloadavg())
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
        args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
