"""Probing building blocks (the `probe` kind and `orchestrator probe`): every layer of an encoder
scored zero-shot, no training.

One forward pass per chunk returns all hidden states at once; each layer's states (layer k as the model
cut at k gives it, trainables.models.architectures) are pooled and scored with the task's evaluator.
The same pooled vectors give each layer's label-free diagnostics (trainables.evaluation.diagnostics).
The model is cut after the deepest layer asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn

from trainables.data.tasks import load_task
from trainables.errors import UserInputError
from trainables.evaluation.diagnostics import DIRECTIONS, layer_diagnostics, pick_and_agreement
from trainables.evaluation.evaluators import Embedder, make_evaluator
from trainables.evaluation.postprocess import fit, fitted_embed
from trainables.evaluation.sts_suite import load_suite, score_suite, suite_sentences
from trainables.models.architectures import layer_states, refuse_pooling, stack_depth
from trainables.models.batching import TokenCache
from trainables.models.encoder import (
    load_encoder,
    load_tokenizer,
    special_ids,
    truncate_encoder,
    truncated_parameter_count,
    without_prompt,
    without_special,
)
from trainables.models.layer_mix import mixed
from trainables.models.pooling_layers import mixed_layers
from trainables.poolings import POOLINGS, build_pooling
from trainables.runtime import resolve_device, resolve_precision, without_cudnn_attention


class ProbeSettings(Protocol):
    """What the probe reads of its config: the probe kind's declaration (`trainables.kinds.probe.ProbeConfig`)
    is one; named here so that evaluation/ imports no kind above it."""

    model: str
    task: Any
    language: str | None
    layers: list[int] | None
    pooling: str
    pooling_layers: str | list[int]
    splits: list[str]
    max_seq_length: int
    precision: str
    device: str
    num_threads: int | None
    data_dir: str | None
    max_eval_samples: int | None
    max_train_samples: int | None
    postprocess: str
    postprocess_dim: int | None
    prompt: str
    include_prompt: bool
    append_eos: bool
    bidirectional: bool
    pool_special_tokens: bool


class AllLayers(nn.Module):
    """Pooled states of the chosen layers: (batch, layers, dim). Layer k is what the encoder cut at k
    returns (trainables.models.architectures: a pre-norm stack's final norm on h_k), from one pass."""

    def __init__(self, encoder: nn.Module, layers: Sequence[int], pooling: str, prompt_tokens: int = 0,
                 pooling_layers: str | list[int] = "last", skipped_ids: list[int] | None = None):
        super().__init__()
        refuse_pooling(encoder.config, pooling)
        self.encoder, self.layers, self.pooling, self.prompt_tokens = encoder, list(layers), pooling, prompt_tokens
        self.pool_layer = build_pooling(pooling, encoder.config.hidden_size)
        self.mixes = [mixed_layers(pooling_layers, k) for k in self.layers]  # row k: the layers it averages
        self.needed = sorted({j for mix in self.mixes for j in mix})
        self.skipped_ids: torch.Tensor | None  # pool_special_tokens: false
        self.register_buffer("skipped_ids", None if skipped_ids is None else torch.tensor(skipped_ids),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = dict(zip(self.needed, layer_states(self.encoder, {"input_ids": input_ids,
                                                                  "attention_mask": attention_mask}, self.needed),
                          strict=True))
        pooled = without_special(without_prompt(attention_mask, self.prompt_tokens), input_ids,  # include_prompt
                                 self.skipped_ids)  # and pool_special_tokens: false
        return torch.stack([self.pool_layer(mixed(states, mix), pooled) for mix in self.mixes], dim=1)


def resolve_layers(layers: Sequence[int] | None, depth: int) -> list[int]:
    """`None` is every layer 0..depth; explicit layers must lie in that range."""
    if layers is None:
        return list(range(depth + 1))
    bad = [k for k in layers if not 0 <= k <= depth]
    if bad or not layers:
        raise UserInputError("layers", list(layers), f"this model has {depth} layers: use values in 0..{depth}")
    return sorted(set(layers))


class LayerTable:
    """Pooled vectors of chosen layers for a fixed set of sentences, from one pass over them;
    `embedder(j)` is an Embed function for the j-th chosen layer."""

    def __init__(self, cfg: ProbeSettings, sentences: Sequence[str]):
        POOLINGS.entry(cfg.pooling, "pooling")
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        device = resolve_device(cfg.device)
        without_cudnn_attention(device)
        dtype = resolve_precision(cfg.precision, device)
        encoder = load_encoder(cfg.model, bidirectional=cfg.bidirectional)
        self.layers = resolve_layers(cfg.layers, stack_depth(encoder))
        self.params = {k: truncated_parameter_count(encoder, k) for k in self.layers}
        truncate_encoder(encoder, max(self.layers))
        tokens = TokenCache(load_tokenizer(cfg.model, cfg.append_eos), cfg.max_seq_length, cfg.prompt)
        model = AllLayers(encoder, self.layers, cfg.pooling, 0 if cfg.include_prompt else tokens.prompt_length,
                          cfg.pooling_layers, None if cfg.pool_special_tokens else special_ids(tokens.tokenizer))
        embed_all = Embedder(model.to(device), tokens, device, dtype)
        sentences = list(dict.fromkeys(sentences))
        self.table = embed_all(sentences)  # (sentences, layers, dim), one pass
        self.row = {s: i for i, s in enumerate(sentences)}

    def embedder(self, j: int):
        def embed(batch: Sequence[str]) -> torch.Tensor:
            return self.table[torch.as_tensor([self.row[s] for s in batch], dtype=torch.long), j]

        return embed


def probe_layers(cfg: ProbeSettings) -> list[dict]:
    """One row per layer: `layer`, `params` (of the model cut there), the metrics of each split and its
    label-free diagnostics, with the layer each diagnostic picks and its agreement with the labels."""
    data = load_task(cfg.task, cfg.language, cfg.data_dir, max_train_samples=cfg.max_train_samples,
                     max_eval_samples=cfg.max_eval_samples)
    if data.kind in ("unlabeled", "pairs", "nli"):
        raise UserInputError("task", data.name, "probe scores labeled pair tasks (stsb, sick, mrpc, ...)")
    for split in cfg.splits:
        data.split(split)
    needed = {"dev", *cfg.splits} if data.kind == "classification" else set(cfg.splits)
    sentences = [s for split in sorted(needed) for column in ("sentence1", "sentence2")
                 for s in data.split(split)[column]]
    fitted_on = (list(dict.fromkeys(list(data.train["sentence1"]) + list(data.train["sentence2"])))
                 if cfg.postprocess != "none" else [])  # the train split's sentences only, never dev or test
    table = LayerTable(cfg, sentences + fitted_on)
    evaluator = make_evaluator(data.kind, {split: data.split(split) for split in needed})
    results = []
    for j, layer in enumerate(table.layers):
        metrics = {"layer": layer, "params": table.params[layer]}
        embed = table.embedder(j)
        if fitted_on:
            embed = fitted_embed(embed, fit(cfg.postprocess, embed(fitted_on), cfg.postprocess_dim))
        for split in cfg.splits:
            metrics.update(evaluator.evaluate(embed, split))
            metrics.update(split_diagnostics(embed, data.split(split), split))
        results.append(metrics)
    for split in cfg.splits:
        add_layer_picks(results, split, evaluator.primary(split))
    return results


def split_diagnostics(embed, frame, split: str) -> dict[str, float]:
    """`{split}_rankme`, `_anisotropy`, `_alignment`, `_uniformity` of one layer from its pooled vectors:
    the split's distinct sentences, and its pairs as given (the scores are not read)."""
    first, second = list(frame["sentence1"]), list(frame["sentence2"])
    vectors = embed(list(dict.fromkeys(first + second)))
    return {f"{split}_{k}": v for k, v in layer_diagnostics(vectors, embed(first), embed(second)).items()}


def add_layer_picks(rows: list[dict], split: str, labelled: str) -> None:
    """On every row, `{split}_{diagnostic}_pick` (the layer it picks) and `_rho` (its Spearman with the
    `labelled` metric over layers, oriented so +1 is full agreement)."""
    layers = [r["layer"] for r in rows]
    for name, direction in DIRECTIONS.items():
        pick, rho = pick_and_agreement(layers, [r[f"{split}_{name}"] for r in rows],
                                       [r[labelled] for r in rows], direction)
        for row in rows:
            row[f"{split}_{name}_pick"], row[f"{split}_{name}_rho"] = pick, rho


def probe_suite(cfg: ProbeSettings, suite: str = "sts") -> list[dict]:
    """One row per layer: `layer`, `params` and the suite's Spearman per set and on average (test
    splits; see trainables.evaluation.sts_suite for the aggregation)."""
    frames = load_suite(suite, cfg.data_dir, cfg.max_eval_samples)
    table = LayerTable(cfg, suite_sentences(frames))
    return [{"layer": layer, "params": table.params[layer], **score_suite(table.embedder(j), frames)}
            for j, layer in enumerate(table.layers)]
