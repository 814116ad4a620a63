from __future__ import annotations

import json
import threading

import pytest
import torch

from trainables import dapt
from trainables.contract import collect
from trainables.dapt import DaptConfig, adapt, dapt_corpus, dapt_schedule
from trainables.errors import UserInputError


@pytest.fixture()
def config(tiny_bert, data_dir, tmp_path):
    return {"model": tiny_bert, "task": "stsb", "layer": 2, "epochs": 1, "lr": 1e-3, "batch_size": 16,
            "max_train_samples": 64, "max_eval_samples": 32, "data_dir": str(data_dir), "device": "cpu",
            "dapt_steps": 30, "dapt_lr": 1e-3, "dapt_batch_size": 16, "dapt_max_seq_length": 32,
            "cache_dir": str(tmp_path / "stages")}


def test_warmup_and_decay_count_optimizer_steps():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = dapt_schedule(optimizer, steps=10, warmup_ratio=0.2)
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([0.0, 0.5, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125])


@pytest.mark.slow
def test_mlm_loss_falls_on_the_wikipedia_slice(config):
    folder, stage, built = adapt(DaptConfig(**{**config, "dapt_steps": 80, "dapt_lr": 5e-3}))
    assert built and stage["corpus_sentences"] == 11_548  # the slice's distinct lines
    assert len(stage["loss_curve"]) == 80
    assert stage["last_loss"] < stage["first_loss"] - 1.5  # measured: 10.19 -> 7.94
    assert (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()
    assert json.loads((folder / "stage.json").read_text())["params"]["dapt_steps"] == 80


def test_gradient_accumulation_multiplies_micro_batches_not_steps(config):
    _, stage, _ = adapt(DaptConfig(**{**config, "dapt_steps": 4, "dapt_grad_accum": 3}))
    assert len(stage["loss_curve"]) == 4


def test_a_second_trial_hits_the_cache_and_concurrent_trials_build_once(config, monkeypatch):
    builds = []
    real = dapt.pretrain

    def counting(*args, **kwargs):
        builds.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(dapt, "pretrain", counting)
    cfg = DaptConfig(**{**config, "dapt_steps": 5})
    results = []
    threads = [threading.Thread(target=lambda: results.append(adapt(cfg))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1 and sorted(r[2] for r in results) == [False, False, True]
    assert len({str(r[0]) for r in results}) == 1
    reports = []
    dapt.run({**config, "dapt_steps": 5, "layer": 1, "seed": 3}, collect(reports))
    assert len(builds) == 1 and reports[-1]["dapt_cache_hit"] == 1  # another layer, the same stage
    dapt.run({**config, "dapt_steps": 6}, collect(reports))
    assert len(builds) == 2 and reports[-1]["dapt_cache_hit"] == 0  # a different stage config


def test_corpora_and_the_transductive_guard(config, tmp_path):
    assert len(dapt_corpus(DaptConfig(**{**config, "dapt_corpus": "task"}))) > 10_000
    text = tmp_path / "domain.txt"
    text.write_text("first line\n\nsecond line\nfirst line\n")
    assert dapt_corpus(DaptConfig(**{**config, "dapt_corpus": str(text)})) == ["first line", "second line"]
    with pytest.raises(UserInputError, match="dapt_corpus: 'task\\+test' is not valid; test sentences train only"):
        dapt_corpus(DaptConfig(**{**config, "dapt_corpus": "task+test"}))
    with_test = dapt_corpus(DaptConfig(**{**config, "dapt_corpus": "task+test", "transductive": True}))
    assert len(with_test) > len(dapt_corpus(DaptConfig(**{**config, "dapt_corpus": "task+dev"})))
    with pytest.raises(UserInputError, match="dapt_corpus: 'wiki' is not valid"):
        dapt_corpus(DaptConfig(**{**config, "dapt_corpus": "wiki"}))


@pytest.mark.slow
def test_minilm_short_mlm_stage_then_finetune(data_dir, minilm_path, tmp_path):
    reports = []
    final = dapt.run({"model": "sentence-transformers/all-MiniLM-L6-v2", "task": "stsb", "layer": 3, "epochs": 1,
                      "max_train_samples": 200, "max_eval_samples": 200, "data_dir": str(data_dir),
                      "dapt_corpus": "task", "dapt_steps": 10, "dapt_batch_size": 16, "dapt_max_seq_length": 64,
                      "cache_dir": str(tmp_path)}, collect(reports))
    assert final["dapt_cache_hit"] == 0 and 0 < final["test_spearman"] <= 100
    assert final["dapt_last_loss"] == final["dapt_last_loss"]  # finite


def save_tiny_electra(folder, tokenizer_source):
    from transformers import AutoTokenizer, ElectraConfig, ElectraForPreTraining

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    torch.manual_seed(0)
    config = ElectraConfig(vocab_size=tokenizer.vocab_size, embedding_size=32, hidden_size=32, num_hidden_layers=3,
                           num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    ElectraForPreTraining(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.mark.slow
def test_replaced_token_detection_trains_an_electra_discriminator(config, tmp_path, tiny_bert):
    electra = save_tiny_electra(tmp_path / "electra", tiny_bert)
    cfg = DaptConfig(**{**config, "model": electra, "dapt_objective": "rtd", "dapt_steps": 60, "dapt_lr": 2e-3})
    folder, stage, built = adapt(cfg)
    assert built and stage["last_loss"] < stage["first_loss"] - 5  # the discriminator learns fast what is kept
    from transformers import AutoModel

    assert type(AutoModel.from_pretrained(folder)).__name__ == "ElectraModel"
    final = dapt.run({**config, "model": electra, "dapt_objective": "rtd", "dapt_steps": 60, "dapt_lr": 2e-3},
                     collect([]))
    assert final["dapt_cache_hit"] == 1 and final["test_spearman"] == final["test_spearman"]


def test_rtd_needs_an_electra_discriminator(config):
    with pytest.raises(UserInputError, match="dapt_objective: 'rtd' is not valid; replaced-token detection needs"):
        adapt(DaptConfig(**{**config, "dapt_objective": "rtd"}))
