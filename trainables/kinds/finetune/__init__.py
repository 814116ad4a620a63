"""`finetune`: a bi-encoder truncated to its first k layers, trained on a labelled pair task,
optionally from a domain-adaptive pretraining stage (`pretrain:`, which is DAPT).

A round is an epoch: length-grouped batches, padding per length-sorted chunk, one optimizer and
schedule over all epochs. STS objectives (cosine_mse as in the paper, cosent, angle) or pair
classification (softmax over (u, v, |u-v|) as SBERT, cosine_bce); `select: f1` selects MRPC on F1.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainables.contract import LoraFields, PoolingLayersFields, PostprocessFields, PromptFields, TrainingConfig
from trainables.data.declaration import TASK_HELP, TaskRef
from trainables.errors import UserInputError
from trainables.kinds.base import (
    TrainingKind,
    check_lora,
    check_pooling_layers,
    check_postprocess,
    check_special_tokens,
    refuse_unused,
)
from trainables.names import PACKED_FAMILIES, PADDINGS, SELECTS
from trainables.objectives import OBJECTIVES, check_loss
from trainables.poolings import POOLINGS
from trainables.stages.fields import PretrainFields, check_pretrain


class FinetuneConfig(TrainingConfig, PretrainFields, PromptFields, LoraFields, PostprocessFields,
                     PoolingLayersFields):
    model: str
    task: TaskRef = Field("stsb", description=TASK_HELP)
    language: str | None = None
    train_data: TaskRef | None = Field(None, description="train on this data set's train split instead of the "
                                                         "task's (a built-in name such as sick_nli, or a mapping "
                                                         "like task:); the task's dev still selects and its test "
                                                         "scores. Pairs or triplets train a pairs loss (mnrl, "
                                                         "mnrl_symmetric, gte)")
    prompts: dict[str, str] | None = Field(None, description="train_data pairs or triplets: each column's own "
                                                             "prompt, as sentence-transformers' prompts "
                                                             "({anchor: 'query: ', positive: 'passage: '}); a "
                                                             "column not named takes prompt, and dev and test are "
                                                             "scored with prompt")
    no_duplicates: bool = Field(False, description="sentence-transformers' NoDuplicatesBatchSampler: no sentence "
                                                   "twice in a batch (no in-batch negative that copies an anchor or "
                                                   "positive; their advice for mnrl and gist), in place of the "
                                                   "length-grouped order")
    mini_batch_size: int = Field(32, ge=1, description="a GradCache loss (cached_mnrl): sentences encoded at once "
                                                      "with gradients (sentence-transformers' mini_batch_size); "
                                                      "batch_size stays the pairs a step's loss sees")
    guide_model: str | None = Field(None, description="a guided loss (gist): the frozen model whose cosines judge "
                                                       "which in-batch negatives are false (GISTEmbed's guide), a "
                                                       "hub id or folder")
    guide_pooling: str = Field("mean", description="guide_model: how its token states are pooled")
    gist_margin: float = Field(0.0, ge=0, description="gist: a candidate the guide finds within this of the "
                                                      "anchor's positive is still a negative")
    gist_margin_strategy: Literal["absolute", "relative"] = Field("absolute", description="gist: the margin as a "
                                                                  "cosine (absolute) or a share of the positive's")
    layer: int | None = Field(None, ge=0, description="keep the first k layers; null keeps all")
    pooling: str = "mean"
    projection_dim: int | None = Field(None, ge=1)
    random_init: bool = False
    loss: str = "cosine_mse"
    select: str | None = Field(None, description="pair classification: accuracy (default) or f1, the metric that "
                                                 "tunes the dev threshold and selects epochs, trials and layers")
    lr: float = Field(2e-5, gt=0)
    epochs: int = Field(4, ge=1)
    batch_size: int = Field(32, ge=2)
    max_seq_length: int = Field(128, ge=2)
    warmup_ratio: float = Field(0.1, ge=0, le=1)
    weight_decay: float = Field(0.01, ge=0)
    layer_lr_decay: float = Field(1.0, gt=0, le=1, description="ELECTRA's layer-wise lr decay: a block at depth d "
                                                             "of n trains at lr * decay ** (n + 2 - d), the "
                                                             "embeddings at depth 0, the head at lr; 1.0 is off")
    max_grad_norm: float | None = Field(1.0, gt=0)
    group_by_length: bool = True
    padding: str = Field("auto", description="how a training batch's sentences go through the encoder: padded "
                                             "(each length-sorted chunk padded to its longest), packed (padding-free: "
                                             "one row of the sentences' own tokens, attention per sentence; "
                                             "trainables.models.padding_free) or auto (packed on a GPU for the "
                                             "families that allow it, padded on a CPU, where neither measured "
                                             "faster). Dev and test are scored padded either way")
    adaptive_layers: bool = Field(False, description="sentence-transformers' AdaptiveLayerLoss (2D Matryoshka's "
                                                     "layers): each step also trains earlier layers of the cut "
                                                     "model on the loss, pulled toward the last by a KL term; the "
                                                     "trial then scores every layer 0..k (layer<j>_dev_*, "
                                                     "layer<j>_test_*)")
    adaptive_layers_per_step: int | None = Field(1, ge=1, description="adaptive_layers: earlier layers drawn per "
                                                                      "step (2DMSE: 1); null: all of them")
    adaptive_prior_weight: float = Field(1.0, ge=0, description="adaptive_layers: weight of the earlier layers' "
                                                                "loss (their mean)")
    adaptive_kl_weight: float = Field(1.0, ge=0, description="adaptive_layers: weight of the KL term")
    adaptive_kl_temperature: float = Field(0.3, ge=0, description="adaptive_layers: the KL term's temperature; "
                                                                  "0 drops the term")
    matryoshka_dims: list[int] | None = Field(None, min_length=1, description="sentence-transformers' "
                                              "MatryoshkaLoss: the loss also on each vector's first d dimensions "
                                              "(unit-normalised), for each d here, summed; the trial then scores "
                                              "every d (dim<d>_dev_*, dim<d>_test_*). With adaptive_layers: 2D "
                                              "Matryoshka, every (layer, d) scored (layer<j>_dim<d>_*)")
    matryoshka_weights: list[float] | None = Field(None, description="matryoshka_dims: each dimension's weight, in "
                                                                     "the same order (default 1 each)")
    matryoshka_dims_per_step: int | None = Field(None, ge=1, description="matryoshka_dims: dimensions drawn per step "
                                                                         "(null: all; 2D Matryoshka's default: 1)")


class FinetuneKind(TrainingKind):
    example = {"layer": 2, "epochs": 3, "lr": 1e-3, "batch_size": 16}
    Config = FinetuneConfig
    learner = "trainables.kinds.finetune.learner:FinetuneLearner"
    exports_models = True
    names = {"pooling": POOLINGS, "loss": OBJECTIVES, "padding": PADDINGS}
    fused_scalars = ("lr", "weight_decay", "warmup_ratio", "max_grad_norm")

    def pilot(self, cfg):
        from trainables.data.tasks import load_task

        trained = cfg.train_data if cfg.train_data is not None else cfg.task
        language = None if cfg.train_data is not None else cfg.language
        return self.epoch_pilot(cfg, len(load_task(trained, language, cfg.data_dir, cfg.max_train_samples).train))

    def fuse_refusal(self, cfg) -> str | None:
        """What a fused array (trainables.kinds.finetune.array) does not train: each member's step is the
        plain pair loss of a whole batch through one stacked encoder, with one learning rate per member and the
        fast dropout masks."""
        from trainables.objectives import objective

        declared = objective(cfg.loss)
        reasons = [(declared.task == "pairs", f"loss {cfg.loss} takes in-batch negatives"),
                   (declared.gradient_cache, f"loss {cfg.loss} encodes in mini-batches (GradCache)"),
                   (cfg.lora_rank is not None, "lora_rank: adapters are not stacked"),
                   (cfg.adaptive_layers, "adaptive_layers trains other layers each step"),
                   (cfg.matryoshka_dims is not None, "matryoshka_dims draws sizes each step"),
                   (cfg.pooling_layers != "last", "pooling_layers mixes layers"),
                   (cfg.layer_lr_decay != 1.0, "layer_lr_decay gives a member several learning rates"),
                   (cfg.no_duplicates, "no_duplicates batches differ in size between members"),
                   (cfg.dropout_masks != "fast", f"dropout_masks: {cfg.dropout_masks} (an array draws the fast "
                                                 "masks)"),
                   (cfg.padding == "packed", "padding: packed (an array pads its members' batches)")]
        found = [why for holds, why in reasons if holds]
        return "; ".join(found) if found else None

    def run_array(self, configs, labels, report, checkpoint_dirs, probe: bool = False) -> None:
        from trainables.kinds.finetune.array import run_array

        run_array(self, configs, labels, report, checkpoint_dirs, probe)

    def tables(self, cfg) -> tuple[str, ...]:
        sizes = () if cfg.matryoshka_dims is None else ("layer_sizes",) if cfg.adaptive_layers else ("sizes",)
        return super().tables(cfg) + (("layers",) if cfg.adaptive_layers else ()) + sizes

    def check_names(self, cfg, key_of) -> None:
        from trainables.data.tasks import task_kind, task_name

        super().check_names(cfg, key_of)
        kind = task_kind(cfg.task)
        if cfg.train_data is None:
            check_loss(cfg.loss, kind, f"task {task_name(cfg.task)}", key_of("loss"))
        else:
            check_train_data(cfg, key_of)
        check_guide(cfg, key_of)
        check_prompts(cfg, key_of)
        if cfg.mini_batch_size != 32 and not key_of("loss").startswith(("ablate.", "tune.")):
            from trainables.objectives import objective

            if not objective(cfg.loss, key_of("loss")).gradient_cache:
                raise UserInputError(key_of("mini_batch_size"), cfg.mini_batch_size, f"only a GradCache loss reads "
                                                                                      f"it (cached_mnrl); loss "
                                                                                      f"{cfg.loss} encodes the whole "
                                                                                      f"batch: remove mini_batch_size")
        if cfg.select is not None and (kind != "classification" or cfg.select not in SELECTS):
            raise UserInputError(key_of("select"), cfg.select, f"pair classification selects on one of: "
                                                               f"{', '.join(SELECTS)}; STS tasks select on Spearman")
        check_pretrain(cfg, key_of)
        check_adaptive_layers(cfg, key_of)
        check_matryoshka(cfg, key_of)
        check_lora(cfg, key_of)
        check_postprocess(cfg, key_of)
        check_pooling_layers(cfg, key_of)
        check_special_tokens(cfg, key_of)
        check_padding(cfg, key_of)


def check_padding(cfg, key_of) -> None:
    """`padding: packed` where a packed row cannot train: a mix of layers or adaptive layers (each reads layers'
    states padded), or a model family that does not run packed rows as padded batches (PACKED_FAMILIES, from its
    config.json; `auto` pads those)."""
    if cfg.padding != "packed":
        return
    reasons = [(cfg.pooling_layers != "last", f"{key_of('pooling_layers')}: {cfg.pooling_layers} mixes layers' "
                                              "states, read padded"),
               (cfg.adaptive_layers, f"{key_of('adaptive_layers')} scores every layer's states, read padded")]
    found = [why for holds, why in reasons if holds]
    if found:
        raise UserInputError(key_of("padding"), "packed", f"{'; '.join(found)}: use padding: auto or padded")
    from trainables.models.files import model_type

    try:
        family = model_type(cfg.model)
    except UserInputError:  # a model that cannot be read is said by the model's own check
        return
    if family not in PACKED_FAMILIES:
        raise UserInputError(key_of("padding"), "packed", f"{cfg.model} (model_type {family}) does not run a "
                                                          "packed row as it runs a padded batch (the families that "
                                                          f"do: {', '.join(sorted(PACKED_FAMILIES))}): use "
                                                          "padding: auto or padded")


def check_train_data(cfg, key_of) -> None:
    """`train_data`: a data set with a train split (not a corpus of single sentences), whose kind the loss trains."""
    import difflib

    from trainables.data.tasks import TASKS, task_kind, task_name, task_spec

    try:
        kind = task_kind(cfg.train_data)
    except UserInputError as exc:  # a name that is no task, or a declaration of a bad shape
        close = difflib.get_close_matches(cfg.train_data, TASKS, n=1) if isinstance(cfg.train_data, str) else []
        fix = f"did you mean {close[0]}? {exc.fix}" if close else exc.fix
        raise UserInputError(key_of("train_data") + exc.key.removeprefix("task"), exc.value, fix) from None
    if isinstance(cfg.train_data, str) and task_spec(cfg.train_data).eval_only:
        raise UserInputError(key_of("train_data"), cfg.train_data, "it has a test split only: name a data set with a "
                                                                 "train split")
    if kind == "unlabeled":
        raise UserInputError(key_of("train_data"), task_name(cfg.train_data), "it is single sentences: finetune "
                                                                             "trains on pairs (sts, "
                                                                             "pair_classification, pairs, triplets)")
    check_loss(cfg.loss, kind, f"train_data {task_name(cfg.train_data)}", key_of("loss"))


ROLES = ("anchor", "positive", "negative")


def check_prompts(cfg, key_of) -> None:
    """`prompts`: a prompt per column of training pairs or triplets; pooling without the prompt reads one
    prompt length, so not with include_prompt: false."""
    if cfg.prompts is None:
        return
    from trainables.data.tasks import task_kind

    bad = [role for role in cfg.prompts if role not in ROLES]
    if bad:
        raise UserInputError(f"{key_of('prompts')}.{bad[0]}", cfg.prompts[bad[0]], f"the columns of training pairs "
                                                                                   f"are {', '.join(ROLES)}")
    if cfg.train_data is None or task_kind(cfg.train_data) != "pairs":
        raise UserInputError(key_of("prompts"), cfg.prompts, "a prompt per column is for training pairs or "
                                                             "triplets (train_data); the task's two sentences "
                                                             "take one prompt: use prompt")
    if not cfg.include_prompt:
        raise UserInputError(key_of("prompts"), cfg.prompts, f"{key_of('include_prompt')}: false pools without one "
                                                             "prompt's tokens, and these differ per column: use "
                                                             "include_prompt: true with prompts")


GIST_SETTINGS = (("guide_model", None), ("guide_pooling", "mean"), ("gist_margin", 0.0),
                 ("gist_margin_strategy", "absolute"))


def check_guide(cfg, key_of) -> None:
    """A guided loss (gist) needs `guide_model`, a model this machine can read; without one its settings would
    be unused (a study that ablates or tunes the loss uses them in the cells that name gist)."""
    from trainables.objectives import objective

    if not objective(cfg.loss, key_of("loss")).guided:
        refuse_unused(cfg, key_of, "loss", GIST_SETTINGS,
                      lambda name: f"only a guided loss reads it (gist); loss {cfg.loss} has no guide: remove {name}")
        return
    if cfg.guide_model is None:
        raise UserInputError(key_of("guide_model"), None, f"loss {cfg.loss} judges its in-batch negatives with a "
                                                           "guide model: name one (a hub id or folder, e.g. "
                                                           "sentence-transformers/all-MiniLM-L6-v2)")
    from trainables.models.files import model_config

    try:
        model_config(cfg.guide_model)
    except UserInputError as exc:
        raise UserInputError(key_of("guide_model"), cfg.guide_model, exc.fix) from None
    if cfg.guide_pooling not in POOLINGS:
        from trainables.errors import one_of

        raise one_of(key_of("guide_pooling"), cfg.guide_pooling, list(POOLINGS))


MATRYOSHKA_SETTINGS = (("matryoshka_weights", None), ("matryoshka_dims_per_step", None))


def check_matryoshka(cfg, key_of) -> None:
    """`matryoshka_dims`: distinct sizes no larger than the vectors the model gives, one weight each; scored at each
    size without a post-processing fitted for the whole vector; its settings without it would be unused."""
    if cfg.matryoshka_dims is None:
        refuse_unused(cfg, key_of, "matryoshka_dims", MATRYOSHKA_SETTINGS,
                      lambda name: f"{name} is read only with {key_of('matryoshka_dims')}: set it, or remove {name}")
        return
    dims = cfg.matryoshka_dims
    if min(dims) < 1 or len(set(dims)) != len(dims):
        raise UserInputError(key_of("matryoshka_dims"), dims, "give distinct sizes of at least 1, e.g. [384, 256, "
                                                              "128, 64]")
    width = cfg.projection_dim or _hidden_size(cfg.model)
    if width is not None and max(dims) > width:
        raise UserInputError(key_of("matryoshka_dims"), dims, f"the model's vectors have {width} dimensions: give "
                                                              f"sizes up to {width} (and {width} itself, to train "
                                                              "the whole vector too)")
    if cfg.matryoshka_weights is not None and len(cfg.matryoshka_weights) != len(dims):
        raise UserInputError(key_of("matryoshka_weights"), cfg.matryoshka_weights, f"give one weight per size of "
                                                                                    f"matryoshka_dims ({len(dims)})")
    if cfg.matryoshka_dims_per_step is not None and cfg.matryoshka_dims_per_step > len(dims):
        raise UserInputError(key_of("matryoshka_dims_per_step"), cfg.matryoshka_dims_per_step,
                             f"matryoshka_dims has {len(dims)} sizes: draw at most {len(dims)}, or null for all")
    if cfg.postprocess != "none":
        raise UserInputError(key_of("matryoshka_dims"), dims, f"each size is scored as the vector's first d "
                                                              f"dimensions: use {key_of('postprocess')}: none with it")


def _hidden_size(model: str) -> int | None:
    """The model's hidden size from its config, or None where it cannot be read here (the trial says)."""
    from trainables.models.files import model_config

    try:
        size = model_config(model).get("hidden_size")
    except Exception:  # noqa: BLE001 (a model that cannot be read is named by the checks that load it)
        return None
    return size if isinstance(size, int) else None


ADAPTIVE_SETTINGS = (("adaptive_layers_per_step", 1), ("adaptive_prior_weight", 1.0), ("adaptive_kl_weight", 1.0),
                     ("adaptive_kl_temperature", 0.3))


def check_adaptive_layers(cfg, key_of) -> None:
    """`adaptive_layers` trains and scores single layers with the cut's head: not with a mix of layers or a
    post-processing fitted for the last layer; its settings without it would be unused."""
    if not cfg.adaptive_layers:
        refuse_unused(cfg, key_of, "adaptive_layers", ADAPTIVE_SETTINGS,
                      lambda name: f"{name} is read only with {key_of('adaptive_layers')}: true: set it, or remove "
                                   f"{name}")
        return
    if cfg.pooling_layers != "last":
        raise UserInputError(key_of("adaptive_layers"), True, f"it trains and scores one layer at a time: use "
                                                              f"{key_of('pooling_layers')}: last with it")
    if cfg.postprocess != "none":
        raise UserInputError(key_of("adaptive_layers"), True, f"every layer is scored without a post-processing "
                                                              f"fitted for the last: use {key_of('postprocess')}: "
                                                              f"none with it")
