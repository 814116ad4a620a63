"""RowAdamW: torch's fused AdamW to the bit, weights, moments and step counts, while it steps a row-wise
embedding gradient's touched rows alone."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import trainables.training.optimizer as optimizer_module
from trainables.models.embedding_grad import RowGradEmbedding
from trainables.training.optimizer import RowAdamW


class Toy(nn.Module):
    """A row-wise embedding table and a linear layer after it, so a step has a table and a dense matrix."""

    def __init__(self, rows: int, hidden: int, seed: int):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.table = RowGradEmbedding.replacing(nn.Embedding(rows, hidden))
        self.table.weight = nn.Parameter(torch.randn(rows, hidden, generator=generator))
        self.linear = nn.Linear(hidden, 3)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(3, hidden, generator=generator))
            self.linear.bias.copy_(torch.randn(3, generator=generator))

    def loss(self, ids: torch.Tensor, dense_use: bool = False) -> torch.Tensor:
        loss = self.linear(self.table(ids)).square().sum()
        return loss + self.table.weight.square().sum() if dense_use else loss


def optimizers(model: nn.Module, lr: float, decay: float):
    """The two ways to step `model`: torch's fused AdamW and RowAdamW, grouped as build_optimizer groups."""
    groups = [{"params": [p for p in model.parameters() if p.ndim >= 2], "weight_decay": decay},
              {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0}]
    return groups, dict(lr=lr, fused=True)


def train(make, rows: int, hidden: int, steps: list[list[int]], lr: float, decay: float, dense_at: set[int],
          seed: int = 0, decaying: bool = True):
    model = Toy(rows, hidden, seed)
    groups, options = optimizers(model, lr, decay)
    optimizer = make(groups, **options)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step) if decaying else 1.0)
    for number, ids in enumerate(steps):
        model.loss(torch.tensor(ids), dense_use=number in dense_at).backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def assert_same(ours, theirs) -> None:
    (model_a, optimizer_a), (model_b, optimizer_b) = ours, theirs
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(a, b), (a - b).abs().max()
    state_a, state_b = optimizer_a.state_dict()["state"], optimizer_b.state_dict()["state"]
    assert state_a.keys() == state_b.keys()
    for index in state_a:
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(state_a[index][name], state_b[index][name]), (index, name)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(8, 120), hidden=st.sampled_from([16, 32, 48]), decay=st.sampled_from([0.0, 0.01, 0.3]),
       lr=st.sampled_from([1e-3, 0.05]), data=st.data())
def test_row_steps_give_torchs_fused_adamw_to_the_bit(rows, hidden, decay, lr, data, monkeypatch_share):
    """Steps that each look up a few rows (a new one now and then, some again, duplicates within a step):
    weights, both moments and the step counts equal torch's, and the row step did run."""
    steps = data.draw(st.lists(st.lists(st.integers(0, rows - 1), min_size=1, max_size=6), min_size=2, max_size=7))
    ran = []
    original = RowAdamW._step_rows

    def counted(self, *args):
        ran.append(1)
        return original(self, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RowAdamW, "_step_rows", counted)
        ours = train(RowAdamW, rows, hidden, steps, lr, decay, set())
    assert_same(ours, train(torch.optim.AdamW, rows, hidden, steps, lr, decay, set()))
    assert ran  # every step after the first touched at most the share (it is 1.0 here)


@pytest.fixture
def monkeypatch_share():
    """Every table in the row step, however many of its rows a step has touched."""
    saved = optimizer_module.ROW_SHARE
    optimizer_module.ROW_SHARE = 1.0
    yield
    optimizer_module.ROW_SHARE = saved


def test_a_table_whose_rows_leave_a_scalar_tail_takes_torchs_step(monkeypatch_share, monkeypatch):
    """Rows of 24 floats: gathered in odd numbers they end in 8 floats of the kernel's scalar code, which
    rounds differently from its vectors over the whole table, so the table takes torch's step: the numbers
    are torch's, and the row step never ran."""
    ran = []
    original = RowAdamW._step_rows
    monkeypatch.setattr(RowAdamW, "_step_rows", lambda self, *args: ran.append(1) or original(self, *args))
    steps = [[1], [3], [1, 2, 3], [3], [3, 5, 7], [3], [9, 3]]
    ours = train(RowAdamW, 40, 24, steps, 0.01, 0.01, set())
    assert_same(ours, train(torch.optim.AdamW, 40, 24, steps, 0.01, 0.01, set()))
    assert not ran and ours[1]._seen  # the rows were still noted


def test_a_table_past_its_share_and_a_dense_gradient_take_torchs_step_and_stay_exact(monkeypatch):
    """With the share at a quarter, the first steps touch few rows (the row step), later ones most (torch's
    step); a tied use at step 3 brings a dense gradient (torch's step, and the rows touched are read from
    the moments after it): torch's numbers throughout."""
    monkeypatch.setattr(optimizer_module, "ROW_SHARE", 0.25)
    steps = [[1, 2], [2, 3], [4], [5, 6], [7], list(range(0, 40)), [1]]
    ours = train(RowAdamW, 40, 16, steps, 0.01, 0.01, dense_at={3})
    assert_same(ours, train(torch.optim.AdamW, 40, 16, steps, 0.01, 0.01, dense_at={3}))
    seen = ours[1]._seen[ours[0].table.weight]
    assert seen.all()  # the dense gradient touched every row


def test_a_restored_state_resumes_as_torchs_does(monkeypatch, tmp_path):
    """Saved mid-run and restored into a fresh RowAdamW (as a checkpoint does): the rows touched are read
    from the moments, and the rest of the run matches torch's uninterrupted one."""
    monkeypatch.setattr(optimizer_module, "ROW_SHARE", 1.0)
    first, rest = [[1, 2], [3], [3, 9]], [[4], [1, 10], [11]]
    model, optimizer = train(RowAdamW, 30, 16, first, 0.02, 0.01, set(), decaying=False)
    saved = optimizer.state_dict()
    groups, options = optimizers(model, 0.02, 0.01)
    resumed = RowAdamW(groups, **options)
    resumed.load_state_dict(saved)
    for ids in rest:
        model.loss(torch.tensor(ids)).backward()
        resumed.step()
        resumed.zero_grad(set_to_none=True)
    assert set(resumed._seen[model.table.weight].nonzero().squeeze(1).tolist()) == {1, 2, 3, 4, 9, 10, 11}
    assert_same((model, resumed), train(torch.optim.AdamW, 30, 16, first + rest, 0.02, 0.01, set(), decaying=False))


def test_build_optimizer_trains_an_encoder_as_torchs_adamw_does(tiny_bert, monkeypatch):
    """A few `finetune` steps of a tiny BERT through build_optimizer (its word table in the row step) and
    through torch's fused AdamW with the same groups: the same weights to the bit."""
    from trainables.models.encoder import build_sentence_encoder
    from trainables.objectives.sts import CosineMSELoss
    from trainables.training.bi_encoder import build_optimizer, train_step

    monkeypatch.setattr(optimizer_module, "ROW_SHARE", 1.0)
    batches = [[[101, 7, 8, 102], [101, 9, 102], [101, 7, 11, 12, 102], [101, 13, 102]],
               [[101, 14, 15, 102], [101, 8, 102], [101, 16, 102], [101, 17, 18, 19, 102]],
               [[101, 7, 102], [101, 20, 21, 102], [101, 22, 102], [101, 23, 102]]]

    def trained(make):
        torch.manual_seed(0)
        model = build_sentence_encoder(tiny_bert, None, "mean", seed=0, dropout_masks="fast").train()
        optimizer = make(list(model.named_parameters()))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        for number, token_lists in enumerate(batches):
            torch.manual_seed(number)
            train_step(model, CosineMSELoss(), optimizer, schedule, token_lists, torch.tensor([0.2, 0.9]), 0,
                       torch.device("cpu"), torch.float32, 1.0)
        return model, optimizer

    ran = []
    original = RowAdamW._step_rows

    def counted(self, param, *args):
        ran.append(param.shape)
        return original(self, param, *args)

    monkeypatch.setattr(RowAdamW, "_step_rows", counted)
    ours = trained(lambda params: build_optimizer(params, 1e-2, 0.01))
    assert isinstance(ours[1], RowAdamW)
    table = ours[0].encoder.get_input_embeddings().weight
    assert ran == [table.shape] * (len(batches) - 1)  # the word table, in the row step after the first

    def torchs(params):
        plain = build_optimizer(params, 1e-2, 0.01)
        return torch.optim.AdamW(plain.param_groups, lr=1e-2, fused=True)

    assert_same(ours, trained(torchs))


def test_a_step_with_a_closure_is_torchs_and_the_rows_it_touches_are_not_lost(monkeypatch_share):
    """A closure recomputes the gradients inside the step, so the step is torch's; the rows it touched are
    read from the moments at the next step, which then matches torch's."""
    steps = [[1], [2], [5]]
    model, optimizer = train(RowAdamW, 30, 16, steps, 0.02, 0.01, set(), decaying=False)
    reference = train(torch.optim.AdamW, 30, 16, steps, 0.02, 0.01, set(), decaying=False)

    for ours, ids in ((True, [7]), (False, [7])):
        target_model, target_optimizer = (model, optimizer) if ours else reference

        def closure(target_model=target_model, target_optimizer=target_optimizer, ids=ids):
            target_optimizer.zero_grad(set_to_none=True)
            loss = target_model.loss(torch.tensor(ids))
            loss.backward()
            return loss

        target_optimizer.step(closure)
        target_optimizer.zero_grad(set_to_none=True)
    for target_model, target_optimizer in ((model, optimizer), reference):
        target_model.loss(torch.tensor([2])).backward()
        target_optimizer.step()
        target_optimizer.zero_grad(set_to_none=True)
    assert 7 in optimizer._seen[model.table.weight].nonzero().squeeze(1).tolist()
    assert_same((model, optimizer), reference)
