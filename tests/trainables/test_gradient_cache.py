"""`loss: cached_mnrl`: MNRL through GradCache (sentence-transformers' CachedMultipleNegativesRankingLoss).
The parameters' gradients and the loss equal one pass over the whole batch; with dropout on, each mini-batch is
encoded again with the masks of its first pass; `mini_batch_size` is refused where no loss reads it."""

from __future__ import annotations

import copy

import pytest
import torch

import trainables.training.bi_encoder as bi_encoder
from trainables.errors import UserInputError
from trainables.kinds import get_kind
from trainables.kinds.finetune import FinetuneConfig
from trainables.models.batching import encode_tokens
from trainables.models.encoder import build_sentence_encoder, load_tokenizer
from trainables.objectives import build_loss, objective

ANCHORS = ["a man plays the guitar", "a dog runs in the park", "the child reads a book", "a red car",
           "two women talk", "the sun sets over the sea"]
POSITIVES = ["someone plays music", "an animal is running", "a kid is reading", "a car that is red",
             "people are talking", "an evening at the beach"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny models: one torch thread (conftest's `one_torch_thread`)."""


@pytest.fixture()
def batch(tiny_bert):
    tokenizer = load_tokenizer(tiny_bert)
    return [tokenizer(s)["input_ids"] for s in ANCHORS + POSITIVES], tokenizer.pad_token_id


@pytest.mark.parametrize("mini_batch", [1, 5, 12, 64])
def test_the_gradients_and_loss_are_those_of_one_pass_over_the_batch(tiny_bert, batch, mini_batch):
    token_lists, pad_id = batch
    # no dropout: one pass is the reference; in float64, so that what differs is not the sums' rounding order (the
    # graph-free first pass of an eval-mode model may take the evaluation's kernels: a difference of ~1e-9)
    model = build_sentence_encoder(tiny_bert, None, "mean").eval().double()
    reference = copy.deepcopy(model)
    loss_fn = build_loss("cached_mnrl", "pairs", 32)
    targets = torch.arange(len(ANCHORS))
    vectors = encode_tokens(reference, token_lists, pad_id, torch.device("cpu"))
    expected = build_loss("mnrl", "pairs", 32)(vectors[:6], vectors[6:], targets)
    expected.backward()
    loss = bi_encoder.cached_step(model, loss_fn, token_lists, targets, pad_id, torch.device("cpu"), torch.float64,
                                  mini_batch)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-8)
    for (name, ours), (_, theirs) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        if theirs.grad is None:
            assert ours.grad is None or not ours.grad.any(), name
            continue
        torch.testing.assert_close(ours.grad, theirs.grad, atol=1e-9, rtol=1e-6)


def test_with_dropout_each_mini_batch_is_encoded_again_with_its_first_masks(tiny_bert, batch, monkeypatch):
    token_lists, pad_id = batch
    model = build_sentence_encoder(tiny_bert, None, "mean").train()
    outputs = []

    def recorded(*args, **kwargs):
        out = encode_tokens(*args, **kwargs)
        outputs.append(out.detach().clone())
        return out

    monkeypatch.setattr(bi_encoder, "encode_tokens", recorded)
    torch.manual_seed(0)
    bi_encoder.cached_step(model, build_loss("cached_mnrl", "pairs", 32), token_lists, torch.arange(6), pad_id,
                           torch.device("cpu"), torch.float32, 5)
    first, again = outputs[:3], outputs[3:]
    assert len(first) == len(again) == 3  # 12 sentences, 5 at a time
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    torch.manual_seed(0)
    with torch.no_grad():  # the masks are dropout's: another draw encodes otherwise
        assert not torch.equal(encode_tokens(model, token_lists[:5], pad_id, torch.device("cpu")),
                               encode_tokens(model, token_lists[:5], pad_id, torch.device("cpu")))


def test_its_declaration_says_so_and_mini_batch_size_is_refused_without_it(tiny_bert):
    assert objective("cached_mnrl").gradient_cache and not objective("mnrl").gradient_cache
    cfg = FinetuneConfig(model=tiny_bert, task="stsb", train_data="sick_nli", loss="mnrl", mini_batch_size=8)
    with pytest.raises(UserInputError) as caught:
        get_kind("finetune").check_names(cfg, lambda name: f"train.{name}")
    assert caught.value.key == "train.mini_batch_size" and "only a GradCache loss reads it" in caught.value.fix
    get_kind("finetune").check_names(cfg.model_copy(update={"loss": "cached_mnrl"}), lambda name: f"train.{name}")
