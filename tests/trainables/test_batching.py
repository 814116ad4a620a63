from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainables.data.tasks import load_task
from trainables.models.batching import TokenCache, encode_tokens, length_chunks, pad, padding_chunks
from trainables.models.encoder import build_sentence_encoder, load_tokenizer


def test_length_chunks_respect_the_token_budget_and_cover_every_row():
    lengths = [5, 40, 12, 7, 40, 3, 30, 9]
    chunks = length_chunks(lengths, tokens_per_chunk=80)
    assert sorted(i for chunk in chunks for i in chunk) == list(range(len(lengths)))
    for chunk in chunks:
        assert len(chunk) * max(lengths[i] for i in chunk) <= 80
    assert chunks[0] == [1, 4]  # longest first
    assert length_chunks([500], tokens_per_chunk=80) == [[0]]  # a long row still gets a chunk
    assert [len(c) for c in length_chunks([2] * 10, 80, max_chunk=4)] == [4, 4, 2]


def padded_cost(chunks: list[list[int]], lengths: list[int], chunk_cost: int) -> int:
    return sum(len(c) * max(lengths[i] for i in c) + chunk_cost for c in chunks)


def fewest_by_brute_force(lengths: list[int], budget: int, max_chunk: int | None, chunk_cost: int) -> int:
    """The least padded tokens plus `chunk_cost` per chunk over every cutting of the longest-first order."""
    ordered = sorted(lengths, reverse=True)
    best = [0] + [None] * len(ordered)
    for last in range(1, len(ordered) + 1):
        for first in range(last):
            count = last - first
            if count > 1 and (count * ordered[first] > budget or count > (max_chunk or count)):
                continue
            cost = best[first] + count * ordered[first] + chunk_cost
            best[last] = cost if best[last] is None else min(best[last], cost)
    return best[-1]


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=40), budget=st.integers(30, 400),
       max_chunk=st.none() | st.integers(1, 20), chunk_cost=st.integers(0, 200))
def test_padding_chunks_cover_every_row_within_the_budget(lengths, budget, max_chunk, chunk_cost):
    """A partition, longest first, each chunk within the budget (or one long sentence) and `max_chunk`;
    the optimum of every cutting (so never costlier than length_chunks)."""
    chunks = padding_chunks(lengths, budget, max_chunk, chunk_cost)
    assert sorted(i for chunk in chunks for i in chunk) == list(range(len(lengths)))
    for before, chunk in zip(chunks, chunks[1:], strict=False):
        assert min(lengths[i] for i in before) >= max(lengths[i] for i in chunk)
    for chunk in chunks:
        assert len(chunk) == 1 or len(chunk) * max(lengths[i] for i in chunk) <= budget
        assert len(chunk) <= (max_chunk or len(chunk))
    cost = padded_cost(chunks, lengths, chunk_cost)
    assert cost <= padded_cost(length_chunks(lengths, budget, max_chunk), lengths, chunk_cost)
    assert cost == fewest_by_brute_force(lengths, budget, max_chunk, chunk_cost)


def test_padding_chunks_pad_stsb_test_far_less_than_length_chunks(data_dir, minilm_path):
    """STS-B test's distinct sentences in MiniLM's tokens, as evaluation cuts them: 8.9 % of the padded
    tokens were padding with length_chunks, under 3 % here, in fewer than twice the chunks."""
    from tests.conftest import MINILM

    data = load_task("stsb", data_folder=str(data_dir))
    tokens = TokenCache(load_tokenizer(MINILM), 128)
    lengths = [len(ids) for ids in tokens.lookup(list(dict.fromkeys([*data.test.sentence1, *data.test.sentence2])))]
    waste = {}
    for name, chunker in (("length", length_chunks), ("padding", padding_chunks)):
        chunks = chunker(lengths, 4096, 256)
        padded = sum(len(c) * max(lengths[i] for i in c) for c in chunks)
        waste[name] = (1 - sum(lengths) / padded, len(chunks))
    assert waste["length"][0] == pytest.approx(0.089, abs=0.001)
    assert waste["padding"][0] < 0.03 and waste["padding"][1] < 2 * waste["length"][1], waste


def test_pad_builds_ids_and_mask():
    ids, mask = pad([[7, 8, 9], [5]], pad_id=0, device=torch.device("cpu"))
    assert ids.tolist() == [[7, 8, 9], [5, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]


@settings(max_examples=60, deadline=None)
@given(token_lists=st.lists(st.lists(st.integers(0, 2**40), min_size=1, max_size=12), min_size=1, max_size=9),
       pad_id=st.integers(0, 5))
def test_pad_right_pads_every_row_to_the_longest(token_lists, pad_id):
    ids, mask = pad(token_lists, pad_id, torch.device("cpu"))
    longest = max(len(row) for row in token_lists)
    assert ids.dtype == mask.dtype == torch.long and ids.shape == mask.shape == (len(token_lists), longest)
    for row, given_ids in enumerate(token_lists):
        assert ids[row].tolist() == given_ids + [pad_id] * (longest - len(given_ids))
        assert mask[row].tolist() == [1] * len(given_ids) + [0] * (longest - len(given_ids))


def test_chunked_encoding_equals_one_padded_batch(tiny_bert):
    model = build_sentence_encoder(tiny_bert, layer=3).eval()
    tokens = TokenCache(load_tokenizer(tiny_bert), 64)
    sentences = ["a man plays a guitar", "hi", "the quick brown fox jumps over the lazy dog again and again",
                 "a cat", "two dogs run in a park near a river"]
    token_lists = tokens.lookup(sentences)
    with torch.no_grad():
        chunked = encode_tokens(model, token_lists, tokens.pad_id, torch.device("cpu"), tokens_per_chunk=20)
        ids, mask = pad(token_lists, tokens.pad_id, torch.device("cpu"))
        whole = model(ids, mask)
    assert len(length_chunks([len(t) for t in token_lists], 20)) > 1
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        fewest = encode_tokens(model, token_lists, tokens.pad_id, torch.device("cpu"), 20, fewest_padded=True)
    assert padding_chunks([len(t) for t in token_lists], 20) != length_chunks([len(t) for t in token_lists], 20)
    torch.testing.assert_close(fewest, whole, atol=1e-5, rtol=1e-5)


def test_gradients_flow_through_chunks(tiny_bert):
    model = build_sentence_encoder(tiny_bert, layer=1).train()
    tokens = TokenCache(load_tokenizer(tiny_bert), 64)
    out = encode_tokens(model, tokens.lookup(["a b c d e f", "x"]), tokens.pad_id, torch.device("cpu"), 6)
    # not out.sum(): a LayerNorm's outputs sum to the sum of its bias whatever its input, so that gradient is 0
    # but for rounding (it passed or failed by the order the tests ran in)
    direction = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
    (out * direction).sum().backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 1e-3


def test_token_cache_tokenizes_each_sentence_once(tiny_bert):
    tokenizer = load_tokenizer(tiny_bert)
    calls = []

    class Counting:
        pad_token_id = tokenizer.pad_token_id

        def __call__(self, sentences, **kwargs):
            calls.append(list(sentences))
            return tokenizer(sentences, **kwargs)

    cache = TokenCache(Counting(), max_length=4)
    first = cache.lookup(["a b c d e f g", "a", "a"])
    cache.lookup(["a", "new one"])
    assert calls == [["a b c d e f g", "a"], ["new one"]]
    assert len(first[0]) == 4  # truncated to max_length, special tokens included


def test_a_reused_worker_tokenizes_each_sentence_once_across_trials(tiny_bert):
    """Two trials in one worker process (Ray reuses workers) share the token ids of a tokenizer at
    the same max length; another max length truncates differently and tokenizes again."""
    tokenizer = load_tokenizer(tiny_bert)
    calls = []

    class Counting:
        pad_token_id = tokenizer.pad_token_id
        name_or_path = f"{tiny_bert}#counting"

        def __len__(self):
            return len(tokenizer)

        def __call__(self, sentences, **kwargs):
            calls.append(list(sentences))
            return tokenizer(sentences, **kwargs)

    first_trial = TokenCache(Counting(), max_length=4).lookup(["a b c d e f g", "a"])
    second_trial = TokenCache(Counting(), max_length=4).lookup(["a", "a b c d e f g", "b"])
    assert calls == [["a b c d e f g", "a"], ["b"]]
    assert second_trial[:2] == first_trial[::-1]
    longer = TokenCache(Counting(), max_length=6).lookup(["a b c d e f g"])
    assert calls[-1] == ["a b c d e f g"] and len(longer[0]) == 6 and len(first_trial[0]) == 4


class CountingEncoder(torch.nn.Module):
    """A stand-in encoder that records each forward's (rows, padded length) and returns one vector per row."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[int, int]] = []

    def forward(self, input_ids, mask):
        self.calls.append(tuple(input_ids.shape))
        return mask.sum(dim=1, keepdim=True).float().expand(-1, 4)


@pytest.mark.parametrize("fewest_padded", [False, True])
def test_an_accelerator_takes_a_batch_in_one_forward_a_cpu_in_chunks(fewest_padded):
    """On an H200 MiniLM's step at batch 128 ran 5.6 forwards of 768 tokens and its epoch 0.53x
    sentence-transformers' (1.73x in one forward a batch): off the CPU the chunk budget is the
    accelerator's ("meta" stands in for CUDA here: the same code path, no kernels). Every row comes
    back in input order either way."""
    token_lists = [[1] * (5 + (i * 7) % 60) for i in range(128)]  # 5-64 tokens, 4,376 in all; 8,192 in one chunk
    rows = {}
    for device in ("cpu", "meta"):
        model = CountingEncoder()
        out = encode_tokens(model, token_lists, 0, torch.device(device), fewest_padded=fewest_padded,
                            max_chunk=256)
        rows[device] = len(model.calls)
        assert out.shape == (128, 4) and out.device.type == device
        if device == "cpu":
            assert out[:, 0].tolist() == [float(len(ids)) for ids in token_lists]
    assert rows["meta"] == 1
    assert rows["cpu"] >= (4 if not fewest_padded else 2)  # training's 2,048 tokens a chunk; evaluation's 4,096


def test_chunk_budgets_by_device():
    from trainables.models.batching import chunk_cost, chunk_tokens

    assert (chunk_tokens("cpu"), chunk_tokens("cpu", evaluation=True)) == (2048, 4096)
    assert (chunk_cost("cpu", evaluation=False), chunk_cost("cpu")) == (300, 150)
    assert (chunk_tokens("cuda"), chunk_tokens("cuda", evaluation=True), chunk_cost("cuda:0")) == (65536, 65536, 2048)
    assert chunk_cost("cuda:0", evaluation=False) is None  # training: one forward a batch


def test_training_chunks_are_cut_where_padding_and_chunks_cost_least():
    """A CPU training batch goes through in chunks cut by padding_chunks at training's budget and
    cost, not filled in turn: 64 sentences of two lengths, 1,344 tokens, in two chunks (one per
    length, no padding) where filling longest first pads the short ones to the long ones' length."""
    token_lists = [[1] * 30] * 32 + [[1] * 12] * 32  # 960 + 384 tokens
    model = CountingEncoder()
    encode_tokens(model, token_lists, 0, torch.device("cpu"))
    assert sorted(model.calls) == [(32, 12), (32, 30)]
    # filled in turn: one chunk, 576 of its 1,920 tokens padding
    assert length_chunks([len(t) for t in token_lists], 2048) == [list(range(64))]
