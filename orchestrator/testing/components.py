"""Checks for an objective or a pooling, importable by a plugin's own tests: each takes a registered
name (or the declaration itself, before it is registered) and raises AssertionError naming what broke.

    from orchestrator.testing.components import check_objective, check_pooling

    def test_my_loss():
        check_objective("my_loss")        # or check_objective(MY_LOSS), the Objective itself

The project's own objectives and poolings pass the same checks (tests/orchestrator/test_kit.py).
"""

from __future__ import annotations

from typing import Any

from trainables.objectives import Objective, objective
from trainables.poolings import Pooling, pooling

LENGTHS = (7, 3, 5, 1)  # real tokens per sentence of the pooling checks' batch (right-padded to 7)


def _objective(declared: str | Objective) -> Objective:
    return objective(declared) if isinstance(declared, str) else declared


def _pooling(declared: str | Pooling) -> Pooling:
    return pooling(declared) if isinstance(declared, str) else declared


def _targets(task_kind: str, batch: int, generator) -> Any:
    import torch

    if task_kind == "sts":
        return torch.rand(batch, generator=generator)
    if task_kind == "pairs":
        return torch.arange(batch)  # each anchor's positive: its own row of v
    if task_kind == "nli":
        return torch.tensor([i % 3 for i in range(batch)])  # entailment, neutral, contradiction
    return torch.tensor([i % 2 for i in range(batch)])  # both classes, as a 0/1 label


def check_objective(declared: str | Objective, dim: int = 16, batch: int = 8, seed: int = 0) -> None:
    """An objective builds from the embedding size, returns a finite scalar for a batch of pairs and
    their targets (a score in [0, 1] for sts, a 0/1 label for pair_classification, each anchor's row of v for
    pairs; a guided objective also gets its guide's vectors as `.guide`), lets gradients
    reach both sides' vectors and its own parameters, reads the target, works for any batch size, and
    is deterministic: built under one seed, the same parameters and the same loss."""
    import torch

    declaration = _objective(declared)
    generator = torch.Generator().manual_seed(seed)
    u, v = torch.randn(batch, dim, generator=generator), torch.randn(batch, dim, generator=generator)
    target = _targets(declaration.task_kind, batch, generator)
    torch.manual_seed(seed)
    first = declaration.build(dim)
    torch.manual_seed(seed)
    second = declaration.build(dim)
    assert isinstance(first, torch.nn.Module), f"{declaration.loss} built a {type(first).__name__}, not a torch module"
    guide = (torch.randn(batch, dim, generator=generator), torch.randn(batch, dim, generator=generator))
    if declaration.guided:  # a guided objective reads the guide model's vectors of the batch, laid out as u and v
        first.guide = second.guide = guide
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items(), strict=True):
        assert torch.equal(a, b), f"built twice under one seed, its parameter {name} differs"
    u_, v_ = u.clone().requires_grad_(), v.clone().requires_grad_()
    loss = first(u_, v_, target)
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0, f"the loss must be a scalar tensor, got {loss!r}"
    assert loss.dtype.is_floating_point and torch.isfinite(loss), f"the loss is not a finite number: {loss}"
    assert torch.equal(loss.detach(), second(u, v, target).detach()), "the same inputs gave another loss"
    assert loss.requires_grad, "no gradient reaches u or v: the loss does not depend on them through autograd"
    loss.backward()
    for side, vectors in (("u", u_), ("v", v_)):
        assert vectors.grad is not None and torch.isfinite(vectors.grad).all(), f"no finite gradient reaches {side}"
        assert vectors.grad.abs().sum() > 0, f"the gradient on {side} is zero everywhere"
    for name, parameter in first.named_parameters():
        assert parameter.grad is not None, f"no gradient reaches its parameter {name}"
    other = target.roll(1) if declaration.task_kind in ("pairs", "nli") else 1 - target
    assert not torch.equal(first(u, v, other).detach(), loss.detach()), "another target gave the same loss"
    if declaration.guided:
        first.guide = (guide[0][:2], guide[1][:2])
    small = first(u[:2], v[:2], target[:2])
    assert small.dim() == 0 and torch.isfinite(small), "a batch of two gave no finite scalar"


def check_pooling(declared: str | Pooling, dim: int = 16, seed: int = 0) -> None:
    """A pooling builds from the hidden size and turns token states (batch, tokens, dim) and a mask into
    one finite vector of size dim per sentence; padding changes nothing (the states under the mask, in
    the forward pass or the backward one: each sentence pooled alone, unpadded, gives its row);
    gradients reach the real tokens; and it is deterministic (built under one seed, the same module)."""
    import torch

    declaration = _pooling(declared)
    generator = torch.Generator().manual_seed(seed)
    longest = max(LENGTHS)
    hidden = torch.randn(len(LENGTHS), longest, dim, generator=generator)
    mask = torch.tensor([[1] * n + [0] * (longest - n) for n in LENGTHS])
    torch.manual_seed(seed)
    pool = declaration.build(dim)
    torch.manual_seed(seed)
    again = declaration.build(dim)
    assert isinstance(pool, torch.nn.Module), f"{declaration.module} built a {type(pool).__name__}, not a torch module"
    for (name, a), (_, b) in zip(pool.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), f"built twice under one seed, its parameter {name} differs"
    states = hidden.clone().requires_grad_()
    vectors = pool(states, mask)
    assert tuple(vectors.shape) == (len(LENGTHS), dim), \
        f"expected shape {(len(LENGTHS), dim)}, got {tuple(vectors.shape)}"
    assert torch.isfinite(vectors).all(), "a pooled vector is not finite"
    assert torch.equal(vectors.detach(), again(hidden, mask).detach()), "the same inputs gave other vectors"
    noise = torch.randn(hidden.shape, generator=generator) * (1 - mask).unsqueeze(-1)
    torch.testing.assert_close(pool(hidden + 1000 * noise, mask), vectors.detach(), atol=1e-5, rtol=1e-5,
                               msg="states under the padding changed the pooled vectors")
    for row, length in enumerate(LENGTHS):
        alone = pool(hidden[row:row + 1, :length], mask[row:row + 1, :length])
        torch.testing.assert_close(alone[0], vectors[row].detach(), atol=1e-5, rtol=1e-5,
                                   msg=f"sentence {row} pooled alone differs from its row in the padded batch")
    vectors.sum().backward()
    assert states.grad is not None and states.grad[mask.bool()].abs().sum() > 0, "no gradient reaches the tokens"
    assert states.grad[~mask.bool()].abs().sum() == 0, "gradient reaches the padding"
