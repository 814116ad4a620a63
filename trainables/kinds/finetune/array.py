"""`finetune` trials of one cell trained as one fused array (trainables.training.fused; issue 56).

Each member is a whole `finetune` trial: its own learner (data, model, optimizer, evaluator) is built as the
trial alone builds it, and between rounds it holds the member's weights, AdamW moments and schedule. A round
stacks the members' models into one `FusedArray`, starts each member's slice from its learner's optimizer,
trains every member on the batches, dropout masks (a generator of the seed its trial's round draws from),
learning rate and clipping its trial alone would take, then writes each member's weights and optimizer back
into its learner. The rest of the round is the trial's own (`trainables.training.loop.end_round`): dev, the
best-dev weights, a checkpoint in the trial's own format, and after the last round test once. So a member's
checkpoint resumes it alone or in another array, and a member run alone gives its numbers back: to fp32
rounding without dropout or with its batch in one chunk, as on a GPU (a trial on a CPU may cut a batch into
chunks, and then draws other masks; docs/concepts/fused-arrays.md).

A member whose loss is not finite leaves the array at that step, as its trial would end (diverged), and
the others go on untouched. Members start from different rounds (a resumed array) in turn: those behind
catch up first. An architecture or loss the array cannot stack (a module with parameters of its own beside
Linear, LayerNorm and Embedding; a loss with a head) trains its members one after another in this process,
as separate trials would, and says so in the log. So does an array that runs out of device memory: the round it
ran out in starts again with each member alone (their learners still hold the round's start), and so do the rest.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from trainables.errors import TrainingDivergedError
from trainables.runtime import prepare, release_memory, seed_everything
from trainables.training.bi_encoder import check_finite, epoch_batches
from trainables.training.fused import FusedArray, MemberSettings
from trainables.training.loop import (
    LoopState,
    check_round,
    end_round,
    load_weights,
    restore,
    seed_round,
    train,
)

MemberReport = Callable[[str, dict, "str | None"], None]  # (member, metrics, checkpoint folder or None)


def flush(report: MemberReport) -> set[str]:
    """A round's reports are all made: a report that gathers them (the Ray trial's) sends them now, and says which
    members the study stopped since (its pruner: they leave the array, as a trial alone would end)."""
    send = getattr(report, "flush", None)
    return set(send() or ()) if send is not None else set()


class Left(Exception):
    """A member trained alone was stopped by the study's pruner after its report."""


@dataclass
class Member:
    """One trial of the array: its label, config, learner, loop state and best-dev weights."""

    label: str
    cfg: object
    learner: object
    state: LoopState = field(default_factory=LoopState)
    best: dict | None = None
    error: str | None = None  # why it left the array (diverged)
    left: bool = False  # stopped by the study (pruned)


def run_array(kind, configs: Sequence[dict], labels: Sequence[str], report: MemberReport,
              checkpoint_dirs: Sequence[str | None], probe: bool = False) -> None:
    """Train the trials `configs` (one cell's, differing in seed and optimizer scalars) as one array;
    `report(label, metrics, folder)` is called once per member and round as its trial alone reports, and
    once with `{"diverged": 1, "error": ...}` (no folder) for a member whose loss stopped being a number.
    `probe` (`resources.fuse: auto`): first measure how many members to fuse (`probe_width`)."""
    cfgs = [kind.parse(config) for config in configs]
    device, dtype = prepare(cfgs[0].device, cfgs[0].precision, cfgs[0].num_threads)
    members = []
    for label, cfg, folder in zip(labels, cfgs, checkpoint_dirs, strict=True):
        seed_everything(cfg.seed)  # what the trial alone builds its model from
        learner = kind.build(cfg, device, dtype)
        member = Member(label, cfg, learner)
        if folder:
            member.learner, member.state, member.best = restore(kind, cfg, learner, folder, device, dtype)
        members.append(member)
    rounds = kind.num_reports(cfgs[0])
    reason = array_refusal(members)
    if reason is not None:
        logging.getLogger("trainables").warning("the array's %d members train one after another: %s",
                                                len(members), reason)
        for member in members:  # each trial builds its own again in the loop: one at a time in memory
            member.learner = None
        release_memory()
        for member, config, folder in zip(members, configs, checkpoint_dirs, strict=True):
            serial(kind, member, config, folder, report)
        return
    width = len(members)
    if probe:
        measured = probe_width(members)
        width = measured.width
        logging.getLogger("trainables").warning("fuse auto: %s", measured.why)
        for member in members:
            member.learner.info["fuse_probe_gain"] = measured.gain
    fusing = width > 1
    while True:
        waiting = [m for m in members if m.error is None and not m.left and m.state.round < rounds]
        if not waiting:
            return
        behind = min(m.state.round for m in waiting)
        now = [m for m in waiting if m.state.round == behind]
        alone: list[Member] = []
        for start in range(0, len(now), width):  # arrays of `width` members, one after another
            group = now[start: start + width]
            if fusing and len(group) > 1:
                fusing = fused_round(kind, group, behind + 1, dtype, report)  # False: out of memory, from here on
                if fusing:
                    continue
            alone += group  # a group of one, or no array any more
        for member in (m for m in alone if m.error is None):  # alone: its round as its trial's, reported as it ends
            serial_round(kind, member, behind + 1, report)
            member.left = member.label in flush(report)
        stopped = flush(report)
        for member in members:
            member.left = member.left or member.label in stopped


def serial(kind, member: Member, config: dict, folder: str | None, report: MemberReport) -> None:
    """A member trained as its trial alone (an array that cannot stack): the one loop, its reports labelled."""
    def each(metrics: dict, checkpoint_dir: str | None = None) -> None:
        report(member.label, metrics, checkpoint_dir)
        if member.label in flush(report):
            raise Left

    try:
        train(kind, kind.parse(config), each, folder)
    except TrainingDivergedError as exc:
        report(member.label, {"diverged": 1, "error": str(exc)}, None)
        flush(report)
    except Left:
        member.left = True


def array_refusal(members: Sequence[Member]) -> str | None:
    """Why these members cannot train stacked (None: they can): a loss with parameters of its own, or members
    whose rounds differ in length."""
    first = members[0].learner
    if any(True for _ in first.loss_fn.parameters()):
        return f"loss {members[0].cfg.loss} has parameters of its own (a head), which the array does not stack"
    if len({len(m.learner.lengths) for m in members}) > 1 or len({m.cfg.batch_size for m in members}) > 1:
        return "the members' epochs differ in length (train data or batch size)"
    return None


PROBE_STEPS = 3  # timed steps of each side, after one untimed step
PROBE_GAIN = 1.2  # an array fuses when K members fused train at least this many times K trials one after another
MEMORY_SHARE = 0.9  # of the device's memory a probed array's peak may take (the rest: evaluation, fragmentation)


@dataclass(frozen=True)
class Probe:
    """What `probe_width` measured: `width` members per array (1: one after another), one member's step alone
    (`alone_s`), the array of `tried` members' step (`fused_s`; None: it could not train), and why."""

    width: int
    alone_s: float
    fused_s: float | None
    tried: int
    why: str

    @property
    def gain(self) -> float:
        """Pairs/s of `tried` members fused over the same members trained one after another (0: not fused)."""
        return self.tried * self.alone_s / self.fused_s if self.fused_s else 0.0


def probe_width(members: Sequence[Member], measure: Callable | None = None) -> Probe:
    """`resources.fuse: auto`'s probe, on the device the array got: one member's first-round steps alone, then
    the first K members' fused (K halved while the device runs out of memory or its peak passes MEMORY_SHARE),
    each PROBE_STEPS timed steps after one. Fused when K fused train at least PROBE_GAIN times the pairs/s of the K
    one after another, else each member alone. Nothing of the probe is kept: it trains copies (alone) and an
    array it drops, and each round reseeds every stream a member draws from. `measure(members, k)`: seconds a step
    and peak memory share (tests; None: `time_steps`)."""
    measure = measure or time_steps
    alone_s, _ = measure(members, 1)
    tried = len(members)
    while tried >= 2:
        try:
            fused_s, share = measure(members, tried)
        except torch.cuda.OutOfMemoryError:
            fused_s, share = None, math.inf
        except TypeError as exc:  # an architecture the array cannot stack: fused_round says so too
            return Probe(1, alone_s, None, tried, f"each member alone: {exc}")
        finally:
            release_memory()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        if fused_s is not None and share <= MEMORY_SHARE:
            break
        tried = max(2, tried // 2) if tried > 2 else 1
    else:
        return Probe(1, alone_s, None, 2, "each member alone: 2 fused members did not fit the device's memory")
    gain = tried * alone_s / fused_s  # what Probe.gain says of the result
    if gain >= PROBE_GAIN:
        return Probe(tried, alone_s, fused_s, tried, f"{tried} members fused trained {gain:.2f}x the pairs/s "
                                                     f"of the {tried} one after another (a step {fused_s:.3f} s "
                                                     f"against {alone_s:.3f} s alone): arrays of {tried}")
    return Probe(1, alone_s, fused_s, tried, f"{tried} members fused trained {gain:.2f}x the pairs/s of the "
                                             f"{tried} one after another, under {PROBE_GAIN}x: each member alone")


def time_steps(members: Sequence[Member], k: int) -> tuple[float, float]:
    """Seconds of one training step of the first `k` members (k = 1: the first member's step as its trial takes
    it, on a copy of its model; else their fused array's), the mean of PROBE_STEPS after one untimed step on their
    first round's batches; and the peak device memory as a share of the device's (0 on a CPU)."""
    import copy

    from trainables.runtime import linear_schedule
    from trainables.training.bi_encoder import build_optimizer, train_step

    chosen = list(members[:k])
    device = next(chosen[0].learner.model.parameters()).device
    orders = [epoch_batches(m.learner.lengths, m.cfg.batch_size, m.cfg.seed * 1_000 + 1, m.cfg.group_by_length)
              for m in chosen]
    steps = min(PROBE_STEPS + 1, *(len(order) for order in orders))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    if k == 1:
        member, learner = chosen[0], chosen[0].learner
        model = copy.deepcopy(learner.model)
        optimizer = build_optimizer(list(model.named_parameters()), member.cfg.lr, member.cfg.weight_decay)
        scheduler = linear_schedule(optimizer, 0, steps)

        def step(i: int) -> None:
            lists, targets = member_batch(member, orders[0][i])
            train_step(model, learner.train_loss, optimizer, scheduler, lists, targets, learner.tokens.pad_id,
                       device, learner.dtype, member.cfg.max_grad_norm, learner.cache, learner.packed).item()
    else:
        array = FusedArray([m.learner.model for m in chosen], [member_settings(m) for m in chosen],
                           chosen[0].learner.tokens.pad_id, [m.label for m in chosen], loss=chosen[0].learner.loss_fn,
                           dtype=chosen[0].learner.dtype)

        def step(i: int) -> None:
            array.step([member_batch(m, order[i]) for m, order in zip(chosen, orders, strict=True)]).tolist()

    step(0)
    started = time.perf_counter()
    for i in range(1, steps):
        step(i)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - started) / max(1, steps - 1)
    share = (torch.cuda.max_memory_allocated(device) / torch.cuda.get_device_properties(device).total_memory
             if device.type == "cuda" else 0.0)
    return seconds, share


def fused_round(kind, members: list[Member], round_: int, dtype: torch.dtype, report: MemberReport) -> bool:
    """One round of `members` as one array, then each member's end of round as its trial's. False when the array
    cannot train (an architecture it cannot stack, or the device ran out of memory): nothing of the round is kept
    but the members that diverged, and the caller trains the others alone (their learners hold the round's start)."""
    started = time.perf_counter()
    try:
        array = FusedArray([m.learner.model for m in members], [member_settings(m) for m in members],
                           members[0].learner.tokens.pad_id, [m.label for m in members],
                           loss=members[0].learner.loss_fn, dtype=dtype)
    except TypeError as exc:  # an architecture the array cannot stack
        logging.getLogger("trainables").warning("the array's members train one after another: %s", exc)
        return False
    try:
        active, totals, steps = train_array(array, members, round_, report)
    except torch.cuda.OutOfMemoryError:  # torch.OutOfMemoryError from torch 2.5; this name since 1.13
        del array
        release_memory()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        logging.getLogger("trainables").warning("an array of %d members ran out of device memory in %s %d: its "
                                                "members train one after another from here", len(members),
                                                kind.round_name, round_)
        return False
    seconds = time.perf_counter() - started
    for member in active:
        write_back(array, member)
        trained = {"train_loss": totals[member.label] / max(1, steps),
                   "train_samples_per_second": len(member.learner.lengths) / seconds}
        member.learner.info["fused_members"] = len(members)
        member.learner.info["padding_free"] = 0.0  # an array pads its members' batches
        member.best = end_round(kind, member.cfg, member.learner, member.state, member.best, round_, trained,
                                seconds, lambda metrics, checkpoint_dir=None, m=member: report(m.label, metrics,
                                                                                               checkpoint_dir))[1]
    return True


def train_array(array: FusedArray, members: list[Member], round_: int, report: MemberReport
                ) -> tuple[list[Member], dict[str, float], int]:
    """The round's steps: (the members still in the array, each one's summed loss, the steps taken)."""
    for member in members:
        moments, steps = optimizer_moments(member.learner)
        array.load_member(member.label, moments, steps)
        seed_round(member.cfg.seed, round_)  # as its trial: Python's and NumPy's streams too
        array.reseed(member.label, member.cfg.seed * 1_000 + round_)  # the stream its dropout draws from
    orders = {m.label: epoch_batches(m.learner.lengths, m.cfg.batch_size, m.cfg.seed * 1_000 + round_,
                                     m.cfg.group_by_length) for m in members}
    totals = dict.fromkeys(orders, 0.0)
    active = list(members)
    steps = len(next(iter(orders.values())))
    for step in range(steps):
        losses = array.step([member_batch(m, orders[m.label][step]) for m in active])
        for member, loss in zip(list(active), losses.tolist(), strict=True):
            try:
                totals[member.label] += check_finite(loss, f"epoch {round_}, step {step + 1} (lr={member.cfg.lr})",
                                                     "lower the learning rate or use precision fp32")
            except TrainingDivergedError as exc:  # it leaves the array as its trial would end
                member.error = str(exc)
                active.remove(member)
                if active:
                    array.drop(member.label)
                report(member.label, {"diverged": 1, "error": member.error}, None)
        if not active:
            break
    return active, totals, steps


def serial_round(kind, member: Member, round_: int, report: MemberReport) -> None:
    """One round of a member alone, as the loop runs it."""
    started = time.perf_counter()
    seed_round(member.cfg.seed, round_)
    try:
        trained = check_round(kind, member.learner.train_round(round_), round_)
    except TrainingDivergedError as exc:
        member.error = str(exc)
        report(member.label, {"diverged": 1, "error": member.error}, None)
        return
    member.learner.info["fused_members"] = 1  # this round alone, padded or packed as its trial
    member.learner.info["padding_free"] = float(member.learner.packed)
    member.best = end_round(kind, member.cfg, member.learner, member.state, member.best, round_, trained,
                            time.perf_counter() - started,
                            lambda metrics, checkpoint_dir=None: report(member.label, metrics, checkpoint_dir))[1]


def member_settings(member: Member) -> MemberSettings:
    """The member's optimizer scalars, as its learner's optimizer and schedule were built from them."""
    cfg, learner = member.cfg, member.learner
    steps_per_epoch = math.ceil(len(learner.lengths) / cfg.batch_size)
    total_steps = steps_per_epoch * cfg.epochs
    return MemberSettings(lr=cfg.lr, total_steps=total_steps, warmup_steps=round(cfg.warmup_ratio * total_steps),
                          weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm, seed=cfg.seed)


def member_batch(member: Member, batch: list[int]) -> tuple[list[list[int]], torch.Tensor]:
    """One step's sentences (first sides, then second sides) and gold scores, as the trial's train_round."""
    learner = member.learner
    first, second = learner.columns[0], learner.columns[1]
    return ([first[learner.first[i]] for i in batch] + [second[learner.second[i]] for i in batch],
            learner.targets[batch])


def optimizer_moments(learner) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], int]:
    """The learner's AdamW moments by parameter name, and the steps its schedule has taken."""
    state = learner.optimizer.state
    moments = {name: (state[p]["exp_avg"], state[p]["exp_avg_sq"]) for name, p in learner.model.named_parameters()
               if p in state and "exp_avg" in state[p]}
    return moments, int(learner.scheduler.last_epoch)


@torch.no_grad()
def write_back(array: FusedArray, member: Member) -> None:
    """The member's weights, AdamW moments and schedule into its learner: what its trial alone would hold."""
    learner = member.learner
    load_weights(learner, {f"model.{k}": v for k, v in array.member_state_dict(member.label).items()})
    steps = array.steps[array.members.index(member.label)]
    moments = array.member_moments(member.label)
    for name, param in learner.model.named_parameters():
        if name in moments and steps:
            exp_avg, exp_avg_sq = moments[name]
            learner.optimizer.state[param] = {"step": torch.tensor(float(steps), dtype=torch.float32,
                                                                   device=param.device),
                                              "exp_avg": exp_avg.to(param.device), "exp_avg_sq":
                                                  exp_avg_sq.to(param.device)}
    scheduler = learner.scheduler
    scheduler.last_epoch = steps
    lrs = [base * factor(steps) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, lr in zip(learner.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = lrs
