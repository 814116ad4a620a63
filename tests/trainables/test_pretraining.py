"""Domain-adaptive pretraining as a stage of `finetune` (`pretrain:`): MLM, ELECTRA's RTD, caching,
stage seeds."""

from __future__ import annotations

import json
import math
import threading

import pytest
import torch

from trainables.contract import collect
from trainables.data.tasks import corpus_sentences
from trainables.errors import UserInputError
from trainables.kinds import get_kind
from trainables.kinds.finetune import FinetuneConfig
from trainables.stages import pretrain as pretraining
from trainables.stages.pretrain import RTDObjective, adapt, schedule

finetune = get_kind("finetune")


@pytest.fixture()
def config(tiny_bert, data_dir, tmp_path):
    return {"model": tiny_bert, "task": "stsb", "layer": 2, "epochs": 1, "lr": 1e-3, "batch_size": 16,
            "max_train_samples": 64, "max_eval_samples": 32, "data_dir": str(data_dir), "device": "cpu",
            "pretrain": "mlm", "pretrain_steps": 30, "pretrain_lr": 1e-3, "pretrain_batch_size": 16,
            "pretrain_max_seq_length": 32, "cache_dir": str(tmp_path / "stages")}


def stage(config, **changes) -> FinetuneConfig:
    return FinetuneConfig(**{**config, **changes})


def test_warmup_and_decay_count_optimizer_steps():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = schedule(optimizer, steps=10, warmup_ratio=0.2)
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([0.0, 0.5, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125])


@pytest.mark.slow
def test_mlm_loss_falls_on_the_wikipedia_slice(config, data_dir):
    folder, record, built = adapt(stage(config, pretrain_steps=80, pretrain_lr=5e-3))
    lines = set()
    for path in sorted((data_dir / "unlabeled-en").glob("wiki1m_for_simcse*.txt")):
        lines |= {line.strip() for line in path.read_text().splitlines() if line.strip()}
    assert built and record["corpus_sentences"] == len(lines)  # every distinct line of the slice, once
    assert len(record["loss_curve"]) == 80
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    assert record["first_loss"] > math.log(vocab) - 1.0  # a fresh MLM head starts near a uniform guess
    assert record["last_loss"] < record["first_loss"] - 1.0
    assert (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()
    assert json.loads((folder / "stage.json").read_text())["params"]["pretrain_steps"] == 80


def test_gradient_accumulation_multiplies_micro_batches_not_steps(config):
    _, record, _ = adapt(stage(config, pretrain_steps=4, pretrain_grad_accum=3))
    assert len(record["loss_curve"]) == 4


def test_a_second_trial_hits_the_cache_and_concurrent_trials_build_once(config, monkeypatch):
    builds = []
    real = pretraining.pretrain

    def counting(*args, **kwargs):
        builds.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pretraining, "pretrain", counting)
    cfg = stage(config, pretrain_steps=5)
    results = []
    threads = [threading.Thread(target=lambda: results.append(adapt(cfg))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1 and sorted(r[2] for r in results) == [False, False, True]
    assert len({str(r[0]) for r in results}) == 1
    reports = []
    finetune.run({**config, "pretrain_steps": 5, "layer": 1}, collect(reports))
    assert len(builds) == 1 and reports[-1]["dapt_cache_hit"] == 1  # another layer, the same stage
    finetune.run({**config, "pretrain_steps": 6}, collect(reports))
    assert len(builds) == 2 and reports[-1]["dapt_cache_hit"] == 0  # a different stage config


def test_each_replicate_seed_builds_its_own_stage_unless_shared(config, tmp_path):
    per_seed = [], []
    for seed, into in zip((0, 1), per_seed, strict=True):
        finetune.run({**config, "pretrain_steps": 4, "seed": seed}, collect(into))
    keys = [r[-1]["dapt_cache_key"] for r in per_seed]
    assert keys[0] != keys[1] and [r[-1]["stage_seed"] for r in per_seed] == [0, 1]
    stages = sorted((tmp_path / "stages").glob("dapt-*/model.safetensors"))
    from safetensors.torch import load_file

    weights = [load_file(p) for p in stages]
    name = next(k for k in weights[0] if "word_embeddings" in k)
    assert not torch.equal(weights[0][name], weights[1][name])  # another seed, another adaptation
    shared = [], []
    for seed, into in zip((0, 1), shared, strict=True):
        finetune.run({**config, "pretrain_steps": 4, "seed": seed, "stage_seed": "shared", "pretrain_seed": 5},
                     collect(into))
    assert shared[0][-1]["dapt_cache_key"] == shared[1][-1]["dapt_cache_key"]
    assert [r[-1]["stage_seed"] for r in shared] == [5, 5] and shared[1][-1]["dapt_cache_hit"] == 1


def test_zero_steps_is_plain_finetuning(config):
    with_zero, without = [], []
    finetune.run({**config, "pretrain_steps": 0}, collect(with_zero))
    finetune.run({k: v for k, v in config.items() if not k.startswith("pretrain")}, collect(without))
    assert with_zero[-1]["test_spearman"] == without[-1]["test_spearman"] and "dapt_cache_key" not in with_zero[-1]


def test_corpora_and_the_transductive_guard(config, tmp_path):
    def corpus(source, transductive=False):
        return corpus_sentences(source, "stsb", None, config["data_dir"], transductive, "pretrain_corpus")

    assert len(corpus("task")) > 10_000
    text = tmp_path / "domain.txt"
    text.write_text("first line\n\nsecond line\nfirst line\n")
    assert corpus(str(text)) == ["first line", "second line"]
    with pytest.raises(UserInputError, match="pretrain_corpus: 'task\\+test' is not valid; test sentences train only"):
        corpus("task+test")
    assert len(corpus("task+test", transductive=True)) > len(corpus("task+dev"))
    with pytest.raises(UserInputError, match="pretrain_corpus: 'wiki' is not valid"):
        corpus("wiki")


@pytest.mark.slow
def test_minilm_short_mlm_stage_then_finetune(data_dir, minilm_path, tmp_path):
    from safetensors.torch import load_file

    reports = []
    final = finetune.run({"model": "sentence-transformers/all-MiniLM-L6-v2", "task": "stsb", "layer": 3,
                          "epochs": 1, "max_train_samples": 200, "max_eval_samples": 200, "data_dir": str(data_dir),
                          "pretrain": "mlm", "pretrain_corpus": "task", "pretrain_steps": 24,
                          "pretrain_batch_size": 16, "pretrain_max_seq_length": 64, "cache_dir": str(tmp_path)},
                         collect(reports))
    assert final["dapt_cache_hit"] == 0 and final["dapt_last_loss"] < final["dapt_first_loss"]
    adapted = load_file(f"{final['dapt_stage_dir']}/model.safetensors")
    original = load_file(minilm_path / "model.safetensors")
    name = "embeddings.word_embeddings.weight"
    assert not torch.equal(adapted[name], original[name])  # the stage changed the encoder it hands on


def save_tiny_electra(folder, tokenizer_source):
    from transformers import AutoTokenizer, ElectraConfig, ElectraForPreTraining

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    torch.manual_seed(0)
    config = ElectraConfig(vocab_size=tokenizer.vocab_size, embedding_size=32, hidden_size=32, num_hidden_layers=3,
                           num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    ElectraForPreTraining(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_the_rtd_generator_reads_and_writes_through_the_shared_embedding_table(config, tmp_path, tiny_bert):
    electra = save_tiny_electra(tmp_path / "electra", tiny_bert)
    objective = RTDObjective(stage(config, model=electra, pretrain="rtd"))
    table = objective.discriminator.electra.embeddings.word_embeddings.weight
    assert objective.generator.electra.embeddings.word_embeddings.weight is table
    assert objective.generator.generator_lm_head.weight is table  # ELECTRA ties the generator's output layer
    batch = {"input_ids": torch.randint(1000, 2000, (4, 12)), "attention_mask": torch.ones(4, 12, dtype=torch.long)}
    labels = torch.full((4, 12), -100)
    labels[:, 3] = batch["input_ids"][:, 3]
    objective({**batch, "labels": labels}).backward()
    assert table.grad is not None and table.grad[batch["input_ids"][:, 3]].abs().sum() > 0


@pytest.mark.slow
def test_replaced_token_detection_trains_an_electra_discriminator(config, tmp_path, tiny_bert):
    electra = save_tiny_electra(tmp_path / "electra", tiny_bert)
    cfg = stage(config, model=electra, pretrain="rtd", pretrain_steps=60, pretrain_lr=2e-3)
    folder, record, built = adapt(cfg)
    assert built and record["last_loss"] < record["first_loss"] - 5  # the discriminator learns fast what is kept
    from transformers import AutoModel

    assert type(AutoModel.from_pretrained(folder)).__name__ == "ElectraModel"
    final = finetune.run({**config, "model": electra, "pretrain": "rtd", "pretrain_steps": 60, "pretrain_lr": 2e-3},
                         collect([]))
    assert final["dapt_cache_hit"] == 1 and final["dapt_stage_dir"] == str(folder)


def test_rtd_needs_an_electra_discriminator(config):
    with pytest.raises(UserInputError, match="pretrain: 'rtd' is not valid; replaced-token detection needs"):
        adapt(stage(config, pretrain="rtd"))
