"""The row-wise word-embedding gradient: the same `.grad` as torch's dense one, step after step,
with chunks accumulated, the padding row left out and only the touched rows reset."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainables.models.embedding_grad import RowGradEmbedding, use_row_gradients
from trainables.models.encoder import load_encoder


def step_grads(embedding: nn.Module, batches: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """The embedding's gradient after each step (several chunks each), zeroed to None in between."""
    torch.manual_seed(0)
    head = torch.randn(embedding.embedding_dim)
    grads = []
    for chunks in batches:
        for ids in chunks:  # one backward per chunk accumulates, as a step over length-sorted chunks does
            (embedding(ids) @ head).pow(2).sum().backward()
        grads.append(embedding.weight.grad.clone())
        embedding.weight.grad = None  # zero_grad(set_to_none=True)
    return grads


def test_the_row_wise_gradient_equals_torchs_dense_one_over_several_steps():
    torch.manual_seed(1)
    dense = nn.Embedding(50, 8, padding_idx=0)
    rows = RowGradEmbedding.replacing(nn.Embedding(50, 8, padding_idx=0))
    rows.weight = nn.Parameter(dense.weight.detach().clone())
    batches = [[torch.tensor([[3, 4, 4, 0], [7, 3, 0, 0]]), torch.tensor([[9, 9, 3, 5, 1]])],
               [torch.tensor([[11, 12, 0]])],  # rows 3, 4, 9 of the last step must be back at zero
               [torch.tensor([[3, 3, 3]]), torch.tensor([[0, 0]])]]
    expected, got = step_grads(dense, batches), step_grads(rows, batches)
    for want, have in zip(expected, got, strict=True):
        assert torch.allclose(have, want, atol=1e-6)
        assert have[0].abs().sum() == 0  # the padding row gets no gradient
    assert got[1][[3, 4, 9]].abs().sum() == 0 and got[1][11].abs().sum() > 0


@pytest.mark.parametrize("use", ["tied_output", "weight_in_the_loss"])
def test_a_table_also_used_outside_the_lookup_gets_torchs_gradient_at_every_step(use):
    """A tied output layer (logits = h · Wᵀ) or a loss on the weight itself adds a dense gradient to
    every row; the kept buffer was only reset on the rows the lookups touched, so that dense part
    stayed in it (a toy was off by 36 and 72 at steps 2 and 3)."""

    def grads(embedding: nn.Embedding) -> list[torch.Tensor]:
        out = []
        for step, ids in enumerate([torch.tensor([[1, 2]]), torch.tensor([[3]]), torch.tensor([[4, 4]])], start=1):
            hidden = embedding(ids)
            weight = embedding.weight
            loss = (hidden @ weight.t()).sum() if use == "tied_output" else hidden.sum() + weight.square().sum()
            (3 * step * loss).backward()
            out.append(weight.grad.clone())
            weight.grad = None
        return out

    torch.manual_seed(0)
    dense = nn.Embedding(6, 2)
    rows = RowGradEmbedding.replacing(nn.Embedding(6, 2))
    rows.weight = nn.Parameter(dense.weight.detach().clone())
    for want, have in zip(grads(dense), grads(rows), strict=True):
        assert torch.allclose(have, want, atol=1e-6), (have - want).abs().max()


def test_an_encoder_trains_the_same_with_either_gradient(tiny_bert):
    """Two AdamW steps of a tiny BERT: the row-wise gradient moves every weight as torch's does."""
    ids = torch.tensor([[101, 2023, 2003, 102, 0], [101, 2178, 6251, 2182, 102]])
    mask = (ids != 0).long()

    def trained(model):
        model.train()
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = 0.0  # the comparison is of gradients, not of dropout draws
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(2):
            for chunk in (slice(0, 1), slice(1, 2)):
                model(ids[chunk], mask[chunk]).last_hidden_state.pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return model.get_input_embeddings().weight.detach()

    rows = load_encoder(tiny_bert)
    assert isinstance(rows.get_input_embeddings(), RowGradEmbedding)
    dense = load_encoder(tiny_bert)
    dense.set_input_embeddings(dense.get_input_embeddings().dense())
    assert type(dense.get_input_embeddings()) is nn.Embedding
    before = rows.get_input_embeddings().weight.detach().clone()
    after_rows, after_dense = trained(rows), trained(dense)
    assert not torch.allclose(after_rows, before)
    assert torch.allclose(after_rows, after_dense, atol=1e-6)


def test_tied_or_unusual_embeddings_are_left_alone():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.out = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
            self.out.weight = self.embed.weight

        def get_input_embeddings(self):
            return self.embed

        def get_output_embeddings(self):
            return self.out

    assert use_row_gradients(Tied()) == 0
    assert use_row_gradients(nn.Linear(2, 2)) == 0
