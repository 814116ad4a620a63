"""LoRA (Hu et al. 2021) through `peft`: low-rank adapters on a cut encoder's linear layers, its own
weights frozen, for models too large to train whole.

The adapters are put into the encoder after the cut (`peft.inject_adapter_in_model`, peft's own layers,
initialisation and scaling alpha / rank), so the blocks a trial drops carry none. `lora_B` starts at
zero: before the first step the model is the pretrained one, and a zero-step trial scores what the
probe scores. Only the adapters train in the encoder; a projection and a loss's head (which are not
the encoder's) train as before. `save:` writes the merged model (each adapter folded into its layer by
peft's `merge`), a plain transformers folder that sentence-transformers loads without peft.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from trainables.errors import UserInputError

if TYPE_CHECKING:
    from torch import nn

# peft's default targets per model type (its TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: the query
# and value projections for BERT, Llama, Qwen, Gemma, ...); for a model type peft does not list (MPNet,
# DistilBERT, ModernBERT, MegatronBERT, ...), the first of these its linear layers have: the same choice
# under the names other families give those projections, or a fused query-key-value projection
QUERY_VALUE = (["query", "value"], ["q_proj", "v_proj"], ["q", "v"], ["q_lin", "v_lin"], ["Wqkv"], ["qkv_proj"],
               ["c_attn"])
ALL_LINEAR = "all-linear"


def default_targets(model_type: str, names: list[str]) -> list[str] | None:
    """The layers LoRA adapts when `lora_targets` is not given: peft's default for the model type, else
    the query and value projections by the first of QUERY_VALUE's names that `names` (the model's linear
    layers) has; None when neither applies."""
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TARGETS

    if model_type in PEFT_TARGETS:
        return list(PEFT_TARGETS[model_type])
    return next((list(found) for found in QUERY_VALUE if set(found) <= set(names)), None)


def linear_names(encoder: nn.Module) -> list[str]:
    """The distinct last names of the encoder's linear layers (what `lora_targets` may name)."""
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    return sorted({name.rsplit(".", 1)[-1] for name, module in encoder.named_modules()
                   if isinstance(module, nn.Linear | Conv1D) and name})


def chosen_targets(model_type: str, names: list[str], targets: list[str] | str | None, key: str) -> list[str] | str:
    """The layers LoRA adapts: `targets` when every name is one of the model's linear layers (`names`), or
    `all-linear`; the model type's default when None; one line naming `key` otherwise."""
    chosen = targets if targets is not None else default_targets(model_type, names)
    if chosen is None:
        raise UserInputError(key, None, f"peft has no default LoRA layers for model type {model_type!r}: name "
                                        f"them (its linear layers: {', '.join(names)}), or {ALL_LINEAR}")
    if isinstance(chosen, str):
        if chosen != ALL_LINEAR:
            raise UserInputError(key, chosen, f"give a list of linear layer names ({', '.join(names)}) or "
                                              f"{ALL_LINEAR}")
        return chosen
    unknown = [name for name in chosen if name not in names]
    if unknown or not chosen:
        raise UserInputError(key, list(chosen), f"{model_type} has no linear layer named "
                                                f"{', '.join(map(repr, unknown)) or 'in an empty list'}; its linear "
                                                f"layers: {', '.join(names)} (or {ALL_LINEAR})")
    return list(chosen)


def check_targets(model: str, targets: list[str] | str | None, key: str) -> None:
    """Before any trial: the study's `lora_targets` (or the default) name linear layers the model has (its
    modules built from its config on the meta device: no weights are read)."""
    import torch
    from transformers import AutoConfig, AutoModel

    from trainables.models.files import resolve_model_path
    from trainables.models.packaged import install_hint

    try:  # as trainables.models.encoder.load_config (which imports this module to save a model)
        config = AutoConfig.from_pretrained(resolve_model_path(model), trust_remote_code=False)
    except OSError as exc:
        raise UserInputError("model", model, install_hint(model)) from exc
    with torch.device("meta"):
        skeleton = AutoModel.from_config(config)
    chosen_targets(config.model_type, linear_names(skeleton), targets, key)


def add_lora(encoder: nn.Module, rank: int, alpha: float | None = None, dropout: float = 0.0,
             targets: list[str] | str | None = None, key: str = "lora_targets") -> int:
    """Put LoRA adapters of `rank` into `encoder` (in place) on `targets` (layer names, `all-linear`, or
    None: the model type's default), scaled by alpha / rank (alpha None: the rank, a scale of 1); freeze
    the encoder's own weights. Returns the number of parameters that now train in it."""
    from peft import LoraConfig, inject_adapter_in_model

    chosen = chosen_targets(encoder.config.model_type, linear_names(encoder), targets, key)
    config = LoraConfig(r=rank, lora_alpha=alpha if alpha is not None else rank, lora_dropout=dropout,
                        target_modules=chosen, bias="none")
    inject_adapter_in_model(config, encoder)
    for name, parameter in encoder.named_parameters():  # peft freezes what is not an adapter; said here too
        parameter.requires_grad_("lora_" in name)
    return sum(p.numel() for p in encoder.parameters() if p.requires_grad)


def has_lora(module: nn.Module) -> bool:
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # without peft no model has its adapters
        return False

    return any(isinstance(m, LoraLayer) for m in module.modules())


def adapter_parameter_count(module: nn.Module) -> int:
    """The parameters of the LoRA adapters in `module` (none in the merged model a trial saves)."""
    return sum(p.numel() for name, p in module.named_parameters() if "lora_" in name)


def merged(encoder: nn.Module) -> nn.Module:
    """A copy of `encoder` with every adapter folded into its layer by peft's `merge` and the layer put
    back in its place: the model's own architecture and parameter names, the adapted numbers."""
    from peft.tuners.lora import LoraLayer

    folded = copy.deepcopy(encoder)
    for name, module in list(folded.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge()
            parent_name, _, child = name.rpartition(".")
            setattr(folded.get_submodule(parent_name) if parent_name else folded, child, module.get_base_layer())
    for parameter in folded.parameters():
        parameter.requires_grad_(True)
    return folded
