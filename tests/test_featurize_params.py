"""The featurizer a training run fits has the options its `TrainParams` name, under one default each."""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp

from trainer.data import Dataset
from trainer.featurize import FeaturizerConfig
from trainer.params import TrainParams, fields_in
from trainer.train import fit_featurizer

OPTIONS = fields_in("featurizer")  # TrainParams' featurizer options: FeaturizerConfig's, by the same names

TEXTS = ["red apple pie", "red apple tart", "green apple pie", "blue sky"]


def _texts(texts: list[str]) -> Dataset:
    return Dataset(Y=sp.csr_matrix((len(texts), 1), dtype=np.float32), n_features=0, n_labels=1, texts=texts)


def test_default_params_fit_the_featurizer_they_say() -> None:
    params = TrainParams()
    featurizer, x = fit_featurizer(params, _texts(TEXTS))
    assert x.shape == (len(TEXTS), featurizer.n_features)
    cfg = featurizer.config
    for name in OPTIONS:
        assert getattr(cfg, name) == getattr(params, name), name
    assert params.hash_size == 0 and not cfg.hashed
    # what those options do: word pairs are in (ngrams 2), terms of one text are out (min_df 2), and each
    # text's first three words count again, marked (lead_words 3)
    assert featurizer.vocab is not None
    assert set(featurizer.vocab) == {"red", "apple", "pie", "red apple", "apple pie",
                                     "^red", "^apple", "^pie"}


def test_every_featurizer_param_reaches_the_featurizer() -> None:
    """A value other than the default, for each option, is the featurizer's: none is dropped on the way."""
    changed = {"tfidf": False, "l2": False, "max_vocab": 7, "min_df": 1, "ngrams": 1, "hash_size": 64,
               "lead_words": 0}
    assert set(changed) == OPTIONS
    for name, value in changed.items():
        assert value != TrainParams.model_fields[name].default, name
        cfg = FeaturizerConfig.from_params(TrainParams(**{name: value}))
        assert getattr(cfg, name) == value, name
    assert FeaturizerConfig.from_params(TrainParams(hash_size=64)).hashed


def test_library_defaults_differ_from_training_only_in_ngrams_and_lead_words() -> None:
    """FeaturizerConfig's defaults are TrainParams' but for ngrams and lead_words (the library keeps to
    single words, unmarked, as a featurizer saved before either field was): a default changed in one place
    and not the other fails here."""
    library, training = FeaturizerConfig(), FeaturizerConfig.from_params(TrainParams())
    differ = {f.name for f in dataclasses.fields(FeaturizerConfig)
              if getattr(library, f.name) != getattr(training, f.name)}
    assert differ == {"ngrams", "lead_words"}, differ
    assert (library.ngrams, training.ngrams) == (1, 2)
    assert (library.lead_words, training.lead_words) == (0, 3)
