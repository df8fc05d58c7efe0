"""`ovex train --init-from` against inputs that do not fit: every one stops with a clear error before
training (exit 2, no traceback), and the base directory is never written."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from service.cli import main
from trainer.artifact import load_artifact
from trainer.continual import continual_params, row_fingerprints
from trainer.data import Dataset, write_xc
from trainer.errors import ArtifactError
from trainer.hooks import QuietHooks
from trainer.params import TrainParams
from trainer.synth import synth_dataset
from trainer.train import train

FAST = ["--dim", "16", "--batch-size", "64", "--negatives", "8", "--group-size", "4", "--epochs", "1",
        "--quiet"]


def _tree_hash(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """old.txt (labels 0-11), all.txt (0-14), test.txt, names12.txt / names15.txt; bases v1 and named
    (labels named by names12.txt) on old.txt."""
    root = tmp_path_factory.mktemp("continual_inputs")
    tr = synth_dataset(15, 60, 400, seed=2)
    te = synth_dataset(15, 60, 100, seed=2, part=1)
    y = sp.csr_matrix(tr.Y)
    rows = np.flatnonzero(np.asarray(y[:, 12:].sum(axis=1)).ravel() == 0)
    old = tr.take(rows)
    write_xc(root / "old.txt", old.X, sp.csr_matrix(old.Y[:, :12]))
    write_xc(root / "all.txt", tr.X, tr.Y)
    write_xc(root / "test.txt", te.X, te.Y)
    (root / "names12.txt").write_text("".join(f"tag{i}\n" for i in range(12)))
    (root / "names15.txt").write_text("".join(f"tag{i}\n" for i in range(15)))
    assert main(["train", "--train", str(root / "old.txt"), "--out", str(root / "v1"), *FAST]) == 0
    assert main(["train", "--train", str(root / "old.txt"), "--label-names", str(root / "names12.txt"),
                 "--out", str(root / "named"), *FAST]) == 0  # the same base, its labels named tag0..tag11
    return root


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["train", "--quiet", *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("out", ["{base}", "{base}/.", "{base}/inner", "{root}"])
def test_out_may_not_be_the_base_or_inside_it_or_hold_it(
    files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str
) -> None:
    import shutil

    root = tmp_path / "models"
    shutil.copytree(files / "v1", root / "m")  # a model directory holding the base: replacing it deletes it
    base = root / "m" / "v1"
    shutil.copytree(files / "v1", base)
    before = _tree_hash(root)
    target = out.format(base=base, root=root / "m")
    code, err = _run(capsys, "--init-from", str(base), "--train", str(files / "all.txt"), "--out", target)
    assert code == 2, err
    assert err.startswith("error: ") and "base model" in err and "--out" in err, err
    assert _tree_hash(root) == before  # nothing written, nothing replaced


def test_out_that_is_not_a_model_dir_is_refused_before_training(files: Path, tmp_path: Path) -> None:
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "notes.txt").write_text("mine")
    seen: list[str] = []

    class Hooks(QuietHooks):
        def on_log(self, message: str) -> None:
            seen.append(message)

    from trainer.data import read_xc

    with pytest.raises(ArtifactError, match="not an ovex model directory"):
        train(TrainParams(), read_xc(files / "all.txt"), None, out_dir=tmp_path / "keep", hooks=Hooks(),
              base=files / "v1")
    assert not any(m.startswith("training ") for m in seen), seen  # refused before any step
    assert (tmp_path / "keep" / "notes.txt").read_text() == "mine"


def test_base_whose_params_disagree_with_its_weights_is_named(
    files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    base = tmp_path / "b"
    shutil.copytree(files / "v1", base)
    config = json.loads((base / "config.json").read_text())
    config["params"]["dim"] = 64  # the weights are 16 wide
    (base / "config.json").write_text(json.dumps(config))
    code, err = _run(capsys, "--init-from", str(base), "--train", str(files / "all.txt"),
                     "--out", str(tmp_path / "o"))
    assert code == 2 and f"error: {base}: " in err and "dim=64" in err and "16" in err, err


def test_base_with_a_label_name_twice_is_refused(
    files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    base = tmp_path / "b"
    shutil.copytree(files / "v1", base)
    lines = (base / "labels.txt").read_text().splitlines()
    lines[5] = lines[3]
    (base / "labels.txt").write_text("\n".join(lines) + "\n")
    code, err = _run(capsys, "--init-from", str(base), "--train", str(files / "all.txt"),
                     "--out", str(tmp_path / "o"))
    assert code == 2 and "labels.txt" in err and "'3'" in err and "twice" in err, err


def test_xc_ids_against_a_base_with_label_names_is_an_error(
    files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    named = files / "named"
    # ids against names: every label would be "new" and the label space doubled
    code, err = _run(capsys, "--init-from", str(named), "--train", str(files / "all.txt"),
                     "--out", str(tmp_path / "o"))
    assert code == 2 and "--label-names" in err and "'tag0'" in err, err
    # names against ids: the same the other way round
    code, err = _run(capsys, "--init-from", str(files / "v1"), "--train", str(files / "all.txt"),
                     "--label-names", str(files / "names15.txt"), "--out", str(tmp_path / "o"))
    assert code == 2 and "--label-names" in err and "ids" in err, err
    assert not (tmp_path / "o").exists()


def test_label_names_name_the_test_and_replay_files_too(
    files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    named = files / "named"
    code = main(["train", "--quiet", "--init-from", str(named), "--train", str(files / "all.txt"),
                 "--label-names", str(files / "names15.txt"), "--test", str(files / "test.txt"),
                 "--replay-data", str(files / "old.txt"), "--out", str(tmp_path / "v2")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "new.p@1" in json.loads(out.strip().splitlines()[-1])
    assert load_artifact(tmp_path / "v2").label_names == [f"tag{i}" for i in range(15)]


def test_flags_are_checked_together_with_the_base_params(
    files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the base has group_size 4: unigram needs group_size 1, which this base does not have...
    code, err = _run(capsys, "--init-from", str(files / "v1"), "--train", str(files / "all.txt"),
                     "--sampler", "unigram", "--out", str(tmp_path / "o"))
    assert code == 2 and "group_size 4 needs sampler 'uniform'" in err, err
    assert "pydantic" not in err and "input_value" not in err, err
    # ...a base with group_size 1 takes it, though the default group_size would not
    g1 = tmp_path / "g1"
    assert main(["train", "--train", str(files / "old.txt"), "--out", str(g1), *FAST[:6],
                 "--group-size", "1", "--epochs", "1", "--quiet"]) == 0
    code, err = _run(capsys, "--init-from", str(g1), "--train", str(files / "all.txt"),
                     "--sampler", "unigram", "--out", str(tmp_path / "u"))
    assert code == 0, err
    assert load_artifact(tmp_path / "u").params.sampler == "unigram"
    # a stop epoch past the run's epochs (2 by default in a continual run) is an error, not clipped
    code, err = _run(capsys, "--init-from", str(files / "v1"), "--train", str(files / "all.txt"),
                     "--stop-epoch", "5", "--out", str(tmp_path / "s"))
    assert code == 2 and "stop_epoch 5 is after the last epoch (2)" in err, err
    assert "pydantic" not in err, err


def test_how_the_base_was_run_is_not_inherited() -> None:
    """Where and how the base was run (its device, its ranks, model selection) is not part of the model:
    a continual run uses today's defaults unless the caller sets them."""
    base = TrainParams(dim=16, device="cuda", nproc_per_node=2, valid_fraction=0.2, refit=True, patience=1)
    merged = continual_params(base, TrainParams(), "v1")
    assert merged.dim == 16
    assert (merged.device, merged.nproc_per_node) == ("auto", 1)
    assert (merged.valid_fraction, merged.refit, merged.patience) == (0.0, False, 0)
    given = TrainParams(valid_fraction=0.1, device="cpu")
    merged = continual_params(base, given, "v1")
    assert (merged.valid_fraction, merged.device) == (0.1, "cpu")


def test_an_unknown_label_names_its_line_in_an_xc_file(
    files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "t.txt").write_text("3 60 30\n1 1:1\n2 2:1\n25 3:1\n")  # row 3 is line 4
    code, err = _run(capsys, "--init-from", str(files / "v1"), "--train", str(files / "all.txt"),
                     "--test", str(tmp_path / "t.txt"), "--out", str(tmp_path / "o"))
    assert code == 2 and f"error: {tmp_path / 't.txt'}:4: label '25'" in err, err


def test_data_without_a_row_the_base_saw_and_no_replay_warns(files: Path, tmp_path: Path) -> None:
    from trainer.data import read_xc

    seen: list[str] = []

    class Hooks(QuietHooks):
        def on_log(self, message: str) -> None:
            seen.append(message)

    ds = read_xc(files / "all.txt")
    y = sp.csr_matrix(ds.Y)
    only_new = ds.take(np.flatnonzero(np.asarray(y[:, 12:].sum(axis=1)).ravel() > 0))
    train(TrainParams(), only_new, None, out_dir=tmp_path / "o", hooks=Hooks(), base=files / "v1")
    assert any("--replay-data" in m and "forgotten" in m for m in seen), seen
    seen.clear()
    old = read_xc(files / "old.txt")
    train(TrainParams(), only_new, None, out_dir=tmp_path / "o2", hooks=Hooks(), base=files / "v1",
          replay_ds=Dataset(Y=old.Y, n_features=old.n_features, n_labels=old.n_labels, X=old.X))
    assert not any("forgotten" in m for m in seen), seen


def test_replay_rows_the_base_never_saw_are_counted_in_the_stats(files: Path, tmp_path: Path) -> None:
    """The grown model's stats describe every row it trained on, once: the row fingerprints, the row
    count and the label counts agree, also when the replay set holds rows the base had not seen."""
    from trainer.data import read_xc

    old = read_xc(files / "old.txt")
    half = old.take(np.arange(old.n_rows // 2))
    train(TrainParams(dim=16, epochs=1), half, None, out_dir=tmp_path / "v1", hooks=QuietHooks())
    ds = read_xc(files / "all.txt")
    y = sp.csr_matrix(ds.Y)
    only_new = ds.take(np.flatnonzero(np.asarray(y[:, 12:].sum(axis=1)).ravel() > 0))
    train(TrainParams(), only_new, None, out_dir=tmp_path / "v2", hooks=QuietHooks(), base=tmp_path / "v1",
          replay_ds=old)
    v2 = load_artifact(tmp_path / "v2")
    assert v2.row_hashes is not None and v2.label_counts is not None
    # the base counted every row of `half`; the run adds each row of only_new and of the replay set
    # (the rest of old.txt) that is not one of those
    rest = old.take(np.flatnonzero(~np.isin(row_fingerprints(old), row_fingerprints(half))))
    assert rest.n_rows > 0
    assert v2.config["n_train_rows"] == half.n_rows + only_new.n_rows + rest.n_rows
    assert set(v2.row_hashes.tolist()) == set(np.concatenate(
        [row_fingerprints(half), row_fingerprints(only_new), row_fingerprints(rest)]).tolist())
    want = sum(np.bincount(d.Y.indices, minlength=15) for d in (half, only_new, rest))
    np.testing.assert_array_equal(v2.label_counts, want)


def test_a_replay_set_without_a_base_is_refused(files: Path, tmp_path: Path) -> None:
    """`train(replay_ds=...)` without `base` would be ignored in silence (the CLI refuses the same)."""
    from trainer.data import read_xc
    from trainer.errors import ParamsError

    old = read_xc(files / "old.txt")
    with pytest.raises(ParamsError, match="replay_ds needs a base"):
        train(TrainParams(dim=16, epochs=1), old, None, out_dir=tmp_path / "o", hooks=QuietHooks(),
              replay_ds=old)
    assert not (tmp_path / "o").exists()


def test_label_names_may_keep_the_base_ids_and_name_new_labels(
    files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = tmp_path / "names.txt"
    names.write_text("".join(f"{i}\n" for i in range(12)) + "cat\ndog\nemu\n")
    code, err = _run(capsys, "--init-from", str(files / "v1"), "--train", str(files / "all.txt"),
                     "--label-names", str(names), "--out", str(tmp_path / "o"))
    assert code == 0, err
    assert load_artifact(tmp_path / "o").label_names == [str(i) for i in range(12)] + ["cat", "dog", "emu"]


@pytest.mark.parametrize("fresh", [False, True])
def test_an_out_that_cannot_be_created_is_refused_before_training(
    files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fresh: bool
) -> None:
    (tmp_path / "afile").write_text("x")
    base = [] if fresh else ["--init-from", str(files / "v1")]
    code, err = _run(capsys, *base, "--train", str(files / "all.txt"), "--out", str(tmp_path / "afile" / "m"),
                     *FAST[:-1])
    assert code == 2 and f"error: {tmp_path / 'afile' / 'm'}: cannot create" in err, err


@pytest.mark.parametrize("flag", ["--out", "--init-from"])
def test_an_empty_path_is_named(files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch, flag: str) -> None:
    monkeypatch.chdir(tmp_path)  # a blank path names the working directory
    args = {"--train": str(files / "all.txt"), "--out": "o", "--init-from": str(files / "v1"), flag: " "}
    code, err = _run(capsys, *[x for kv in args.items() for x in kv])
    assert code == 2 and f"{flag} is empty" in err, err
    assert not any(tmp_path.iterdir())


def _texts(path: Path, n: int = 40) -> Path:
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta"]
    with open(path, "w") as fh:
        for i in range(n):
            text = " ".join(words[(i + j) % 6] for j in range(3))
            fh.write(json.dumps({"text": text, "labels": [f"l{i % 4}"]}) + "\n")
    return path


@pytest.mark.parametrize(("kind", "flag", "value"), [
    ("hash", "--max-vocab", "5000"), ("hash", "--min-df", "3"),
    ("xc", "--max-vocab", "5000"), ("xc", "--min-df", "3"), ("xc", "--hash-size", "64"),
])
def test_a_featurizer_flag_the_base_does_not_use_is_refused_as_such(
    files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, flag: str, value: str
) -> None:
    """A text setting given to a base that hashes (no vocabulary) or reads XC features has no effect: the
    error says so, not that it 'differs from the base' as if another value would do."""
    if kind == "hash":
        data = _texts(tmp_path / "t.jsonl")
        assert main(["train", "--train", str(data), "--out", str(tmp_path / "b"), "--hash-size", "256",
                     *FAST]) == 0
        base, why = tmp_path / "b", "hashes words into hash_size=256 buckets and has no vocabulary"
    else:
        data, base, why = files / "all.txt", files / "v1", "takes sparse features (XC data)"
    code, err = _run(capsys, "--init-from", str(base), "--train", str(data), "--out", str(tmp_path / "o"),
                     flag, value)
    name = flag[2:].replace("-", "_")
    assert code == 2 and f"{name}={value} does not apply: the base model {why}" in err, err
    assert "differs" not in err and f"(leave {name} out)" in err, err
    assert not (tmp_path / "o").exists()


def test_a_vocabulary_setting_other_than_the_base_is_still_a_conflict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _texts(tmp_path / "t.jsonl")
    assert main(["train", "--train", str(data), "--out", str(tmp_path / "b"), *FAST]) == 0
    code, err = _run(capsys, "--init-from", str(tmp_path / "b"), "--train", str(data), "--out",
                     str(tmp_path / "o"), "--max-vocab", "5000")
    assert code == 2 and "max_vocab=5000 differs from the base model's max_vocab=200000" in err, err


def test_every_field_has_one_role_in_a_continual_run() -> None:
    """The roles partition TrainParams: a run field takes today's default, a learning field the base's."""
    from trainer.params import ARCHITECTURE_FIELDS, LEARNING_FIELDS, RUN_FIELDS

    roles = (ARCHITECTURE_FIELDS, RUN_FIELDS, LEARNING_FIELDS)
    assert sum(len(r) for r in roles) == len(TrainParams.model_fields)
    assert set().union(*roles) == set(TrainParams.model_fields)
    base = TrainParams(patience=3, valid_fraction=0.1, replay=1.0, lr=0.07, dropout=0.3, dim=32)
    run = continual_params(base, TrainParams(), "base")
    assert (run.patience, run.valid_fraction, run.replay) == (0, 0.0, TrainParams().replay)
    assert (run.lr, run.dropout, run.dim) == (0.07, 0.3, 32)
