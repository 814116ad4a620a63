"""The `finetune` kind's learner: one epoch of length-grouped pair batches per round."""

from __future__ import annotations

import logging
import math
import random
import time

import torch

from trainables.data.tasks import load_task
from trainables.errors import UserInputError
from trainables.evaluation.evaluators import Embedder, make_evaluator
from trainables.evaluation.postprocess import FittedOnTrain
from trainables.kinds.finetune import FinetuneConfig
from trainables.models.architectures import stack_depth
from trainables.models.batching import TokenCache
from trainables.models.encoder import build_sentence_encoder, load_tokenizer, special_ids, used_parameter_count
from trainables.models.layer_vectors import LayerVectors
from trainables.models.lora import adapter_parameter_count, add_lora
from trainables.models.padding_free import choose_packing
from trainables.objectives import build_loss, objective
from trainables.objectives.adaptive_layers import AdaptiveLayerLoss
from trainables.objectives.matryoshka import MatryoshkaLoss
from trainables.runtime import linear_schedule, scoring_dtype
from trainables.stages.pretrain import pretrained_start
from trainables.training.bi_encoder import (
    build_optimizer,
    check_finite,
    epoch_batches,
    layer_lr_scales,
    no_duplicate_batches,
    train_step,
)
from trainables.training.learner import OneModelLearner


class FinetuneLearner(OneModelLearner):
    def __init__(self, cfg: FinetuneConfig, device, dtype):
        self.cfg, self.device, self.dtype = cfg, device, dtype
        data = load_task(cfg.task, cfg.language, cfg.data_dir, cfg.max_train_samples, cfg.max_eval_samples)
        if data.kind in ("unlabeled", "pairs", "nli"):
            raise UserInputError("task", data.name, "finetune needs a labeled pair task (stsb, sick, mrpc, ...)")
        trained = data if cfg.train_data is None else load_task(cfg.train_data, None, cfg.data_dir,
                                                                cfg.max_train_samples)
        start, stage = pretrained_start(cfg, cfg.pooling)
        self.tokens = TokenCache(load_tokenizer(start, cfg.append_eos), cfg.max_seq_length, cfg.prompt)
        self.model = build_sentence_encoder(start, cfg.layer, cfg.pooling, cfg.projection_dim, cfg.random_init,
                                            cfg.seed, cfg.dropout_masks,
                                            0 if cfg.include_prompt else self.tokens.prompt_length,
                                            cfg.pooling_layers, cfg.bidirectional,
                                            None if cfg.pool_special_tokens else special_ids(self.tokens.tokenizer)
                                            ).to(device)
        if cfg.lora_rank is not None:  # after the cut: adapters on the blocks kept, the encoder's weights frozen
            add_lora(self.model.encoder, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets)
        # padding-free training batches (checked on the model as cut, with its adapters); adaptive layers read
        # every layer's states padded (check_padding refuses `packed` with them)
        self.packed, self.padding = ((False, "adaptive_layers: padded") if cfg.adaptive_layers
                                     else choose_packing(cfg.padding, self.model, device))
        logging.getLogger("trainables").info("training batches %s: %s", "packed" if self.packed else "padded",
                                             self.padding)
        dim = self.model.projection[0].out_features if self.model.projection else self.model.encoder.config.hidden_size
        self.loss_fn = build_loss(cfg.loss, trained.kind, dim).to(device)
        declared = objective(cfg.loss)
        self.cache = cfg.mini_batch_size if declared.gradient_cache else None
        self.guided = declared.guided
        self.depth = stack_depth(self.model.encoder)  # the cut's k: adaptive_layers draws from 0..k-1 below it
        self.matryoshka = None
        if cfg.matryoshka_dims is not None:
            if max(cfg.matryoshka_dims) > dim:
                raise UserInputError("matryoshka_dims", cfg.matryoshka_dims, f"the model's vectors have {dim} "
                                                                             f"dimensions: give sizes up to {dim}")
            self.matryoshka = MatryoshkaLoss(self.loss_fn, cfg.matryoshka_dims, cfg.matryoshka_weights,
                                             cfg.matryoshka_dims_per_step)
        inner = self.matryoshka or self.loss_fn
        self.train_loss = (AdaptiveLayerLoss(inner, cfg.adaptive_prior_weight, cfg.adaptive_kl_weight,
                                             cfg.adaptive_kl_temperature) if cfg.adaptive_layers else inner)
        self.in_batch = trained.kind == "pairs"  # (anchor, positive[, negative]): the batch's own negatives
        sides = ("anchor", "positive") if self.in_batch else ("sentence1", "sentence2")
        self.first, self.second = list(trained.train[sides[0]]), list(trained.train[sides[1]])
        self.negatives = list(trained.train["negative"]) if "negative" in trained.train else []
        roles = cfg.prompts or {}  # each training column's own prompt (sentence-transformers' prompts)
        self.columns = [TokenCache(self.tokens.tokenizer, cfg.max_seq_length, roles.get(role, cfg.prompt))
                        if roles.get(role, cfg.prompt) != cfg.prompt else self.tokens
                        for role in ("anchor", "positive", "negative")]
        for cache, sentences in zip(self.columns, (self.first, self.second, self.negatives), strict=True):
            cache.add(sentences)
        if self.guided:  # the frozen guide's vectors of every train sentence, once (GISTEmbed)
            self.guide_rows, self.guide_vectors = guide_vectors(cfg, self.first + self.second + self.negatives,
                                                                device)
            self.loss_fn.margin, self.loss_fn.strategy = cfg.gist_margin, cfg.gist_margin_strategy
        self.targets = (None if self.in_batch else
                        torch.as_tensor(trained.train["score" if trained.kind == "sts" else "label"].to_numpy().copy()))
        # nli: 0/1/2 labels (entailment, neutral, contradiction), as pair classification's 0/1
        self.evaluator = make_evaluator(data.kind, {"dev": data.dev, "test": data.test}, cfg.select)
        self.metric, self.greater_is_better = self.evaluator.primary("dev"), self.evaluator.greater_is_better
        self.embed = Embedder(self.model, self.tokens, device, scoring_dtype(cfg.eval_precision, dtype))
        self.postprocess = FittedOnTrain(cfg.postprocess, cfg.postprocess_dim, self.model, self.embed,
                                         self.first + self.second)
        self.lengths = [max(len(self.columns[0][a]), len(self.columns[1][b]))
                        for a, b in zip(self.first, self.second, strict=True)]
        total = math.ceil(len(self.lengths) / cfg.batch_size) * cfg.epochs
        scales = layer_lr_scales(self.model, cfg.layer_lr_decay) if cfg.layer_lr_decay != 1.0 else None
        head = [(f"loss.{name}", p) for name, p in self.loss_fn.named_parameters()]  # the head: at lr
        trained = [(name, p) for name, p in self.model.named_parameters() if p.requires_grad]  # LoRA: adapters
        self.optimizer = build_optimizer(trained + head, cfg.lr, cfg.weight_decay, scales)
        self.scheduler = linear_schedule(self.optimizer, round(cfg.warmup_ratio * total), total)
        self.test_frame = data.test
        self.info = {"params": used_parameter_count(self.model) - adapter_parameter_count(self.model),
                     "padding_free": float(self.packed), **stage}
        if cfg.lora_rank is not None:  # the model's size is the merged model's; what trained, beside it
            self.info["trained_params"] = sum(p.numel() for _, p in trained + head)

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"model": self.model, "loss": self.loss_fn}

    def train_round(self, round_: int) -> dict[str, float]:
        cfg = self.cfg
        started = time.perf_counter()
        self.model.train()
        total = 0.0
        if cfg.no_duplicates:  # sentence-transformers' sampler: its seed + epoch (0 first)
            rows = list(zip(*(side for side in (self.first, self.second, self.negatives) if side), strict=True))
            batches = no_duplicate_batches(rows, cfg.batch_size, cfg.seed, round_ - 1)
        else:
            batches = epoch_batches(self.lengths, cfg.batch_size, cfg.seed * 1_000 + round_, cfg.group_by_length)
        for step, batch in enumerate(batches, start=1):
            sides = (self.first, self.second, self.negatives) if self.negatives else (self.first, self.second)
            token_lists = [cache[side[i]] for cache, side in zip(self.columns, sides, strict=False) for i in batch]
            model = self.model if not cfg.adaptive_layers else LayerVectors(self.model, self.drawn(round_, step))
            targets = torch.arange(len(batch)) if self.in_batch else self.targets[batch]  # each anchor's positive
            if self.guided:
                rows = [self.guide_rows[side[i]] for side in sides for i in batch]
                guide = self.guide_vectors[rows].to(self.device)
                self.loss_fn.guide = (guide[:len(batch)], guide[len(batch):])
            if self.matryoshka is not None:
                self.matryoshka.reseed(f"{cfg.seed}/{round_}/{step}/dims")
            loss = train_step(model, self.train_loss, self.optimizer, self.scheduler, token_lists,
                              targets, self.tokens.pad_id, self.device, self.dtype, cfg.max_grad_norm, self.cache,
                              self.packed)
            total += check_finite(loss.item(), f"epoch {round_}, step {step} (lr={cfg.lr})",
                                  "lower the learning rate or use precision fp32")
        seconds = time.perf_counter() - started
        return {"train_loss": total / max(1, len(batches)), "train_samples_per_second": len(self.lengths) / seconds}

    def drawn(self, round_: int, step: int) -> list[int]:
        """adaptive_layers: the earlier layers this step trains (sentence-transformers draws them from Python's
        global generator; here from one seeded by (seed, epoch, step), so that a resumed trial draws the same),
        then the last layer, k."""
        earlier = list(range(self.depth))  # 0 (the embeddings' output) .. k-1, as hidden_states[:-1] there
        count = self.cfg.adaptive_layers_per_step
        if count is not None and count < len(earlier):
            earlier = sorted(random.Random(f"{self.cfg.seed}/{round_}/{step}").sample(earlier, count))
        return [*earlier, self.depth]

    def test_extras(self) -> dict[str, float]:
        """Dev and test of the trained model (its best-dev weights) at every layer 0..k (adaptive_layers), each as
        a model cut there with this head (`layer<j>_dev_spearman`, ...), at every size d of matryoshka_dims
        (`dim<d>_dev_spearman`, ...), and with both at every pair (`layer<j>_dim<d>_dev_spearman`, ...)."""
        cfg = self.cfg
        if not cfg.adaptive_layers and cfg.matryoshka_dims is None:
            return {}
        layers = range(self.depth + 1) if cfg.adaptive_layers else [None]
        model = LayerVectors(self.model, layers) if cfg.adaptive_layers else self.model
        every = Embedder(model, self.tokens, self.device, self.embed.dtype)
        encoded: dict[tuple[str, ...], torch.Tensor] = {}  # a split's sentences: one pass gives every layer

        def at(layer: int | None, dims: int | None):
            def embed(sentences):
                key = tuple(sentences)
                if key not in encoded:
                    encoded[key] = every(sentences)
                vectors = encoded[key] if layer is None else encoded[key][:, layer]
                return vectors if dims is None else vectors[..., :dims]
            return embed

        scores: dict[str, float] = {}
        for layer in layers:
            for dims in [None, *(cfg.matryoshka_dims or [])]:
                if layer is None and dims is None:
                    continue  # the trial's own scores
                name = "_".join(([f"layer{layer}"] if layer is not None else []) + ([f"dim{dims}"] if dims else []))
                for split in ("dev", "test"):
                    found = self.evaluator.evaluate(at(layer, dims), split)
                    scores.update({f"{name}_{k}": v for k, v in found.items()})
        return scores

    def postprocess_map(self):
        """Fitted on the train split's distinct sentences with the weights held now (FittedOnTrain)."""
        return self.postprocess()

    def evaluate(self, split: str):
        metrics = self.evaluator.evaluate(self.postprocess.embedder(), split)
        return metrics, self.evaluator.last_scores[split]

    def sentence_model(self):
        return self.model, self.tokens.tokenizer, self.cfg.max_seq_length


def guide_vectors(cfg: FinetuneConfig, sentences: list[str], device) -> tuple[dict[str, int], torch.Tensor]:
    """`guide_model`'s vectors of the distinct sentences (in inference mode, fp32) and each sentence's row."""
    distinct = list(dict.fromkeys(sentences))
    guide = build_sentence_encoder(cfg.guide_model, None, cfg.guide_pooling).to(device)
    tokens = TokenCache(load_tokenizer(cfg.guide_model), cfg.max_seq_length)
    tokens.add(distinct)
    vectors = Embedder(guide, tokens, device)(distinct)
    return {s: i for i, s in enumerate(distinct)}, vectors
