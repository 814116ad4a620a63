"""`cross_encoder`: both sentences in one input to a (truncated) encoder with a regression head,
trained on a labelled STS task; a round is an epoch."""

from __future__ import annotations

from pydantic import Field

from trainables.contract import TrainingConfig
from trainables.data.declaration import TASK_HELP, TaskRef
from trainables.kinds.base import TrainingKind, check_head_pooling
from trainables.names import CROSS_HEADS, CROSS_LOSSES
from trainables.poolings import POOLINGS
from trainables.stages.fields import PretrainFields, check_pretrain


class CrossEncoderConfig(TrainingConfig, PretrainFields):
    model: str
    task: TaskRef = Field("stsb", description=TASK_HELP)
    language: str | None = None
    layer: int | None = Field(None, ge=0, description="keep the first k layers; null keeps all")
    pooling: str = Field("cls", description="with head: linear; head: pretrained reads the first token (cls)")
    head: str = Field("pretrained", description="pretrained: the model's own classification head, its pretrained "
                                                "pooler (dense + tanh), dropout and a new classifier, as "
                                                "sentence-transformers' CrossEncoder; linear: a new linear layer on "
                                                "the pooled last hidden state")
    loss: str = Field("bce", description="bce on the logit, or mse of the sigmoid")
    lr: float = Field(2e-5, gt=0)
    epochs: int = Field(3, ge=1)
    batch_size: int = Field(32, ge=1)
    max_seq_length: int = Field(128, ge=4, description="tokens of the joined pair")
    warmup_ratio: float = Field(0.1, ge=0, le=1)
    weight_decay: float = Field(0.01, ge=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    group_by_length: bool = True


class CrossEncoderKind(TrainingKind):
    example = {"layer": 1, "epochs": 2, "lr": 1e-3, "batch_size": 32, "max_seq_length": 48,
               "max_train_samples": 96}
    Config = CrossEncoderConfig
    learner = "trainables.kinds.cross_encoder.learner:CrossEncoderLearner"
    names = {"pooling": POOLINGS, "loss": CROSS_LOSSES, "head": CROSS_HEADS}

    def check_names(self, cfg, key_of) -> None:
        super().check_names(cfg, key_of)
        check_head_pooling(cfg.head, cfg.pooling, key_of("pooling"))
        check_pretrain(cfg, key_of)

    def pilot(self, cfg):
        from trainables.data.tasks import load_task

        return self.epoch_pilot(cfg, len(load_task(cfg.task, cfg.language, cfg.data_dir, cfg.max_train_samples).train))
