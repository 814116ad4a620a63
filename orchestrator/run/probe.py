"""`orchestrator probe` in this process: a model's every layer pooled and scored in one pass (or a suite),
its architecture, pooling and layers checked first as a study's are."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from trainables.errors import UserInputError

if TYPE_CHECKING:
    import pandas as pd


def probe(model: str, *, task: str = "stsb", language: str | None = None, split: str = "test",
          pooling: str = "mean", layers: Sequence[int] | None = None, data_dir: str | None = None,
          max_seq_length: int = 128, precision: str = "auto", device: str = "auto", suite: str | None = None,
          max_eval_samples: int | None = None, postprocess: str = "none", postprocess_dim: int | None = None,
          max_train_samples: int | None = None, prompt: str = "", include_prompt: bool = True,
          pooling_layers: str | Sequence[int] = "last", append_eos: bool = False,
          bidirectional: bool = False, pool_special_tokens: bool = True) -> pd.DataFrame:
    """Zero-shot layer profile of an encoder, as `orchestrator probe`: every layer (or `layers`) pooled
    and scored in one forward pass per batch; one row per layer with its scores (Spearman x100) and
    parameter count. `suite="sts"` scores STS12-16, STS-B and SICK-R (test) and their average instead.
    `postprocess` (whiten, abtt, zscore): each layer's vectors mapped by a transform fitted on the task's
    train sentences (at most `max_train_samples` pairs) before the cosine. `prompt`: text put before every
    sentence (E5's 'query: ', an instruction), as a study's `prompt:`; `include_prompt=False` pools
    without its tokens; `append_eos` ends every input with the tokenizer's EOS token (a decoder's recipe);
    `bidirectional` makes a causal decoder attend both ways (LLM2Vec's first step); `pool_special_tokens=False`
    pools without the special tokens (BOS, [CLS], [SEP], EOS).
    `pooling_layers` (first_last, top2, all, or a list ending at the one layer scored):
    each layer's vector from several layers' token states averaged (trainables.models.pooling_layers)."""
    import pandas as pd

    from trainables.contract import parse_config
    from trainables.evaluation.probe import probe_layers, probe_suite
    from trainables.evaluation.sts_suite import suite_tasks
    from trainables.kinds.probe import ProbeConfig

    if split not in ("dev", "test"):
        raise UserInputError("--split", split, "use dev or test")
    if suite is not None:
        suite_tasks(suite)
        if postprocess != "none":
            raise UserInputError("--postprocess", postprocess, "a suite is scored on test splits alone, with no "
                                                               "train split to fit it on: probe one task")
    cfg = parse_config(ProbeConfig, dict(
        model=model, task=task, language=language, layers=list(layers) if layers is not None else None,
        pooling=pooling, splits=[split], max_seq_length=max_seq_length, precision=precision, device=device,
        data_dir=data_dir, max_eval_samples=max_eval_samples, max_train_samples=max_train_samples,
        postprocess=postprocess, postprocess_dim=postprocess_dim, prompt=prompt, include_prompt=include_prompt,
        append_eos=append_eos, bidirectional=bidirectional, pool_special_tokens=pool_special_tokens,
        pooling_layers=pooling_layers if isinstance(pooling_layers, str) else list(pooling_layers)))
    from trainables.kinds.base import check_pooling_layers, check_postprocess

    def option(key: str) -> str:
        return f"--{key.replace('_', '-')}"

    check_postprocess(cfg, option)
    from trainables.kinds.base import TOKEN_POOLINGS

    if not pool_special_tokens and pooling in TOKEN_POOLINGS:
        raise UserInputError("--skip-special", True, f"--pooling {pooling} reads one token, not an average over the "
                                                     "tokens: use --pooling mean, max or mean_sqrt_len")
    if layers is None and not isinstance(pooling_layers, str):
        layers = [max(pooling_layers)] if pooling_layers else []  # a list is one cut: the layer it ends at
        cfg = cfg.model_copy(update={"layers": layers})
    check_pooling_layers(cfg, option, sorted(set(layers)) if layers is not None else [])
    check_probed_model(model, pooling, layers, bidirectional)
    if append_eos:
        from trainables.models.files import refuse_append_eos

        refuse_append_eos(model, "--append-eos")
    try:
        if suite is not None:
            return pd.DataFrame(probe_suite(cfg, suite))
        return pd.DataFrame([{k.removeprefix(f"{split}_"): v for k, v in row.items()} for row in probe_layers(cfg)])
    except UserInputError as exc:  # a prompt whose tokens fill --max-seq-length: named as the option
        if exc.key != "prompt":
            raise
        raise UserInputError("--prompt", exc.value, exc.fix.replace("max_seq_length", "--max-seq-length")) from None


def check_probed_model(model: str, pooling: str, layers: Sequence[int] | None, bidirectional: bool = False) -> None:
    """The probe's model checked as a study's is, before any data is read: its architecture in the layer
    table, the pooling one it can take (attending both ways, a decoder takes `cls`), its layers its entry's
    (cached once per model files)."""
    from trainables.models.architectures import as_asked, refuse_pooling, require_architecture
    from trainables.models.files import model_config, model_depth
    from trainables.models.layer_check import check_model_layers

    require_architecture(model, "--model")
    refuse_pooling(as_asked(model_config(model), bidirectional, "--bidirectional"), pooling, "--pooling")
    depth = model_depth(model)  # a layer the model lacks is the probe's own one line, after this
    check_model_layers(model, [k for k in layers if 0 <= k <= depth] if layers is not None else None)
