"""`resources.fuse`: how many of a cell's replicates train together as one fused array (one stacked model in one
process; trainables.training.fused, issue 56), and why. Each member stays a trial everywhere a user looks.

- `off`, or 1: every trial alone.
- a number K: each cell's replicates in arrays of up to K; a cell whose trials the kind cannot fuse (its
  `fuse_refusal`) is refused at `validate`, naming why, with the fix.
- `auto` (the default): on CPUs each trial alone (an array computes the same arithmetic; on the 2-core machine it
  measured slower than its trials side by side, docs/concepts/fused-arrays.md); with a fraction of a GPU per trial
  each trial alone (the trials already share the GPU as processes); with a GPU or more per trial, arrays of up to
  AUTO_MEMBERS in the cells the kind can fuse, the rest alone. Each such array starts with a probe on the GPU it
  got (trainables.kinds.finetune.array.probe_width): a few steps of one member alone and of K fused, K halved
  while the device's memory does not hold them; it fuses when K fused train at least 1.2x the pairs/s of the K one
  after another, else each member trains alone in the array's process. The gain is each member's
  `fuse_probe_gain` metric. An array that still runs out of device memory later trains its members one after
  another. The probe does not choose separate processes or Ray's GPU fraction: those are placed before any trial
  runs (give `resources.gpu: 0.25` for four trials to a GPU as processes).

Tuning trials fuse too when every tuned parameter is one of the kind's `fused_scalars` (finetune: lr,
weight_decay, warmup_ratio, max_grad_norm): an array's K suggestions are asked from the cell's sampler one after
another (TPE with `constant_liar`, Optuna's rule for asks while trials run), and the cell's pruner decides for
each member as for a trial alone (orchestrator.run.tune_adapters.CellScheduler); otherwise they run alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainables.errors import Problems, UserInputError

if TYPE_CHECKING:
    from orchestrator.study.config import StudyConfig
    from trainables.contract import TrialConfig
    from trainables.kinds import TrainableKind

AUTO_MEMBERS = 8  # 8 fused MiniLM trials: 5.8-8.2x one trial on an H100 and an H200 (docs/benchmarks/speed.md)
CPU_REASON = ("the trials run on CPUs, where 4 fused trials ran 0.62x as fast as the same 4 as separate processes "
              "(docs/concepts/fused-arrays.md)")


@dataclass(frozen=True)
class Fusion:
    """A cell's replicates: `members` per array (1: each trial alone), and why; `tuning`: its tuning trials too."""

    members: int
    why: str
    tuning: bool = False

    def line(self) -> str:
        if self.members == 1:
            return f"each trial alone ({self.why})"
        which = "replicates and tuning trials" if self.tuning else "replicates"
        return f"{which} in fused arrays of up to {self.members} ({self.why})"


def fusions(study: StudyConfig, kind: TrainableKind, parsed: list[TrialConfig], seeds: int,
            tuned: dict[str, Any] | None = None) -> tuple[Fusion, ...]:
    """Each cell's Fusion; a number that a cell's trials cannot take is refused, one line per reason."""
    asked = study.resources.fuse
    if asked == "off" or asked == 1:
        return tuple(Fusion(1, f"resources.fuse: {asked}") for _ in parsed)
    refusals = [kind.fuse_refusal(cfg) for cfg in parsed]
    scalars = set(getattr(kind, "fused_scalars", ()))
    others = sorted(set(tuned or {}) - scalars)
    tunes = study.tune is not None and not others
    alone = f"; tuning trials alone: they tune {', '.join(others)}, not only optimizer scalars" if others else ""
    if asked == "auto":
        if study.resources.gpu == 0:
            return tuple(Fusion(1, f"auto: {CPU_REASON}") for _ in parsed)
        if study.resources.gpu < 1:
            return tuple(Fusion(1, f"auto: each trial holds {study.resources.gpu:g} of a GPU, so trials already share "
                                   "one as processes (give resources.gpu: 1 to fuse them instead)") for _ in parsed)
        size = max(seeds, study.tune.trials if study.tune is not None and tunes else 0)
        if size < 2:
            return tuple(Fusion(1, "auto: one trial per cell and phase") for _ in parsed)
        return tuple(Fusion(1, f"auto: {why}") if why else
                     Fusion(min(AUTO_MEMBERS, size), f"auto: the trials run on a GPU; each array first measures "
                                                     f"its members fused against one alone and fuses only as many "
                                                     f"as pay and fit{alone}", tunes)
                     for why in refusals)
    found = Problems()
    for why in dict.fromkeys(r for r in refusals if r):
        found.add(UserInputError("resources.fuse", asked, f"{why}, so these trials cannot train as one array: use "
                                                          "resources.fuse: off, or auto (which fuses the cells "
                                                          "that can)"))
    found.raise_any()
    return tuple(Fusion(int(asked), f"resources.fuse: {asked}{alone}", tunes) for _ in parsed)


def summary(found: tuple[Fusion, ...], cell_keys: list[str]) -> str:
    """One line for the launch: the replicates' arrays, per distinct choice (with the cells when they differ)."""
    choices = list(dict.fromkeys(found))
    if len(choices) == 1:
        return choices[0].line()
    return "; ".join(f"{', '.join(k for k, f in zip(cell_keys, found, strict=True) if f == choice)}: {choice.line()}"
                     for choice in choices)
