from __future__ import annotations

import torch

from trainables.models.batching import TokenCache, encode_tokens, length_chunks, pad
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


def test_pad_builds_ids_and_mask():
    ids, mask = pad([[7, 8, 9], [5]], pad_id=0, device=torch.device("cpu"))
    assert ids.tolist() == [[7, 8, 9], [5, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]


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


def test_gradients_flow_through_chunks(tiny_bert):
    model = build_sentence_encoder(tiny_bert, layer=1).train()
    tokens = TokenCache(load_tokenizer(tiny_bert), 64)
    out = encode_tokens(model, tokens.lookup(["a b c d e f", "x"]), tokens.pad_id, torch.device("cpu"), 6)
    out.sum().backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0


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
