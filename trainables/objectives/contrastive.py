"""Unsupervised contrastive building blocks: SimCSE (Gao et al., 2021) and miCSE's attention term
(Klein & Nabi, 2023), used by the `contrastive` kind and by the contrastive pretraining stage.

SimCSE: every sentence of a batch goes through the encoder twice in one pass; dropout is the only
augmentation, the two views of a sentence are positives and the batch's other sentences negatives
(InfoNCE over cosine / temperature).

miCSE (`attention_loss: mi`, the reference's formulation and the default): per row (sentence x
layer x head), `samples` entries that are non-zero in both views' attention maps are drawn at
random, their logs' Pearson correlation rho gives the Gaussian mutual information
-1/2 log(1 - rho^2); the term is minus its mean, times the squared fraction of non-zero entries,
times `attention_weight` (the reference's runs: 1e-4 to 5e-4; default 5e-4), on the layers the
reference uses (for a 12-layer BERT 8..11, 1-based; for k kept layers k-4..k-1). Deviations, all
small and on purpose: rows are per layer (the reference folds two layers of equal parity into one
row, an artefact of its reshape), and rho^2 is capped at 1 - 1e-6 so identical views give a large
finite value instead of infinity. `attention_loss: correlation` is this project's earlier variant
(1 - rho over every non-zero entry; at its old weight 1.0 the review measured ~90x the reference's
pull by gradient norm on MiniLM).
"""

from __future__ import annotations

import torch
from torch import nn

from trainables.models.batching import pad
from trainables.models.encoder import SentenceEncoder
from trainables.names import ATTENTION_LOSSES, METHODS  # noqa: F401 (re-exported)
from trainables.runtime import autocast

MI_SAMPLES = 150  # entries drawn per row, as the reference does


def info_nce(first: torch.Tensor, second: torch.Tensor, temperature: float) -> torch.Tensor:
    """Row i of `first` should be closest to row i of `second` among all rows (in-batch negatives)."""
    logits = nn.functional.cosine_similarity(first.unsqueeze(1), second.unsqueeze(0), dim=-1) / temperature
    return nn.functional.cross_entropy(logits, torch.arange(len(first), device=first.device))


def _rows(attentions: list[torch.Tensor]) -> torch.Tensor:
    """(sentence x layer x head, query x key) from a list of (batch, heads, query, key) maps."""
    stacked = torch.stack([a.float() for a in attentions], dim=1)  # (batch, layers, heads, q, k)
    return stacked.reshape(-1, stacked.shape[-2] * stacked.shape[-1])


def attention_mutual_information(first: list[torch.Tensor], second: list[torch.Tensor],
                                 samples: int = MI_SAMPLES) -> torch.Tensor:
    """miCSE's term (to be minimized): -mean Gaussian MI of the views' sampled log attention,
    scaled by the squared fraction of entries non-zero in both views."""
    x, y = _rows(first), _rows(second)
    valid = (x > 0) & (y > 0)
    counts = valid.sum(dim=1)
    enough = counts >= samples
    if enough.any():
        x, y, valid = x[enough], y[enough], valid[enough]
    else:  # short sentences: draw as many as every row has
        samples = int(counts.min())
    if samples < 2:
        return x.sum() * 0.0
    index = torch.multinomial(valid.float(), samples)  # without replacement, from the valid entries
    xs, ys = torch.log(x.gather(1, index)), torch.log(y.gather(1, index))
    rho = nn.functional.cosine_similarity(xs - xs.mean(1, keepdim=True), ys - ys.mean(1, keepdim=True),
                                          dim=-1, eps=1e-6)
    information = -0.5 * torch.log(1.0 - rho.square().clamp(max=1.0 - 1e-6))
    fraction = valid.float().mean()
    return -information.mean() * (fraction.square() + 1e-6)


def attention_correlation(first: list[torch.Tensor], second: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """The project's earlier variant: per sentence, 1 - the Pearson correlation of the views' log
    attention over every head and real-token (query, key) pair of the chosen layers (entries that
    attention dropout zeroed in either view left out), averaged over sentences."""
    pair_mask = (mask.unsqueeze(2) * mask.unsqueeze(1)).bool()
    x = torch.stack([a.float() for a in first], dim=1)
    y = torch.stack([a.float() for a in second], dim=1)
    valid = (pair_mask[:, None, None] & (x > 0) & (y > 0)).reshape(len(x), -1)
    x = torch.log(x.clamp_min(1e-9)).reshape(len(x), -1)
    y = torch.log(y.clamp_min(1e-9)).reshape(len(y), -1)
    count = valid.sum(dim=1).clamp_min(1)
    x_centered = torch.where(valid, x - (x * valid).sum(1, keepdim=True) / count[:, None], 0.0)
    y_centered = torch.where(valid, y - (y * valid).sum(1, keepdim=True) / count[:, None], 0.0)
    covariance = (x_centered * y_centered).sum(1)
    scale = (x_centered.square().sum(1) * y_centered.square().sum(1)).sqrt()
    correlation = torch.where(scale > 1e-12, covariance / scale.clamp_min(1e-12), torch.ones_like(scale))
    return (1 - correlation).mean()


class ContrastiveModel(nn.Module):
    """A SentenceEncoder and, while training, SimCSE's MLP head over its pooled vectors."""

    def __init__(self, encoder: SentenceEncoder, mlp_head: bool):
        super().__init__()
        self.sentence_encoder = encoder
        hidden = encoder.encoder.config.hidden_size
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()) if mlp_head else nn.Identity()

    def views(self, input_ids: torch.Tensor, mask: torch.Tensor, attention_layers: list[int] | None):
        """Pooled (and head-projected) vectors of each row; with `attention_layers`, also the
        attention probabilities of those layers (0-based)."""
        if not attention_layers:
            return self.head(self.sentence_encoder(input_ids, mask)), []
        encoder = self.sentence_encoder
        output = encoder.encoder(input_ids=input_ids, attention_mask=mask, output_attentions=True,
                                 output_hidden_states=encoder.mix is not None)
        vectors = self.head(encoder.pool(encoder.mixed_states(output), mask, input_ids))
        return vectors, [output.attentions[k] for k in attention_layers]


def contrastive_step(model: ContrastiveModel, token_lists: list[list[int]], pad_id: int, device, dtype,
                     temperature: float, attention_layers: list[int] | None, attention_weight: float,
                     attention_loss: str = "mi") -> tuple[torch.Tensor, dict]:
    """The loss of one batch: every sentence twice in one pass, so dropout gives two views."""
    input_ids, mask = pad(token_lists + token_lists, pad_id, device)
    with autocast(device, dtype):
        vectors, attentions = model.views(input_ids, mask, attention_layers)
    half = len(token_lists)
    loss = contrastive = info_nce(vectors[:half].float(), vectors[half:].float(), temperature)
    parts = {"contrastive_loss": contrastive.detach()}
    if attention_layers:
        first, second = [a[:half] for a in attentions], [a[half:] for a in attentions]
        term = (attention_mutual_information(first, second) if attention_loss == "mi"
                else attention_correlation(first, second, mask[:half]))
        loss = loss + attention_weight * term
        parts["attention_loss"] = term.detach()
    return loss, parts


def step_batches(count: int, batch_size: int, seed: int, steps: int, done: int = 0) -> list[list[int]]:
    """Row indices of the batches of steps done+1..steps: passes over the corpus in seeded random
    orders (a short last batch, with too few negatives, is dropped), so a resumed run sees the
    same batches as an uninterrupted one."""
    per_pass = max(1, count // batch_size)
    orders: dict[int, list[int]] = {}
    out: list[list[int]] = []
    for step in range(done, steps):
        epoch, index = divmod(step, per_pass)
        if epoch not in orders:
            generator = torch.Generator().manual_seed(seed * 1_000 + epoch)
            orders[epoch] = torch.randperm(count, generator=generator).tolist()
        out.append(orders[epoch][index * batch_size: (index + 1) * batch_size])
    return out
