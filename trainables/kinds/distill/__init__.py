"""`distill`: Trans-Encoder (Liu et al., ICLR 2022) self- and mutual-distillation between bi- and
cross-encoders on unlabeled pairs, and plain teacher -> student distillation. A round is a cycle.

One cycle of `mode: self`: the bi-encoder trained in the previous cycle scores every pair by cosine
(clipped to [0, 1]); the cross-encoder learns those scores on both orders of each pair (BCE); it
relabels the pairs (sigmoid, averaged over both orders); the bi-encoder learns them (MSE on cosine).
With `restart_each_cycle`, each encoder starts fresh right before it learns, *after* the labels of
the previous cycle's models were taken, so only the labels carry over. `mode: mutual` runs two
bi-/cross-encoder pairs (two layers or two models) that learn from the average of their labels.
`mode: teacher` trains a cross-encoder on the task's gold train labels (a cached stage with its own
seed) whose scores teach the bi-encoder. The cycle is chosen on the bi-encoder's dev Spearman;
test is scored once, with that cycle's weights. Every cycle's labels are kept in the checkpoint
and logged as the MLflow artifact `pseudo_labels.csv`.
"""

from __future__ import annotations

from pydantic import Field

from trainables.contract import LoraFields, PoolingLayersFields, PostprocessFields, PromptFields, TrainingConfig
from trainables.data.declaration import TaskRef
from trainables.errors import UserInputError
from trainables.kinds.base import (
    PilotSpec,
    TrainingKind,
    check_head_pooling,
    check_lora,
    check_pooling_layers,
    check_postprocess,
    check_special_tokens,
)
from trainables.models.files import model_depth
from trainables.names import CROSS_HEADS, CROSS_LOSSES
from trainables.poolings import POOLINGS
from trainables.stages.fields import PretrainFields, check_pretrain

MODES = ("self", "mutual", "teacher")


class DistillConfig(TrainingConfig, PretrainFields, PromptFields, PoolingLayersFields, LoraFields, PostprocessFields):
    model: str = Field(description="the bi-encoder to start from (Trans-Encoder: an unsupervised SimCSE model)")
    mode: str = Field("self", description="self, mutual (two encoder pairs, averaged labels) or teacher")
    cross_model: str | None = Field(None, description="the cross-encoder's backbone; null is the bi-encoder's start "
                                                      "(`model`, or its pretraining stage)")
    partner_model: str | None = Field(None, description="mutual: the second bi-encoder; null is `model`")
    partner_layer: int | None = Field(None, ge=0, description="mutual: the second bi-encoder's layer")
    partner_cross_model: str | None = Field(None, description="mutual: the second cross backbone")
    task: TaskRef = Field("stsb", description="the STS task: its dev split selects cycles; its pairs are unlabeled")
    language: str | None = None
    pairs: str = Field("task", description="task (train pairs, labels dropped), task+dev, task+test "
                                           "(transductive), or a TSV file of two sentence columns")
    layer: int | None = Field(None, ge=0)
    pooling: str = "mean"
    cross_layer: int | None = Field(None, ge=0)
    cross_pooling: str = Field("cls", description="with cross_head: linear (pretrained reads the first token)")
    cross_head: str = Field("pretrained", description="pretrained: the cross model's own classification head (its "
                                                      "pretrained pooler, dropout, a new classifier), as "
                                                      "sentence-transformers' CrossEncoder in the Trans-Encoder "
                                                      "reference; linear: a new linear layer on the pooled state")
    pretrain_lr: float = Field(3e-5, gt=0)
    pretrain_batch_size: int = Field(64, ge=1)
    pretrain_max_seq_length: int = Field(32, ge=8)
    cycles: int = Field(3, ge=1)
    bi_epochs: int = Field(10, ge=1)
    bi_lr: float = Field(5e-5, gt=0)
    bi_batch_size: int = Field(128, ge=2)
    bi_max_seq_length: int = Field(32, ge=2)
    cross_epochs: int = Field(1, ge=1)
    cross_lr: float = Field(2e-5, gt=0)
    cross_batch_size: int = Field(32, ge=1)
    cross_max_seq_length: int = Field(64, ge=4, description="the same at training and test time")
    cross_loss: str = "bce"
    restart_each_cycle: bool = Field(False, description="each encoder starts fresh before it learns, after the "
                                                        "previous cycle's models labelled the pairs")
    max_train_samples: int | None = Field(None, ge=1, description="at most this many unlabeled pairs")

    def num_reports(self) -> int:
        return 1 if self.mode == "teacher" else self.cycles


class DistillKind(TrainingKind):
    example = {"layer": 2, "cycles": 2, "bi_epochs": 1, "cross_epochs": 1, "max_train_samples": 64}
    Config = DistillConfig
    learner = "trainables.kinds.distill.learner:DistillLearner"
    exports_models = True
    round_name = "cycle"
    round_table = True
    names = {"mode": MODES, "cross_loss": CROSS_LOSSES, "pooling": POOLINGS, "cross_pooling": POOLINGS,
             "cross_head": CROSS_HEADS}

    def pilot(self, cfg):
        """A cycle's work (labelling, the cross- and the bi-encoder's epochs) grows with the pairs:
        time one cycle on a few batches' worth of pairs. With `mode: teacher` the one round holds
        the teacher stage, trained on every train pair: the pilot is that round."""
        if cfg.mode == "teacher":
            return super().pilot(cfg)
        from trainables.data.tasks import unlabeled_pairs  # the pairs a trial would see

        pairs = len(unlabeled_pairs(cfg.pairs, cfg.task, cfg.language, cfg.data_dir, cfg.transductive,
                                    cfg.max_train_samples))
        kept = min(pairs, 2 * max(cfg.bi_batch_size, cfg.cross_batch_size))
        return PilotSpec({**self.stage_free(cfg), "cycles": 1, "max_train_samples": kept}, kept, pairs, "pair")

    def stages(self, cfg) -> tuple[str, ...]:
        return super().stages(cfg) + (("teacher",) if cfg.mode == "teacher" else ())

    def layer_bounds(self, cfg):
        partner = cfg.partner_model or cfg.model
        return [("layer", cfg.layer, cfg.model), ("cross_layer", cfg.cross_layer, cfg.cross_model or cfg.model),
                ("partner_layer", cfg.partner_layer, partner)]

    def check_names(self, cfg, key_of) -> None:
        super().check_names(cfg, key_of)
        check_head_pooling(cfg.cross_head, cfg.cross_pooling, key_of("cross_pooling"), "cross_head")
        check_pretrain(cfg, key_of)
        check_pooling_layers(cfg, key_of)  # the bi-encoder's cut
        check_special_tokens(cfg, key_of)
        check_lora(cfg, key_of)  # the bi-encoder's adapters (both bi-encoders' in mutual mode)
        check_postprocess(cfg, key_of)  # each bi-encoder's map, fitted on the pairs it trains on
        if cfg.mode == "mutual" and not isinstance(cfg.pooling_layers, str):  # a list is one cut: the partner's too
            from trainables.models.pooling_layers import problem

            partner = cfg.partner_model or cfg.model
            try:
                cut = cfg.partner_layer if cfg.partner_layer is not None else model_depth(partner)
            except UserInputError:
                return
            found = problem(cfg.pooling_layers, cut, key_of("partner_layer") if cfg.partner_layer is not None
                            else "the partner's last layer")
            if found:
                raise UserInputError(key_of("pooling_layers"), cfg.pooling_layers, found)
