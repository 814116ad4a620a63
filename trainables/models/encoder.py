"""Encoders: loading by hub id or folder, truncation surgery, pooling heads, parameter counts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel

from trainables.errors import UserInputError, one_of
from trainables.models.architectures import (
    architecture_of,
    attend_both_ways,
    cut_stack,
    layer_states,
    native_bidirectional,
    refuse_bidirectional,
    refuse_pooling,
    stack,
    stack_depth,
    states_of,
    token_states,
)
from trainables.models.files import (  # noqa: F401 (re-exported)
    encoder_depth,
    refuse_custom_code,
    refuse_unsafe_weights,
    resolve_model_path,
)
from trainables.models.packaged import install_hint
from trainables.names import DROPOUT_MASKS
from trainables.poolings import build_pooling, pooling


def load_config(name: str) -> PretrainedConfig:
    try:
        return AutoConfig.from_pretrained(resolve_model_path(name), trust_remote_code=False)
    except OSError as exc:
        raise UserInputError("model", name, install_hint(name)) from exc


def load_tokenizer(name: str, append_eos: bool = False):
    """The model's tokenizer; `append_eos`: ending every input with its EOS token (`with_eos`)."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(name), trust_remote_code=False)
    return with_eos(tokenizer, name) if append_eos else tokenizer


def with_eos(tokenizer, name: str = "the model"):
    """`tokenizer`, its inputs ending with its EOS token, as decoder embedding recipes ask (E5-Mistral's
    tokenizer with `add_eos_token`, LLM2Vec; `last_token` then pools the EOS's state): a step added to its
    post-processor, so truncation keeps room for the EOS, every kind and the probe tokenize alike, and a saved
    model's tokenizer.json does the same in sentence-transformers. A tokenizer whose inputs end with EOS already
    (Qwen3-Embedding's) is returned as it is; one without an EOS token, or without a fast backend, is one line."""
    eos, eos_id, backend = tokenizer.eos_token, tokenizer.eos_token_id, getattr(tokenizer, "_tokenizer", None)
    if eos is None or eos_id is None:
        raise UserInputError("append_eos", True, f"the tokenizer of {name} has no EOS token to append: "
                                                 "leave append_eos false")
    if backend is None:
        raise UserInputError("append_eos", True, f"the tokenizer of {name} is not a fast (tokenizers) one, whose "
                                                 "post-processor appending takes: leave append_eos false")
    if tokenizer("a")["input_ids"][-1:] == [eos_id]:
        return tokenizer
    from tokenizers import processors

    steps = [backend.post_processor] if backend.post_processor is not None else []
    backend.post_processor = processors.Sequence([*steps, processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A $B:1 {eos}:1", special_tokens=[(eos, eos_id)])])
    return tokenizer


def load_encoder(name: str, random_init: bool = False, seed: int = 0,
                 dropout_masks: str = "torch", bidirectional: bool = False) -> PreTrainedModel:
    """The bare encoder (no task head); `random_init` keeps the architecture with fresh weights;
    `dropout_masks`: "fast" draws training's dropout masks with trainables.models.dropout; `bidirectional`:
    a causal decoder attends both ways (`attend_both_ways`; the model's own switch where it has one)."""
    from transformers import AutoModel  # its modeling code costs ~1.5 s: only when an encoder is built

    if dropout_masks not in DROPOUT_MASKS:
        raise one_of("dropout_masks", dropout_masks, DROPOUT_MASKS)
    config = load_config(name)
    native = bidirectional and native_bidirectional(config)
    if bidirectional:
        refuse_bidirectional(config)
    if native:  # built from the switched dict, as a config file saying so is (Gemma 3 then halves its window)
        config = type(config).from_dict({**config.to_dict(), "use_bidirectional_attention": True})
    if random_init:
        torch.manual_seed(seed)
        model = AutoModel.from_config(config)
    else:
        model = AutoModel.from_pretrained(resolve_model_path(name), config=config, trust_remote_code=False)
    if bidirectional and not native:
        attend_both_ways(model)
    model.attends_both_ways = bidirectional  # switched here: sentence-transformers would build it causal again
    return prepare_for_training(model, dropout_masks)


def prepare_for_training(model: PreTrainedModel, dropout_masks: str) -> PreTrainedModel:
    """`dropout_masks: fast` draws training's dropout masks with trainables.dropout; either way
    evaluation's attention runs unfused on a CPU (trainables.models.attention); the word embeddings
    get the row-wise gradient (the same gradient, without a dense zero-fill per chunk)."""
    if dropout_masks not in DROPOUT_MASKS:
        raise one_of("dropout_masks", dropout_masks, DROPOUT_MASKS)
    if dropout_masks == "fast":
        from trainables.models.dropout import use_fast_dropout

        use_fast_dropout(model)
    else:
        from trainables.models.attention import use_inference_attention

        use_inference_attention(model)
    from trainables.models.embedding_grad import use_row_gradients

    use_row_gradients(model)
    return model


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The stack of transformer blocks, where the model's architecture entry says it is
    (trainables.models.architectures; an architecture without one is refused in one line)."""
    return stack(model)


def truncate_encoder(model: PreTrainedModel, num_layers: int, keep_pooler: bool = False) -> PreTrainedModel:
    """Keep the embeddings and the first `num_layers` blocks (and a pre-norm stack's final norm); later
    blocks and the pooler (unless `keep_pooler`: a cross-encoder's pretrained head reads it) are removed
    from the module, so compute and parameters shrink. `num_layers=0` is the embedding output; what layer
    k means per architecture: trainables.models.architectures."""
    depth = stack_depth(model)
    if not 0 <= num_layers <= depth:
        raise UserInputError("layer", num_layers, f"this model has {depth} layers: use 0..{depth}")
    cut_stack(model, num_layers)
    if getattr(model, "pooler", None) is not None and not keep_pooler:
        model.pooler = None
    return model


def last_hidden_state(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Token states of the (truncated) encoder: layer k of the full model when k blocks are left (a
    family whose forward cannot run empty, DeBERTa, gives its embedding output directly)."""
    segments = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
    return token_states(model, input_ids, attention_mask, **segments)


def pair_separator(tokenizer, config: PretrainedConfig) -> int | None:
    """The separator token id after which a pair's second segment starts, for encoders that embed
    segments (BERT, ELECTRA, MiniLM: `type_vocab_size` > 1 and a tokenizer that gives pairs
    segment ids); None for those that do not (RoBERTa, MPNet)."""
    if getattr(config, "type_vocab_size", 1) <= 1 or tokenizer.sep_token_id is None:
        return None
    segments = tokenizer("a", "b").get("token_type_ids")
    return tokenizer.sep_token_id if segments and any(segments) else None


def segment_ids(input_ids: torch.Tensor, attention_mask: torch.Tensor, separator: int) -> torch.Tensor:
    """Segment ids of joined pairs (`[CLS] a [SEP] b [SEP]`), as the tokenizer gives them: 0 up to
    and including the first separator, 1 after it, 0 on padding."""
    is_sep = (input_ids == separator).long()
    return ((is_sep.cumsum(dim=1) - is_sep) > 0).long() * attention_mask.long()


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def used_parameter_count(model: nn.Module) -> int:
    """The model's size as a run reports it (`params`): every parameter but those of submodules its
    forward never reads (`unread_modules()`: the pretrained pooler under a pooling head or a linear
    cross-encoder head, kept with `layer: null` but neither trained nor part of the model)."""
    unread = [part for module in model.modules() if hasattr(module, "unread_modules")
              for part in module.unread_modules()]
    return count_parameters(model) - sum(count_parameters(part) for part in unread)


def truncated_parameter_count(model: PreTrainedModel, num_layers: int) -> int:
    """Parameters of `model` truncated at `num_layers`, without copying it."""
    shared = architecture_of(model).shared_blocks  # ALBERT: a cut runs its one block fewer times
    removed = 0 if shared else sum(count_parameters(block) for block in list(encoder_layers(model))[num_layers:])
    pooler = getattr(model, "pooler", None)
    return count_parameters(model) - removed - (count_parameters(pooler) if pooler is not None else 0)


def pool(hidden: torch.Tensor, mask: torch.Tensor, method: str) -> torch.Tensor:
    """Sentence vectors from token states (batch, seq, dim) and the attention mask (batch, seq), by a
    registered pooling without parameters (a module that has some lives in its SentenceEncoder)."""
    return build_pooling(method, hidden.shape[-1])(hidden, mask)


def without_prompt(mask: torch.Tensor, prompt_tokens: int) -> torch.Tensor:
    """The attention mask that pooling reads when a prompt's `prompt_tokens` leading tokens are left out of
    it (sentence-transformers' Pooling(include_prompt=False), right padding): the encoder still attends to them."""
    if not prompt_tokens:
        return mask
    mask = mask.clone()
    mask[:, :prompt_tokens] = 0
    return mask


def special_ids(tokenizer) -> list[int]:
    """The ids of the tokenizer's special tokens (BOS, [CLS], [SEP], EOS, padding, ...), for
    `pool_special_tokens: false`."""
    return sorted(set(tokenizer.all_special_ids))


def without_special(mask: torch.Tensor, input_ids: torch.Tensor | None, skipped: torch.Tensor | None) -> torch.Tensor:
    """The pooling mask with the positions whose token is one of `skipped` (special token ids) left out
    (`pool_special_tokens: false`); the encoder still attends to them."""
    if skipped is None or input_ids is None:
        return mask
    return mask.masked_fill(torch.isin(input_ids, skipped), 0)


class SentenceEncoder(nn.Module):
    """A (truncated) encoder, a pooling method and an optional dense projection (Linear + tanh, as
    sentence-transformers' Dense module). `prompt_tokens`: the leading tokens of every input that are a
    prompt's and that pooling leaves out (`include_prompt: false`); 0 pools them all. `skipped_ids`: token ids
    pooling leaves out wherever they stand (`pool_special_tokens: false`: the special tokens'); None pools all."""

    def __init__(self, encoder: PreTrainedModel, pooling: str = "mean", projection_dim: int | None = None,
                 prompt_tokens: int = 0, mix: nn.Module | None = None, skipped_ids: list[int] | None = None):
        super().__init__()
        refuse_pooling(encoder.config, pooling)
        hidden = encoder.config.hidden_size
        self.encoder, self.pooling, self.prompt_tokens = encoder, pooling, prompt_tokens
        self.skipped_ids: torch.Tensor | None  # not in the state dict: checkpoints stay as they were
        self.register_buffer("skipped_ids", None if skipped_ids is None else torch.tensor(skipped_ids),
                             persistent=False)
        self.mix = mix  # several layers' token states combined before the pooling (trainables.models.layer_mix)
        self.pool_layer = build_pooling(pooling, hidden)  # no parameters in the built-ins: the weights stay the same
        self.projection = (nn.Sequential(nn.Linear(hidden, projection_dim), nn.Tanh())
                           if projection_dim else None)

    def unread_modules(self) -> list[nn.Module]:
        """The encoder's pooler, when it kept one: sentence vectors pool the last hidden states."""
        pooler = getattr(self.encoder, "pooler", None)
        return [pooler] if isinstance(pooler, nn.Module) else []

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor,
             input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Sentence vectors from the token states, before the projection (`input_ids`: for `skipped_ids`)."""
        mask = without_prompt(attention_mask, self.prompt_tokens)
        return self.pool_layer(hidden, without_special(mask, input_ids, self.skipped_ids))

    def mixed_states(self, output) -> torch.Tensor:
        """The token states it pools, from an encoder output that has `hidden_states` when it mixes layers."""
        return output.last_hidden_state if self.mix is None else self.mix(states_of(self.encoder, output,
                                                                                    self.mix.layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.mix is None:
            hidden = last_hidden_state(self.encoder, input_ids, attention_mask)
        else:
            hidden = self.mix(layer_states(self.encoder, {"input_ids": input_ids, "attention_mask": attention_mask},
                                           self.mix.layers))
        vectors = self.pool(hidden, attention_mask, input_ids)
        return self.projection(vectors) if self.projection is not None else vectors

    def forward_packed(self, plan) -> torch.Tensor:
        """Sentence vectors of a packed row (trainables.models.padding_free.Packed): the encoder runs on the
        sentences' own tokens, then pools them laid out padded, as `forward` pools."""
        from trainables.models.padding_free import run_packed

        if self.mix is not None:
            raise ValueError("a packed row pools one layer's token states (pooling_layers: last)")
        hidden = plan.padded(run_packed(self.encoder, plan))
        vectors = self.pool(hidden, plan.attention_mask(), plan.padded_ids(0))
        return self.projection(vectors) if self.projection is not None else vectors


def build_sentence_encoder(name: str, layer: int | None = None, pooling: str = "mean",
                           projection_dim: int | None = None, random_init: bool = False,
                           seed: int = 0, dropout_masks: str = "torch", prompt_tokens: int = 0,
                           pooling_layers: str | list[int] = "last", bidirectional: bool = False,
                           skipped_ids: list[int] | None = None) -> SentenceEncoder:
    """Load `name`, truncate it to `layer` blocks (None keeps all) and put a pooling head on it, over the
    cut layer's token states or, with `pooling_layers`, several layers' combined (layer_mix)."""
    from trainables.models.layer_mix import build_mix

    encoder = load_encoder(name, random_init=random_init, seed=seed, dropout_masks=dropout_masks,
                           bidirectional=bidirectional)
    if layer is not None:
        truncate_encoder(encoder, layer)
    mix = build_mix(pooling_layers, stack_depth(encoder)) if pooling_layers != "last" else None
    return SentenceEncoder(encoder, pooling, projection_dim, prompt_tokens, mix, skipped_ids)


def save_sentence_transformer(encoder: SentenceEncoder, tokenizer, folder: str | Path, max_seq_length: int,
                              prompt: str = "", postprocess=None) -> Path:
    """`encoder` (truncated, pooled, projected) as a sentence-transformers model folder: a user
    loads it with `SentenceTransformer(folder)` and gets the same vectors the trial scored. A `prompt` is
    saved as the model's `query` and `document` prompt and its default, so `encode` puts it before every
    sentence as the trial did, and the Pooling module leaves it out where the encoder did. A `postprocess`
    map (an Affine) is the last module, a Dense layer with an identity activation."""
    import tempfile

    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Pooling, Transformer

    folder = Path(folder)
    if encoder.mix is not None:
        raise UserInputError("pooling_layers", encoder.mix.layers, "sentence-transformers has no module that "
                                                                   "combines layers, so the model cannot be saved "
                                                                   "in that format: use save: none")
    if encoder.skipped_ids is not None:
        raise UserInputError("pool_special_tokens", False, "sentence-transformers' Pooling pools every token but "
                                                           "a prompt's, so the model cannot be saved in that "
                                                           "format: use save: none")
    if getattr(encoder.encoder, "attends_both_ways", False):
        raise UserInputError("bidirectional", True, "sentence-transformers would build the decoder causal again "
                                                    "when it loads the folder, so the model cannot be saved in that "
                                                    "format: use save: none")
    mode = pooling(encoder.pooling).sentence_transformers
    if mode is None:
        raise UserInputError("pooling", encoder.pooling, "it has no sentence-transformers equivalent, so the model "
                                                         "cannot be saved in that format: use save: none")
    from trainables.models.lora import has_lora, merged

    with tempfile.TemporaryDirectory(prefix="encoder-") as raw:  # LoRA's adapters folded into their layers
        (merged(encoder.encoder) if has_lora(encoder.encoder) else encoder.encoder).save_pretrained(
            raw, safe_serialization=True)
        tokenizer.save_pretrained(raw)
        modules = [Transformer(raw, max_seq_length=max_seq_length),
                   Pooling(encoder.encoder.config.hidden_size, pooling_mode=mode,
                           include_prompt=not encoder.prompt_tokens)]
        if encoder.projection is not None:
            linear = encoder.projection[0]
            modules.append(Dense(linear.in_features, linear.out_features, activation_function=nn.Tanh(),
                                 init_weight=linear.weight.detach().cpu().clone(),
                                 init_bias=linear.bias.detach().cpu().clone()))
        if postprocess is not None:  # y = (x - mean) @ matrix: weight matrixᵀ, bias -mean @ matrix
            linear = postprocess.as_linear()
            modules.append(Dense(linear.in_features, linear.out_features, activation_function=nn.Identity(),
                                 init_weight=linear.weight.detach().clone(), init_bias=linear.bias.detach().clone()))
        prompts = {"prompts": {"query": prompt, "document": prompt}, "default_prompt_name": "query"} if prompt else {}
        SentenceTransformer(modules=modules, device="cpu", **prompts).save(str(folder))
    return folder
