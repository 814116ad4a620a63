"""Token-level batching: tokenize each distinct sentence once, pad only to the longest in a chunk.

A batch of sentences is sorted by length and cut into chunks under a token budget before it
goes through the encoder, so padding is paid per chunk of similar lengths, not per batch. The
result is the same function of the batch (padding is masked), with fewer tokens computed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from trainables.errors import UserInputError

# A training batch on a CPU goes through in chunks of at most TRAIN_TOKENS_PER_CHUNK padded tokens,
# cut where padding plus TRAIN_CHUNK_COST per chunk is least (padding_chunks). Each chunk has a
# fixed cost that does not shrink with its tokens (its weights laid out again for oneDNN's matmuls,
# a weight-sized gradient per weight added to the other chunks', per-operator overhead; autocast
# casts each weight and its gradient once a step, not per chunk); a MiniLM step of 64 three-token
# sentences took 73-76 ms on a 2-core Xeon with AMX, AdamW and clipping included, so a step of
# 32 STS-B pairs in 1.1 chunks (10.7 % padding) ran 1.09-1.15x as fast for MiniLM and 1.03-1.05x
# for MPNet as in 1.7 chunks of 768 tokens filled in turn (8.2 % padding; benchmarks/train_chunks.py,
# docs/benchmarks/speed.md)
TRAIN_TOKENS_PER_CHUNK = 2048
TRAIN_CHUNK_COST: int | None = 300
EVAL_TOKENS_PER_CHUNK = 4096
# what one more chunk costs in evaluation, in padded tokens: an encoder forward's fixed cost (Python,
# per-operator overhead, smaller matmuls); 150 ran fastest of 0-400 on STS-B test (MiniLM, 2-core EPYC)
EVAL_CHUNK_COST = 150
# On an accelerator what a chunk costs is its launches and Python, not cache: a batch goes through
# in one forward up to this many padded tokens (H200, MiniLM at batch 128: in chunks of 768 tokens a
# step ran 5.6 forwards and the epoch 0.53x sentence-transformers'; in one forward 1.73x), and
# evaluation's cutting weighs a chunk as ACCELERATOR_CHUNK_COST tokens (a first setting, not tuned)
ACCELERATOR_TOKENS_PER_CHUNK = 65536
ACCELERATOR_CHUNK_COST = 2048


def chunk_tokens(device: torch.device | str, evaluation: bool = False) -> int:
    """The padded tokens one encoder forward takes at most on `device`: on a CPU training's
    TRAIN_TOKENS_PER_CHUNK and evaluation's EVAL_TOKENS_PER_CHUNK, whole batches up to
    ACCELERATOR_TOKENS_PER_CHUNK elsewhere."""
    if torch.device(device).type == "cpu":
        return EVAL_TOKENS_PER_CHUNK if evaluation else TRAIN_TOKENS_PER_CHUNK
    return ACCELERATOR_TOKENS_PER_CHUNK


def chunk_cost(device: torch.device | str, evaluation: bool = True) -> int | None:
    """What one more chunk costs on `device`, in padded tokens (padding_chunks' weighing); None where
    chunks are filled in turn by length_chunks (training on an accelerator, whose batch goes through
    in one forward; on a CPU with TRAIN_CHUNK_COST set to None, as benchmarks/train_chunks.py does)."""
    if torch.device(device).type == "cpu":
        return EVAL_CHUNK_COST if evaluation else TRAIN_CHUNK_COST
    return ACCELERATOR_CHUNK_COST if evaluation else None


def attention_group_cost(device: torch.device | str) -> int | None:
    """A packed row's attention, where it runs padded (trainables.models.padding_free): on a CPU in groups cut as
    evaluation's chunks (EVAL_CHUNK_COST); on an accelerator in one group (its varlen kernel, where it runs, needs
    none)."""
    return EVAL_CHUNK_COST if torch.device(device).type == "cpu" else None


def tokenize(tokenizer, sentences: Sequence[str], max_length: int, prompt: str = "") -> list[list[int]]:
    """Token ids with special tokens, truncated to `max_length`, unpadded. A `prompt` is put before each
    sentence's text, as sentence-transformers' `encode(prompt=...)` does: its tokens count toward `max_length`."""
    if not sentences:
        return []
    return tokenizer([prompt + s for s in sentences], truncation=True, max_length=max_length,
                     add_special_tokens=True)["input_ids"]


def prompt_length(tokenizer, prompt: str, max_length: int) -> int:
    """The leading tokens of a prompted sentence that are the prompt's, as sentence-transformers counts them
    for Pooling(include_prompt=False): the prompt tokenized alone (its special tokens included, so BERT's
    [CLS] or a decoder's BOS counts), less a trailing special token ([SEP], EOS); 0 without a prompt."""
    if not prompt:
        return 0
    ids = tokenize(tokenizer, [prompt], max_length)[0]
    return len(ids) - (1 if ids and ids[-1] in tokenizer.all_special_ids else 0)


def pad(token_lists: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to the longest list: (input_ids, attention_mask). The rows padded as Python lists and
    made one tensor at once (a row at a time, 64 rows took 0.48 ms, now 0.10)."""
    lengths = [len(ids) for ids in token_lists]
    longest = max(lengths)
    input_ids = torch.tensor([[*ids, *[pad_id] * (longest - n)] for ids, n in zip(token_lists, lengths, strict=True)],
                             dtype=torch.long)
    mask = (torch.arange(longest) < torch.tensor(lengths)[:, None]).long()
    return input_ids.to(device), mask.to(device)


def length_chunks(lengths: Sequence[int], tokens_per_chunk: int, max_chunk: int | None = None) -> list[list[int]]:
    """Indices grouped longest first so that each chunk's padded size (count x longest) stays
    under `tokens_per_chunk` (a chunk always holds at least one sentence)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    chunks, start = [], 0
    while start < len(order):
        size = max(1, tokens_per_chunk // max(1, lengths[order[start]]))
        if max_chunk is not None:
            size = min(size, max_chunk)
        chunks.append(order[start: start + size])
        start += size
    return chunks


def padding_chunks(lengths: Sequence[int], tokens_per_chunk: int, max_chunk: int | None = None,
                   chunk_cost: int = EVAL_CHUNK_COST) -> list[list[int]]:
    """Indices grouped longest first, each chunk's padded size (count x longest) under
    `tokens_per_chunk` (or one sentence) and at most `max_chunk` sentences, cut where padded tokens
    plus `chunk_cost` per chunk are fewest: the optimum over every cutting of the longest-first
    order, by dynamic programming (length_chunks fills each chunk in turn: 8.9 % of STS-B test's
    padded tokens were padding, here 2.5 % in 18 chunks instead of 12; the cutting takes 10 ms)."""
    import numpy as np

    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    longest = np.array([max(1, lengths[i]) for i in order], dtype=np.float64)
    n = len(order)
    best = np.zeros(n + 1)  # best[j]: the cheapest cutting of the first j sentences
    cut = np.zeros(n + 1, dtype=np.int64)
    # a chunk of sentences first..last-1 costs (last - first) * longest[first] + chunk_cost
    offset = np.zeros(n)  # best[first] - first * longest[first], filled as best is
    positions = np.arange(n, dtype=np.float64)
    first = 0  # the earliest start a chunk ending at `last` may have: it only moves forward
    for last in range(1, n + 1):
        offset[last - 1] = best[last - 1] - positions[last - 1] * longest[last - 1]
        while first < last - 1 and ((last - first) * longest[first] > tokens_per_chunk
                                    or (max_chunk is not None and last - first > max_chunk)):
            first += 1
        costs = offset[first:last] + last * longest[first:last]
        pick = int(np.argmin(costs))
        best[last], cut[last] = costs[pick] + chunk_cost, first + pick
    chunks, last = [], n
    while last:
        chunks.append(order[int(cut[last]): last])
        last = int(cut[last])
    return chunks[::-1]


def encode_tokens(model: nn.Module, token_lists: Sequence[Sequence[int]], pad_id: int,
                  device: torch.device, tokens_per_chunk: int | None = None,
                  max_chunk: int | None = None, fewest_padded: bool = False, packed: bool = False) -> torch.Tensor:
    """`model(input_ids, attention_mask)` over length-sorted chunks, rows back in input order;
    `fewest_padded`: evaluation's chunking, else training's (whose chunking is part of its numbers:
    dropout's masks are drawn per chunk). Chunks are cut by padding_chunks at the device's chunk
    cost, or by length_chunks where it has none (training on an accelerator: one forward a batch);
    `tokens_per_chunk` by default chunk_tokens' for the device. Keeps the autograd graph with
    gradients enabled. `packed`: padding-free rows of up to the same budget in real tokens
    (trainables.models.padding_free; `model` a SentenceEncoder that `packing_refusal` passed)."""
    lengths = [len(ids) for ids in token_lists]
    budget = chunk_tokens(device, fewest_padded) if tokens_per_chunk is None else tokens_per_chunk
    if packed:
        return encode_packed(model, token_lists, device, budget, attention_group_cost(device))
    cost = chunk_cost(device, evaluation=fewest_padded)
    chunks = (length_chunks(lengths, budget, max_chunk) if cost is None
              else padding_chunks(lengths, budget, max_chunk, cost))
    outputs, positions = [], []
    for chunk in chunks:
        input_ids, mask = pad([token_lists[i] for i in chunk], pad_id, device)
        outputs.append(model(input_ids, mask))
        positions.extend(chunk)
    stacked = torch.cat(outputs)
    inverse = torch.empty(len(positions), dtype=torch.long)
    inverse[torch.as_tensor(positions)] = torch.arange(len(positions))
    return stacked[inverse.to(stacked.device)]


def encode_packed(model: nn.Module, token_lists: Sequence[Sequence[int]], device: torch.device,
                  tokens_per_chunk: int, group_cost: int | None) -> torch.Tensor:
    """`model.forward_packed` (a SentenceEncoder's; trainables.models.padding_free) over rows of at most
    `tokens_per_chunk` real tokens, the sentences longest first, each row's attention in padding_chunks' groups
    at `group_cost` (None: one group); vectors back in input order. Keeps the autograd graph with gradients
    enabled."""
    from trainables.models.padding_free import pack, position_offset

    order = sorted(range(len(token_lists)), key=lambda i: -len(token_lists[i]))
    offset = position_offset(model.encoder)
    outputs, rows, row, used = [], [], [], 0
    for i in order:
        if row and used + len(token_lists[i]) > tokens_per_chunk:
            rows.append(row)
            row, used = [], 0
        row.append(i)
        used += len(token_lists[i])
    rows.append(row)
    for row in rows:
        lists = [token_lists[i] for i in row]
        lengths = [len(ids) for ids in lists]
        groups = (None if group_cost is None
                  else padding_chunks(lengths, max(lengths) * len(lengths), chunk_cost=group_cost))
        outputs.append(model.forward_packed(pack(lists, device, offset, groups)))
    stacked = torch.cat(outputs)
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.as_tensor(order)] = torch.arange(len(order))
    return stacked[inverse.to(stacked.device)]


_SHARED: dict[tuple, dict[str, list[int]]] = {}


def forget_shared_tokens() -> None:
    """Drop the process's token ids (a benchmark that times tokenization starts from nothing)."""
    _SHARED.clear()


class TokenCache:
    """Token ids of every sentence seen so far, so each distinct sentence is tokenized once per
    worker process: the ids are kept per (tokenizer, max length, prompt) for the process's life, so a
    reused Ray worker's next trial looks up what an earlier trial tokenized (full STS-B, 17k
    sentences, takes 0.6 s to tokenize on one core here). With a `prompt`, a sentence's ids are those
    of the prompt and the sentence (`tokenize`), looked up by the sentence."""

    def __init__(self, tokenizer, max_length: int, prompt: str = ""):
        self.tokenizer, self.max_length, self.prompt = tokenizer, max_length, prompt
        self.prompt_length = prompt_length(tokenizer, prompt, max_length)
        if prompt and len(tokenizer(prompt, add_special_tokens=True)["input_ids"]) >= max_length:
            raise UserInputError("prompt", prompt, f"its tokens alone fill max_seq_length {max_length}, so no "
                                                   "sentence would be left: shorten it or raise the length")
        name = str(getattr(tokenizer, "name_or_path", "") or "")
        steps = str(getattr(getattr(tokenizer, "_tokenizer", None), "post_processor", ""))  # append_eos's EOS
        self._ids: dict[str, list[int]] = _SHARED.setdefault(
            (type(tokenizer).__name__, name, len(tokenizer), max_length, prompt, steps), {}) if name else {}

    def add(self, sentences: Iterable[str]) -> None:
        new = list(dict.fromkeys(s for s in sentences if s not in self._ids))
        self._ids.update(zip(new, tokenize(self.tokenizer, new, self.max_length, self.prompt), strict=True))

    def __getitem__(self, sentence: str) -> list[int]:
        return self._ids[sentence]

    def lookup(self, sentences: Sequence[str]) -> list[list[int]]:
        self.add(sentences)
        return [self._ids[s] for s in sentences]

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
