"""The one conversion module: parameter types to Optuna distributions."""

from __future__ import annotations

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from search_spaces.params import Choice, Fixed, IntRange, LogUniform, Param, Uniform


def to_optuna(param: Param) -> BaseDistribution:
    if isinstance(param, Choice):
        return CategoricalDistribution(list(param.values))
    if isinstance(param, Fixed):
        return CategoricalDistribution([param.value])
    if isinstance(param, Uniform):
        return FloatDistribution(param.low, param.high)
    if isinstance(param, LogUniform):
        return FloatDistribution(param.low, param.high, log=True)
    if isinstance(param, IntRange):
        return IntDistribution(param.low, param.high)
    raise TypeError(f"{type(param).__name__} is an ablation axis, not a tuned distribution")


def optuna_space(params: dict[str, Param]) -> dict[str, BaseDistribution]:
    return {name: to_optuna(param) for name, param in params.items()}
