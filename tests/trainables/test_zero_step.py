"""A fine-tuning trial before its first step scores dev as the probe scores the same layer with the same pooling,
family by family: the cut, the pooling and the scoring are the same code paths' numbers at the trial level too."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel

from orchestrator.testing.fixtures import WORDS
from tests.trainables.test_architectures import FAMILIES
from trainables.contract import parse_config
from trainables.evaluation.probe import probe_layers
from trainables.kinds import get_kind
from trainables.kinds.finetune.learner import FinetuneLearner
from trainables.kinds.probe import ProbeConfig
from trainables.models.architectures import is_causal

# one of each way a family is cut or read: post-norm encoders, shared blocks, relative positions, pre-norm
# encoders, local attention, decoders with and without sliding windows, a bidirectional decoder
CHOSEN = ("bert", "albert", "deberta-v2", "megatron-bert", "xlm-roberta-xl", "modernbert", "gpt2", "llama", "qwen3",
          "gemma3_text", "embeddinggemma")


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny models: one torch thread (conftest's `one_torch_thread`)."""


def save_family(family: str, folder) -> str:
    """The family's tiny random model with a word-level tokenizer over the synthetic data's words."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "<unk>", *WORDS]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A </s>",
                                                             special_tokens=[("<s>", 1), ("</s>", 2)])
    torch.manual_seed(0)
    AutoModel.from_config(FAMILIES[family]()).save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<unk>").save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("family", CHOSEN)
def test_a_trial_before_its_first_step_scores_dev_as_the_probe_does(family, synthetic_data_dir, tmp_path):
    assert len(WORDS) + 4 <= 100  # the tiny configs' vocabulary
    model = save_family(family, tmp_path / family)
    finetune = get_kind("finetune")
    scores = []
    for layer in (1, 3):
        pooling = "last_token" if is_causal(FAMILIES[family]()) else "mean"
        cfg = finetune.parse({"model": model, "data_dir": str(synthetic_data_dir), "layer": layer, "pooling": pooling,
                              "max_train_samples": 16, "max_eval_samples": 40, "precision": "fp32", "device": "cpu",
                              "eval_precision": "fp32"})
        learner = FinetuneLearner(cfg, torch.device("cpu"), torch.float32)
        trial, _ = learner.evaluate("dev")
        probed = probe_layers(parse_config(ProbeConfig, {
            "model": model, "data_dir": str(synthetic_data_dir), "layers": [layer], "pooling": pooling,
            "splits": ["dev"], "max_eval_samples": 40, "precision": "fp32", "device": "cpu"}))[0]
        assert trial["dev_spearman"] == pytest.approx(probed["dev_spearman"], abs=1e-6), (family, layer)
        assert trial["dev_pearson"] == pytest.approx(probed["dev_pearson"], abs=1e-6), (family, layer)
        scores.append(trial["dev_spearman"])
    assert abs(scores[0] - scores[1]) > 1e-4  # the two cuts differ: an equality above is not one number twice
