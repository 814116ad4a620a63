"""Prompts (`prompt:`, `include_prompt:`): the text put before every sentence a bi-encoder embeds, as
sentence-transformers 6.2 puts it (`encode(prompt=...)`, `Pooling(include_prompt=...)`): the same token ids,
truncation counting the prompt, the same vectors for every pooling, an encoder and a decoder; kept apart in
the token cache; an ablation axis checked before launch and recorded on every run."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.testing.fixtures import WORDS
from trainables.contract import collect
from trainables.errors import UserInputError
from trainables.evaluation.evaluators import Embedder
from trainables.kinds import get_kind
from trainables.models.batching import TokenCache, tokenize
from trainables.models.encoder import build_sentence_encoder, load_tokenizer, pool

SENTENCES = ["a cat plays in the park", "the dog runs", "child",
             "man eats a red ball near the large green house by the river and tree"]  # the last one is cut
MAX_LENGTH = 12
INSTRUCTION = "Instruct: find similar ones\nQuery: "  # Qwen3-Embedding's form
ST_MODES = {"mean": "mean", "cls": "cls", "max": "max", "mean_sqrt_len": "mean_sqrt_len_tokens",
            "last_token": "lasttoken"}


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny models: one torch thread (conftest's `one_torch_thread`)."""


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    """A random Llama (3 blocks of 32) with a word-level tokenizer that adds BOS and no EOS, as Llama's does."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaModel, PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "<unk>", *WORDS, "query", "instruct", ":", "find", "similar", "ones", "a",
             "the", "in", "near", "by", "and"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    LlamaModel(LlamaConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                           num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64, pad_token_id=0,
                           bos_token_id=1, eos_token_id=2)).save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<unk>").save_pretrained(folder)
    return str(folder)


def ours(model: str, pooling: str, prompt: str, include_prompt: bool) -> torch.Tensor:
    """The vectors every kind's evaluation computes: the token cache, the sentence encoder, the embedder."""
    tokens = TokenCache(load_tokenizer(model), MAX_LENGTH, prompt)
    encoder = build_sentence_encoder(model, None, pooling, prompt_tokens=0 if include_prompt else tokens.prompt_length)
    return Embedder(encoder.eval(), tokens, torch.device("cpu"))(SENTENCES)


def sentence_transformer(model: str, pooling: str, include_prompt: bool):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    return SentenceTransformer(modules=[Transformer(model, max_seq_length=MAX_LENGTH),
                                        Pooling(32, pooling_mode=ST_MODES[pooling], include_prompt=include_prompt)],
                               device="cpu")


@pytest.mark.parametrize("include_prompt", [True, False])
@pytest.mark.parametrize("pooling", list(ST_MODES))
def test_an_encoders_vectors_are_sentence_transformers_with_the_prompt(tiny_bert, pooling, include_prompt):
    """BERT: the prompt's length is [CLS] and its words ([SEP] is not counted), so include_prompt: false leaves
    [CLS] out too, and `cls` then reads the first token after the prompt, as sentence-transformers does."""
    st = sentence_transformer(tiny_bert, pooling, include_prompt)
    for prompt in ("", "query: "):
        expected = st.encode(SENTENCES, prompt=prompt or None, convert_to_tensor=True)
        torch.testing.assert_close(ours(tiny_bert, pooling, prompt, include_prompt), expected, atol=1e-5, rtol=0)
    plain = ours(tiny_bert, pooling, "", True)
    assert (ours(tiny_bert, pooling, "query: ", include_prompt) - plain).abs().max() > 1e-2  # the prompt is read


@pytest.mark.parametrize("include_prompt", [True, False])
@pytest.mark.parametrize("pooling", ["last_token", "mean"])
def test_a_decoders_vectors_are_sentence_transformers_with_an_instruction(tiny_llama, pooling, include_prompt):
    """Llama: the prompt's length counts BOS; the last token is the sentence's with or without the prompt pooled."""
    st = sentence_transformer(tiny_llama, pooling, include_prompt)
    for prompt in ("", INSTRUCTION):
        expected = st.encode(SENTENCES, prompt=prompt or None, convert_to_tensor=True)
        torch.testing.assert_close(ours(tiny_llama, pooling, prompt, include_prompt), expected, atol=1e-5, rtol=0)
    assert TokenCache(load_tokenizer(tiny_llama), MAX_LENGTH, INSTRUCTION).prompt_length == 8  # <s> and 7 words
    with_prompt, without = ours(tiny_llama, pooling, INSTRUCTION, True), ours(tiny_llama, pooling, INSTRUCTION, False)
    if pooling == "last_token":  # the same token either way: what the prompt changes, it changes through attention
        torch.testing.assert_close(with_prompt, without, atol=0, rtol=0)
        assert (with_prompt - ours(tiny_llama, pooling, "", True)).abs().max() > 1e-2
    else:
        assert (with_prompt - without).abs().max() > 1e-2


def test_cls_without_a_prompt_is_the_first_token_as_before():
    hidden = torch.randn(3, 5, 4)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    assert torch.equal(pool(hidden, mask, "cls"), hidden[:, 0])


def test_truncation_counts_the_prompt_as_sentence_transformers_does(tiny_bert, tiny_llama):
    """The prompt is text before the sentence, tokenized with it: a long sentence loses as many tokens as the
    prompt takes, and the ids are those sentence-transformers feeds its model."""
    for model, prompt in ((tiny_bert, "query: "), (tiny_llama, INSTRUCTION)):
        tokens = TokenCache(load_tokenizer(model), MAX_LENGTH, prompt)
        st = sentence_transformer(model, "mean", True)[0]
        for sentence in SENTENCES:
            expected = st.preprocess([sentence], prompt=prompt)["input_ids"][0].tolist()
            assert tokens.lookup([sentence])[0] == expected
        long = tokens.lookup(SENTENCES[-1:])[0]
        plain = tokenize(tokens.tokenizer, SENTENCES[-1:], MAX_LENGTH)[0]
        assert len(long) == len(plain) == MAX_LENGTH
        kept = MAX_LENGTH - tokens.prompt_length - (model == tiny_bert)  # BERT's [SEP] ends every input
        assert long[tokens.prompt_length: tokens.prompt_length + kept] == plain[1: 1 + kept]  # the sentence's first


def test_a_prompt_that_fills_the_length_is_one_line(tiny_bert):
    with pytest.raises(UserInputError, match=re.escape("prompt: 'query: a cat plays' is not valid; its tokens alone "
                                                       "fill max_seq_length 5, so no sentence would be left")):
        TokenCache(load_tokenizer(tiny_bert), 5, "query: a cat plays")


def test_the_token_cache_keeps_prompts_apart(tiny_bert):
    """A reused Ray worker keeps token ids per (tokenizer, length, prompt): a trial with another prompt never
    reads ids an earlier trial made, and one with the same prompt reuses them."""
    tokenizer = load_tokenizer(tiny_bert)
    plain, prompted = TokenCache(tokenizer, MAX_LENGTH), TokenCache(tokenizer, MAX_LENGTH, "query: ")
    plain.add(SENTENCES)
    assert prompted.lookup(SENTENCES[:1]) == [tokenizer("query: " + SENTENCES[0])["input_ids"]]
    assert plain.lookup(SENTENCES[:1]) == [tokenizer(SENTENCES[0])["input_ids"]]
    again = TokenCache(tokenizer, MAX_LENGTH, "query: ")
    assert again._ids is prompted._ids and again._ids is not plain._ids
    assert TokenCache(tokenizer, MAX_LENGTH, "passage: ").lookup(SENTENCES[:1]) != prompted.lookup(SENTENCES[:1])


def test_the_prompt_reaches_the_probes_score_and_no_prompt_is_todays(tiny_bert, synthetic_data_dir):
    def probe(**prompt) -> dict:
        return get_kind("probe").run({"model": tiny_bert, "data_dir": str(synthetic_data_dir), "layers": [2],
                                      "max_eval_samples": 40, "precision": "fp32", "device": "cpu", **prompt},
                                     collect([]))

    today = probe()
    np.testing.assert_equal(probe(prompt=""), today)  # every number exactly (NaN diagnostics included)
    prompted = probe(prompt="query: ")
    assert prompted["dev_spearman"] != today["dev_spearman"]
    assert probe(prompt="query: ", include_prompt=False)["dev_spearman"] not in (today["dev_spearman"],
                                                                                 prompted["dev_spearman"])


def test_a_saved_model_puts_the_prompt_before_every_sentence_as_the_run_did(tiny_bert, synthetic_data_dir, tmp_path):
    """`save:` writes the prompt as the model's default (and query and document) prompt and the Pooling's
    include_prompt, so `SentenceTransformer(folder).encode(sentences)` scores the test pairs as the run did."""
    import pandas as pd
    from sentence_transformers import SentenceTransformer

    saved = {}

    def keep(metrics, checkpoint_dir=None):
        if (Path(checkpoint_dir) / "model").exists():
            saved["model"] = shutil.copytree(Path(checkpoint_dir) / "model", tmp_path / "model")
            saved["predictions"] = pd.read_csv(Path(checkpoint_dir) / "test_predictions.csv")

    get_kind("finetune").run({"model": tiny_bert, "data_dir": str(synthetic_data_dir), "layer": 2, "epochs": 1,
                              "lr": 1e-3, "batch_size": 16, "max_train_samples": 32, "precision": "fp32",
                              "device": "cpu", "prompt": "query: ", "include_prompt": False, "export_model": True,
                              "cache_dir": str(tmp_path / "cache")}, keep)
    model = SentenceTransformer(str(saved["model"]), device="cpu")
    assert (model.prompts["query"], model.default_prompt_name, model[1].include_prompt) == ("query: ", "query", False)
    lines = [line.split("\t") for line in (synthetic_data_dir / "stsb" / "sts-test.csv").read_text().splitlines()]
    a = model.encode([r[5] for r in lines], convert_to_tensor=True)
    b = model.encode([r[6] for r in lines], convert_to_tensor=True)
    np.testing.assert_allclose(torch.nn.functional.cosine_similarity(a, b).numpy(),
                               saved["predictions"]["prediction"], atol=1e-4, rtol=0)


runner = CliRunner()


def study(folder: Path, model: str, data_dir: Path, **changes) -> Path:
    path = folder / "prompts.yaml"
    path.write_text(yaml.safe_dump({
        "name": "prompts", "model": model, "ablate": {"prompt": ["", "query: "]}, "replicate": {"seeds": [0, 1]},
        "train": {"epochs": 2, "layer": 2}, "data_dir": str(data_dir),
        "tracking": {"mlflow_uri": f"sqlite:///{folder / 'mlflow.db'}"}, **changes}))
    return path


@pytest.mark.parametrize(("changes", "message"), [
    ({"ablate": {"layer": [1]}, "train": {"prompt": 3}},
     "train.prompt: 3 is not valid; input should be a valid string"),
    ({"ablate": {"prompt": ["", 3]}}, "ablate.prompt: 3 is not valid; input should be a valid string"),
    ({"ablate": {"layer": [1]}, "train": {"prompt": {"query": None}}},
     "train.prompt: {'query': None} is not valid; input should be a valid string: quote it in YAML (\"query: \")"),
    ({"ablate": {"include_prompt": [True, "sometimes"]}},
     "ablate.include_prompt: 'sometimes' is not valid; input should be a valid boolean"),
    ({"trainable": "cross_encoder", "ablate": {"layer": [1]}, "train": {"prompt": "query: "}},
     "train.prompt: 'prompt' is not valid; valid names: batch_size"),
])
def test_a_bad_prompt_is_one_line_exit_2(tmp_path, tiny_bert, synthetic_data_dir, monkeypatch, changes, message):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["validate", str(study(tmp_path, tiny_bert, synthetic_data_dir, **changes))])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_an_ablated_prompt_plans_a_cell_per_prompt_and_each_trial_carries_its_prompt(tmp_path, tiny_bert,
                                                                                      synthetic_data_dir):
    """Without Ray: the plan's cells, each trial's config, and the study record that the report's
    reproducibility section and every run's MLflow parameters are written from."""
    import orchestrator as orc
    from orchestrator.api import checked_plan
    from orchestrator.study.plan import plan_record

    spec = orc.load_study(study(tmp_path, tiny_bert, synthetic_data_dir, ablate={"prompt": ["", INSTRUCTION]}),
                          check=False)
    planned = orc.plan(spec)
    assert planned.trials == 4 and list(planned.cells.prompt) == ["", INSTRUCTION]
    assert len(set(planned.cells.cell)) == 2
    resolved = checked_plan(spec.spec)  # the loaded study's file
    assert [resolved.trial_config(cell, {}, 0)["prompt"] for cell in resolved.cells] == ["", INSTRUCTION]
    record = plan_record(resolved)
    assert record.cells == [{"prompt": ""}, {"prompt": INSTRUCTION}] and record.defaults["include_prompt"] is True


def test_a_prompt_axis_is_on_every_run_and_labels_the_reports_cells(tmp_path, tiny_bert, synthetic_data_dir,
                                                                     monkeypatch):
    """Trials run instantly (benchmarks/instant.py): each run's `prompt` parameter and `ablate.prompt` tag hold
    the whole prompt, spaces, newline and all (the report's cells come from the tag); the LaTeX table escapes
    it; `report.labels` names a long or empty one, and the Markdown table keeps one line per row."""
    import mlflow

    import orchestrator as orc
    from benchmarks.instant import instant_executor
    from orchestrator.run import launcher

    prompts = ["", "query: ", "50% of {x}_y & $z #1 ~^\\: ", INSTRUCTION]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launcher, "connect_ray", lambda address: None)
    monkeypatch.setattr(launcher, "check_cluster", lambda ray, study: None)
    monkeypatch.setattr(launcher, "run_tuner", instant_executor(
        lambda config, seed, epoch: 50 + prompts.index(config["prompt"]) + epoch + 0.5 * seed, slots=4))
    path = study(tmp_path, tiny_bert, synthetic_data_dir, ablate={"prompt": prompts},
                 report={"baseline": {"prompt": ""}, "labels": {"": "none", INSTRUCTION: "instruction"}})
    result = orc.launch(path, storage=tmp_path / "studies", progress=False)
    assert result.counts["completed"] == 8
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("prompts").experiment_id], "tags.phase = 'replicate'")
    assert sorted((r.data.params["prompt"], r.data.tags["ablate.prompt"]) for r in runs) == sorted(
        (p, p) for p in prompts for _ in range(2))
    cells = result.report.cells.set_index("prompt")["mean"]
    assert cells.to_dict() == pytest.approx({p: 51.25 + i for i, p in enumerate(prompts)})  # test: dev at epoch 2 - 1
    tex = (result.report.folder / "ablation.tex").read_text()
    assert r"50\% of \{x\}\_y \& \$z \#1 \textasciitilde{}\textasciicircum{}\textbackslash{}: " in tex
    assert "none" in tex and "instruction" in tex and "Query" not in tex
    markdown = (result.report.folder / "report.md").read_text().splitlines()
    header = next(line for line in markdown if line.startswith("|  | Prompt"))
    assert header.count(" | ") == 4 and "Prompt none" in header and "Prompt instruction" in header


@pytest.mark.parametrize(("value", "shown"), [
    ("", "none"), ("query: ", "query: "), ("Instruct: Given a/b pair\nQuery: ", "Instruct: Given a/b pair Query:"),
    ("sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2"), ("/models/tiny/", "tiny"), ("cls", "CLS")])
def test_a_prompt_is_labelled_whole_on_one_line_and_no_prompt_as_none(value, shown):
    """A report's cell label: no prompt is `none` (not a blank column header), an instruction over two lines
    is one line (a Markdown row would break), and a prompt with a `/` is not cut as a model path is."""
    from reports.labels import value_label

    assert value_label(value) == shown


def test_the_probe_verb_takes_the_prompt_as_the_probe_kind_does(tiny_bert, synthetic_data_dir):
    """`orchestrator probe --prompt` scores what a study's `prompt:` scores (the probe kind, same layer and pairs),
    `--no-include-prompt` what `include_prompt: false` does, and says the prompt in its table and JSON; a prompt
    whose tokens fill the length is one line naming the option, exit 2."""
    import json

    def kind(**prompt) -> float:  # the probe kind's config (a study's `prompt:`), on the verb's one split
        from trainables.contract import parse_config
        from trainables.evaluation.probe import probe_layers
        from trainables.kinds.probe import ProbeConfig

        cfg = parse_config(ProbeConfig, {"model": tiny_bert, "data_dir": str(synthetic_data_dir), "layers": [2],
                                         "splits": ["dev"], "max_eval_samples": 40, "precision": "fp32",
                                         "device": "cpu", **prompt})
        return probe_layers(cfg)[0]["dev_spearman"]

    def verb(*options: str) -> dict:
        result = runner.invoke(app, ["probe", "--model", tiny_bert, "--data-dir", str(synthetic_data_dir),
                                     "--layers", "2", "--split", "dev", "--max-eval-samples", "40",
                                     "--device", "cpu", "--json", *options])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout.strip().splitlines()[-1])

    prompted, plain = verb("--prompt", "query: "), verb()
    assert prompted["prompt"] == "query: " and prompted["include_prompt"] is True and "prompt" not in plain
    assert prompted["spearman"] == pytest.approx(kind(prompt="query: "), abs=1e-9)
    assert abs(prompted["spearman"] - plain["spearman"]) > 0.5  # the prompt reached the vectors
    excluded = verb("--prompt", "query: ", "--no-include-prompt")
    assert excluded["spearman"] == pytest.approx(kind(prompt="query: ", include_prompt=False), abs=1e-9)
    assert abs(excluded["spearman"] - prompted["spearman"]) > 0.1
    table = runner.invoke(app, ["probe", "--model", tiny_bert, "--data-dir", str(synthetic_data_dir), "--layers",
                                "2", "--split", "dev", "--max-eval-samples", "40", "--prompt", "query: "])
    assert table.exit_code == 0 and "prompt 'query: '" in table.stdout, table.output
    long = runner.invoke(app, ["probe", "--model", tiny_bert, "--data-dir", str(synthetic_data_dir),
                               "--max-seq-length", "5", "--prompt", "query: a cat plays"])
    assert long.exit_code == 2, long.output
    assert long.stderr.strip().splitlines() == [
        "error: --prompt: 'query: a cat plays' is not valid; its tokens alone fill --max-seq-length 5, so no "
        "sentence would be left: shorten it or raise the length"]


def test_append_eos_ends_every_input_with_eos_within_the_length_as_e5_mistrals_tokenizer_does(tiny_llama):
    """`append_eos`: the sentence's ids (BOS first, cut to one token short of the length) and then EOS, for every
    sentence, the long one too; a prompt's length is unchanged (its own trailing EOS is not counted); appending
    twice is appending once; the token cache keeps ids with and without EOS apart."""
    from trainables.models.encoder import with_eos

    plain, ending = load_tokenizer(tiny_llama), load_tokenizer(tiny_llama, append_eos=True)
    eos = ending.eos_token_id
    assert eos == 2 and plain(SENTENCES[0])["input_ids"][-1] != eos
    tokens = TokenCache(ending, MAX_LENGTH)
    for sentence in SENTENCES:
        cut = plain(sentence, truncation=True, max_length=MAX_LENGTH - 1)["input_ids"]
        assert tokens.lookup([sentence])[0] == [*cut, eos]
    assert len(tokens.lookup(SENTENCES[-1:])[0]) == MAX_LENGTH
    assert with_eos(ending)(SENTENCES[0])["input_ids"] == tokens.lookup(SENTENCES[:1])[0]  # no second EOS
    assert TokenCache(ending, MAX_LENGTH, INSTRUCTION).prompt_length == 8  # <s> and 7 words, as without EOS
    assert TokenCache(plain, MAX_LENGTH).lookup(SENTENCES[:1])[0][-1] != eos


def test_with_eos_last_token_pools_the_eos_and_a_saved_model_gives_the_same_vectors(tiny_llama, tmp_path):
    """The vectors of `last_token` with EOS appended are the EOS's states (not the last word's), and the model
    saved as sentence-transformers (its tokenizer.json carries the EOS step) encodes the sentences to them."""
    from sentence_transformers import SentenceTransformer

    from trainables.models.encoder import save_sentence_transformer

    encoder = build_sentence_encoder(tiny_llama, None, "last_token").eval()
    tokens = TokenCache(load_tokenizer(tiny_llama, append_eos=True), MAX_LENGTH)
    with_eos = Embedder(encoder, tokens, torch.device("cpu"))(SENTENCES)
    without = Embedder(encoder, TokenCache(load_tokenizer(tiny_llama), MAX_LENGTH), torch.device("cpu"))(SENTENCES)
    assert (with_eos - without).abs().max() > 1e-2
    folder = save_sentence_transformer(encoder, tokens.tokenizer, tmp_path / "model", MAX_LENGTH)
    saved = SentenceTransformer(str(folder), device="cpu")
    assert saved.tokenizer(SENTENCES[0])["input_ids"] == tokens.lookup(SENTENCES[:1])[0]
    torch.testing.assert_close(saved.encode(SENTENCES, convert_to_tensor=True), with_eos, atol=1e-5, rtol=0)


def test_append_eos_reaches_the_probes_score(tiny_llama, synthetic_data_dir):
    def probe(**changes) -> float:
        return get_kind("probe").run({"model": tiny_llama, "data_dir": str(synthetic_data_dir), "layers": [2],
                                      "pooling": "last_token", "max_eval_samples": 40, "precision": "fp32",
                                      "device": "cpu", **changes}, collect([]))["dev_spearman"]

    assert probe(append_eos=False) == probe()
    assert probe(append_eos=True) != probe()


def test_append_eos_for_a_tokenizer_without_eos_is_one_line_in_validate_the_probe_and_a_trial(
        tmp_path, tiny_bert, synthetic_data_dir, monkeypatch):
    """BERT's tokenizer names no EOS token: `validate` says so in one line, exit 2, before any trial; so does
    `probe --append-eos`; a trial started anyway (the Python API without checks) refuses in the same words."""
    monkeypatch.chdir(tmp_path)
    path = study(tmp_path, tiny_bert, synthetic_data_dir, ablate={"layer": [1]},
                 train={"epochs": 1, "append_eos": True})
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: train.append_eos: True is not valid; the tokenizer of {tiny_bert} has no EOS token to "
                     "append: leave it false"], lines
    result = runner.invoke(app, ["probe", "--model", tiny_bert, "--append-eos", "--data-dir", str(synthetic_data_dir)])
    assert result.exit_code == 2 and result.stderr.strip().splitlines() == [
        f"error: --append-eos: True is not valid; the tokenizer of {tiny_bert} has no EOS token to append: leave "
        "it false"], result.output
    with pytest.raises(UserInputError, match="append_eos: True is not valid; the tokenizer of .* has no EOS token"):
        load_tokenizer(tiny_bert, append_eos=True)
    assert list(tmp_path.iterdir()) == [path]  # nothing written


def test_pool_special_tokens_false_averages_the_sentences_own_tokens_only(tiny_bert, tiny_llama):
    """`pool_special_tokens: false`: mean and max over the tokens that are not special (BERT's [CLS] and [SEP], a
    decoder's BOS and an appended EOS), computed here by hand from the encoder's token states; with a prompt left
    out too; the states themselves are the same (the encoder still attends to every token)."""
    from trainables.models.encoder import special_ids

    for model, append_eos in ((tiny_bert, False), (tiny_llama, True)):
        tokenizer = load_tokenizer(model, append_eos)
        tokens = TokenCache(tokenizer, MAX_LENGTH)
        skipped = special_ids(tokenizer)
        assert tokenizer.bos_token_id in skipped or tokenizer.cls_token_id in skipped
        for pooling in ("mean", "max"):
            encoder = build_sentence_encoder(model, None, pooling, skipped_ids=skipped).eval()
            ours = Embedder(encoder, tokens, torch.device("cpu"))(SENTENCES)
            plain = Embedder(build_sentence_encoder(model, None, pooling).eval(), tokens,
                             torch.device("cpu"))(SENTENCES)
            for row, sentence in enumerate(SENTENCES):
                ids = torch.tensor([tokens.lookup([sentence])[0]])
                with torch.no_grad():
                    states = encoder.encoder(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0]
                own = torch.tensor([i not in skipped for i in ids[0].tolist()])
                assert 0 < own.sum() < len(own)  # special tokens stood there, words too
                expected = states[own].mean(0) if pooling == "mean" else states[own].max(0).values
                torch.testing.assert_close(ours[row], expected, atol=1e-5, rtol=0)
            assert (ours - plain).abs().max() > 1e-3


def test_pool_special_tokens_false_with_a_one_token_pooling_or_save_is_one_line(tmp_path, tiny_bert, tiny_llama,
                                                                                 synthetic_data_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for changes, message in (
            ({"train": {"epochs": 1, "pooling": "cls", "pool_special_tokens": False}},
             "train.pool_special_tokens: False is not valid; cls reads one token, not an average over the tokens: "
             "use mean, max or mean_sqrt_len, or pool_special_tokens: true"),
            ({"train": {"epochs": 1, "pool_special_tokens": False}, "save": "best_per_cell"},
             "train.pool_special_tokens: False is not valid; save: best_per_cell writes sentence-transformers "
             "folders, whose Pooling pools every token but a prompt's")):
        path = study(tmp_path, tiny_bert, synthetic_data_dir, ablate={"layer": [1]}, **changes)
        result = runner.invoke(app, ["validate", str(path)])
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], lines
    result = runner.invoke(app, ["probe", "--model", tiny_llama, "--skip-special", "--pooling", "last_token",
                                 "--data-dir", str(synthetic_data_dir)])
    assert result.exit_code == 2 and result.stderr.strip().splitlines() == [
        "error: --skip-special: True is not valid; --pooling last_token reads one token, not an average over the "
        "tokens: use --pooling mean, max or mean_sqrt_len"], result.output
    path = study(tmp_path, tiny_bert, synthetic_data_dir, ablate={"pool_special_tokens": [True, False]},
                 train={"epochs": 1, "layer": 2})
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0 and "2 cells" in result.stdout, result.output


def test_pool_special_tokens_reaches_the_probe_and_a_trial_before_its_first_step_pools_the_same(
        tiny_llama, synthetic_data_dir):
    """The probe's and a fine-tuning trial's vectors with `pool_special_tokens: false` are the same numbers on the
    same sentences (the scores of a random tiny decoder's near-parallel vectors would move with batch rounding)."""
    from trainables.contract import parse_config
    from trainables.evaluation.probe import LayerTable
    from trainables.kinds.finetune.learner import FinetuneLearner
    from trainables.kinds.probe import ProbeConfig

    def probe(**changes) -> float:
        return get_kind("probe").run({"model": tiny_llama, "data_dir": str(synthetic_data_dir), "layers": [2],
                                      "max_eval_samples": 40, "precision": "fp32", "device": "cpu", **changes},
                                     collect([]))["dev_spearman"]

    assert probe(pool_special_tokens=False) != probe()
    cfg = get_kind("finetune").parse({"model": tiny_llama, "data_dir": str(synthetic_data_dir), "layer": 2,
                                      "pool_special_tokens": False, "max_train_samples": 16, "max_eval_samples": 40,
                                      "precision": "fp32", "device": "cpu"})
    learner = FinetuneLearner(cfg, torch.device("cpu"), torch.float32)
    sentences = list(learner.test_frame["sentence1"]) + list(learner.test_frame["sentence2"])
    table = LayerTable(parse_config(ProbeConfig, {"model": tiny_llama, "layers": [2], "pool_special_tokens": False,
                                                  "precision": "fp32", "device": "cpu"}), sentences)
    torch.testing.assert_close(learner.embed(sentences), table.embedder(0)(sentences), atol=1e-6, rtol=0)


def test_a_probe_study_with_append_eos_on_a_tokenizer_without_eos_is_one_line(tmp_path, tiny_bert,
                                                                              synthetic_data_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = study(tmp_path, tiny_bert, synthetic_data_dir, trainable="probe", ablate={"pooling": ["mean", "max"]},
                 train={"append_eos": True}, replicate={"seeds": [0]})
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [f"error: train.append_eos: True is not valid; the tokenizer of "
                                                  f"{tiny_bert} has no EOS token to append: leave it false"]
