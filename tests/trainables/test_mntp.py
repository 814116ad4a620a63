"""`pretrain: mntp`: LLM2Vec's masked next-token prediction as the `dapt` stage of a decoder made to attend both
ways. Its loss is checked against one computed here by hand (the causal LM under a padding-only mask, each masked
token read from the position before it), then the stage is run, cached and started from, and what cannot be is
one line at validate."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.testing.fixtures import WORDS
from trainables.contract import collect
from trainables.errors import UserInputError
from trainables.kinds import get_kind
from trainables.kinds.finetune import FinetuneConfig
from trainables.models.architectures import is_causal
from trainables.models.encoder import load_encoder, load_tokenizer
from trainables.models.files import model_config
from trainables.stages.fields import check_pretrain
from trainables.stages.pretrain import BLANK, MNTPObjective, adapt, with_mask_token

runner = CliRunner()


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny models: one torch thread (conftest's `one_torch_thread`)."""


def save_tiny_llama(folder, blank: bool = True) -> str:
    """A random Llama (2 blocks of 32) for causal LM, with a word-level tokenizer over the synthetic data's words
    that adds BOS, as Llama's does; `blank`: its vocabulary holds `_`, as Llama's and Mistral's do."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "<unk>", *WORDS, *([BLANK] if blank else [])]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64,
                                 pad_token_id=0, bos_token_id=1, eos_token_id=2)).save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<unk>").save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama-lm"))


PAIRS = [("red", "car"), ("blue", "river"), ("green", "tree"), ("small", "child"), ("large", "house"),
         ("man", "sings"), ("woman", "reads"), ("dog", "runs"), ("cat", "sits")]


def write_corpus(path) -> str:
    """Sentences of three word pairs that always go together: a masked word is its partner's, before or after it."""
    import random

    rng = random.Random(0)
    path.write_text("".join(" ".join(w for pair in rng.sample(PAIRS, 3) for w in pair) + "\n" for _ in range(400)))
    return str(path)


@pytest.fixture()
def config(tiny_llama, synthetic_data_dir, tmp_path):
    return {"model": tiny_llama, "task": "stsb", "epochs": 1, "lr": 1e-3, "batch_size": 16, "pooling": "mean",
            "max_train_samples": 64, "max_eval_samples": 32, "data_dir": str(synthetic_data_dir), "device": "cpu",
            "bidirectional": True, "pretrain": "mntp", "pretrain_corpus": write_corpus(tmp_path / "pairs.txt"),
            "pretrain_steps": 150,
            "pretrain_lr": 3e-3, "pretrain_batch_size": 16, "pretrain_max_seq_length": 16,
            "pretrain_mlm_probability": 0.2, "cache_dir": str(tmp_path / "stages")}


def test_the_loss_is_each_masked_token_read_from_the_position_before_it_with_the_whole_sentence_in_view(
        config, tiny_llama):
    from transformers import LlamaForCausalLM

    objective = MNTPObjective(FinetuneConfig(**config)).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 4 + len(WORDS), (3, 9), generator=generator)
    ids[:, 0] = 1  # BOS
    mask = torch.ones_like(ids)
    mask[2, 6:] = 0  # a shorter sentence, padded
    ids = ids.masked_fill(mask == 0, 0)
    labels = torch.full_like(ids, -100)
    for row, position in ((0, 3), (0, 7), (1, 1), (1, 8), (2, 5)):  # masked tokens, each with its original id
        labels[row, position] = ids[row, position]
        ids[row, position] = 4 + len(WORDS)  # `_`, the mask
    with torch.no_grad():
        ours = objective({"input_ids": ids, "attention_mask": mask, "labels": labels})
    # by hand: the same weights as a plain causal LM under a mask that hides only the padding
    causal = LlamaForCausalLM.from_pretrained(tiny_llama).eval()
    keys = mask.bool()[:, None, None, :].expand(-1, 1, ids.shape[1], -1)
    padding_only = torch.zeros(keys.shape).masked_fill(~keys, torch.finfo(torch.float32).min)
    with torch.no_grad():
        logits = causal(input_ids=ids, attention_mask=padding_only).logits
        plain = causal(input_ids=ids, attention_mask=mask).logits  # causal: another model
    rows, positions = (labels != -100).nonzero(as_tuple=True)
    reference = torch.nn.functional.cross_entropy(logits[rows, positions - 1], labels[rows, positions])
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=0)
    unshifted = torch.nn.functional.cross_entropy(logits[rows, positions], labels[rows, positions])
    causal_loss = torch.nn.functional.cross_entropy(plain[rows, positions - 1], labels[rows, positions])
    assert abs(float(ours - unshifted)) > 1e-3 and abs(float(ours - causal_loss)) > 1e-3


def test_the_mask_is_llm2vecs_blank_where_the_vocabulary_has_it_else_eos(tiny_llama, tmp_path):
    assert with_mask_token(load_tokenizer(tiny_llama), "mntp").mask_token == BLANK
    without = save_tiny_llama(tmp_path / "no-blank", blank=False)
    tokenizer = with_mask_token(load_tokenizer(without), "mntp")
    assert tokenizer.mask_token == "</s>" and tokenizer.mask_token_id == 2
    assert with_mask_token(load_tokenizer(without), "mlm").mask_token is None  # the others keep theirs


def test_the_stage_learns_is_cached_and_a_trial_starts_from_it(config, tiny_llama):
    cfg = FinetuneConfig(**config)
    folder, record, built = adapt(cfg, "mean")
    assert built and record["corpus_sentences"] > 200  # distinct ones
    print(f"mntp loss {record['first_loss']:.3f} -> {record['last_loss']:.3f}")
    assert record["first_loss"] > 3.0 and record["last_loss"] < 1.5, record  # ln 32 = 3.47: a guess; then partners
    adapted = load_encoder(str(folder), bidirectional=True)
    original = load_encoder(tiny_llama, bidirectional=True)
    name = "layers.0.self_attn.q_proj.weight"
    assert not torch.equal(adapted.state_dict()[name], original.state_dict()[name])  # the stage changed it
    assert type(adapted).__name__ == "LlamaModel"  # the base model, its LM head left behind
    assert is_causal(model_config(str(folder)))  # its config the model's own: the trial turns it both ways
    assert load_tokenizer(str(folder)).mask_token is None  # its tokenizer too: the blank was the collator's
    final = get_kind("finetune").run(config, collect([]))
    assert final["dapt_cache_hit"] == 1 and final["dapt_stage_dir"] == str(folder)


def test_what_mntp_cannot_train_is_one_line(config, tiny_bert):
    key_of = lambda key: f"train.{key}"  # noqa: E731
    with pytest.raises(UserInputError, match="train.pretrain: 'mntp' is not valid; masked next-token prediction is "
                                             "for a decoder .*: use mlm"):
        check_pretrain(FinetuneConfig(**{**config, "model": tiny_bert, "bidirectional": False}), key_of)
    with pytest.raises(UserInputError, match="attend both ways \\(LLM2Vec\\): set bidirectional: true"):
        check_pretrain(FinetuneConfig(**{**config, "bidirectional": False}), key_of)
    cross = get_kind("cross_encoder").Config(model=config["model"], pretrain="mntp")
    with pytest.raises(UserInputError, match="this kind has no bidirectional setting"):
        check_pretrain(cross, key_of)


def test_validate_says_it_in_one_line_exit_2(config, tmp_path):
    study = {"name": "mntp", "trainable": "finetune", "task": "stsb", "model": config["model"],
             "data_dir": config["data_dir"], "train": {"pretrain": "mntp", "epochs": 1}}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "train.pretrain: 'mntp' is not valid" in result.output and "set bidirectional: true" in result.output
    study["train"]["bidirectional"] = True
    path.write_text(yaml.safe_dump(study))
    assert runner.invoke(app, ["validate", str(path)]).exit_code == 0


def test_llm2vec_whole_recipe_mntp_then_simcse_starts_contrastive_from_the_same_cached_stage(config):
    """LLM2Vec's three steps: attend both ways, masked next-token prediction, then unsupervised SimCSE (the
    `contrastive` kind with `pretrain: mntp`); its stage is the one a finetune of the same settings uses."""
    stage = {k: config[k] for k in config if k.startswith("pretrain") or k in ("cache_dir", "bidirectional")}
    simcse = {"model": config["model"], "task": "stsb", "corpus": "task", "steps": 4, "eval_every": 2,
              "batch_size": 16, "pooling": "mean", "max_train_samples": 64, "max_eval_samples": 32,
              "data_dir": config["data_dir"], "device": "cpu", **stage, "pretrain_steps": 20}
    first = get_kind("contrastive").run(simcse, collect([]))
    assert first["dapt_cache_hit"] == 0 and math.isfinite(first["test_spearman"])
    again = get_kind("finetune").run({**config, "pretrain_steps": 20}, collect([]))
    assert again["dapt_cache_hit"] == 1 and again["dapt_stage_dir"] == first["dapt_stage_dir"]
    without = get_kind("contrastive").run({**simcse, "pretrain": None}, collect([]))
    assert "dapt_stage_dir" not in without and without["test_spearman"] != pytest.approx(first["test_spearman"])
    key_of = lambda key: f"train.{key}"  # noqa: E731
    with pytest.raises(UserInputError, match="contrastive is that training already: adapt the model first with "
                                             "mlm, rtd or mntp"):
        get_kind("contrastive").check_names(get_kind("contrastive").Config(**{**simcse, "pretrain": "simcse"}),
                                            key_of)
