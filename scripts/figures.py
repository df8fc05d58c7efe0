"""The README's headline figures, written from the results JSON, never copied by hand.

    .venv/bin/python scripts/figures.py          # exit 1, showing the difference, if README.md is not current
    .venv/bin/python scripts/figures.py --write  # rewrite the generated blocks of README.md

Each generated block sits between `<!-- figures:NAME -->` and `<!-- /figures:NAME -->`. Every line takes
all its numbers from one row of one results file (one set of a run, one cell of a serving table), names
that row, and says whether a target it is held to was met.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.params import TrainParams  # noqa: E402

RESULTS = ROOT / "bench" / "results"
README = ROOT / "README.md"


def load(name: str, results: Path = RESULTS) -> Any:
    return json.loads((results / name).read_text())


def link(name: str, row: str = "") -> str:
    text = f"[`{name}`](bench/results/{name})"
    return f"{text}, {'rows' if ' and ' in row else 'row'} {row}" if row else text


def size(n: int) -> str:
    """10^6 for a power of ten, else the number written out."""
    text = str(n)
    return f"10^{len(text) - 1}" if text.strip("0") == "1" else f"{n:,}"


def width(dim: int) -> str:
    """d=512, saying so when it is the default a user gets."""
    return f"d={dim}" + (", the default" if dim == TrainParams().dim else "")


def verdict(value: float, bound: float, at_most: bool, unit: str = "") -> str:
    """`target ≤ 10 ms: met` or `...: missed`, so a missed target is said where its figure is."""
    met = value <= bound if at_most else value >= bound
    shown = f"{bound:,g}{unit}"
    return f"target {'≤' if at_most else '≥'} {shown}: {'met' if met else '**missed**'}"


# --------------------------------------------------------------------------------------------------
# the Results table: one line per headline


def real_set(name: str, shown: str, peers: bool, results: Path, note: str = "") -> tuple[str, str, str]:
    data = load("real.json", results)
    s = data["summary"][name]
    labels = next(r["n_train_labels"] for r in data["runs"] if r["set"] == name and r["status"] == "ok")
    seeds = s["ovex"]["ok"]

    def m(method: str, key: str) -> float:
        return float(s[method][key]["mean"])

    text = "real text, " if name.startswith("wordnet") else ""
    what = f"{shown} P@1 ({text}{labels:,} labels, {seeds} seeds{note})"
    fig = (f"ovex {m('ovex', 'p@1'):.4f}, omikuji {m('omikuji', 'p@1'):.4f}, "
           f"napkinXC PLT {m('napkinxc-plt', 'p@1'):.4f}")
    if peers:
        def side(key: str, title: str) -> str:
            a, o = m("ovex", key), m("omikuji", key)
            return f"{'ahead' if a > o else 'behind'} on {title} ({a:.4f} against {o:.4f})"

        ratio = m("ovex", "train_wall_s") / m("omikuji", "train_wall_s")
        fig += (f"; ovex {side('p@5', 'P@5')}, {side('psp@5', 'PSP@5')}; trained in {ratio:.2f}× "
                "omikuji's time")
    return what, fig, link("real.md", f"`{name}`")


def step_cost(results: Path) -> tuple[str, str, str]:
    rows = load("step_cost.json", results)["results"]
    rate = {(r["loss"], r["k"]): r["examples_per_cpu_s"] for r in rows}
    ks = sorted({r["k"] for r in rows})
    lo, hi = ks[0], ks[-1]
    fig = (f"ovex {rate[('ove', lo)]:,.0f} → {rate[('ove', hi)]:,.0f}; exact softmax "
           f"{rate[('softmax', lo)]:,.0f} → {rate[('softmax', hi)]:,.0f}")
    return (f"training examples per CPU-second, {size(lo)} → {size(hi)} labels", fig,
            link("step_cost.md", f"`{lo:,}` and `{hi:,}` (K)"))


def scale(results: Path) -> tuple[str, str, str]:
    r = load("scale.json", results)
    what = f"{size(r['labels'])} labels, {r['rows']:,} rows, {r['params']['epochs']} epochs"
    return what, f"P@1 {r['metrics']['p@1']:.4f}, trained in {r['train_seconds']:.0f} s", link("scale.md")


def distributed(results: Path) -> tuple[str, str, str]:
    key = "scale_600k_rows_4_epochs_dropout_0"
    s = load("distributed.json", results)[key]
    what = (f"10^7 labels on {s['ranks']} ranks (`--nproc-per-node {s['ranks']}`, d={s['dim']}, dropout 0, "
            f"{s['train_rows']:,} rows, {s['epochs']} epochs)")
    fig = (f"P@1 {s['metrics']['p@1']:.4f} against {s['most_frequent_p@1']:.4f} for always the most frequent "
           f"label; trained in {s['train_s']:.0f} s, served after a {s['serve_load_s']:.1f} s load")
    return what, fig, link("distributed.md", f"`{s['train_rows']:,} rows, {s['epochs']} epochs, dropout 0`")


def gpu(results: Path) -> tuple[str, str, str]:
    run, cpu = load("gpu.json", results), load("gpu_cpu.json", results)

    def speed(data: dict[str, Any], labels: int, batch: int = 256) -> dict[str, Any]:
        return next(s for s in data["speed"] if s["labels"] == labels and s["batch_size"] == batch
                    and s["requested"] == "auto" and not s.get("inline"))  # the default way a step runs

    one, big, huge = speed(run, 10**6), speed(run, 10**6, 8192), speed(run, 10**7)
    base = speed(cpu, 10**6)
    wn = next(w for w in run["wordnet"] if w["label"] == "defaults")
    wn_big = next(w for w in run["wordnet"] if w["label"] == "b8192 e56")
    wn_cpu = next(w for w in cpu["wordnet"] if w["label"] == "defaults")
    gpu_name = run["machine"].get("gpu", "GPU").replace("NVIDIA ", "")
    what = f"training on one GPU ({gpu_name}), planted data, d={one['dim']}, the default batch of 256"
    fig = (f"{one['examples_per_s']:,.0f} examples/s at 10^6 labels "
           f"({one['examples_per_s'] / base['examples_per_s']:.1f}× this CPU; the step is bound by the host "
           f"and kernel launches; target ≥ 500,000: missed), {big['examples_per_s']:,.0f} with batches of "
           f"8192; "
           f"a 10^7-label model in {huge['peak_device_bytes'] / 2**30:.1f} GiB; WordNet P@1 {wn['p@1']:.4f} "
           f"against {wn_cpu['p@1']:.4f} on the CPU, {wn['wall_s']:.1f} s against {wn_cpu['wall_s']:.1f} s "
           f"({wn_big['p@1']:.4f} in {wn_big['wall_s']:.1f} s with batches of 8192 and 56 epochs)")
    return what, fig, link("gpu.md")


def serve_cell(name: str, path: str, norm: str, conc: int, results: Path) -> dict[str, Any]:
    """One cell of a serving table, with its model's label count and width."""
    model = load(name, results)["models"][0]
    server = next(s for s in model["servers"] if s["path"] == path)
    cell = next(c for c in server["cells"] if c["normalization"] == norm and c["concurrency"] == conc)
    return {**cell, "labels": model["labels"], "dim": model["dim"]}


def serve_1e6(results: Path) -> tuple[str, str, str]:
    c = serve_cell("serve_load_trained_1e6.json", "int8", "sparsemax", 1, results)
    fig = (f"p50 {c['p50_ms']} ms, p99 {c['p99_ms']} ms ({verdict(c['p99_ms'], 10, True, ' ms')}); "
           f"certified exact {c['certified_exact_share']}")
    what = (f"serving a *trained* {size(c['labels'])}-label model ({width(c['dim'])}), one client, sparsemax "
            "answers (the default), int8 path")
    return what, fig, link("serve_load_trained_1e6.md", "`int8 \\| sparsemax \\| 1` (c = 1)")


def serve_1e6_workers(results: Path) -> tuple[str, str, str]:
    c = serve_cell("serve_load_trained_1e6_workers2.json", "int8", "sparsemax", 32, results)
    fig = f"{c['req_per_s']:,} requests/s ({verdict(c['req_per_s'], 1000, False)})"
    return ("the same model, 32 clients, `ovex serve --workers 2`", fig,
            link("serve_load_trained_1e6_workers2.md", "`int8 \\| sparsemax \\| 32` (c = 32)"))


def serve_1e5(results: Path) -> tuple[str, str, str]:
    c = serve_cell("serve_load_trained_1e5.json", "int8", "sparsemax", 1, results)
    fig = (f"p50 {c['p50_ms']} ms ({verdict(c['p50_ms'], 5, True, ' ms')}), p99 {c['p99_ms']} ms "
           f"({verdict(c['p99_ms'], 10, True, ' ms')}); every label's int8 code read per query")
    what = (f"serving a trained {size(c['labels'])}-label model ({width(c['dim'])}), one client, sparsemax "
            "answers")
    return what, fig, link("serve_load_trained_1e5.md", "`int8 \\| sparsemax \\| 1` (c = 1)")


def results_table(results: Path = RESULTS) -> str:
    rows = [
        real_set("wordnet", "WordNet", True, results),
        real_set("wordnet-texts", "WordNet with its label texts", True, results,
                 "; `--label-texts`, the peers given the texts as rows"),
        real_set("bibtex", "Bibtex", False, results),
        real_set("corel5k", "Corel5k", False, results),
        step_cost(results), scale(results), distributed(results), gpu(results),
        serve_1e6(results), serve_1e6_workers(results), serve_1e5(results),
    ]
    lines = ["| what | figure | source |", "|---|---|---|"]
    lines += [f"| {what} | {fig} | {src} |" for what, fig, src in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# continual training: one line per target, the four sets of one file


# the sets `make bench` reruns (the 40,000-row synthetic set is a record: docs/continual.md)
CONTINUAL_SETS = ("bibtex", "corel5k", "synth")
CONTINUAL_NAMES = {"bibtex": "Bibtex", "corel5k": "Corel5k", "synth": "the synthetic set"}


def continual(results: Path = RESULTS) -> str:
    agg = load("continual.json", results)["aggregate"]

    def line(key: str, text: str, sign: bool) -> str:
        vals = [agg[s]["targets"][key] for s in CONTINUAL_SETS]
        shown = " / ".join(f"{v['mean']:+.4f}" if sign else f"{v['mean']:.4f}" for v in vals)
        missed = [CONTINUAL_NAMES[s] for s, v in zip(CONTINUAL_SETS, vals, strict=True) if v["met"] is False]
        target = vals[0]["target"].replace(">=", "≥").replace("<=", "≤")
        said = f"target {target}: **missed** on {' and '.join(missed)}" if missed else f"target {target}: met"
        return f"{text} {shown} ({said})"

    parts = [
        line("new_p@1_ratio", "new-label P@1", False) + " of the retrain's",
        line("old_p@1_delta_vs_base", "old-label P@1", True) + " against the base",
        line("all_p@1_delta_vs_full", "overall P@1", True) + " against the retrain",
        line("time_ratio", "wall time", False) + " of the retrain's",
    ]
    seeds = len({r["seed"] for r in load("continual.json", results)["runs"] if r["set"] in CONTINUAL_SETS})
    return textwrap.fill(
        f"Against a full retrain ({seeds} seeds, Bibtex / Corel5k / synthetic 10^5 labels with 10,000 rows; "
        "each set's rows `new_p@1_ratio`, `old_p@1_delta_vs_base`, `all_p@1_delta_vs_full` "
        "and `time_ratio` of `bench/results/continual.md`): " + "; ".join(parts) + ".", width=108,
        break_on_hyphens=False)


def data(results: Path = RESULTS) -> str:
    r = load("data_read.json", results)
    made = "; ".join(f"{size(g['labels'])} labels × {g['rows']:,} rows in {g['cpu_s']} CPU-seconds"
                     for g in load("synth_scale.json", results)["rows"])
    return wrap(f"Measured: an XC file of {r['rows']:,} rows × {r['nnz_per_row']:.2f} non-zeros "
                f"({r['file_mb']} MB of text) is read in {r['read_cpu_seconds']:.3f} CPU-seconds with a "
                f"{r['read_peak_rss_mb']} MB peak for {r['csr_mb']} MB of CSR "
                "([`data_read.md`](bench/results/data_read.md), `bench/read_speed.py`); `ovex synth` "
                "generates "
                f"{made} ([`synth_scale.md`](bench/results/synth_scale.md), `bench/synth_scale.py`).")


def workers(results: Path = RESULTS) -> str:
    r = load("serve_workers.json", results)
    ratio, model = r["ratios"], r["model"]
    return wrap(f"On a trained {size(model['labels'])}-label model (d = {model['dim']}) two workers of "
                f"`ovex serve --workers 2` hold {ratio['group_unique_two_over_one']}x the memory of one "
                "(distinct resident pages of the whole group) and answer "
                f"{ratio['req_per_s_c32_two_over_one']}x its req/s at concurrency 32 "
                "(`bench/results/serve_workers.md`; 1.179x and 1.81x at 2·10^5 labels in an earlier run, "
                "`bench/results/serve_workers_200k.md@70608af`).")


def add_labels(results: Path = RESULTS) -> str:
    r = load("add_labels.json", results)
    before, after = r["certified_share_before"], r["certified_share_after"]
    certified = (f"{before} of the answers were certified before and after" if before == after else
                 f"{before} of the answers were certified before, {after} after")
    return wrap(f"On a served model of {r['labels_before']:,} labels (d = {r['dim']}, int8 path), adding "
                f"{r['labels_added']:,} labels by text took {r['post_to_answer_s']} s from the POST to the "
                f"new version answering ({r['rebuild_from_scratch_s']} s would have gone on building its "
                f"int8 index from scratch alone); {certified}, and P@5 on the old labels was "
                f"{r['old_labels']['p_at_5_before']} before and {r['old_labels']['p_at_5_after']} after "
                "(`bench/results/add_labels.md`).")


def hostile(results: Path = RESULTS) -> str:
    r = load("hostile.json", results)["report"]
    kinds = (("server_errors", "answered 5xx"), ("dropped", "dropped"),
             ("bad_bodies", "with a wrong error body"), ("unusable_after", "leaving the connection unusable"))
    faults = [f"{len(r[k]) if isinstance(r[k], list) else r[k]} {what}" for k, what in kinds if r[k]]
    outcome = "none was answered 5xx or dropped" if not faults else "; ".join(faults) + " (**failed**)"
    return wrap(f"`bench/hostile.py` sends {r['cases']} wrong, hostile or odd requests to a live server, "
                "each followed by a good one on the same connection, while `/healthz` is timed on another: "
                f"{outcome}, and `/healthz` waited at most {r['healthz_max_ms_while_refusing']} ms while a "
                "request was being refused (`bench/results/hostile.md`).")


def wrap(text: str) -> str:
    return textwrap.fill(text, width=108, break_on_hyphens=False, break_long_words=False)


BLOCKS: dict[str, Callable[[Path], str]] = {"results": results_table, "continual": continual, "data": data,
                                            "workers": workers, "add_labels": add_labels, "hostile": hostile}


def render(text: str, results: Path = RESULTS) -> str:
    """`text` with every generated block written anew from the results files."""
    for name, make in BLOCKS.items():
        pattern = re.compile(rf"(<!-- figures:{name} -->\n).*?(\n?<!-- /figures:{name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no `<!-- figures:{name} -->` block")
        body = make(results)
        text = pattern.sub(lambda m, body=body: m[1] + body + "\n" + m[2].lstrip("\n"), text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="rewrite README.md's generated blocks")
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    old = README.read_text()
    new = render(old, args.results)
    if args.write:  # the figures that moved, before and after
        moved = [ln for ln in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
                 if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
        print("\n".join(moved) if moved else "README.md: no figure moved")
        README.write_text(new)
        return 0
    if new != old:
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "README.md",
                                                   "generated"))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
