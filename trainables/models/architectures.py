"""What "layer k" is, per architecture: one table entry per transformers `model_type` saying where the
blocks are, which final norm follows them, what k = 0 is and how a cut stack runs. The probe, fine-tuning
and every kind read it (through `cut_stack`, `stack_depth` and `layer_states`), so a layer means the same
everywhere; `trainables.models.layer_check` checks a model against its entry.

Layer k is the model's own output once every block after k is removed:
- post-LN stacks (BERT & co.): `hidden_states[k]`;
- pre-norm stacks (MegatronBERT, XLM-R-XL, RoBERTa-PreLN, ModernBERT, EuroBERT, GPT-2, Llama, Qwen, Gemma):
  the final norm applied to `h_k`, so k = L is the model's own `last_hidden_state`. (transformers 5.24
  ties `hidden_states[-1]` to `last_hidden_state`, so there the last element already has the norm and the
  others have not: scoring `hidden_states[k]` as it comes mixes the two.)

The table is a registry like the poolings: the built-ins below, and a plugin's entries under the
entry-point group `ablation_orchestrator.architectures` (name: the `model_type`, value: `module:ENTRY`,
an `Architecture`). Nothing here imports torch at module level: `validate` reads the table from a
model's `config.json` alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainables.errors import UserInputError
from trainables.registry import Registry, load_target

if TYPE_CHECKING:
    import torch
    from torch import nn

GROUP = "architectures"

HOW_TO_ADD = ("add an entry (trainables.models.architectures.Architecture: where the blocks are, which final "
              "norm follows them) under the entry-point group ablation_orchestrator.architectures, named by "
              "the model_type; see docs/reference/models.md")


@dataclass(frozen=True)
class Architecture:
    """One family's answer to "what is layer k". Paths are attribute paths from the bare model
    (`AutoModel`, what `load_encoder` returns)."""

    blocks: str  # the nn.ModuleList of blocks, "encoder.layer"
    final_norm: str | None = None  # the norm the model applies after its last block; None: post-LN
    layer_zero: str = "the embedding output"  # what k = 0 is (documentation)
    causal: bool = False  # causal attention: its first token sees nothing after it (no `cls`)
    # `module:function(model, k)` for a family whose cut is not "keep the first k blocks" (ALBERT)
    cut: str | None = None
    # `module:function(model, input_ids, attention_mask, **segments)` -> token states, for a family whose
    # forward cannot run with no block left (DeBERTa): k = 0 then comes from here
    embeddings_only: str | None = None
    shared_blocks: bool = False  # one set of blocks repeated config.num_hidden_layers times (ALBERT)
    notes: str = ""

    def __post_init__(self) -> None:
        for field in ("cut", "embeddings_only"):
            value = getattr(self, field)
            if value is not None and ":" not in value:
                raise ValueError(f"{field} must be 'module:function', but got {field}={value!r}")

    @property
    def pre_norm(self) -> bool:
        return self.final_norm is not None

    @property
    def layer_k(self) -> str:
        """What layer k means for this family, in words (the reference table)."""
        if self.final_norm is None:
            return "hidden_states[k] (no norm after the stack)"
        return f"{self.final_norm}(h_k): the final norm on block k's output; k = L is last_hidden_state"


POST_LN = Architecture("encoder.layer")
EMBEDDING_PROJECTION = Architecture("encoder.layer", layer_zero="the embedding output after its projection "
                                                                "to the hidden size (embeddings_project)")
REMBERT = Architecture("encoder.layer", layer_zero="the embedding output after encoder.embedding_hidden_mapping_in")
MOBILEBERT = Architecture("encoder.layer", layer_zero="the embedding output (its 3-gram projection included)")
DEBERTA = Architecture("encoder.layer", embeddings_only="trainables.models.architectures:deberta_embeddings",
                       notes="its layer loop cannot run empty: k = 0 is computed by its embeddings directly")
DISTILBERT = Architecture("transformer.layer")
ROTARY_POST_LN = Architecture("layers", layer_zero="the embedding output (LayerNorm of the token embeddings)",
                              notes="rotary positions: computed by the model, shared by every block")
MEGATRON = Architecture("encoder.layer", final_norm="encoder.ln")
XLMR_XL = Architecture("encoder.layer", final_norm="encoder.LayerNorm")
ROBERTA_PRELN = Architecture("encoder.layer", final_norm="LayerNorm")
ALBERT = Architecture("encoder.albert_layer_groups", cut="trainables.models.architectures:cut_albert",
                      shared_blocks=True,
                      layer_zero="the embedding output after encoder.embedding_hidden_mapping_in",
                      notes="one shared block run num_hidden_layers times: a cut runs it k times (no weights "
                            "removed); num_hidden_groups and inner_group_num must be 1")
MODERNBERT = Architecture("layers", final_norm="final_norm",
                          layer_zero="final_norm of the embedding output (itself normed token embeddings)",
                          notes="alternating global/local attention: layer_types is cut with the blocks")
EUROBERT = Architecture("layers", final_norm="norm")
GPT2 = Architecture("h", final_norm="ln_f", causal=True, layer_zero="ln_f of token + position embeddings")
DECODER = Architecture("layers", final_norm="norm", causal=True,
                       layer_zero="the final norm of the token embeddings (Gemma: scaled by sqrt(hidden))",
                       notes="rotary positions and causal/sliding masks are built by the model from layer_types, "
                             "which is cut with the blocks")

_HERE = "trainables.models.architectures"
BUILTIN = {
    **{name: f"{_HERE}:POST_LN" for name in ("bert", "roberta", "xlm-roberta", "camembert", "mpnet", "ernie",
                                             "data2vec-text")},
    **{name: f"{_HERE}:EMBEDDING_PROJECTION" for name in ("electra", "roformer", "convbert")},
    "rembert": f"{_HERE}:REMBERT",
    "mobilebert": f"{_HERE}:MOBILEBERT",
    "deberta": f"{_HERE}:DEBERTA",
    "deberta-v2": f"{_HERE}:DEBERTA",
    "distilbert": f"{_HERE}:DISTILBERT",
    "nomic_bert": f"{_HERE}:ROTARY_POST_LN",
    "gte": f"{_HERE}:ROTARY_POST_LN",
    "megatron-bert": f"{_HERE}:MEGATRON",
    "xlm-roberta-xl": f"{_HERE}:XLMR_XL",
    "roberta-prelayernorm": f"{_HERE}:ROBERTA_PRELN",
    "albert": f"{_HERE}:ALBERT",
    "modernbert": f"{_HERE}:MODERNBERT",
    "eurobert": f"{_HERE}:EUROBERT",
    "gpt2": f"{_HERE}:GPT2",
    **{name: f"{_HERE}:DECODER" for name in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")},
}
ARCHITECTURES = Registry(GROUP, "architecture", BUILTIN)


class UnknownArchitectureError(UserInputError):
    """A model whose `model_type` has no entry in the table: refused before anything runs."""

    problem = "has an architecture without a layer table entry"


def architecture(model_type: str | None, name: object = None, key: str = "model") -> Architecture:
    """The entry of `model_type`; an unknown one is one line naming it, what is supported and how to add one."""
    if model_type is None or model_type not in ARCHITECTURES:
        shown = name if name is not None else model_type
        raise UnknownArchitectureError(key, shown, f"its model_type {model_type!r} is not one of: "
                                                   f"{ARCHITECTURES.listing()}; {HOW_TO_ADD}")
    return ARCHITECTURES.declared(model_type, key, Architecture, "an Architecture (trainables.models.architectures)")


def _config_value(model: Any, field: str, default: Any = None) -> Any:
    """A field of a model's config, of a config, or of a `config.json` read as a dict (no torch)."""
    config = getattr(model, "config", model)
    return config.get(field, default) if isinstance(config, dict) else getattr(config, field, default)


def architecture_of(model: Any, key: str = "model") -> Architecture:
    """The entry of a model, a config or a `config.json` dict (its `model_type`)."""
    return architecture(_config_value(model, "model_type"), _config_value(model, "_name_or_path") or None, key)


def require_architecture(name: str, key: str = "model") -> Architecture:
    """The entry of the model `name` (hub id or folder), from its `config.json` alone (no torch): what
    `validate` and `probe` call to refuse an unknown architecture in one line."""
    from trainables.models.files import model_type

    return architecture(model_type(name), name, key)


def is_causal(config: Any) -> bool:
    """Whether the model (or config, or `config.json` dict) attends causally: a decoder not switched to
    bidirectional attention, as EmbeddingGemma is with `use_bidirectional_attention` and any decoder is by
    `bidirectional: true` (`attend_both_ways`)."""
    return (architecture_of(config).causal and not _config_value(config, "use_bidirectional_attention", False)
            and _config_value(config, "is_causal", True) is not False)


def native_bidirectional(config: Any) -> bool:
    """Whether the model's config has a switch of its own to bidirectional attention (Gemma 3's and
    EmbeddingGemma's `use_bidirectional_attention`): set before the model is built, it is saved with it."""
    config = getattr(config, "config", config)
    return ("use_bidirectional_attention" in config if isinstance(config, dict)
            else hasattr(config, "use_bidirectional_attention"))


def refuse_bidirectional(config: Any, key: str = "bidirectional") -> None:
    """One line for `bidirectional: true` on a model that attends both ways already (an encoder, or a decoder
    whose config switched it, as EmbeddingGemma's does)."""
    if not is_causal(config):
        why = "an encoder" if not architecture_of(config, key).causal else "its config says so"
        raise UserInputError(key, True, f"{_config_value(config, 'model_type')} attends both ways already "
                                        f"({why}): leave it false")


def as_asked(config: dict, bidirectional: bool, key: str = "bidirectional") -> dict:
    """A `config.json` dict as a study's settings make the model: with `bidirectional`, refused in one line
    where it cannot apply, else marked as attending both ways (so `refuse_pooling` then allows `cls`)."""
    if not bidirectional:
        return config
    refuse_bidirectional(config, key)
    return {**config, "is_causal": False}


def attend_both_ways(model: Any) -> Any:
    """A causal decoder made to attend both ways, as LLM2Vec's first step does: every token sees the whole
    sentence, padding still masked. transformers 5 builds a bidirectional mask for a config whose `is_causal`
    is false (`create_causal_mask` and its sliding-window twin hand over to `create_bidirectional_mask`), and
    SDPA, given no mask (a batch without padding), reads each attention module's own `is_causal`: both are
    turned off. A model with a switch of its own (`native_bidirectional`) is built with it instead."""
    refuse_bidirectional(model)
    model.config.is_causal = False
    for module in model.modules():
        if getattr(module, "is_causal", None) is True:
            module.is_causal = False
    return model


def refuse_pooling(config: Any, pooling_name: str, key: str = "pooling") -> None:
    """One line for a pooling a causal model cannot use (`cls`: its first token sees nothing after it);
    `config` may be the `config.json` dict (`validate`, without torch)."""
    from trainables.poolings import pooling

    if is_causal(config) and not pooling(pooling_name, key).causal:
        raise UserInputError(key, pooling_name, f"{_config_value(config, 'model_type')} attends causally, so its "
                                                "first token sees nothing after it: use last_token or mean")


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _set(obj: Any, path: str, value: Any) -> None:
    owner, _, attribute = path.rpartition(".")
    setattr(_get(obj, owner) if owner else obj, attribute, value)


def stack(model: nn.Module) -> nn.ModuleList:
    """The model's block list, where its entry says it is."""
    arch = architecture_of(model)
    try:
        blocks = _get(model, arch.blocks)
    except AttributeError:
        blocks = None
    from torch import nn

    if not isinstance(blocks, nn.ModuleList):
        raise UserInputError("model", model.config.model_type, f"{type(model).__name__} has no block list at "
                                                               f"{arch.blocks!r} as its layer table entry says; "
                                                               "fix the entry (or load the bare model)")
    return blocks


def final_norm(model: nn.Module) -> nn.Module | None:
    arch = architecture_of(model)
    return None if arch.final_norm is None else _get(model, arch.final_norm)


def stack_depth(model: nn.Module) -> int:
    """Number of layers the model runs now (a cut model: its k)."""
    if architecture_of(model).shared_blocks:
        return int(model.config.num_hidden_layers)
    return len(stack(model))


def set_depth(config: Any, k: int) -> None:
    """The config says `k` layers: `num_hidden_layers` (n_layers, n_layer through attribute maps) and the
    per-layer `layer_types` (sliding/full attention) cut with the blocks."""
    depth = getattr(config, "num_hidden_layers", None)
    types = getattr(config, "layer_types", None)
    if isinstance(types, list | tuple) and len(types) == depth:
        config.layer_types = list(types)[:k]
    config.num_hidden_layers = k


def cut_stack(model: nn.Module, k: int) -> nn.Module:
    """Remove every block after the k-th, in place (the model's own forward then runs the first k blocks,
    its masks, positions and final norm); `k` is checked by the caller (`truncate_encoder`)."""
    arch = architecture_of(model)
    if arch.cut is not None:
        load_target(arch.cut)(model, k)
        return model
    from torch import nn

    _set(model, arch.blocks, nn.ModuleList(list(stack(model))[:k]))
    set_depth(model.config, k)
    return model


@contextmanager
def cut_view(model: nn.Module, k: int) -> Iterator[nn.Module]:
    """The model cut at `k` inside the block, whole again after it (its block list and config restored):
    the layer check runs every k on one model without copying its weights. A family's own `cut` must
    change only the block list and the config for this to hold."""
    arch = architecture_of(model)
    blocks, saved = _get(model, arch.blocks), dict(model.config.__dict__)
    try:
        yield cut_stack(model, k)
    finally:
        _set(model, arch.blocks, blocks)
        model.config.__dict__.clear()
        model.config.__dict__.update(saved)


def cut_albert(model: nn.Module, k: int) -> None:
    """ALBERT runs one shared block `num_hidden_layers` times: a cut runs it k times."""
    config = model.config
    if config.num_hidden_groups != 1 or config.inner_group_num != 1:
        raise UserInputError("model", getattr(config, "_name_or_path", "albert"),
                             f"ALBERT with num_hidden_groups={config.num_hidden_groups} and inner_group_num="
                             f"{config.inner_group_num} cannot be cut by layer (the groups are assigned by depth): "
                             "only 1 and 1 (every released ALBERT) are supported")
    config.num_hidden_layers = k


def deberta_embeddings(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       **segments: torch.Tensor) -> torch.Tensor:
    return model.embeddings(input_ids=input_ids, mask=attention_mask, **segments)


def token_states(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 **segments: torch.Tensor) -> torch.Tensor:
    """The (cut) model's output, token by token: layer k of the full model when k blocks are left."""
    arch = architecture_of(model)
    if arch.embeddings_only is not None and stack_depth(model) == 0:
        return load_target(arch.embeddings_only)(model, input_ids, attention_mask, **segments)
    return model(input_ids=input_ids, attention_mask=attention_mask, **segments).last_hidden_state


def layer_states(model: nn.Module, inputs: dict[str, torch.Tensor], layers: list[int]) -> list[torch.Tensor]:
    """The reference: token states of each layer in `layers` from one forward pass of the (uncut or cut
    deeper) model. Layer k is hidden_states[k], with the family's final norm applied for pre-norm stacks;
    k = the model's depth is its `last_hidden_state` (where transformers already put the norm)."""
    if stack_depth(model) == 0:
        return [token_states(model, **inputs) for _ in layers]
    return states_of(model, model(**inputs, output_hidden_states=True), layers)


def states_of(model: nn.Module, out: Any, layers: Sequence[int]) -> list[torch.Tensor]:
    """Layer k's token states (see `layer_states`) from a forward's output that has `hidden_states`, for a
    caller that needs that output for more (a contrastive step's attentions)."""
    depth = stack_depth(model)
    norm = final_norm(model)
    return [out.last_hidden_state if k == depth else out.hidden_states[k] if norm is None
            else norm(out.hidden_states[k]) for k in layers]


def layer_representation(model: nn.Module, inputs: dict[str, torch.Tensor], k: int) -> torch.Tensor:
    """Token states of layer `k` (batch, tokens, dim) as the table defines it; see `layer_states`."""
    return layer_states(model, inputs, [k])[0]


__all__ = ["ARCHITECTURES", "Architecture", "UnknownArchitectureError", "architecture", "architecture_of",
           "cut_stack", "cut_view", "is_causal", "layer_representation", "layer_states", "refuse_pooling",
           "require_architecture", "stack", "stack_depth", "states_of", "token_states"]
