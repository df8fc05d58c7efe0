"""Every benchmark behind a figure in README.md or docs/*.md: how to rerun it, what it writes, and the code
it measures, so one command reruns them all on today's code and a stale result can be found.

    .venv/bin/python bench/suite.py plan [--quick]           # the commands and the expected time
    .venv/bin/python bench/suite.py run [--quick] [--only a,b] [--stale] [--results DIR]
    .venv/bin/python bench/suite.py stale                    # results older than the code they measure

`make bench` runs `run`; `QUICK=1` runs the small profile into a scratch directory (never over
bench/results), `STALE=1` only the benchmarks whose results are stale, `ONLY=a,b` the ones named.

A command is an argv after the interpreter; `{results}` is the results directory and `{work}` a scratch
directory kept for the run (trained models passed from one step to the next). A benchmark's expected time
is computed from the runs its results record that its full command still makes (`expected`, where the
file also holds runs the profile no longer makes), else the wall time its results last recorded (`wall_s`
of the stamp), else the estimate written here.

The full profile fits `BUDGET_S` (45 minutes) on this 2-core machine and reruns every benchmark whose
results README.md or docs/*.md cite, but the GPU's own rows (`bench/gpu.py` on a device machine, which
the full profile's `gpu_cpu` renders beside this CPU's). So bench/results holds what one `make bench`
wrote, and the last device run. The records of decisions (A/B runs, screens, profiles) run on demand
(`full=False`, `make bench ONLY=name`) and are cited in the docs from git history as `FILE@COMMIT`, as
are the parts a benchmark no longer runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from stamp import git  # noqa: E402

COMMITTED = ROOT / "bench" / "results"
TRAINER = ("trainer/",)
SERVING = ("trainer/", "service/")
CLI = ("trainer/", "service/cli.py", "service/serve.py")
BUDGET_S = 45 * 60  # the full profile's expected time on this 2-core machine, at most
DATA = str(ROOT.parent / "shared" / "data")
APART_TOWER = "--label-tower-mode apart --label-tower-detach"  # the apart, detached tower (the default)
NO_TEXT_ROWS = "--no-label-text-rows"  # the default tower without its labels' texts as training rows
# the defaults before text rows: each step's candidates' rows hold their texts (the tower joint, not detached)
JOINT_TOWER = ("--label-tower-mode joint --no-label-tower-detach --no-label-text-rows "
               "--label-tower-zero-bias 2 --label-tower-zero-scale 1")


@dataclass(frozen=True)
class Bench:
    """One benchmark: its steps (full and quick), the results files it writes, the code it measures."""

    name: str
    steps: tuple[tuple[str, ...], ...]
    quick: tuple[tuple[str, ...], ...]
    outputs: tuple[str, ...]  # file names under the results directory
    measures: tuple[str, ...]  # paths (files or folders) whose change makes the results stale
    estimate_s: float  # the full profile's wall time when no results file records one
    device: str = "cpu"  # "cuda": needs a GPU, never run by `make bench` here
    full: bool = True  # False: on demand only (ONLY=name), a decision's record rather than a figure of today
    # the full profile's seconds from the runs its results record that the full command still makes
    expected: Callable[[Path], float | None] | None = None

    def scripts(self) -> list[str]:
        return sorted({step[0] for step in (*self.steps, *self.quick)})


def _s(*argv: str) -> tuple[str, ...]:
    return argv


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# What the full profile runs of `bench/real.py`: the three real sets (WordNet also with its label texts,
# each peer given them as rows) and the planted 10^5-label set, ovex with its defaults against the peers
# and the popularity floor, 3 seeds: `bench/real.py`'s default sets, so a rerun rewrites real.md whole.
# Left out (cited as real.md@COMMIT): the extra `--precision bf16` row (a hand-picked setting) and
# `ovex-tfidf`.
REAL_SETS = ("wordnet", "wordnet-texts", "bibtex", "corel5k", "synth-1e5")
REAL_METHODS = ("ovex", "omikuji", "napkinxc-plt", "popularity")
# What the full profile runs of `bench/continual.py`: the base, the continual run and the full retrain on
# Bibtex, Corel5k and the 10,000-row synthetic set. Left out (cited as continual.md@COMMIT, rerun on
# demand by `continual_records`): the 40,000-row synthetic set and the variant rows, four fifths of the
# recorded time.
CONTINUAL_SETS = ("bibtex", "corel5k", "synth")
CONTINUAL_RUNS = ("base", "continual", "full")
# A set's recorded times are its `train` calls; building the set, scoring each model and starting the
# process come on top. The whole process against the kept runs' `train` calls, seed 0, on the shared
# machine: 1.36x on Corel5k, 1.41x on the synthetic set (both with the variants' scoring, so high).
CONTINUAL_UNTIMED = 1.4
# the seeds of `small_sets_seeds`: on Bibtex and Corel5k the mean of 3 seeds moves by up to a point
SMALL_SET_SEEDS = tuple(str(seed) for seed in range(20))
SERVE_1E5_REPEATS = 3
# the 10^5-label model's steps that its results do not time: writing the planted data, scoring the test
# rows, saving the artifact and building the int8 index (a guess: their parts are not recorded)
SERVE_1E5_UNTIMED_S = 60.0


def real_expected(results: Path) -> float | None:
    """Each kept run's own wall time (`run_wall_s`: its child process, data to scores)."""
    data = _json(results / "real.json")
    runs = data.get("runs", []) if isinstance(data, dict) else []
    return sum(r.get("run_wall_s") or 0.0 for r in runs
               if r.get("set") in REAL_SETS and r.get("method") in REAL_METHODS
               and r.get("label") == r.get("method")) or None


def continual_expected(results: Path) -> float | None:
    """The kept runs' timed `train` calls (every repeat), times what the untimed steps add."""
    data = _json(results / "continual.json")
    timed = sum(sum(r.get("wall_s_each") or [r.get("wall_s") or 0.0])
                for row in (data.get("runs", []) if isinstance(data, dict) else [])
                if row.get("set") in CONTINUAL_SETS
                for name, r in row.get("runs", {}).items() if name in CONTINUAL_RUNS)
    return timed * CONTINUAL_UNTIMED or None


def serve_1e5_expected(results: Path) -> float | None:
    """Training the model, then the int8 path's concurrency-1 cells, each run SERVE_1E5_REPEATS times."""
    data = _json(results / "serve_load_trained_1e5.json")
    try:
        model = data["models"][0]
        server = next(s for s in model["servers"] if s["path"] == "int8")
        cells = sum(c["seconds"] for c in server["cells"] if c["concurrency"] == 1)
        return (float(model["train"]["train_seconds"]) + server["ready_seconds"]
                + SERVE_1E5_REPEATS * cells + SERVE_1E5_UNTIMED_S)
    except (TypeError, KeyError, IndexError, StopIteration):
        return None


BENCHES: tuple[Bench, ...] = (
    Bench("real", steps=(_s("bench/real.py", "--sets", *REAL_SETS, "--methods", *REAL_METHODS,
                            "--out", "{results}/real"),),
          quick=(_s("bench/real.py", "--sets", "bibtex", "--methods", "ovex", "popularity", "--seeds", "0",
                    "--out", "{results}/real"),),
          outputs=("real.json", "real.md"), measures=(*CLI, "bench/real.py"), estimate_s=470,
          expected=real_expected),
    Bench("step_cost", steps=(_s("bench/step_cost.py", "--out", "{results}/step_cost"),),
          quick=(_s("bench/step_cost.py", "--ks", "1000,10000", "--rows", "2000", "--features", "5000",
                    "--seconds", "0.3", "--softmax-seconds", "0.3", "--out", "{results}/step_cost"),),
          outputs=("step_cost.json", "step_cost.md"), measures=(*TRAINER, "bench/step_cost.py"),
          estimate_s=150),
    # one 10^6-label model: its training is the scale figure, then it is served
    Bench("scale_serve_1e6",
          steps=(_s("bench/scale.py", "--model-dir", "{work}/t1e6/1", "--out", "{results}/scale"),
                 _s("bench/serve_load.py", "--artifact", "{work}/t1e6/1", "--train-report",
                    "{results}/scale.json", "--work", "{work}/serve", "--out",
                    "{results}/serve_load_trained_1e6"),
                 _s("bench/serve_load.py", "--artifact", "{work}/t1e6/1", "--train-report",
                    "{results}/scale.json", "--paths", "int8", "--workers", "2", "--work", "{work}/serve",
                    "--out", "{results}/serve_load_trained_1e6_workers2")),
          quick=(_s("bench/scale.py", "--labels", "20000", "--features", "5000", "--rows", "5000",
                    "--test-rows", "200", "--epochs", "1", "--dim", "32", "--model-dir", "{work}/t1e6/1",
                    "--out", "{results}/scale"),
                 _s("bench/serve_load.py", "--artifact", "{work}/t1e6/1", "--train-report",
                    "{results}/scale.json", "--paths", "int8", "--concurrency", "1,8", "--cell-seconds",
                    "1", "--max-requests", "100", "--quick", "--work", "{work}/serve", "--out",
                    "{results}/serve_load_trained_1e6"),
                 _s("bench/serve_load.py", "--artifact", "{work}/t1e6/1", "--train-report",
                    "{results}/scale.json", "--paths", "int8", "--workers", "2", "--concurrency", "8",
                    "--cell-seconds", "1", "--max-requests", "100", "--quick", "--work", "{work}/serve",
                    "--out", "{results}/serve_load_trained_1e6_workers2")),
          outputs=("scale.json", "scale.md", "serve_load_trained_1e6.json", "serve_load_trained_1e6.md",
                   "serve_load_trained_1e6_workers2.json", "serve_load_trained_1e6_workers2.md"),
          measures=(*SERVING, "bench/scale.py", "bench/serve_load.py"), estimate_s=560),
    Bench("serve_1e5",
          steps=(_s("bench/scale.py", "--labels", "100000", "--rows", "100000", "--dim", "512", "--epochs",
                    "7", "--batch-size", "256", "--model-dir", "{work}/t1e5/1", "--out",
                    "{work}/serve_train_1e5"),
                 _s("bench/serve_load.py", "--artifact", "{work}/t1e5/1", "--train-report",
                    "{work}/serve_train_1e5.json", "--paths", "int8", "--concurrency", "1", "--repeats",
                    str(SERVE_1E5_REPEATS), "--work", "{work}/serve", "--out",
                    "{results}/serve_load_trained_1e5")),
          quick=(_s("bench/scale.py", "--labels", "5000", "--features", "5000", "--rows", "3000",
                    "--test-rows", "200", "--epochs", "1", "--dim", "64", "--model-dir", "{work}/t1e5/1",
                    "--out", "{work}/serve_train_1e5"),
                 _s("bench/serve_load.py", "--artifact", "{work}/t1e5/1", "--train-report",
                    "{work}/serve_train_1e5.json", "--paths", "exact,int8", "--concurrency", "1",
                    "--repeats", "2", "--cell-seconds", "1", "--max-requests", "100", "--quick", "--work",
                    "{work}/serve",
                    "--out", "{results}/serve_load_trained_1e5")),
          outputs=("serve_load_trained_1e5.json", "serve_load_trained_1e5.md"),
          measures=(*SERVING, "bench/scale.py", "bench/serve_load.py"), estimate_s=320,
          expected=serve_1e5_expected),
    Bench("continual",
          steps=(_s("bench/continual.py", "--sets", *CONTINUAL_SETS, "--variants"),),
          quick=(_s("bench/continual.py", "--sets", "bibtex", "--seeds", "0", "--repeats", "1",
                    "--variants"),),
          outputs=("continual.json", "continual.md"), measures=(*TRAINER, "bench/continual.py"),
          estimate_s=270, expected=continual_expected),
    Bench("data_read", steps=(_s("bench/read_speed.py", "--out", "{results}/data_read.json"),),
          quick=(_s("bench/read_speed.py", "--rows", "2000", "--labels", "1000", "--features", "1000",
                    "--repeats", "1", "--out", "{results}/data_read.json"),),
          outputs=("data_read.json", "data_read.md"),
          measures=("trainer/data.py", "trainer/synth.py", "bench/read_speed.py"), estimate_s=90),
    Bench("synth_scale", steps=(_s("bench/synth_scale.py", "--out", "{results}/synth_scale"),),
          quick=(_s("bench/synth_scale.py", "--labels", "1000", "--features", "500", "--rows", "1000,2000",
                    "--out", "{results}/synth_scale"),),
          outputs=("synth_scale.json", "synth_scale.md"),
          measures=("trainer/synth.py", "bench/synth_scale.py"), estimate_s=40),
    Bench("hostile", steps=(_s("bench/hostile.py", "--out", "{results}"),),
          quick=(_s("bench/hostile.py", "--out", "{results}"),),
          outputs=("hostile.json", "hostile.md"), measures=("service/", "bench/hostile.py"), estimate_s=90),
    Bench("add_labels",
          steps=(_s("bench/add_labels.py", "--labels", "100000", "--added", "1000", "--features", "50000",
                    "--rows", "50000", "--test-rows", "2000", "--dim", "512", "--out",
                    "{results}/add_labels"),),
          quick=(_s("bench/add_labels.py", "--labels", "2000", "--added", "20", "--features", "2000",
                    "--rows", "2000", "--test-rows", "100", "--dim", "32", "--no-compare-rebuild",
                    "--out", "{results}/add_labels"),),
          outputs=("add_labels.json", "add_labels.md"), measures=(*SERVING, "bench/add_labels.py"),
          estimate_s=380),
    Bench("serve_workers",
          steps=(_s("bench/serve_workers.py", "--work", "{work}/workers", "--out",
                    "{results}/serve_workers"),),
          quick=(_s("bench/serve_workers.py", "--labels", "2000", "--features", "1000", "--rows", "1000",
                    "--seconds", "1", "--work", "{work}/workers", "--out", "{results}/serve_workers"),),
          outputs=("serve_workers.json", "serve_workers.md"),
          measures=(*SERVING, "bench/serve_workers.py", "bench/serve_load.py"), estimate_s=240),
    Bench("gpu", steps=(_s("bench/gpu.py", "--device", "cuda", "--out", "{results}/gpu.json"),),
          quick=(), outputs=("gpu.json",), measures=(*TRAINER, "bench/gpu.py"), estimate_s=600,
          device="cuda"),
    # this CPU's rows of the GPU table (the same settings, but 10^7 labels, which do not fit here), then
    # gpu.md from both files
    Bench("gpu_cpu",
          steps=(_s("bench/gpu.py", "--device", "cpu", "--labels", "100000", "1000000", "--extra-batch",
                    "8192", "--extra-precision", "fp32", "--wordnet-runs", "defaults=", "--no-profile",
                    "--data", DATA, "--scratch", "{work}", "--out", "{results}/gpu_cpu.json"),
                 _s("bench/gpu.py", "--render", "{results}/gpu.json", "{results}/gpu_cpu.json")),
          quick=(_s("bench/gpu.py", "--device", "cpu", "--labels", "2000", "--rows", "2000", "--extra-batch",
                    "--extra-precision", "--wordnet-runs", "--no-profile", "--scratch", "{work}",
                    "--out", "{results}/gpu_cpu.json"),
                 _s("bench/gpu.py", "--render", "{results}/gpu_cpu.json")),
          outputs=("gpu_cpu.json", "gpu.md"), measures=(*TRAINER, "bench/gpu.py"), estimate_s=150),
    # the 10^7-label model on 2 ranks (training it is most of the time), and the traffic and throughput
    # against K behind docs/distributed.md
    Bench("distributed",
          steps=(_s("bench/distributed.py", "--part", "traffic"),
                 _s("bench/distributed.py", "--part", "throughput"),
                 _s("bench/distributed.py", "--part", "scale", "--train-rows", "600000", "--epochs", "4",
                    "--train-flags=--dropout 0", "--name", "600k_rows_4_epochs_dropout_0")),
          quick=(_s("bench/distributed.py", "--part", "traffic", "--ks", "1e4", "--steps", "3"),),
          outputs=("distributed.json", "distributed.md"),
          measures=(*CLI, "bench/distributed.py"), estimate_s=760),
    # an opt-in feature: `--label-texts` with the tower's defaults, and beside them the same without text rows
    # and the joint tower; on demand, so that the full profile fits its budget (docs cite its last run)
    Bench("label_texts",
          steps=(_s("bench/label_texts.py", f"--also={NO_TEXT_ROWS}", f"--also={JOINT_TOWER}",
                    "--zero-shot-scales", "--out", "{results}/label_texts"),),
          quick=(_s("bench/label_texts.py", "--sets", "bibtex", "--seeds", "0", "--arms", "label-texts",
                    "--out", "{results}/label_texts"),),
          outputs=("label_texts.json", "label_texts.md"), measures=(*CLI, "bench/label_texts.py"),
          estimate_s=1100, full=False),
    # the records of decisions: rerun on demand (ONLY=name), not by every `make bench`
    # continual learning's choices: the variant rows and the 40,000-row synthetic set (the full command
    # with every variant, into its own file), 10^6 labels, the old-label rows, direct-I/O saves
    Bench("continual_records",
          steps=(_s("bench/continual.py", "--sets", *CONTINUAL_SETS, "synth-40k", "--name",
                    "continual_records"),), quick=(),
          outputs=("continual_records.json", "continual_records.md"),
          measures=(*TRAINER, "bench/continual.py"), estimate_s=1100, full=False),
    Bench("continual_scale", steps=(_s("bench/continual_scale.py"),),
          quick=(_s("bench/continual_scale.py", "--labels", "20000", "--rows", "2000", "--repeats", "1"),),
          outputs=("continual_scale.json", "continual_scale.md"),
          measures=(*TRAINER, "bench/continual_scale.py", "bench/continual.py"), estimate_s=180, full=False),
    Bench("continual_old_rows", steps=(_s("bench/continual_old_rows.py"),),
          quick=(_s("bench/continual_old_rows.py", "--sets", "bibtex", "--seeds", "0"),),
          outputs=("continual_old_rows.json", "continual_old_rows.md"),
          measures=(*TRAINER, "bench/continual_old_rows.py", "bench/continual.py"), estimate_s=120,
          full=False),
    Bench("save_weights", steps=(_s("bench/save_weights.py"),),
          quick=(_s("bench/save_weights.py", "--repeats", "1", "--pause", "0"),),
          outputs=("save_weights.json", "save_weights.md"),
          measures=("trainer/durable.py", "bench/save_weights.py"), estimate_s=100, full=False),
    Bench("accuracy", steps=(_s("bench/accuracy.py", "--out", "{results}/accuracy"),), quick=(),
          outputs=("accuracy.json", "accuracy.md"), measures=(*TRAINER, "bench/accuracy.py"),
          estimate_s=1800, full=False),
    Bench("hard_negatives",
          steps=(_s("bench/real.py", "--sets", "wordnet", "--methods", "ovex", "--seeds", "0", "1", "2",
                    "--ovex-args=--hard-negatives 16", "--label", "ovex --hard-negatives 16",
                    "--out", "{results}/hard_negatives"),), quick=(),
          outputs=("hard_negatives.json", "hard_negatives.md"), measures=(*CLI, "bench/real.py"),
          estimate_s=1200, full=False),
    # a tighter bound than the default's (one group of 4096 sampled negatives), beside the defaults
    Bench("groups_4096",
          steps=(_s("bench/real.py", "--sets", "wordnet", "--methods", "ovex", "--seeds", "0", "1", "2",
                    "--ovex-args=--negatives 4096 --group-size 4096",
                    "--label", "ovex --negatives 4096 --group-size 4096", "--out", "{results}/groups_4096"),),
          quick=(), outputs=("groups_4096.json", "groups_4096.md"), measures=(*CLI, "bench/real.py"),
          estimate_s=280, full=False),
    # `--ensemble 2` beside the defaults and one model as wide (`--dim 1024`)
    Bench("ensemble",
          steps=(_s("bench/ensemble.py", "--out", "{results}/ensemble"),), quick=(),
          outputs=("ensemble.json", "ensemble.md"), measures=(*CLI, "bench/ensemble.py", "bench/real.py"),
          estimate_s=660, full=False),
    # the default `--lead-words 3`'s evidence: the text sets with and without the marked leading words, and
    # omikuji on the peers' features with the same marked words added
    Bench("lead_words",
          steps=(_s("bench/real.py", "--sets", "wordnet", "wordnet-texts", "--methods", "ovex", "omikuji",
                    "omikuji-lead", "--seeds", "0", "1", "2",
                    "--ovex-args=--lead-words 0", "--label", "ovex --lead-words 0 (the previous default)",
                    "--out", "{results}/lead_words"),),
          quick=(), outputs=("lead_words.json", "lead_words.md"),
          measures=(*CLI, "bench/real.py"), estimate_s=800, full=False),
    # the default `--logit-adjust τ`'s evidence: unshifted models rescored over a grid of τ
    Bench("logit_adjust",
          steps=(_s("bench/logit_adjust.py", "--out", "{results}/logit_adjust"),), quick=(),
          outputs=("logit_adjust.json", "logit_adjust.md"),
          measures=(*CLI, "bench/logit_adjust.py", "bench/real.py"), estimate_s=900, full=False),
    # τ chosen per set on held-out training rows, against the one default
    Bench("logit_adjust_held_out",
          steps=(_s("bench/logit_adjust.py", "--sets", "wordnet", "bibtex", "corel5k", "--held-out", "0.05",
                    "--out", "{results}/logit_adjust_held_out"),), quick=(),
          outputs=("logit_adjust_held_out.json", "logit_adjust_held_out.md"),
          measures=(*CLI, "bench/logit_adjust.py", "bench/real.py"), estimate_s=360, full=False),
    # the small sets over 20 seeds, where 3 seeds' means move by a point: today's defaults beside the
    # settings before the real-data round (groups of 128, unshifted) and omikuji; the τ grid on the same seeds
    Bench("small_sets_seeds",
          steps=(_s("bench/real.py", "--sets", "bibtex", "corel5k", "--methods", "ovex", "omikuji",
                    "--seeds", *SMALL_SET_SEEDS, "--ovex-args=--group-size 128 --logit-adjust 0",
                    "--label", "ovex, the settings before the real-data round (groups of 128, unshifted)",
                    "--out", "{results}/small_sets_seeds"),
                 _s("bench/logit_adjust.py", "--sets", "bibtex", "corel5k", "--seeds", *SMALL_SET_SEEDS,
                    "--out", "{results}/logit_adjust_seeds")), quick=(),
          outputs=("small_sets_seeds.json", "small_sets_seeds.md", "logit_adjust_seeds.json",
                   "logit_adjust_seeds.md"),
          measures=(*CLI, "bench/real.py", "bench/logit_adjust.py"), estimate_s=900, full=False),
    # the input table slowed by the run's length against the table at `lr`, on heads wide and narrow for
    # their labels: the 10^6-label planted set of `scale` (2 epochs, 128 wide), the planted 10^5-label
    # set, and WordNet at its default width and 128 wide; each slowed row takes the rate the rule gives a
    # wide head of its run's length (903, 1,372 and 782 steps)
    Bench("input_lr_rule",
          steps=(_s("bench/scale.py", "--input-lr", "0.00809", "--out", "{results}/input_lr_planted"),
                 _s("bench/real.py", "--sets", "wordnet", "--methods", "ovex", "--seeds", "0", "1", "2",
                    "--ovex-args=--input-lr 0.01", "--label", "ovex --input-lr 0.01 (the table at lr)",
                    "--ovex-args=--dim 128", "--label", "ovex --dim 128 (the table at lr)",
                    "--ovex-args=--dim 128 --input-lr 0.00753",
                    "--label", "ovex --dim 128 --input-lr 0.00753 (the table slowed)",
                    "--out", "{results}/input_lr_wordnet"),
                 _s("bench/real.py", "--sets", "synth-1e5", "--methods", "ovex", "--seeds", "0", "1", "2",
                    "--ovex-args=--input-lr 0.00611", "--label", "ovex --input-lr 0.00611 (the table slowed)",
                    "--out", "{results}/input_lr_synth")),
          quick=(), outputs=("input_lr_planted.json", "input_lr_planted.md", "input_lr_wordnet.json",
                             "input_lr_wordnet.md", "input_lr_synth.json", "input_lr_synth.md"),
          measures=(*CLI, "bench/scale.py", "bench/real.py"), estimate_s=1000, full=False),
    # a design probe for labels known by their text: test-only labels scored by their texts' tf-idf cosine
    Bench("lexical_channel",
          steps=(_s("bench/lexical_channel.py", "--out", "{results}/lexical_channel"),), quick=(),
          outputs=("lexical_channel.json", "lexical_channel.md"),
          measures=(*CLI, "bench/lexical_channel.py", "bench/real.py"), estimate_s=480, full=False),
    # the label texts' defaults' evidence: WordNet's training rows split as its test split was, the labels of
    # the held-out rows known by their text alone; each model rescored over a grid of their norm and bias
    Bench("label_texts_valid",
          steps=(_s("bench/label_texts.py", "--sets", "wordnet-valid", f"--also={NO_TEXT_ROWS}",
                    f"--also={JOINT_TOWER}", "--zero-shot-scales", "--out", "{results}/label_texts_valid"),),
          quick=(), outputs=("label_texts_valid.json", "label_texts_valid.md"),
          measures=(*CLI, "bench/label_texts.py"), estimate_s=800, full=False),
    # how often an apart label tower trains: `--label-tower-every` 16 (the default) beside 1, 4 and 64
    Bench("label_tower_every",
          steps=(_s("bench/label_texts.py", "--sets", "wordnet",
                    f"--extra={APART_TOWER}", "--also=--label-tower-every 1", "--also=--label-tower-every 4",
                    "--also=--label-tower-every 64", "--zero-shot-scales",
                    "--out", "{results}/label_tower_every"),), quick=(),
          outputs=("label_tower_every.json", "label_tower_every.md"),
          measures=(*CLI, "bench/label_texts.py"), estimate_s=660, full=False),
    # the `auto` precision's evidence: the same runs in float32, beside `real.json`'s (bf16 on this CPU)
    Bench("precision",
          steps=(_s("bench/real.py", "--sets", "wordnet", "bibtex", "corel5k", "--methods", "ovex",
                    "--seeds", "0", "1", "2", "--ovex-args=--precision fp32",
                    "--label", "ovex --precision fp32", "--out", "{results}/precision"),), quick=(),
          outputs=("precision.json", "precision.md"), measures=(*CLI, "bench/real.py"),
          estimate_s=420, full=False),
    Bench("objectives", steps=(_s("bench/objectives.py", "--out", "{results}/objectives"),), quick=(),
          outputs=("objectives.json", "objectives.md"), measures=(*TRAINER, "bench/objectives.py"),
          estimate_s=1800, full=False),
    Bench("profile_train", steps=(_s("bench/profile_train.py", "--out", "{results}/profile_train"),),
          quick=(), outputs=("profile_train.json", "profile_train.md"),
          measures=(*TRAINER, "bench/profile_train.py"), estimate_s=300, full=False),
    Bench("featurize_defaults",
          steps=(_s("bench/featurize_defaults.py", "--out", "{results}/featurize_defaults.json"),), quick=(),
          outputs=("featurize_defaults.json",),
          measures=("trainer/featurize.py", "bench/featurize_defaults.py"),
          estimate_s=600, full=False),
    Bench("accuracy_sweep", steps=(_s("bench/sweep.py", "--table"),), quick=(),
          outputs=("accuracy_sweep.jsonl", "accuracy_sweep.md"), measures=("bench/sweep.py",),
          estimate_s=0, full=False),
    Bench("real_screens", steps=(_s("bench/screen_real.py", "--out", "{results}/real_screens"),), quick=(),
          outputs=("real_screens.json", "real_screens.md", "real_screens_patched.json",
                   "real_screens_patched.md"), measures=(), estimate_s=0, full=False),
    Bench("capacity_rss", steps=(_s("bench/capacity_rss.py"),), quick=(),
          outputs=("capacity_rss.json", "capacity_rss.md"),
          measures=("trainer/capacity.py", "bench/capacity_rss.py"),
          estimate_s=300, full=False),
)
BY_NAME = {b.name: b for b in BENCHES}


def recorded_seconds(bench: Bench, results: Path = COMMITTED) -> float | None:
    """The wall time the results files record (a stamp's `wall_s`), if any."""
    total = 0.0
    for name in bench.outputs:
        path = results / name
        if path.suffix != ".json" or not path.exists():
            continue
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("wall_s"), int | float):
            total += float(data["wall_s"])
    return total or None


def expected_seconds(bench: Bench, quick: bool = False) -> float:
    if quick:
        return 30.0 * len(bench.quick)
    # a file made by a larger command records its wall time too: count only the runs still made
    kept = bench.expected(COMMITTED) if bench.expected else None
    return kept or recorded_seconds(bench) or bench.estimate_s


def selected(only: str | None, quick: bool, stale_only: bool) -> list[Bench]:
    names = [n for n in (only or "").split(",") if n]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"no benchmark named {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    # the quick profile keeps every script alive, on-demand ones included
    default = [b for b in BENCHES if (b.full or quick) and b.device == "cpu"]
    chosen = [BY_NAME[n] for n in names] if names else default
    if stale_only:
        stale_names = {row["bench"] for row in stale()}
        chosen = [b for b in chosen if b.name in stale_names]
    return [b for b in chosen if (b.quick if quick else b.steps)]


def commands(bench: Bench, quick: bool, results: Path, work: Path) -> list[list[str]]:
    fill = {"results": str(results), "work": str(work)}
    steps = bench.quick if quick else bench.steps
    return [[sys.executable, *(a.format(**fill) for a in step)] for step in steps]


# --------------------------------------------------------------------------------------------------
# staleness: a result is stale when the code it measures changed after the commit that made it


def result_commits(path: Path) -> list[str | None]:
    """The commits a results JSON was made at (each part's, where runs were merged); None: no stamp."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return [None]
    if not isinstance(data, dict):
        return [None]
    parts = data.get("stamps")
    if isinstance(parts, dict) and parts:
        return [p.get("commit") if isinstance(p, dict) else None for p in parts.values()]
    commit = data.get("commit")
    return [commit.removesuffix("-dirty") if isinstance(commit, str) and commit else None]


def changed_since(commit: str, paths: tuple[str, ...]) -> str:
    """The newest commit after `commit` that touched `paths` ('' if none, '?' if `commit` is unknown)."""
    if not git("rev-parse", "--verify", "-q", f"{commit}^{{commit}}"):
        return "?"
    return git("log", "-1", "--format=%h", f"{commit}..HEAD", "--", *paths)


def stale(results: Path = COMMITTED) -> list[dict[str, Any]]:
    """Each results JSON of a rerunnable benchmark whose commit predates a change to what it measures."""
    rows = []
    for bench in BENCHES:
        if not bench.steps or not bench.measures:
            continue
        for name in bench.outputs:
            path = results / name
            if path.suffix != ".json" or not path.exists():
                continue
            for commit in result_commits(path):
                if commit is None:
                    rows.append({"bench": bench.name, "file": name, "commit": None,
                                 "why": "no commit recorded"})
                    break
                newer = changed_since(commit, bench.measures)
                if newer:
                    why = ("commit unknown here" if newer == "?"
                           else f"{', '.join(bench.measures)} changed in {newer}")
                    rows.append({"bench": bench.name, "file": name, "commit": commit[:10], "why": why})
                    break
    return rows


# --------------------------------------------------------------------------------------------------


def run(benches: list[Bench], quick: bool, results: Path) -> int:
    results.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OVEX_BENCH_RESULTS": str(results), "PYTHONUNBUFFERED": "1"}
    timings: dict[str, float] = {}
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ovex-bench-") as tmp:
        for bench in benches:
            work = Path(tmp) / bench.name
            work.mkdir()
            t0 = time.monotonic()
            for argv in commands(bench, quick, results, work):
                print(f"$ {shlex.join(argv)}", flush=True)
                if subprocess.run(argv, cwd=ROOT, env=env).returncode != 0:
                    failed.append(bench.name)
                    break
            timings[bench.name] = round(time.monotonic() - t0, 1)
            print(f"== {bench.name}: {timings[bench.name]} s", flush=True)
    total = sum(timings.values())
    print(json.dumps({"seconds": timings, "total_s": round(total, 1), "failed": failed}, indent=1))
    return 1 if failed else 0


def plan(benches: list[Bench], quick: bool) -> None:
    total = 0.0
    for bench in benches:
        secs = expected_seconds(bench, quick)
        total += secs
        print(f"{bench.name:20s} ~{secs / 60:5.1f} min  writes {', '.join(bench.outputs)}")
        for argv in commands(bench, quick, Path("{results}"), Path("{work}")):
            print(f"    {shlex.join(['python', *argv[1:]])}")
    print(f"expected: {total / 60:.1f} min in all")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["plan", "run", "stale"])
    ap.add_argument("--quick", action="store_true", help="the small profile (under 10 minutes)")
    ap.add_argument("--only", default=None, help="comma-separated benchmark names")
    ap.add_argument("--stale", action="store_true", help="only the benchmarks with stale results")
    ap.add_argument("--results", type=Path, default=None,
                    help="where results go (default: bench/results; with --quick a scratch directory)")
    args = ap.parse_args(argv)
    if args.action == "stale":
        rows = stale()
        for row in rows:
            bench = BY_NAME[row["bench"]]
            how = ("" if bench.full and bench.device == "cpu" else
                   f"  [not in make bench: make bench ONLY={bench.name}]" if bench.device == "cpu" else
                   f"  [needs {bench.device}: bench/{bench.name}.py on a device machine]")
            print(f"{row['file']:40s} {row['commit'] or '-':10s} {row['why']}{how}")
        print(f"{len(rows)} stale; rerun: make bench STALE=1")
        return 0
    benches = selected(args.only, args.quick, args.stale)
    if args.action == "plan":
        plan(benches, args.quick)
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="ovex-bench-quick-")) if args.quick and not args.results else None
    results = args.results or scratch or COMMITTED
    if args.quick and results.resolve() == COMMITTED.resolve():
        raise SystemExit("the quick profile never writes over bench/results: give another --results")
    print(f"results → {results}", flush=True)
    return run(benches, args.quick, results)


if __name__ == "__main__":
    raise SystemExit(main())
