"""Names that configs and search spaces check against, importable without torch: small closed sets of
modes. Poolings and objectives are not here: their registries (`trainables.poolings`,
`trainables.objectives`) hold the built-in ones and those installed plugins add."""

from __future__ import annotations

PRECISIONS = ("auto", "fp32", "bf16")  # training: bf16 autocast where fast, or forced
EVAL_PRECISIONS = ("fp32", "same")  # dev/test scoring: fp32, or as training
DROPOUT_MASKS = ("fast", "torch")  # trainables.models.dropout's masks, or torch's bernoulli_
PADDINGS = ("auto", "padded", "packed")  # a training batch padded per chunk, or padding-free (models.padding_free)
SELECTS = ("accuracy", "f1")  # what pair classification selects on (STS tasks select on Spearman)
CROSS_LOSSES = ("bce", "mse")  # a cross-encoder's objective on its logit
# a cross-encoder's head: the model's own sequence-classification head with its pretrained pooler (dense + tanh,
# dropout, a new linear classifier: sentence-transformers' CrossEncoder), or a new linear layer on the pooled state
CROSS_HEADS = ("pretrained", "linear")
METHODS = ("simcse", "micse")  # unsupervised contrastive objectives
ATTENTION_LOSSES = ("mi", "correlation")  # miCSE's attention alignment term


# the model families whose encoder runs a packed row as it runs a padded batch (trainables.models.padding_free's
# check passes on each; tests/trainables/test_padding_free.py keeps this list true): `padding: packed` is refused
# at `validate` for any other `model_type`, and `auto` packs only these
PACKED_FAMILIES = frozenset({
    "albert", "bert", "camembert", "data2vec-text", "distilbert", "electra", "ernie", "eurobert", "gemma",
    "gemma3_text", "gpt2", "gte", "llama", "mistral", "modernbert", "nomic_bert", "qwen2", "qwen3", "roberta",
    "roberta-prelayernorm", "xlm-roberta", "xlm-roberta-xl"})


def primary_metric(task_kind: str, select: str | None = None) -> tuple[str, bool]:
    """(metric, greater is better) that selects rounds, trials and layers on a task of this kind:
    the name its evaluator reports (`trainables.evaluation.evaluators`), without building one."""
    return ("spearman", True) if task_kind == "sts" else (select or "accuracy", True)
