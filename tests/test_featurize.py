"""Featurizers: the weighting formulas, input validation, and exact save/load round trips."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from trainer.data import Dataset
from trainer.errors import ArtifactError, DataFormatError, ParamsError
from trainer.featurize import Featurizer, FeaturizerConfig, tokenize


def _texts(texts: list[str]) -> Dataset:
    return Dataset(Y=sp.csr_matrix((len(texts), 1), dtype=np.float32), n_features=0, n_labels=1, texts=texts)


def _sparse(X: sp.csr_matrix) -> Dataset:
    return Dataset(Y=sp.csr_matrix((X.shape[0], 1), dtype=np.float32), n_features=X.shape[1], n_labels=1,
                   X=sp.csr_matrix(X, dtype=np.float32))


DOCS = ["The cat sat on the mat", "the dog sat", "A cat and a dog", "zebra"]


def test_tokenize_lowercases_and_adds_bigrams() -> None:
    assert tokenize("Hello, WORLD! a b x9") == ["hello", "world", "x9"]
    assert tokenize("New York city", ngrams=2) == ["new", "york", "city", "new york", "york city"]


def test_vocab_tfidf_l2_by_hand() -> None:
    f = Featurizer(FeaturizerConfig(min_df=1)).fit(_texts(DOCS))
    assert f.vocab is not None
    # vocabulary ordered by document frequency, then alphabetically
    assert list(f.vocab)[:5] == ["cat", "dog", "sat", "the", "and"]  # df 2,2,2,2 then 1
    X = f.transform_texts(["the the cat unknownword"]).toarray()[0]
    n = len(DOCS)
    idf_the = math.log((1 + n) / (1 + 2)) + 1  # "the" occurs in 2 docs (counted once per doc)
    idf_cat = math.log((1 + n) / (1 + 2)) + 1
    w_the = (1 + math.log(2)) * idf_the  # sublinear tf for 2 occurrences
    w_cat = 1.0 * idf_cat
    norm = math.hypot(w_the, w_cat)
    assert X[f.vocab["the"]] == pytest.approx(w_the / norm, rel=1e-6)
    assert X[f.vocab["cat"]] == pytest.approx(w_cat / norm, rel=1e-6)
    assert np.count_nonzero(X) == 2


def test_min_df_and_max_vocab_shape_the_vocabulary() -> None:
    f = Featurizer(FeaturizerConfig(min_df=2)).fit(_texts(DOCS))
    assert f.vocab is not None and set(f.vocab) == {"the", "cat", "sat", "dog"}
    g = Featurizer(FeaturizerConfig(min_df=1, max_vocab=2)).fit(_texts(DOCS))
    assert g.n_features == 2
    with pytest.raises(ParamsError, match="empty vocabulary"):
        Featurizer(FeaturizerConfig(min_df=5)).fit(_texts(DOCS))


def test_hashing_signed_and_unsigned() -> None:
    cfg = FeaturizerConfig(hash_size=16, tfidf=False, l2=False, sublinear_tf=False)
    f = Featurizer(cfg).fit(_texts(DOCS))
    assert f.n_features == 16
    row = f.transform_texts(["cat cat cat"])
    assert row.nnz == 1 and abs(float(row.data[0])) == 3.0
    u = Featurizer(FeaturizerConfig(hash_size=16, signed_hash=False, tfidf=False, l2=False)).fit(_texts(DOCS))
    many = u.transform_texts([" ".join(f"w{i}" for i in range(200))])
    assert many.data.min() > 0  # unsigned: collisions only add up
    signed = Featurizer(FeaturizerConfig(hash_size=1 << 12, tfidf=False, l2=False)).fit(_texts(DOCS))
    assert (signed.transform_texts([" ".join(f"w{i}" for i in range(200))]).data < 0).any()


def test_hashing_is_stable_across_instances() -> None:
    cfg = FeaturizerConfig(hash_size=1 << 10)
    a = Featurizer(cfg).fit(_texts(DOCS)).transform_texts(["a stable hash please"])
    b = Featurizer(cfg).fit(_texts(DOCS)).transform_texts(["a stable hash please"])
    assert (a != b).nnz == 0


def test_sparse_idf_and_l2_by_hand() -> None:
    X = sp.csr_matrix(np.array([[1, 0, 2], [1, 1, 0], [0, 0, 3]], dtype=np.float32))
    f = Featurizer(FeaturizerConfig(tfidf=True, l2=True)).fit(_sparse(X))
    idf = [math.log(4 / 3) + 1, math.log(4 / 2) + 1, math.log(4 / 3) + 1]
    out = f.transform_sparse(sp.csr_matrix(np.array([[2, 1, 0]], dtype=np.float32))).toarray()[0]
    raw = np.array([2 * idf[0], 1 * idf[1], 0.0])
    assert out == pytest.approx(raw / np.linalg.norm(raw), rel=1e-6)
    plain = Featurizer(FeaturizerConfig(tfidf=False, l2=False)).fit(_sparse(X))
    assert (plain.transform_sparse(X) != X).nnz == 0


def test_transform_sparse_validates_rows() -> None:
    X = sp.csr_matrix(np.eye(3, dtype=np.float32))
    f = Featurizer().fit(_sparse(X))
    wide = sp.csr_matrix(([1.0, 1.0], ([0, 1], [1, 5])), shape=(2, 6))
    with pytest.raises(DataFormatError) as ei:
        f.transform_sparse(wide, source="request")
    assert ei.value.line == 2 and "feature id 5 out of range" in ei.value.message
    assert str(ei.value).startswith("request:2:")
    bad = sp.csr_matrix(([1.0, np.nan], ([0, 0], [0, 1])), shape=(1, 3))
    with pytest.raises(DataFormatError, match="non-finite"):
        f.transform_sparse(bad)
    with pytest.raises(DataFormatError, match="takes sparse feature vectors, not texts"):
        f.transform_texts(["hello"])
    # narrower input is widened to n_features
    assert f.transform_sparse(sp.csr_matrix(([2.0], ([0], [1])), shape=(1, 2))).shape == (1, 3)


def test_transform_texts_validates_rows() -> None:
    f = Featurizer(FeaturizerConfig(min_df=1)).fit(_texts(DOCS))
    with pytest.raises(DataFormatError) as ei:
        f.transform_texts(["ok", 3])  # type: ignore[list-item]
    assert ei.value.line == 2 and "text must be a string" in ei.value.message
    with pytest.raises(DataFormatError, match="takes texts"):
        f.transform_sparse(sp.csr_matrix((1, f.n_features)))
    assert f.transform_texts([""]).nnz == 0


def test_unfitted_featurizer_refuses() -> None:
    with pytest.raises(ParamsError, match="not fitted"):
        Featurizer().transform_texts(["x"])


def test_config_round_trip_and_validation() -> None:
    cfg = FeaturizerConfig(ngrams=2, hash_size=99, signed_hash=False)
    assert FeaturizerConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ParamsError, match="unknown featurizer option"):
        FeaturizerConfig.from_dict({"ngram": 2})
    with pytest.raises(ParamsError, match="ngrams must be 1 or 2"):
        FeaturizerConfig(ngrams=3)
    with pytest.raises(ParamsError, match="hash_size must be in"):
        FeaturizerConfig(hash_size=-1)


def test_class_level_fit_with_trainer_options() -> None:
    f = Featurizer.fit(_texts(DOCS), tfidf=False, l2=True, hash_size=64, max_vocab=10, min_df=1)
    assert f.config.hashed and f.n_features == 64 and f.idf is None


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(st.text(alphabet="abc d.;", min_size=0, max_size=40), min_size=8, max_size=20),
    mode=st.sampled_from(["vocab", "hash"]),
    ngrams=st.sampled_from([1, 2]),
    lead=st.sampled_from([0, 1, 3]),
    sublinear=st.booleans(),
    buckets=st.sampled_from([1, 3, 64]),
)
@example(docs=["a b"] * 8, mode="hash", ngrams=1, lead=0, sublinear=False, buckets=3)  # no token at all
def test_batch_and_single_row_routes_are_bit_identical(docs: list[str], mode: str, ngrams: int, lead: int,
                                                       sublinear: bool, buckets: int) -> None:
    """A row featurizes the same alone (dict route, as a request) or inside a batch (numpy route)."""
    cfg = FeaturizerConfig(ngrams=ngrams, lead_words=lead, min_df=1,
                           hash_size=buckets if mode == "hash" else 0, sublinear_tf=sublinear)
    f = Featurizer(cfg).fit(_texts([*docs, "ab cd"]))  # "ab cd": the vocabulary is never empty
    batch = f.transform_texts(docs)
    for i, doc in enumerate(docs):
        one = f.transform_texts([doc])
        assert np.array_equal(one.indices, batch[i].indices)
        assert np.array_equal(one.data, batch[i].data), (doc, one.data, batch[i].data)


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(st.text(alphabet="abcé dZ.!", min_size=0, max_size=40), min_size=1, max_size=20),
    mode=st.sampled_from(["vocab", "hash"]),
    ngrams=st.sampled_from([1, 2]),
    lead=st.sampled_from([0, 2]),
    min_df=st.integers(1, 3),
    max_vocab=st.sampled_from([1, 4, 100]),
    tfidf=st.booleans(),
    l2=st.booleans(),
)
def test_fit_transform_is_fit_then_transform_to_the_bit(docs: list[str], mode: str, ngrams: int, lead: int,
                                                        min_df: int, max_vocab: int, tfidf: bool,
                                                        l2: bool) -> None:
    """Training featurizes its rows from the fit's one tokenization: the same vocabulary, idf and rows as
    a fit followed by a transform, through either route (fewer rows than a batch, or a batch)."""
    docs = [*docs, "ab cd ab"]  # the vocabulary is never empty at min_df 1
    cfg = FeaturizerConfig(ngrams=ngrams, lead_words=lead, min_df=min_df, max_vocab=max_vocab, tfidf=tfidf,
                           l2=l2, hash_size=16 if mode == "hash" else 0)
    ds = _texts(docs)
    try:
        apart = Featurizer(cfg).fit(ds)
    except ParamsError:  # no term in min_df texts: fit_transform refuses alike
        with pytest.raises(ParamsError, match="empty vocabulary"):
            Featurizer(cfg).fit_transform(ds)
        return
    one = Featurizer(cfg)
    x = one.fit_transform(ds)
    want = apart.transform(ds)
    assert one.vocab == apart.vocab and one.n_features == apart.n_features and one.n_docs == apart.n_docs
    if mode == "vocab":  # the vocabulary by its definition: terms of >= min_df texts, most texts first
        df = Counter(term for doc in docs for term in set(tokenize(doc, ngrams, lead)))
        ranked = sorted((t for t, c in df.items() if c >= min_df), key=lambda t: (-df[t], t))
        assert list(one.vocab) == ranked[:max_vocab]
        assert list(one.vocab.values()) == list(range(one.n_features))
    assert (one.idf is None) == (apart.idf is None)
    assert one.idf is None or np.array_equal(one.idf, apart.idf)
    assert x.shape == want.shape and x.has_sorted_indices
    assert np.array_equal(x.indptr, want.indptr) and np.array_equal(x.indices, want.indices)
    assert np.array_equal(x.data, want.data) and x.data.dtype == np.float32


def test_fit_transform_of_sparse_rows_is_fit_then_transform() -> None:
    X = sp.csr_matrix(np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]], dtype=np.float32))
    apart = Featurizer(FeaturizerConfig(tfidf=True, l2=True)).fit(_sparse(X))
    x = Featurizer(FeaturizerConfig(tfidf=True, l2=True)).fit_transform(_sparse(X))
    assert np.array_equal(x.toarray(), apart.transform(_sparse(X)).toarray())


# ----------------------------------------------------------------------------- persistence


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    docs=st.lists(st.text(alphabet="abcde fgh.", min_size=1, max_size=30), min_size=1, max_size=8),
    mode=st.sampled_from(["vocab", "hash"]),
    ngrams=st.sampled_from([1, 2]),
    lead=st.sampled_from([0, 3]),
    idf=st.booleans(),
)
def test_text_save_load_gives_identical_transforms(tmp_path: Path, docs: list[str], mode: str, ngrams: int,
                                                   lead: int, idf: bool) -> None:
    cfg = FeaturizerConfig(ngrams=ngrams, lead_words=lead, min_df=1, hash_size=32 if mode == "hash" else 0,
                           tfidf=idf)
    # no token of 2+ characters at all: a vocabulary cannot be built (hashing still fits, to empty rows)
    assume(mode == "hash" or any(tokenize(d) for d in docs))
    f = Featurizer(cfg).fit(_texts(docs))
    f.save(tmp_path / "fz")
    g = Featurizer.load(tmp_path / "fz")
    probe = [*docs, "ab cd ef unseen"]
    a, b = f.transform_texts(probe), g.transform_texts(probe)
    assert a.shape == b.shape and np.array_equal(a.indices, b.indices) and np.array_equal(a.data, b.data)
    assert g.config == f.config and g.n_features == f.n_features


def test_sparse_save_load_gives_identical_transforms(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    X = sp.random(50, 40, density=0.2, format="csr", dtype=np.float32, random_state=rng)
    for cfg in (FeaturizerConfig(tfidf=True), FeaturizerConfig(tfidf=False, l2=False)):
        f = Featurizer(cfg).fit(_sparse(X))
        f.save(tmp_path / "s")
        g = Featurizer.load(tmp_path / "s")
        a, b = f.transform_sparse(X), g.transform_sparse(X)
        assert np.array_equal(a.toarray(), b.toarray())


def test_load_rejects_broken_directories(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"missing featurizer\.json"):
        Featurizer.load(tmp_path)
    f = Featurizer(FeaturizerConfig(min_df=1)).fit(_texts(DOCS))
    f.save(tmp_path)
    meta = json.loads((tmp_path / "featurizer.json").read_text())
    (tmp_path / "featurizer.json").write_text(json.dumps({**meta, "version": 99}))
    with pytest.raises(ArtifactError, match="version 99 is not supported"):
        Featurizer.load(tmp_path)
    (tmp_path / "featurizer.json").write_text(json.dumps({**meta, "n_features": 3}))
    with pytest.raises(ArtifactError, match="vocabulary has"):
        Featurizer.load(tmp_path)
    (tmp_path / "featurizer.json").write_text(json.dumps(meta))
    (tmp_path / "featurizer.safetensors").write_bytes(b"garbage")
    with pytest.raises(ArtifactError, match="unreadable idf"):
        Featurizer.load(tmp_path)
    (tmp_path / "featurizer.json").write_text("{not json")
    with pytest.raises(ArtifactError, match=r"unreadable featurizer\.json"):
        Featurizer.load(tmp_path)
    assert not list(tmp_path.glob("*.pkl"))


@pytest.mark.parametrize("hashed", [False, True])
def test_a_featurizer_saved_under_the_earlier_option_names_reads_as_it_was_fit(tmp_path: Path,
                                                                                hashed: bool) -> None:
    """Before the options took `TrainParams`' names a featurizer.json said `text_mode`/`hash_features`,
    `max_features` and a `text_*` and a `sparse_*` of each weighting, of which its kind used one."""
    cfg = FeaturizerConfig(min_df=1, hash_size=32 if hashed else 0, tfidf=False, l2=True, max_vocab=50)
    f = Featurizer(cfg).fit(_texts(DOCS))
    f.save(tmp_path / "fz")
    path = tmp_path / "fz" / "featurizer.json"
    meta = json.loads(path.read_text())
    meta["config"] = {"text_mode": "hash" if hashed else "vocab", "ngrams": 1, "min_df": 1,
                      "max_features": 50, "hash_features": 32 if hashed else 1 << 18, "signed_hash": True,
                      "sublinear_tf": True,
                      "text_idf": False, "text_l2": True, "sparse_idf": True, "sparse_l2": False}
    path.write_text(json.dumps(meta))
    g = Featurizer.load(tmp_path / "fz")
    assert g.config == cfg  # the text options, not the sparse ones the file also held
    probe = [*DOCS, "the cat and an unseen word"]
    a, b = f.transform_texts(probe), g.transform_texts(probe)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.data, b.data)
    meta["config"]["max_features"] = "many"
    path.write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match=r"invalid featurizer\.json"):
        Featurizer.load(tmp_path / "fz")
