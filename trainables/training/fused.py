"""Fused trial arrays: K trainings of one architecture that differ only in seed and optimizer scalars,
trained as one stacked model in one process (issue 56).

A layer study's trials are many small, identical trainings, and one alone leaves a GPU mostly idle
(one MiniLM trial at batch 32 kept an H100 10 % busy). Here the K members' weights are stacked along
a new first dimension in a copy of the model whose Linear, LayerNorm and Embedding modules are
swapped for stacked ones, so each matmul of all K members is one batched matmul. A forward takes
the members' batches as one batch of K x rows, member-major, padded to the longest sentence of all;
each stacked module applies member k's weights to member k's rows; attention and pooling are per row.

Each member keeps its own
- batches (its data order is the caller's: `step` takes one batch per member);
- dropout masks: the `fast` masks (trainables.models.dropout) drawn from its own generator at its own
  shapes (its rows, padded to its own longest sentence), so neither the other members nor the padding
  they add change them, and a member draws what a `dropout_masks: fast` trial seeded alike draws when
  its batch goes through in one chunk (as on a GPU; tested on a CPU, where a trial's batch may take
  several chunks and then draws other masks);
- learning rate with transformers' linear warmup and decay, weight decay (none on biases and
  normalization weights, as `build_optimizer`), clipping by its own gradient norm, and AdamW state:
  torch's fused AdamW kernel run on its slices of the stacked tensors (`MemberAdamW`);
- fate: a member whose loss is not finite is not updated, and `drop` slices a member (diverged,
  pruned) out of every stacked tensor without touching the others' numbers;
- weights: `member_state_dict` is a member as its own model's state dict (a best-dev checkpoint).

Needs torch and transformers only (trainables.models' modules imported here need nothing else), so
it runs where Ray, MLflow and Optuna are not. Encoders whose parameters sit in Linear, LayerNorm and
Embedding modules stack (BERT, MiniLM, RoBERTa, ELECTRA, DistilBERT; MPNet with its relative position
bias computed per member, `stacked_position_bias`); anything else is refused by name.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.adam import adam

from trainables.models.attention import attention as inference_attention
from trainables.models.dropout import LEVELS, effective_p, explicit_without_dropout, keep_indicator, keep_threshold

ATTENTION = "fused_members"
PairLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class MemberSettings:
    """What may differ between the members of an array: optimizer scalars and the dropout seed."""

    lr: float
    total_steps: int
    warmup_steps: int = 0
    weight_decay: float = 0.01
    max_grad_norm: float | None = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        rules = (("lr", self.lr > 0, "greater than 0"), ("total_steps", self.total_steps >= 1, "at least 1"),
                 ("warmup_steps", 0 <= self.warmup_steps <= self.total_steps, "between 0 and total_steps"),
                 ("weight_decay", self.weight_decay >= 0, "at least 0"),
                 ("max_grad_norm", self.max_grad_norm is None or self.max_grad_norm > 0, "None or greater than 0"))
        for name, holds, rule in rules:
            if not holds:
                raise ValueError(f"{name} must be {rule}, but got {name}={getattr(self, name)}")

    def lr_at(self, step: int) -> float:
        """The learning rate of the step after `step` steps: transformers' get_linear_schedule_with_warmup,
        the same float arithmetic as its LambdaLR."""
        if step < self.warmup_steps:
            factor = float(step) / float(max(1, self.warmup_steps))
        else:
            factor = max(0.0, float(self.total_steps - step) / float(max(1, self.total_steps - self.warmup_steps)))
        return self.lr * factor


@dataclass
class MemberRows:
    """What the stacked modules need to know of the forward that runs: rows per member, each member's
    own padded length and its own count of rows (its dropout masks are drawn at them: a member whose batch
    is smaller, an epoch's last, fills its rows with copies it does not draw for), each member's dropout
    generator, and the array's one generator when members do not draw their own."""

    generators: list[torch.Generator]
    shared: torch.Generator | None = None
    rows: int = 1
    lengths: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)  # real rows per member; empty: every member `rows`


class StackedLinear(nn.Module):
    """K nn.Linear of one shape, each applied to its member's rows: one batched matmul for all."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight = nn.Parameter(weight)  # (K, out, in)
        self.bias = nn.Parameter(bias) if bias is not None else None  # (K, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        count = self.weight.shape[0]
        rows = x.reshape(count, -1, x.shape[-1])
        weight = self.weight.transpose(1, 2)
        out = (torch.bmm(rows, weight) if self.bias is None
               else torch.baddbmm(self.bias.unsqueeze(1), rows, weight))
        return out.view(*x.shape[:-1], out.shape[-1])


class StackedLayerNorm(nn.Module):
    """K nn.LayerNorm: normalized once for all rows, then each member's scale and shift."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, shape: tuple[int, ...], eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None
        self.normalized_shape, self.eps = shape, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = F.layer_norm(x, self.normalized_shape, None, None, self.eps).reshape(
            self.weight.shape[0], -1, *self.normalized_shape)
        weight = self.weight.unsqueeze(1)
        out = rows * weight if self.bias is None else torch.addcmul(self.bias.unsqueeze(1), rows, weight)
        return out.view(x.shape)


class StackedEmbedding(nn.Module):
    """K nn.Embedding tables (K, vocabulary, dim): each member's rows look up its own table (one lookup
    in the tables laid end to end); ids shared by every row (BERT's position ids, shape (1, length))
    give each member its own vectors, repeated for its rows. The padding row gets no gradient, as in
    torch (`zero_padding_grad` after backward)."""

    def __init__(self, weight: torch.Tensor, padding_idx: int | None, members: MemberRows):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.padding_idx, self.members = padding_idx, members

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        count, vocabulary, dim = self.weight.shape
        rows = self.members.rows
        if ids.shape[0] == count * rows:
            offsets = torch.arange(count, device=ids.device).repeat_interleave(rows) * vocabulary
            return F.embedding(ids + offsets.view(-1, *[1] * (ids.dim() - 1)), self.weight.view(-1, dim))
        if ids.shape[0] == 1:
            looked = self.weight.index_select(1, ids[0].reshape(-1)).view(count, 1, *ids.shape[1:], dim)
            return looked.expand(count, rows, *looked.shape[2:]).reshape(count * rows, *ids.shape[1:], dim)
        raise TypeError(f"a stacked embedding got ids of shape {tuple(ids.shape)}: neither one row per "
                        f"sentence ({count} members x {rows}) nor one row shared by all; this architecture's "
                        "lookups cannot be split by member")

    def zero_padding_grad(self) -> None:
        if self.padding_idx is not None and self.weight.grad is not None:
            self.weight.grad[:, self.padding_idx] = 0.0


class MemberDropout(nn.Module):
    """Dropout with each member's `fast` masks from its own generator, drawn at its own shapes: its rows,
    its own padded length on the token dimensions (dim 1 of token states (rows, length, dim), dims 2 and 3
    of attention probabilities (rows, heads, length, length)); the rest of the padded batch is dropped.
    With a shared generator (`MemberRows.shared`) one draw covers the whole batch instead: a site costs a few
    kernels, not a few per member, but a member's masks then depend on the array it is in."""

    def __init__(self, p: float, members: MemberRows):
        super().__init__()
        self.p, self.members = p, members

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.p >= 1.0:
            return x * 0.0
        return x * self.keep(x).to(x.dtype).mul_(1.0 / (1.0 - effective_p(self.p)))

    def keep(self, x: torch.Tensor) -> torch.Tensor:
        """int16 ones where `x` is kept. Each member's words are drawn into one buffer, as keep_indicator
        draws them (the same values: its generator, its count), and turned into indicators in one pass."""
        if self.members.shared is not None:
            return keep_indicator(x.shape, self.p, x.device, self.members.shared)
        generators, lengths = self.members.generators, self.members.lengths
        rows = x.shape[0] // len(generators)
        row_counts = self.members.counts or [rows] * len(generators)
        tokens = {3: (1,), 4: (2, 3)}.get(x.dim(), ())
        shapes = [tuple(length if dim in tokens else size for dim, size in enumerate((count, *x.shape[1:])))
                  for length, count in zip(lengths, row_counts, strict=True)]
        counts = [math.prod(shape) for shape in shapes]
        words = torch.empty(sum((n + 3) // 4 for n in counts), dtype=torch.int64, device=x.device)
        starts = [0]
        for generator, n in zip(generators, counts, strict=True):
            words[starts[-1]: starts[-1] + (n + 3) // 4].random_(generator=generator)
            starts.append(starts[-1] + (n + 3) // 4)
        bits = words.view(torch.int16).bitwise_and_(LEVELS - 1)  # keep_indicator's 15 bits an element
        threshold = keep_threshold(self.p)
        bits = bits.fill_(1) if threshold == 0 else bits.sub_(threshold - 1).clamp_(0, 1)
        if all(shape == shapes[0] and n % 4 == 0 for shape, n in zip(shapes, counts, strict=True)) and (
                shapes[0] == (rows, *x.shape[1:])):  # no padding between or within members: a view
            return bits[: sum(counts)].view(x.shape)
        out = bits.new_zeros(x.shape)
        for member, (shape, n, start) in enumerate(zip(shapes, counts, starts, strict=False)):
            region = out[member * rows: (member + 1) * rows]
            region[tuple(slice(0, size) for size in shape)] = bits[4 * start: 4 * start + n].view(shape)
        return out


def member_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     position_bias: torch.Tensor | None = None, **kwargs):
    """transformers' attention for a stacked model: with dropout, trainables.models.dropout's math
    (softmax(q kᵀ · scale + mask) in fp32) with the probabilities dropped by the module's MemberDropout,
    each member its own masks; without, trainables.models.attention's (SDPA; unfused evaluation on a CPU)."""
    dropout = dropout if module.training else 0.0
    if dropout == 0.0 and not explicit_without_dropout(module, query):
        return inference_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=scaling,
                                   position_bias=position_bias, **kwargs)
    drop = getattr(module, "dropout", None)
    if not isinstance(drop, MemberDropout) or kwargs.get("is_causal") or key.shape[1] != query.shape[1]:
        raise TypeError(f"{type(module).__name__}: a fused array's attention dropout needs an encoder's attention "
                        "whose probabilities' dropout is its `dropout` module")
    root = math.sqrt(scaling if scaling is not None else query.shape[-1] ** -0.5)
    dtype = query.dtype
    with torch.autocast(query.device.type, enabled=False):
        query, key, value = (t.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
                             for t in (query, key, value))
        scores = torch.matmul(query.mul_(root), key.mul_(root).transpose(-2, -1))
        if attention_mask is not None:
            if attention_mask.dtype == torch.bool:
                floor = torch.zeros((), dtype=scores.dtype, device=scores.device)
                scores = scores + floor.masked_fill(~attention_mask, float("-inf"))
            else:
                scores = scores + attention_mask[..., : key.shape[-2]].float()
        if position_bias is not None:
            scores = scores + position_bias.float()
        output = torch.matmul(drop(torch.softmax(scores, dim=-1)), value)
    return output.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format, copy=True), None


def stacked(name: str, modules: list[nn.Module], members: MemberRows) -> nn.Module | None:
    """The stacked replacement of the K members' module `name`; None for one without parameters of its own."""
    first = modules[0]

    def stack(attribute: str) -> torch.Tensor | None:
        tensors = [getattr(module, attribute) for module in modules]
        return None if tensors[0] is None else torch.stack([t.detach() for t in tensors])

    if isinstance(first, nn.Dropout):
        return MemberDropout(first.p, members)
    if isinstance(first, nn.Linear):
        return StackedLinear(stack("weight"), stack("bias"))
    if isinstance(first, nn.LayerNorm) and first.weight is not None:  # one without weights is shared as it is
        return StackedLayerNorm(stack("weight"), stack("bias"), tuple(first.normalized_shape), first.eps)
    if isinstance(first, nn.Embedding) and first.max_norm is None and not first.sparse:
        return StackedEmbedding(stack("weight"), first.padding_idx, members)
    if next(first.parameters(recurse=False), None) is not None:
        raise TypeError(f"{name} ({type(first).__name__}) has parameters a fused array cannot stack: it stacks "
                        "nn.Linear, nn.LayerNorm and nn.Embedding")
    return None


def stacked_position_bias(encoder: nn.Module, members: MemberRows) -> Callable:
    """MPNet's relative position bias for a stacked encoder: each member's from its own bucket table,
    repeated for its rows (its own code looks one table up for the whole batch)."""

    def compute_position_bias(x: torch.Tensor, position_ids: torch.Tensor | None = None,
                              num_buckets: int = 32) -> torch.Tensor:
        if position_ids is not None:
            raise TypeError("a stacked MPNet computes its position bias from positions 0..length-1 only")
        positions = torch.arange(x.size(1), dtype=torch.long, device=x.device)
        buckets = encoder.relative_position_bucket(positions[None, :] - positions[:, None], num_buckets=num_buckets)
        table = encoder.relative_attention_bias.weight  # (members, buckets, heads)
        values = table[:, buckets].permute(0, 3, 1, 2)  # (members, heads, length, length)
        count = table.shape[0]
        return values.unsqueeze(1).expand(count, members.rows, *values.shape[1:]).reshape(-1, *values.shape[1:])

    return compute_position_bias


def use_member_attention(model: nn.Module) -> None:
    """Route every transformers model inside `model` through `member_attention`."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ATTENTION, member_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    for module in model.modules():
        if getattr(module, "_supports_attention_backend", False) and hasattr(module, "set_attn_implementation"):
            module.set_attn_implementation(ATTENTION)


def check_one_architecture(models: Sequence[nn.Module]) -> None:
    """Every member has member 0's weights by name and shape, and its buffers (a stacked model shares them)."""
    reference = models[0].state_dict()
    parameters = {name for name, _ in models[0].named_parameters()}
    for index, model in enumerate(models[1:], start=1):
        state = model.state_dict()
        for key in [*reference, *(k for k in state if k not in reference)]:
            if key not in state or key not in reference or state[key].shape != reference[key].shape:
                raise ValueError(f"member {index} differs from member 0 at {key}: a fused array needs one architecture")
            if key not in parameters and not torch.equal(state[key], reference[key]):
                raise ValueError(f"member {index}'s buffer {key} differs from member 0's: buffers are shared")


def stack_models(models: Sequence[nn.Module], members: MemberRows) -> nn.Module:
    """A copy of the first model with every module that holds parameters stacked over all of them."""
    check_one_architecture(models)
    template = copy.deepcopy(models[0])
    sources = [dict(model.named_modules()) for model in models]
    for name, _ in list(template.named_modules()):
        replacement = stacked(name, [source[name] for source in sources], members) if name else None
        if replacement is not None:
            parent, _, child = name.rpartition(".")
            setattr(template.get_submodule(parent), child, replacement)
    for module in template.modules():
        if isinstance(getattr(module, "relative_attention_bias", None), StackedEmbedding) and hasattr(
                module, "compute_position_bias"):  # MPNet's encoder
            module.compute_position_bias = stacked_position_bias(module, members)
    use_member_attention(template)
    return template


class MemberAdamW:
    """AdamW over stacked tensors (members along dim 0), each member its own learning rate, weight decay
    and step count: torch's fused AdamW kernel on the members' slices, one call per (lr, weight decay,
    step) that members share, so K replicates step in two calls (decayed and not)."""

    def __init__(self, params: list[torch.Tensor], decays: list[bool], betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self.params, self.decays, self.betas, self.eps = params, decays, betas, eps
        self.exp_avgs = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in params]
        self.exp_avg_sqs = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in params]

    @torch.no_grad()
    def step(self, members: list[int], lrs: list[float], weight_decays: list[float], steps: list[int]) -> None:
        """One step of `members` (indices along dim 0), whose `steps` steps are done before this one."""
        groups: dict[tuple[float, float, int], list[int]] = {}
        for member, lr, decay, done in zip(members, lrs, weight_decays, steps, strict=True):
            groups.setdefault((lr, decay, done), []).append(member)
        used = [i for i, p in enumerate(self.params) if p.grad is not None]  # torch's AdamW skips the rest too
        slices = [{i: tensors[i].unbind(0) for i in used} for tensors in
                  (self.params, [p.grad for p in self.params], self.exp_avgs, self.exp_avg_sqs)]
        for (lr, decay, done), chosen in groups.items():
            for decayed in (True, False):
                which = [i for i in used if self.decays[i] == decayed]
                if not which:
                    continue
                params, grads, exp_avgs, exp_avg_sqs = ([s[i][m] for i in which for m in chosen] for s in slices)
                counts = list(torch.full((len(params),), float(done), device=params[0].device).unbind(0))
                adam(params, grads, exp_avgs, exp_avg_sqs, [], counts, fused=True, decoupled_weight_decay=True,
                     amsgrad=False, beta1=self.betas[0], beta2=self.betas[1], lr=lr,
                     weight_decay=decay if decayed else 0.0, eps=self.eps, maximize=False)

    @torch.no_grad()
    def keep(self, index: torch.Tensor) -> None:
        """Only the members at `index` stay (their state sliced out; the parameters are the caller's)."""
        self.exp_avgs = [t.index_select(0, index) for t in self.exp_avgs]
        self.exp_avg_sqs = [t.index_select(0, index) for t in self.exp_avg_sqs]


def cosine_mse(u: torch.Tensor, v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Each member's MSE between cos(u, v) and the gold score (`cosine_mse`), over (members, pairs, dim)."""
    return (F.cosine_similarity(u, v, dim=-1) - target.to(u.dtype)).pow(2).mean(dim=-1)


class MeanPooled(nn.Module):
    """A plain transformers encoder with mean pooling: the sentence vector `finetune` trains by default."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


def aligned_epoch_batches(lengths: list[int], batch_size: int, seed: int, shared_seed: int) -> list[list[int]]:
    """A member's batches for one epoch: the batches `epoch_batches` draws for `seed` (transformers'
    length-grouped order), in an order drawn from the array's `shared_seed`, so that at each step every
    member's batch is the same length rank of its own megabatch. The array pads each step
    to its longest member: with each member's own batch order, STS-B at batch 32 padded 65 % of 16 members'
    tokens (47 % of 4), in this order 16 % (15 %), against 12.5 % for one trial alone."""
    from transformers.trainer_pt_utils import get_length_grouped_indices  # heavy: when an array is built

    order = get_length_grouped_indices(lengths, batch_size, generator=torch.Generator().manual_seed(seed))
    batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    shuffle = torch.randperm(len(batches), generator=torch.Generator().manual_seed(shared_seed)).tolist()
    return [batches[i] for i in shuffle]


def member_batch(batches: Sequence[Sequence[Sequence[int]]], pad_id: int, device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int], list[int]]:
    """Every member's sentences longest first (the order a one-chunk solo batch has), padded to the longest
    of all, member-major: (input_ids, attention_mask, the index of each member's sentences in the batch, in
    their own order and members one after another; each member's own padded length; each member's count of
    sentences). A member with fewer sentences (an epoch's last, smaller batch) fills its rows with copies
    of its shortest sentence, after its own: nothing reads them (their dropout is not drawn, their vectors
    not used)."""
    rows = max(len(batch) for batch in batches)
    orders = [sorted(range(len(batch)), key=lambda i, b=batch: -len(b[i])) for batch in batches]
    lengths = [len(batch[order[0]]) for batch, order in zip(batches, orders, strict=True)]
    longest = max(lengths)
    ordered = [batch[i] for batch, order in zip(batches, orders, strict=True)
               for i in [*order, *[order[-1]] * (rows - len(order))]]
    mask = torch.arange(longest) < torch.tensor([len(t) for t in ordered])[:, None]
    ids = torch.full(mask.shape, pad_id, dtype=torch.long)
    ids[mask] = torch.tensor(list(itertools.chain.from_iterable(ordered)), dtype=torch.long)  # row-major, as mask
    mask = mask.long()
    counts = [len(batch) for batch in batches]
    index = torch.empty(sum(counts), dtype=torch.long)
    start = 0
    for member, order in enumerate(orders):
        index[start + torch.tensor(order)] = torch.arange(len(order)) + member * rows
        start += len(order)
    return ids.to(device), mask.to(device), index.to(device), lengths, counts


class FusedArray:
    """K members of one architecture trained as one stacked model; `members` are their labels, in order.
    `loss` is one member's pair loss (u, v, target) -> scalar, run over the members by torch.func.vmap
    (default: cosine_mse); `dtype` bfloat16 trains under bf16 autocast; `shared_dropout_seed` draws
    every member's dropout masks from one generator of that seed (fewer kernels a step on a GPU, but masks
    that depend on the array; by default each member draws its own)."""

    def __init__(self, models: Sequence[nn.Module], settings: Sequence[MemberSettings], pad_id: int,
                 members: Sequence | None = None, loss: PairLoss | None = None, dtype: torch.dtype = torch.float32,
                 shared_dropout_seed: int | None = None, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        if not models or len(models) != len(settings):
            raise ValueError(f"a fused array needs one MemberSettings per model, but got {len(models)} models and "
                             f"{len(settings)} settings")
        self.members = list(range(len(models)) if members is None else members)
        if len(set(self.members)) != len(models):
            raise ValueError(f"members must be {len(models)} distinct labels, but got members={self.members}")
        self.settings, self.steps = list(settings), [0] * len(models)
        self.device = next(models[0].parameters()).device
        self.pad_id, self.dtype = pad_id, dtype
        self.single_loss = loss if loss is not None else lambda u, v, t: cosine_mse(u[None], v[None], t[None])[0]
        self.loss = cosine_mse if loss is None else torch.func.vmap(loss)
        self.rows = MemberRows([self._generator(s.seed) for s in settings],
                               None if shared_dropout_seed is None else self._generator(shared_dropout_seed))
        self.model = stack_models(models, self.rows)
        self.params = list(self.model.parameters())
        self.optimizer = MemberAdamW(self.params, [p.dim() > 2 for p in self.params], betas, eps)

    def _generator(self, seed: int) -> torch.Generator:
        return torch.Generator(self.device).manual_seed(seed)

    def _index(self, member) -> int:
        if member not in self.members:
            raise KeyError(f"no member {member!r} in this array: its members are {self.members}")
        return self.members.index(member)

    def reseed(self, member, seed: int) -> None:
        """Restart `member`'s dropout stream at `seed` (a solo trial reseeds torch's generator each round)."""
        self.rows.generators[self._index(member)].manual_seed(seed)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def step(self, batches: Sequence[tuple[Sequence[Sequence[int]], torch.Tensor]]) -> torch.Tensor:
        """One optimizer step of every member on its own batch, in `members` order: (token lists whose first
        half pairs with the second, targets). Returns the members' losses; a member whose loss is not finite
        is not updated (drop it, as a solo trial would end)."""
        if len(batches) != len(self.members):
            raise ValueError(f"step needs one batch per member ({len(self.members)}), but got {len(batches)}")
        ids, mask, index, self.rows.lengths, counts = member_batch([b[0] for b in batches], self.pad_id,
                                                                    self.device)
        count = len(self.members)
        self.rows.rows = ids.shape[0] // count
        self.rows.counts = counts
        self.model.train()
        for param in self.params:
            param.grad = None
        with self._autocast():
            vectors = self.model(ids, mask).float()
        vectors = vectors[index]
        if all(n == self.rows.rows for n in counts):  # every member a whole batch: one vmapped loss
            vectors = vectors.view(count, self.rows.rows, -1)
            targets = torch.stack([torch.as_tensor(b[1]) for b in batches]).to(self.device, torch.float32)
            half = self.rows.rows // 2
            losses = self.loss(vectors[:, :half], vectors[:, half:], targets)
        else:  # some member's batch is smaller: each member's loss on its own sentences
            parts, losses_of = vectors.split(counts), []
            for part, (_, target) in zip(parts, batches, strict=True):
                half = part.shape[0] // 2
                target = torch.as_tensor(target).to(self.device, torch.float32)
                losses_of.append(self.single_loss(part[:half], part[half:], target))
            losses = torch.stack(losses_of)
        finite = torch.isfinite(losses)
        torch.where(finite, losses, torch.zeros_like(losses)).sum().backward()
        for module in self.model.modules():
            if isinstance(module, StackedEmbedding):
                module.zero_padding_grad()
        norms = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.flatten(1), dim=1)
                                                      for p in self.params if p.grad is not None]), dim=0)
        values, norms = torch.stack([losses.detach(), norms]).tolist()  # the step's one wait for the device
        updated = [k for k, value in enumerate(values) if math.isfinite(value)]
        self._clip(updated, norms)
        self.optimizer.step(updated, [self.settings[k].lr_at(self.steps[k]) for k in updated],
                            [self.settings[k].weight_decay for k in updated], [self.steps[k] for k in updated])
        for k in updated:
            self.steps[k] += 1
        return losses.detach()

    def _clip(self, members: list[int], norms: list[float]) -> None:
        """torch's clip_grad_norm_ for each member on its own norm (a coefficient of 1 multiplies nothing)."""
        grads = [p.grad.unbind(0) for p in self.params if p.grad is not None]
        for k in members:
            limit = self.settings[k].max_grad_norm
            coefficient = limit / (norms[k] + 1e-6) if limit else 1.0
            if coefficient < 1.0:
                torch._foreach_mul_([g[k] for g in grads], coefficient)

    @torch.no_grad()
    def drop(self, member) -> None:
        """Take `member` out of the array (pruned, diverged): every stacked tensor loses its slice; the
        others' weights, optimizer state, generators and step counts are kept as they are."""
        index = self._index(member)
        if len(self.members) == 1:
            raise ValueError(f"member {member!r} is the array's last: end the array instead")
        keep = torch.tensor([k for k in range(len(self.members)) if k != index], device=self.device)
        for param in self.params:
            param.grad = None
            param.data = param.data.index_select(0, keep)
        self.optimizer.keep(keep)
        for values in (self.members, self.settings, self.steps, self.rows.generators):
            del values[index]

    def names(self) -> list[str]:
        """The stacked parameters' names, in the optimizer's order: one member's model's parameter names."""
        return [name for name, _ in self.model.named_parameters()]

    @torch.no_grad()
    def load_member(self, member, moments: dict[str, tuple[torch.Tensor, torch.Tensor]], steps: int) -> None:
        """Start `member` from a trial's optimizer: AdamW's two moments of each parameter by name (one that is
        not named starts at zero) and the steps it has taken (its schedule's and AdamW's step count)."""
        index = self._index(member)
        for name, exp_avg, exp_avg_sq in zip(self.names(), self.optimizer.exp_avgs, self.optimizer.exp_avg_sqs,
                                             strict=True):
            first, second = moments.get(name, (None, None))
            if first is not None:
                exp_avg[index].copy_(first)
                exp_avg_sq[index].copy_(second)
        self.steps[index] = steps

    def member_moments(self, member) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """`member`'s AdamW moments by parameter name (what `load_member` takes)."""
        index = self._index(member)
        return {name: (exp_avg[index].clone(), exp_avg_sq[index].clone()) for name, exp_avg, exp_avg_sq in
                zip(self.names(), self.optimizer.exp_avgs, self.optimizer.exp_avg_sqs, strict=True)}

    def member_state_dict(self, member) -> dict[str, torch.Tensor]:
        """`member`'s weights as its own model's state dict (keys and shapes of one member's model)."""
        index = self._index(member)
        stacked_names = {name for name, _ in self.model.named_parameters()}
        return {name: (tensor[index] if name in stacked_names else tensor).detach().clone()
                for name, tensor in self.model.state_dict().items()}

    @torch.no_grad()
    def encode(self, token_lists: Sequence[Sequence[int]], chunk: int = 256) -> torch.Tensor:
        """Every member's vectors of the same sentences, (members, sentences, dim), in evaluation mode
        (dev and test scoring of each member); sentences go through longest first, `chunk` at a time."""
        self.model.eval()
        count = len(self.members)
        order = sorted(range(len(token_lists)), key=lambda i: -len(token_lists[i]))
        parts = []
        for start in range(0, len(order), chunk):
            picked = [token_lists[i] for i in order[start: start + chunk]]
            ids, mask, _, _, _ = member_batch([picked], self.pad_id, self.device)
            self.rows.rows, self.rows.lengths, self.rows.counts = len(picked), [ids.shape[1]] * count, []
            with self._autocast():
                vectors = self.model(ids.repeat(count, 1), mask.repeat(count, 1)).float()
            parts.append(vectors.view(count, len(picked), -1))
        vectors = torch.cat(parts, dim=1)
        inverse = torch.empty(len(order), dtype=torch.long, device=vectors.device)
        inverse[torch.tensor(order, device=vectors.device)] = torch.arange(len(order), device=vectors.device)
        return vectors[:, inverse]
