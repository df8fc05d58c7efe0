"""Writing a model's weights file: ovex's durable writer against the page-cache writers, side by side.

Writers, alternated within each repeat: `durable` (`trainer.durable.write_safetensors`: direct I/O where
the file system takes it, fsync), `page cache + fsync` (`safetensors.torch.save_file`, then fsync: the
same durability through the page cache) and `page cache` (`save_file` alone, what ovex wrote before: not
on disk when it returns). Tables of the default `dim` (512) at two label counts, Bibtex's (159 labels,
1,836 features) and the synthetic 10^5-label set's (50,000 features); the values do not matter to a write,
so they are random. Each write goes to a new file after a pause of `--pause` seconds, as a save comes
long after the last large free (this machine hands freed memory back to its host within about a second,
and first touching fresh memory is most of a page-cache write's cost here).

    .venv/bin/python bench/save_weights.py [--repeats 5] [--pause 3] [--dir /tmp]

Results: bench/results/save_weights.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from stamp import RESULTS, markdown_line, stamp, stamped  # noqa: E402

from trainer.durable import write_safetensors  # noqa: E402

SIZES = {"Bibtex (159 labels)": (159, 1_836), "synthetic (100,000 labels)": (100_000, 50_000)}
DIM = 512


def _page_cache_fsync(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    save_file(tensors, str(path))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


WRITERS: dict[str, Callable[[Path, dict[str, torch.Tensor]], object]] = {
    "durable": write_safetensors,
    "page cache + fsync": _page_cache_fsync,
    "page cache": lambda p, t: save_file(t, str(p)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pause", type=float, default=3.0)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the files are written (and removed)")
    args = ap.parse_args()
    st = stamp()
    out: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ovex-save-", dir=args.dir) as tmp:
        for size, (labels, features) in SIZES.items():
            g = torch.Generator().manual_seed(0)
            tensors = {"head": torch.randn(labels, DIM + 1, generator=g),
                       "input.weight": torch.randn(features, DIM, generator=g),
                       "input.bias": torch.zeros(DIM)}
            mb = sum(t.numel() * t.element_size() for t in tensors.values()) / 1e6
            times: dict[str, list[float]] = {w: [] for w in WRITERS}
            for r in range(args.repeats):
                order = list(WRITERS) if r % 2 == 0 else list(WRITERS)[::-1]
                for w in order:
                    path = Path(tmp) / f"w-{r}-{len(times[w])}.safetensors"
                    time.sleep(args.pause)
                    t0 = time.perf_counter()
                    WRITERS[w](path, tensors)
                    times[w].append(time.perf_counter() - t0)
                    path.unlink()
            out[f"{size}, {mb:.1f} MB"] = times
            print(size, {w: round(statistics.median(v), 4) for w, v in times.items()}, flush=True)
            del tensors
    meta = {"command": "python bench/save_weights.py " + " ".join(sys.argv[1:]),
            "machine": f"{platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}",
            "repeats": args.repeats, "pause_s": args.pause, "dir": "a temporary folder under " + args.dir}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "save_weights.json").write_text(
        json.dumps(stamped(st, {"meta": meta, "seconds": out}), indent=1))
    lines = ["# Writing a weights file: durable writer against page-cache writers", "", markdown_line(st), "",
             f"Command: `{meta['command']}`  ", f"Machine: {meta['machine']}; files in {meta['dir']}", "",
             "Median seconds per write (every write in the JSON); each write to a new file after a pause of "
             f"{args.pause:g} s.", "", "| tables | " + " | ".join(WRITERS) + " |",
             "|---|" + "---|" * len(WRITERS)]
    for size, times in out.items():
        cells = " | ".join(f"{statistics.median(times[w]):.4f}" for w in WRITERS)
        lines.append(f"| {size} | {cells} |")
    (RESULTS / "save_weights.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
