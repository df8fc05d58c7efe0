"""`TrainParams`: the one typed parameter object shared by CLI flags, API job requests and the artifact.

Keeping a single pydantic model means a job submitted over HTTP, a command line run and a saved model all
describe training the same way, and the artifact's config can be validated when it is loaded back.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from trainer.errors import ParamsError

Encoder = Literal["linear", "mlp", "maxout"]
Sampler = Literal["uniform", "unigram"]
Schedule = Literal["cosine", "linear", "constant"]
Device = Literal["auto", "cpu", "cuda"]
Precision = Literal["auto", "fp32", "bf16"]
LabelWeighting = Literal["row", "pair"]
Optimizer = Literal["adam", "adagrad"]
NewLabelInit = Literal["mean", "random"]

# upper bounds of the per-step sizes: a step holds batch × (negatives + positives) scores
MAX_BATCH = 65_536
MAX_NEGATIVES = 262_144
MAX_SEED = (1 << 32) - 1
MAX_ENSEMBLE = 8
MAX_DIM = 16384  # the widest model, an ensemble's members side by side included
MAX_LEAD_WORDS = 64  # leading words of a clause marked as terms of their own (`lead_words`)
LOGIT_ADJUST = -0.1  # the shift of a model without label texts when `logit_adjust` is unset
INPUT_LR_STEPS = 512  # runs up to this many steps train the input table at `lr` (`input_lr` 0)
INPUT_LR_LABELS_PER_DIM = 64  # a head with more trained labels than this per dimension: the table at `lr`
# `batch_size` 0: a batch of 512 rows once an epoch holds this many rows (100 steps of 512), 256 below. More
# rows a step share the step's negatives; a small set would take too few steps (docs/training.md)
AUTO_BATCH_ROWS = 51_200
AUTO_BATCHES = (256, 512)


def auto_batch_size(rows: int) -> int:
    """The rows per step of `batch_size` 0 for an epoch of `rows` rows."""
    return AUTO_BATCHES[1] if rows >= AUTO_BATCH_ROWS else AUTO_BATCHES[0]


def validation_message(exc: Any, flags: bool = False) -> str:
    """A pydantic ValidationError as `field: what is wrong; ...` (`--field-name` with `flags`), without
    the input dump and documentation link pydantic appends: users read it, not developers."""
    parts = []
    for err in exc.errors():
        msg = str(err["msg"]).removeprefix("Value error, ")
        loc = ".".join(str(x) for x in err["loc"])
        if loc and flags:
            loc = "--" + loc.replace("_", "-")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


MAX_UNKNOWN_KEYS = 20  # more unknown keys than this are refused in one error, before any field is checked


def refuse_many_unknown(model: type[BaseModel], data: Any) -> Any:
    """For a `mode="before"` model validator: pydantic reports each unknown key of a mapping as its own
    error, so a body of made-up keys would cost far more to describe than to send; past a few, one error
    names some of them and how many there are."""
    if not isinstance(data, dict) or len(data) <= MAX_UNKNOWN_KEYS:
        return data
    known = set(model.model_fields)
    unknown = [key for key in data if key not in known]
    if len(unknown) <= MAX_UNKNOWN_KEYS:
        return data
    shown = ", ".join(repr(str(key)[:40]) for key in unknown[:5])
    raise PydanticCustomError(
        "extra_forbidden",
        "{count} unknown fields ({shown}, ...); the fields are: {known}",
        {"count": len(unknown), "shown": shown, "known": ", ".join(model.model_fields)},
    )


def given_params(values: dict[str, Any], continuing: bool) -> TrainParams:
    """The params a caller set, each field checked (pydantic's ValidationError otherwise). The checks
    between fields too, unless the run continues a base: a pair may then take its other side from the
    base's params, and `trainer.continual.continual_params` checks the merged set."""
    try:
        return TrainParams.model_validate(values)
    except ValidationError as exc:
        if continuing and all(not err["loc"] for err in exc.errors()):  # only checks between fields
            return TrainParams.model_construct(**values)
        raise


# Each field belongs to one group, written on the field itself: `ovex train --help` lists the flags by group,
# and a continual run treats a field by its group's role (below).
GROUPS: dict[str, str] = {
    "model": "the model's shape and loss",
    "featurizer": "how rows become features",
    "objective": "the sampled bound: negatives and their groups",
    "optimiser": "how the weights learn",
    "label_texts": "labels' own texts (--label-texts)",
    "run": "where and how a run computes, its model selection",
    "continual": "continuing a base model (--init-from)",
}


def _in(group: str) -> dict[str, Any]:
    assert group in GROUPS, group
    return {"group": group}


class TrainParams(BaseModel):
    """Every knob of a training run, with defaults chosen to work on the XC benchmark sets untuned."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _few_unknown(cls, data: Any) -> Any:
        return refuse_many_unknown(cls, data)

    # objective
    loss: str = Field(
        default="ove",
        description="training objective: ove (grouped one-vs-each bound), softmax (exact, the reference), "
        "ove-subset, sparsemax, evsoftmax, dropmax (trainer.losses.LOSSES)",
        json_schema_extra=_in("model"),
    )
    # more negatives a step buy P@1 on WordNet and the planted 10^5-label set, shared by the larger batch of
    # `batch_size` 0 on such epochs; Bibtex and Corel5k, whose labels all fit, train on all of them as before
    negatives: int = Field(
        default=2048, ge=1, le=MAX_NEGATIVES, description="negatives drawn per step (shared)",
        json_schema_extra=_in("objective"),
    )
    # groups beat pairs on every set at the same step cost, and larger groups beat smaller ones on WordNet
    # and the planted 10^5-label set, up to one group of all the step's negatives (docs/training.md, with the
    # figures and their files)
    group_size: int = Field(
        default=2048,
        ge=1,
        le=MAX_NEGATIVES,
        description="ove: compare each positive with groups of this many sampled negatives under a "
        "softmax (a tighter bound of the same family; 1 = the one-vs-each bound over pairs)",
        json_schema_extra=_in("objective"),
    )
    sampler: Sampler = Field(default="uniform", description="proposal for negatives (importance-weighted)",
                             json_schema_extra=_in("objective"))
    hard_negatives: int = Field(
        default=0,
        ge=0,
        le=1024,
        description="ove: each positive also takes this many hard negatives, its label's nearest labels by "
        "head row (mined every hard_every epochs from the second on), scored with weight 1 while the "
        "sampled ones that fall among them are left out for it, so the loss stays a bound (0 = off)",
        json_schema_extra=_in("objective"),
    )
    hard_every: int = Field(
        default=1, ge=1, le=10_000, description="with hard_negatives: epochs between two minings",
        json_schema_extra=_in("objective"),
    )
    alpha: float = Field(default=0.75, ge=0.0, le=2.0, description="exponent of the unigram^alpha proposal",
                         json_schema_extra=_in("objective"))
    label_weighting: LabelWeighting = Field(
        default="row",
        description="multi-label rows in ove/ove-subset/softmax: row (each row weighs 1, shared by its "
        "positives) or pair (each positive pair weighs 1)",
        json_schema_extra=_in("objective"),
    )
    # unset, a small shift (LOGIT_ADJUST): WordNet, Bibtex and the planted 10^5-label set gain P@1 with it,
    # Corel5k moves within its seeds' spread, and a model with label texts loses with it (docs/training.md)
    logit_adjust: float | None = Field(
        default=None,
        ge=-2.0,
        le=2.0,
        description="add this times log(the label's training rows) to each label's bias in the saved model "
        "(and its evaluations): below 0 lowers the frequent labels against the rare ones, 0 = off; unset: "
        f"{LOGIT_ADJUST}, or 0 for a model with label texts, whose text rows already lift the rare labels",
        json_schema_extra=_in("objective"),
    )
    # encoder
    dim: int = Field(default=512, ge=1, le=MAX_DIM, description="width d of the representation h(x)",
                     json_schema_extra=_in("model"))
    encoder: Encoder = Field(default="linear", description="linear, mlp (ReLU) or maxout",
                             json_schema_extra=_in("model"))
    hidden: int = Field(default=0, ge=0, le=8, description="number of hidden layers after the projection",
                        json_schema_extra=_in("model"))
    pieces: int = Field(default=2, ge=2, le=16, description="maxout pieces per unit",
                        json_schema_extra=_in("model"))
    dropout: float = Field(default=0.6, ge=0.0, lt=1.0, description="dropout on h and hidden layers",
                           json_schema_extra=_in("optimiser"))
    # optimisation
    # grouped ove gains little after 7 epochs on Bibtex and over-fits Corel5k's noisy tags after 7;
    # pairwise ove needed 20 (docs/training.md, round v7 of accuracy_sweep.md)
    epochs: int = Field(default=7, ge=1, le=10_000, description="passes over the training rows",
                        json_schema_extra=_in("optimiser"))
    # adagrad steps are cheaper and it leads early at 10^6 labels, but adam ends higher
    # (docs/training.md, bench/results/scale*.md)
    optimizer: Optimizer = Field(default="adam", description="big tables: adam or adagrad (row-wise)",
                                 json_schema_extra=_in("optimiser"))
    lr: float = Field(default=0.01, gt=0.0, le=10.0, description="peak learning rate (adagrad: use ~0.1)",
                      json_schema_extra=_in("optimiser"))
    dense_lr: float = Field(default=0.002, gt=0.0, le=10.0, description="peak lr of hidden layers (Adam)",
                            json_schema_extra=_in("optimiser"))
    # under Adam each touch moves a row by about the lr whatever its gradient, so the input table drifts
    # further the more steps a run takes: long runs of a wide head gain with its rate lowered, short runs
    # and narrow heads (many labels a dimension) lose (docs/training.md)
    input_lr: float = Field(
        default=0.0, ge=0.0, le=10.0,
        description=f"peak lr of the input table; 0: lr, times sqrt({INPUT_LR_STEPS} / steps) in a run "
                    f"of more steps whose head has at most {INPUT_LR_LABELS_PER_DIM} trained labels per "
                    "dimension",
        json_schema_extra=_in("optimiser"),
    )
    warmup: float = Field(default=0.05, ge=0.0, lt=1.0, description="fraction of steps with linear warmup",
                          json_schema_extra=_in("optimiser"))
    schedule: Schedule = Field(default="cosine", description="decay after warmup",
                               json_schema_extra=_in("optimiser"))
    batch_size: int = Field(
        default=0, ge=0, le=MAX_BATCH,
        description=f"rows per training step; 0: {AUTO_BATCHES[1]} once an epoch holds {AUTO_BATCH_ROWS:,} "
        f"rows, {AUTO_BATCHES[0]} below",
        json_schema_extra=_in("optimiser"),
    )
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0, description="decoupled L2 on touched rows",
                                json_schema_extra=_in("optimiser"))
    init_scale: float = Field(default=1.0, gt=0.0, le=100.0, description="init scale of input projection",
                              json_schema_extra=_in("optimiser"))
    seed: int = Field(
        default=0, ge=0, le=MAX_SEED, description="seed of initialisation, sampling and shuffling",
        json_schema_extra=_in("optimiser"),
    )
    device: Device = Field(default="auto", description="auto (a GPU when there is one), cpu or cuda",
                           json_schema_extra=_in("run"))
    precision: Precision = Field(
        default="auto",
        description="fp32, or bf16: a step's score products (its largest matrix products) in bfloat16; "
        "weights, optimizer state and the loss stay float32. auto: bf16 on a CPU with bfloat16 "
        "instructions, fp32 elsewhere (a GPU, or a CPU that would emulate them)",
        json_schema_extra=_in("run"),
    )
    # ranks: the label head is sharded across them, the encoder data-parallel (trainer.label_shards)
    nproc_per_node: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="training processes (ranks) to start on this machine; batch_size is the batch of all "
        "of them together. Under torchrun the ranks come from its environment instead",
        json_schema_extra=_in("run"),
    )
    # a "run" field, not a "model" one: the saved model is one linear model of ensemble·dim, and a continual
    # run continues it as that (trainer.ensemble)
    ensemble: int = Field(
        default=1,
        ge=1,
        le=MAX_ENSEMBLE,
        description="train this many models one after another (seeds seed, seed+1, ...) and save them as one "
        "model ensemble·dim wide that scores their sum: ensemble times the training time and the served "
        "width (linear encoder only)",
        json_schema_extra=_in("run"),
    )
    # featurizer: trainer.featurize.FeaturizerConfig.from_params maps these onto its options, whose library
    # defaults are these same values but for ngrams and lead_words.
    # idf + L2: the best weighting measured on both Bibtex and Corel5k for a linear model
    # (bench/results/featurize_defaults.json)
    tfidf: bool = Field(default=True, description="re-weight features by inverse document frequency",
                        json_schema_extra=_in("featurizer"))
    l2: bool = Field(default=True, description="L2-normalise each input row",
                     json_schema_extra=_in("featurizer"))
    hash_size: int = Field(default=0, ge=0, le=1 << 26, description="text: hash buckets (0 = vocab)",
                           json_schema_extra=_in("featurizer"))
    max_vocab: int = Field(default=200_000, ge=1, le=1 << 26, description="text: vocabulary size cap",
                           json_schema_extra=_in("featurizer"))
    # word pairs carry what single words miss ("an artist" says which noun a gloss is about): P@1 on the
    # WordNet texts rises with them (docs/training.md); XC feature files are not affected
    ngrams: int = Field(
        default=2, ge=1, le=2, description="text: word n-grams in the vocabulary (1 = words, 2 = words and "
        "adjacent word pairs)",
        json_schema_extra=_in("featurizer"),
    )
    # a term in one training text (most word pairs) identifies that text, not a label: dropping them costs
    # nothing on WordNet and keeps its words and pairs under the vocabulary cap (docs/training.md)
    min_df: int = Field(
        default=2, ge=1, le=1_000_000_000,
        description="text: minimum document frequency of a vocabulary term",
        json_schema_extra=_in("featurizer"),
    )
    # a description names what it is about in its first words ("a state of extreme confusion"): those words,
    # marked, weigh apart from the same words further on; P@1 on the WordNet texts rises with them
    # (docs/training.md); XC feature files are not affected
    lead_words: int = Field(
        default=3, ge=0, le=MAX_LEAD_WORDS,
        description="text: the first words of each sentence or clause also count as marked terms of their "
        "own (0 = off)",
        json_schema_extra=_in("featurizer"),
    )
    # continual training (`train --init-from`): only used when a run starts from a base model
    continual_epochs: int = Field(
        default=2,
        ge=1,
        le=10_000,
        description="with a base model: epochs of a continual run when `epochs` is not given",
        json_schema_extra=_in("continual"),
    )
    replay: float = Field(
        default=2.0,
        ge=0.0,
        le=100.0,
        description="with a base model: rows the base already trained on, replayed per epoch, as a "
        "multiple of the rows new to it (0 = train on new rows only)",
        json_schema_extra=_in("continual"),
    )
    continual_schedule: Schedule = Field(
        default="linear",
        description="with a base model: decay of a continual run when `schedule` is not given (a short run "
        "from a trained model learns more at a linearly decaying rate than under cosine's long tail)",
        json_schema_extra=_in("continual"),
    )
    continual_lr: float = Field(
        default=1.25,
        gt=0.0,
        le=100.0,
        description="with a base model: peak learning rates (lr and dense_lr) of a continual run, as a "
        "multiple of `lr` and `dense_lr` (the run starts from a trained model and is short)",
        json_schema_extra=_in("continual"),
    )
    new_label_lr: float = Field(
        default=3.0,
        gt=0.0,
        le=1000.0,
        description="with a base model: learning rate of the head rows of labels new to it, as a multiple "
        "of `lr` (they start from their initialisation, the others from a trained model)",
        json_schema_extra=_in("continual"),
    )
    new_label_negatives: float = Field(
        default=0.2,
        ge=0.0,
        lt=1.0,
        description="with a base model and the uniform sampler: share of each step's sampled negatives drawn "
        "from the new labels that have rows (when `negatives` < the label count), so a label with few rows "
        "is pushed down on the others' rows in a short run (0 = uniform over all labels)",
        json_schema_extra=_in("continual"),
    )
    new_label_init: NewLabelInit = Field(
        default="mean",
        description="with a base model: start of the head rows of labels new to it: mean (the mean "
        "encoding of their positive rows, scaled to score them as trained labels score theirs) or random",
        json_schema_extra=_in("continual"),
    )
    # label texts (`train --label-texts`): w_k = free_k + gain * encoder(featurizer(text_k))
    label_tower_gain: float = Field(
        default=1.0,
        gt=0.0,
        le=1000.0,
        description="with label texts: initial gain of the label tower's rows (learned during training)",
        json_schema_extra=_in("label_texts"),
    )
    # apart and detached, with text rows: on WordNet's training rows split the best PSP@5 and P@1 for a step
    # of about the cost of one without texts; the joint tower cost Bibtex P@1 (docs/training.md)
    label_tower_mode: Literal["joint", "apart"] = Field(
        default="apart",
        description="with label texts: joint (a label's row is its free part plus its tower row) or apart "
        "(a label with rows is its free part alone; the tower is trained beside it as a text-only scorer "
        "of the same candidates and gives the rows of labels without training rows)",
        json_schema_extra=_in("label_texts"),
    )
    label_tower_detach: bool = Field(
        default=True,
        description="with label texts: the tower reads the input encoder without a gradient (only its map "
        "and gain learn from the tower's scores; the encoder learns from the rows it trains on)",
        json_schema_extra=_in("label_texts"),
    )
    label_tower_every: int = Field(
        default=16,
        ge=1,
        le=100_000,
        description="with label texts in the apart mode: train the tower on every N-th step of an epoch only "
        "(its texts are embedded and scored on those steps alone; the joint mode needs them every step)",
        json_schema_extra=_in("label_texts"),
    )
    # a sample of the candidates' texts (the rest read from a table refreshed each epoch) makes a joint step
    # cost little more than one without texts, but scored lower on WordNet's training rows (docs/training.md)
    label_tower_live: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description="with label texts in the joint mode: candidate labels whose texts a step embeds with a "
        "gradient (drawn afresh each step); the others' tower rows are read from a table of every label's, "
        "refreshed each epoch and by the steps that embed them (0 = every candidate's, every step)",
        json_schema_extra=_in("label_texts"),
    )
    label_tower_fade: float = Field(
        default=0.0,
        ge=0.0,
        le=1e9,
        description="with label texts: a label with n training rows gets the tower's row times "
        "fade / (fade + n), so frequent labels rest on their free part (0 = the same tower row for all)",
        json_schema_extra=_in("label_texts"),
    )
    # with the zero scale: of a grid on WordNet's training rows split as its test split was, the most held-out
    # labels found with P@1 and P@5 no lower than without texts; at 0 a text-only label ranks as the rarest
    # labels with rows do (docs/training.md)
    label_tower_zero_bias: float = Field(
        default=2.5,
        ge=-100.0,
        le=100.0,
        description="with label texts: added to the bias a label without training rows gets (that of the "
        "rarest labels with rows): how readily a label known by its text alone is answered",
        json_schema_extra=_in("label_texts"),
    )
    label_tower_zero_scale: float = Field(
        default=0.65625,
        gt=0.0,
        le=100.0,
        description="with label texts: the row norm a label without training rows gets, as a multiple of "
        "that of the rarest labels with rows",
        json_schema_extra=_in("label_texts"),
    )
    label_text_rows: bool = Field(
        default=True,
        description="with label texts: each label that has training rows and a text also trains on its text, "
        "as one more row of that label alone (a fresh run's epochs; a continual run trains on its rows)",
        json_schema_extra=_in("label_texts"),
    )
    # evaluation
    eval_every: int = Field(
        default=1, ge=0, le=10_000, description="evaluate every N epochs (0 = only at the end)",
        json_schema_extra=_in("optimiser"),
    )
    # model selection on held-out TRAINING rows (never the test split). Off by default: with the short
    # schedule of grouped ove it gains nothing on Bibtex or Corel5k (accuracy_sweep.md rows 149, 161) for
    # about twice the training time, and without refit the held-out rows cost accuracy
    valid_fraction: float = Field(
        default=0.0,
        ge=0.0,
        le=0.5,
        description="hold out this fraction of the training rows (seeded split) to pick the epoch whose "
        "weights are kept: the one with the best P@1 on them (0 = off, keep the last epoch)",
        json_schema_extra=_in("run"),
    )
    refit: bool = Field(
        default=False,
        description="with valid_fraction > 0: train again on all training rows and stop after the "
        "selected epoch (same schedule); the saved model is that second run",
        json_schema_extra=_in("run"),
    )
    stop_epoch: int = Field(
        default=0,
        ge=0,
        le=10_000,
        description="end training after this epoch while the learning-rate schedule still spans "
        "`epochs` (0 = all epochs; refit sets it)",
        json_schema_extra=_in("run"),
    )
    patience: int = Field(
        default=0,
        ge=0,
        le=10_000,
        description="with valid_fraction > 0: stop after this many epochs without a better validation "
        "P@1 (0 = train every epoch, still keeping the best one)",
        json_schema_extra=_in("run"),
    )

    @field_validator("*", mode="before")
    @classmethod
    def _finite(cls, value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {'NaN' if math.isnan(value) else value}")
        return value

    @model_validator(mode="after")
    def _fields_agree(self) -> TrainParams:
        self.check_between_fields()
        return self

    def check_between_fields(self) -> None:
        """The checks that involve two fields (ValueError when they disagree)."""
        from trainer.losses import get_loss

        if self.stop_epoch > self.epochs:
            raise ValueError(f"stop_epoch {self.stop_epoch} is after the last epoch ({self.epochs})")
        if self.hard_negatives > 0 and self.loss != "ove":
            raise ValueError(f"hard_negatives {self.hard_negatives} needs loss 'ove', not {self.loss!r}; "
                             "set hard_negatives 0 to train with it")
        if self.hard_negatives > 0 and self.nproc_per_node > 1:
            raise ValueError(f"hard_negatives {self.hard_negatives} trains on one process; set "
                             f"nproc_per_node 1 or hard_negatives 0")
        if self.ensemble > 1:
            self._check_ensemble()
        if self.group_size > 1 and self.sampler != "uniform" and get_loss(self.loss).grouped:
            raise ValueError(
                f"group_size {self.group_size} needs sampler 'uniform' (grouped negatives are only unbiased "
                f"with equal inclusion probabilities); set group_size 1 to use sampler {self.sampler!r}"
            )

    def logit_shift(self, label_texts: bool) -> float:
        """The τ a run applies to its model, with or without label texts: `logit_adjust`, or where it is
        unset the default for that kind of model."""
        if self.logit_adjust is not None:
            return self.logit_adjust
        return 0.0 if label_texts else LOGIT_ADJUST

    def batch_for(self, rows: int) -> int:
        """The rows per step of a run whose epoch holds `rows` rows."""
        return self.batch_size or auto_batch_size(rows)

    @property
    def model_dim(self) -> int:
        """The width of the model these params save: an ensemble's members side by side."""
        return self.dim * self.ensemble

    def _check_ensemble(self) -> None:
        from trainer.losses import get_loss

        n = self.ensemble
        if self.encoder != "linear" or self.hidden > 0:
            raise ValueError(f"ensemble {n} needs encoder 'linear' without hidden layers (only linear "
                             "members sum as one model); set ensemble 1 to train this encoder")
        if get_loss(self.loss).extra_heads:
            raise ValueError(f"ensemble {n} cannot merge the extra heads of loss {self.loss!r}; "
                             "set ensemble 1")
        if self.nproc_per_node > 1:
            raise ValueError(f"ensemble {n} trains its members on one process; set nproc_per_node 1")
        if self.valid_fraction > 0 and not self.refit:
            raise ValueError(f"ensemble {n} with valid_fraction {self.valid_fraction} would fit each member "
                             "on other rows (and so another vocabulary); add refit or set valid_fraction 0")
        if self.model_dim > MAX_DIM:
            raise ValueError(f"ensemble {n} of dim {self.dim} makes a model {self.model_dim} wide, over the "
                             f"{MAX_DIM} a model may have; lower dim or ensemble")
        if self.seed + n - 1 > MAX_SEED:
            raise ValueError(f"ensemble {n} from seed {self.seed} needs seeds up to {self.seed + n - 1}, "
                             f"over {MAX_SEED}; lower seed")

    @field_validator("loss")
    @classmethod
    def _known_loss(cls, value: str) -> str:
        from trainer.losses import LOSSES, load_plugins

        load_plugins()
        if value not in LOSSES:
            raise ValueError(f"unknown loss {value!r}; choose one of {sorted(LOSSES)}")
        return value

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> TrainParams:
        """Parse params of a saved artifact or stored job; turns validation errors into `ParamsError`.

        Params written before `group_size` existed describe pairwise OVE, and those written before `ngrams`
        existed single words, so a missing one reads as 1; before `precision`, every run was float32, and
        before `label_tower_every` an apart tower trained on every step, and before `label_tower_zero_bias` a
        label without rows took the bias of the rarest labels with rows; before `label_tower_live` a joint
        step embedded every candidate's text; before `label_text_rows` no text was a training row, and
        before `label_tower_zero_scale` a label without rows took the rarest labels' norm as it is, and before
        `logit_adjust` no bias was shifted.
        """
        try:
            older = {"group_size": 1, "ngrams": 1, "precision": "fp32", "label_tower_every": 1,
                     "label_tower_zero_bias": 0.0, "label_tower_live": 0, "label_text_rows": False,
                     "label_tower_zero_scale": 1.0, "logit_adjust": 0.0, "lead_words": 0}
            return cls.model_validate({**older, **data})
        except ValidationError as exc:  # said as `field: what is wrong`, without pydantic's links
            raise ParamsError(f"invalid training parameters: {validation_message(exc)}") from exc


def fields_in(*groups: str) -> frozenset[str]:
    """The TrainParams fields of these groups."""
    return frozenset(name for name, info in TrainParams.model_fields.items() if group_of(info) in groups)


def group_of(info: Any) -> str:
    extra = info.json_schema_extra
    return str(extra["group"]) if isinstance(extra, dict) and "group" in extra else ""


# What a continual run does with each field, by its group:
# - the shape of the model or its input rows: taken from the base; a different value given is refused
ARCHITECTURE_FIELDS = fields_in("model", "featurizer")
# - how a run continues, where and how the base ran, its model selection: none of them part of the model,
#   so today's defaults apply unless the caller sets them, never the values the base was trained under
RUN_FIELDS = fields_in("run", "continual")
# - how the model learns: the base's, unless the caller sets them
LEARNING_FIELDS = fields_in("objective", "optimiser", "label_texts")


def _check_groups() -> None:
    """Every field in exactly one group (and so one role): a new field cannot be forgotten."""
    lost = sorted(name for name, info in TrainParams.model_fields.items() if group_of(info) not in GROUPS)
    if lost:
        raise AssertionError(f"TrainParams fields without a group: {lost}")


_check_groups()
