"""Fused trial arrays (trainables.training.fused): every member trains as it would alone.

Tiny random BERTs (and one MPNet) built from a config (no downloads, no tokenizer: the batches are random
token ids). A member's numbers are compared with the same model trained alone by a plain loop
(torch.optim.AdamW, transformers' linear schedule, clip_grad_norm_) on the same batches, dropout 0: loss
curve and weights to fp32 rounding (rtol 1e-4, atol 1e-5: the stacked matmuls, the padding to the longest
sentence of all members and torch's fused AdamW kernel round differently from the plain loop; bit
equality is not claimed). With dropout, a member's masks are its own: those a `dropout_masks: fast` model
alone draws from a generator of the member's seed (its batch in one chunk), unchanged when another member
leaves the array."""

from __future__ import annotations

import copy
import random
import re

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertModel, MPNetConfig, MPNetModel, get_linear_schedule_with_warmup

from trainables.models.batching import encode_tokens, pad
from trainables.models.encoder import SentenceEncoder, prepare_for_training
from trainables.objectives.sts import CosineMSELoss
from trainables.training.bi_encoder import epoch_batches
from trainables.training.fused import FusedArray, MeanPooled, MemberAdamW, MemberSettings, aligned_epoch_batches

STEPS, PAIRS, VOCABULARY = 20, 6, 120
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
SAME = {"rtol": 1e-5, "atol": 1e-6}  # "unchanged": a different padded length rounds a little differently


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny matmuls on one thread (conftest's `one_torch_thread`): two OpenMP threads on a shared 2-core
    machine spin far longer than they compute."""


def tiny_model(seed: int, dropout: float = 0.0) -> SentenceEncoder:
    """A random 2-layer BERT (hidden 32) under mean pooling, its weights drawn from `seed`."""
    config = BertConfig(vocab_size=VOCABULARY, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout)
    torch.manual_seed(seed)
    return SentenceEncoder(BertModel(config, add_pooling_layer=False), "mean")


def as_trial(model: SentenceEncoder) -> SentenceEncoder:
    """A copy made ready as a `finetune` trial makes its model (row-wise embedding gradient, fast dropout):
    what an array is given in the project; the plain loop trains the model as built."""
    return SentenceEncoder(prepare_for_training(copy.deepcopy(model.encoder), "fast"), "mean")


def batches(seed: int, steps: int = STEPS, lengths: tuple[int, int] = (3, 16),
            first_id: int = 1) -> list[tuple[list, torch.Tensor]]:
    """A member's own data order: `steps` batches of PAIRS pairs of random sentences (ids from `first_id`:
    none is the padding id) and scores."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        sizes = torch.randint(lengths[0], lengths[1] + 1, (2 * PAIRS,), generator=generator).tolist()
        lists = [torch.randint(first_id, VOCABULARY, (n,), generator=generator).tolist() for n in sizes]
        out.append((lists, torch.rand(PAIRS, generator=generator)))
    return out


def train_alone(model: nn.Module, settings: MemberSettings, data: list, one_chunk: bool = False, pad_id: int = 0):
    """The plain loop: (losses, gradient norms before clipping, final weights)."""
    params = list(model.named_parameters())
    optimizer = torch.optim.AdamW([{"params": [p for _, p in params if p.ndim >= 2],
                                    "weight_decay": settings.weight_decay},
                                   {"params": [p for _, p in params if p.ndim < 2], "weight_decay": 0.0}],
                                  lr=settings.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, settings.warmup_steps, settings.total_steps)
    loss_fn, losses, norms = CosineMSELoss(), [], []
    model.train()
    for lists, targets in data:
        if one_chunk:  # a trial's own batching, its batch in one chunk (as on a GPU)
            vectors = encode_tokens(model, lists, pad_id, torch.device("cpu"), tokens_per_chunk=10**6)
        else:
            vectors = model(*pad(lists, pad_id, torch.device("cpu")))
        loss = loss_fn(vectors[:PAIRS], vectors[PAIRS:], targets)
        loss.backward()
        limit = settings.max_grad_norm
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), limit if limit else float("inf"))))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, norms, model.state_dict()


def train_fused(array: FusedArray, data: dict, steps: int = STEPS, drops: dict | None = None) -> dict:
    """Each member's loss curve; `drops` maps a step to the member dropped before it."""
    curves = {member: [] for member in array.members}
    for step in range(steps):
        if drops and step in drops:
            array.drop(drops[step])
        losses = array.step([data[member][step] for member in array.members]).tolist()
        for member, loss in zip(array.members, losses, strict=True):
            curves[member].append(loss)
    return curves


def assert_same_member(curve: list, weights: dict, alone_curve: list, alone_weights: dict, **tolerance) -> None:
    tolerance = tolerance or TOLERANCE
    torch.testing.assert_close(torch.tensor(curve), torch.tensor(alone_curve), **tolerance)
    assert weights.keys() == alone_weights.keys()
    for key, value in alone_weights.items():
        torch.testing.assert_close(weights[key], value, **tolerance, msg=lambda m, key=key: f"{key}: {m}")


def check_array_against_alone(inits: list[int], settings: list[MemberSettings]) -> tuple[dict, list[list[float]]]:
    """An array of the members against each trained alone; returns the array's loss curves and the plain
    loop's gradient norms."""
    data = {member: batches(100 + member) for member in range(len(inits))}
    array = FusedArray([as_trial(tiny_model(seed)) for seed in inits], settings, pad_id=0)
    curves = train_fused(array, data)
    all_norms = []
    for member, (seed, member_settings) in enumerate(zip(inits, settings, strict=True)):
        alone_curve, norms, alone_weights = train_alone(tiny_model(seed), member_settings, data[member])
        assert_same_member(curves[member], array.member_state_dict(member), alone_curve, alone_weights)
        all_norms.append(norms)
    return curves, all_norms


def test_replicates_match_each_trained_alone():
    """Four replicates: their own initial weights and data order, the same optimizer scalars."""
    settings = [MemberSettings(lr=2e-3, total_steps=STEPS, warmup_steps=4, seed=seed) for seed in range(4)]
    curves, _ = check_array_against_alone([0, 1, 2, 3], settings)
    assert len({curve[-1] for curve in curves.values()}) == 4  # four trajectories, not one four times


def test_tuning_members_match_each_trained_alone():
    """Four members of one start with their own learning rate, warmup, weight decay and clipping; two of
    them clip (their gradient norms pass the limit) and one does not clip at all."""
    lrs, warmups, decays = (1e-4, 5e-4, 2e-3, 5e-3), (0, 2, 5, 0), (0.0, 0.01, 0.1, 0.01)
    limits = (None, 1.0, 0.05, 0.2)
    settings = [MemberSettings(lr=lr, total_steps=STEPS, warmup_steps=w, weight_decay=d, max_grad_norm=c, seed=i)
                for i, (lr, w, d, c) in enumerate(zip(lrs, warmups, decays, limits, strict=True))]
    _, norms = check_array_against_alone([5, 5, 5, 5], settings)
    assert any(n > 0.05 for n in norms[2]) and any(n > 0.2 for n in norms[3])  # clipping was exercised


def test_mpnet_members_match_each_trained_alone():
    """MPNet (its relative position bias computed per member, its attention its own eager code): two members
    of one start with their own learning rate and data order against each trained alone."""
    config = MPNetConfig(vocab_size=VOCABULARY, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)

    def tiny_mpnet() -> SentenceEncoder:
        torch.manual_seed(4)
        return SentenceEncoder(MPNetModel(config, add_pooling_layer=False), "mean")

    settings = [MemberSettings(lr=lr, total_steps=STEPS, warmup_steps=2, seed=i) for i, lr in enumerate((1e-3, 4e-3))]
    data = {member: batches(50 + member, first_id=2) for member in range(2)}  # MPNet pads with 1
    array = FusedArray([as_trial(tiny_mpnet()) for _ in range(2)], settings, pad_id=config.pad_token_id)
    curves = train_fused(array, data)
    for member in range(2):
        alone_curve, _, alone_weights = train_alone(tiny_mpnet(), settings[member], data[member],
                                                    pad_id=config.pad_token_id)
        assert_same_member(curves[member], array.member_state_dict(member), alone_curve, alone_weights)


def test_member_adamw_is_torch_adamw_per_member():
    """Stacked AdamW with a learning rate and weight decay per member against torch.optim.AdamW on each
    member's own tensors (decay on matrices only): torch's fused kernel to the bit, its default to rounding."""
    generator = torch.Generator().manual_seed(0)
    shapes, count = [(5, 3), (3,), (4, 2, 2)], 3
    initial = [torch.randn((count, *s), generator=generator) for s in shapes]
    stacked = [t.clone() for t in initial]
    grads = [[torch.randn((count, *s), generator=generator) for s in shapes] for _ in range(6)]
    lrs, decays = [1e-3, 3e-2, 1e-3], [0.01, 0.1, 0.0]
    optimizer = MemberAdamW(stacked, [t.dim() > 2 for t in stacked])
    for step, step_grads in enumerate(grads):
        for tensor, grad in zip(stacked, step_grads, strict=True):
            tensor.grad = grad.clone()
        optimizer.step(list(range(count)), lrs, decays, [step] * count)
    for fused in (True, False):
        for member in range(count):
            own = [nn.Parameter(t[member].clone()) for t in initial]
            reference = torch.optim.AdamW([{"params": [p for p in own if p.dim() >= 2], "weight_decay": decays[member]},
                                           {"params": [p for p in own if p.dim() < 2], "weight_decay": 0.0}],
                                          lr=lrs[member], fused=fused)
            for step_grads in grads:
                for param, grad in zip(own, step_grads, strict=True):
                    param.grad = grad[member].clone()
                reference.step()
            for param, tensor in zip(own, stacked, strict=True):
                tolerance = {"rtol": 0, "atol": 0} if fused else {"rtol": 1e-6, "atol": 1e-7}
                torch.testing.assert_close(tensor[member], param.detach(), **tolerance)


def test_members_draw_their_own_dropout_masks():
    """With dropout, members of the same weights and batch differ by their seed alone: the same seed
    draws the same masks, another seed other masks; evaluation has no dropout."""
    settings = [MemberSettings(lr=1e-3, total_steps=STEPS, seed=seed) for seed in (7, 7, 8)]
    array = FusedArray([as_trial(tiny_model(0, dropout=0.1)) for _ in range(3)], settings, pad_id=0)
    batch = batches(1, steps=1)[0]
    losses = array.step([batch] * 3).tolist()
    assert losses[0] == losses[1] and abs(losses[0] - losses[2]) > 1e-4
    vectors = array.encode(batch[0])
    torch.testing.assert_close(vectors[0], vectors[1], rtol=0, atol=0)


def test_member_draws_the_masks_of_a_fast_dropout_trial():
    """A member with dropout draws the masks a `dropout_masks: fast` model draws alone from torch's
    generator seeded alike, its batch in one chunk: the same loss curve and weights to rounding."""
    settings = [MemberSettings(lr=2e-3, total_steps=STEPS, warmup_steps=2, seed=seed) for seed in (11, 12)]
    data = {member: batches(200 + member) for member in range(2)}
    array = FusedArray([as_trial(tiny_model(3, dropout=0.1)) for _ in range(2)], settings, pad_id=0)
    curves = train_fused(array, data)
    for member in range(2):
        model = as_trial(tiny_model(3, dropout=0.1))
        torch.manual_seed(settings[member].seed)  # what a trial's round does before its first step
        alone = train_alone(model, settings[member], data[member], one_chunk=True)
        assert_same_member(curves[member], array.member_state_dict(member), alone[0], alone[2])
    assert curves[0] != curves[1]


def test_one_shared_dropout_stream_gives_members_other_masks():
    """`shared_dropout_seed`: one draw for the whole array; members of one seed still get masks of their own,
    and the same shared seed draws them again."""
    settings = [MemberSettings(lr=1e-3, total_steps=STEPS, seed=7)] * 2
    batch = batches(1, steps=1)[0]
    runs = [FusedArray([as_trial(tiny_model(0, dropout=0.1)) for _ in range(2)], settings, pad_id=0,
                       shared_dropout_seed=3).step([batch] * 2).tolist() for _ in range(2)]
    assert runs[0] == runs[1] and abs(runs[0][0] - runs[0][1]) > 1e-4


def test_a_given_pair_loss_runs_for_each_member():
    """A loss module of one member's pairs (here the `cosine_mse` objective's) runs over the members by vmap:
    the same losses and weights as the built-in vectorized one."""
    settings = [MemberSettings(lr=2e-3, total_steps=5, seed=seed) for seed in range(2)]
    data = {member: batches(40 + member, steps=5) for member in range(2)}
    arrays = [FusedArray([as_trial(tiny_model(seed)) for seed in range(2)], settings, pad_id=0, loss=loss)
              for loss in (None, CosineMSELoss())]
    curves = [train_fused(array, data, steps=5) for array in arrays]
    for member in range(2):
        assert_same_member(curves[1][member], arrays[1].member_state_dict(member), curves[0][member],
                           arrays[0].member_state_dict(member), **SAME)


def test_aligned_order_is_the_trials_batches_in_the_arrays_order():
    """aligned_epoch_batches: each member gets the batches its trial draws, in an order that lines their
    lengths up, so that padding every member to the step's longest sentence costs far less."""
    draw = random.Random(0)
    lengths = [min(60, 3 + int(draw.expovariate(0.1))) for _ in range(800)]  # skewed, as sentence lengths are
    aligned = [aligned_epoch_batches(lengths, 8, seed, shared_seed=5) for seed in (1, 2, 3)]
    own = [epoch_batches(lengths, 8, seed, True) for seed in (1, 2, 3)]
    for mine, trials in zip(aligned, own, strict=True):
        assert sorted(mine) == sorted(trials)

    def padded_share(orders: list[list[list[int]]]) -> float:
        steps = list(zip(*orders, strict=True))
        real = sum(lengths[i] for step in steps for batch in step for i in batch)
        return 1 - real / sum(len(orders) * len(step[0]) * max(lengths[i] for b in step for i in b) for step in steps)

    assert padded_share(aligned) < 0.5 * padded_share(own)


def long_batches(seed: int) -> list:
    return batches(seed, lengths=(20, 30))  # longer than the others': the array's padded length shrinks without it


def test_dropping_a_member_leaves_the_others_unchanged():
    """Dropping a member (whose sentences were the longest: the others' padded batch shrinks), dropout on:
    the other members' curves and weights are those of the array that kept it."""
    settings = {name: MemberSettings(lr=2e-3, total_steps=STEPS, seed=seed) for seed, name in enumerate("abc")}
    data = {"a": batches(1), "b": long_batches(2), "c": batches(3)}
    runs = []
    for drops in (None, {7: "b"}):
        array = FusedArray([as_trial(tiny_model(0, dropout=0.1)) for _ in "abc"], list(settings.values()), pad_id=0,
                           members=list("abc"))
        runs.append((train_fused(array, data, drops=drops), array))
    (kept_curves, kept), (dropped_curves, dropped) = runs
    assert dropped.members == ["a", "c"] and len(dropped_curves["b"]) == 7
    for member in "ac":
        assert_same_member(dropped_curves[member], dropped.member_state_dict(member), kept_curves[member],
                           kept.member_state_dict(member), **SAME)


def test_a_diverged_member_is_not_updated_and_leaves_the_others_untouched():
    """A member whose loss is NaN (its targets are, at step 4) keeps its weights; the others' numbers are
    those of an array where nothing diverged, before and after the diverged member is dropped."""
    settings = [MemberSettings(lr=2e-3, total_steps=STEPS, seed=seed) for seed in range(3)]
    data = {member: batches(10 + member) for member in range(3)}
    poisoned = {**data, 1: [(lists, torch.full_like(t, float("nan")) if step == 4 else t)
                            for step, (lists, t) in enumerate(data[1])]}
    reference = FusedArray([as_trial(tiny_model(seed)) for seed in range(3)], settings, pad_id=0)
    reference_curves = train_fused(reference, data)
    array = FusedArray([as_trial(tiny_model(seed)) for seed in range(3)], settings, pad_id=0)
    train_fused(array, poisoned, steps=4)
    before = array.member_state_dict(1)
    losses = array.step([poisoned[member][4] for member in range(3)])
    assert torch.isnan(losses[1]) and torch.isfinite(losses[[0, 2]]).all()
    for key, value in before.items():
        torch.testing.assert_close(array.member_state_dict(1)[key], value, rtol=0, atol=0)
    array.drop(1)
    curves = {member: [float("nan")] * 4 + [losses[member].item()] for member in (0, 2)}
    for step in range(5, STEPS):
        for member, loss in zip((0, 2), array.step([data[0][step], data[2][step]]).tolist(), strict=True):
            curves[member].append(loss)
    for member in (0, 2):
        torch.testing.assert_close(torch.tensor(curves[member][4:]), torch.tensor(reference_curves[member][4:]), **SAME)
        for key, value in reference.member_state_dict(member).items():
            torch.testing.assert_close(array.member_state_dict(member)[key], value, **SAME)


def test_member_state_dict_is_a_normal_model():
    """A member's state dict loads into its own model (plain transformers under mean pooling), which
    then gives the vectors the array gives for it."""
    encoders = []
    for seed in range(2):
        torch.manual_seed(seed)
        encoders.append(MeanPooled(tiny_model(seed).encoder))
    array = FusedArray(encoders, [MemberSettings(lr=1e-3, total_steps=5, seed=s) for s in range(2)], pad_id=0)
    data = {member: batches(30 + member, steps=3) for member in range(2)}
    train_fused(array, data, steps=3)
    sentences = data[0][0][0]
    vectors = array.encode(sentences)
    for member in range(2):
        model = MeanPooled(tiny_model(9).encoder)
        model.load_state_dict(array.member_state_dict(member))
        model.eval()
        with torch.no_grad():
            alone = torch.cat([model(*pad([s], 0, torch.device("cpu"))) for s in sentences])
        torch.testing.assert_close(vectors[member], alone, **TOLERANCE)


@pytest.mark.parametrize(("fields", "message"), [
    ({"lr": 0.0}, "lr must be greater than 0, but got lr=0.0"),
    ({"total_steps": 0}, "total_steps must be at least 1, but got total_steps=0"),
    ({"warmup_steps": 11}, "warmup_steps must be between 0 and total_steps, but got warmup_steps=11"),
    ({"weight_decay": -0.1}, "weight_decay must be at least 0, but got weight_decay=-0.1"),
    ({"max_grad_norm": 0.0}, "max_grad_norm must be None or greater than 0, but got max_grad_norm=0.0"),
])
def test_member_settings_say_the_rule_and_the_value(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        MemberSettings(**{"lr": 1e-3, "total_steps": 10, **fields})


def test_learning_rate_is_transformers_schedule():
    settings = MemberSettings(lr=3e-3, total_steps=17, warmup_steps=4)
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=settings.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, 4, 17)
    for step in range(20):
        assert settings.lr_at(step) == optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()


def test_array_refuses_what_it_cannot_stack():
    settings = [MemberSettings(lr=1e-3, total_steps=5)] * 2
    with pytest.raises(ValueError, match=re.escape("member 1 differs from member 0 at encoder.embeddings")):
        other = SentenceEncoder(BertModel(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=64),
                                          add_pooling_layer=False), "mean")
        FusedArray([tiny_model(0), other], settings, pad_id=0)

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))

    with pytest.raises(TypeError, match=re.escape("scale_head (Scaled) has parameters a fused array cannot stack")):
        models = [tiny_model(0), tiny_model(1)]
        for model in models:
            model.scale_head = Scaled()
        FusedArray(models, settings, pad_id=0)
    with pytest.raises(ValueError, match=re.escape("a fused array needs one MemberSettings per model, but got 2 "
                                                   "models and 1 settings")):
        FusedArray([tiny_model(0), tiny_model(1)], settings[:1], pad_id=0)
