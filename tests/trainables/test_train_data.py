"""`train_data`: a finetune trains on another data set's train split (pairs or triplets for the in-batch
negatives losses, or any labelled pair set) while its task's dev selects and its test scores; pairs and
triplets as declared data sets, `where` and a `positive_label` among several classes."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainables.contract import collect
from trainables.data.tasks import load_task
from trainables.errors import UserInputError
from trainables.kinds import get_kind
from trainables.kinds.finetune import FinetuneConfig
from trainables.kinds.finetune.learner import FinetuneLearner
from trainables.objectives import build_loss

ANCHORS = [f"a man number {i} plays a guitar on stage" for i in range(12)]
POSITIVES = [f"someone {i} is playing music" for i in range(12)]
NEGATIVES = [f"the {i} cats sleep on a warm sofa" for i in range(12)]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny models: one torch thread (conftest's `one_torch_thread`)."""


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def steps_of(monkeypatch) -> list[dict]:
    """Every step a finetune learner takes from here on: its token lists, targets and the shapes of the guide
    vectors its loss holds (a guided loss), as `train_step` receives them."""
    import trainables.kinds.finetune.learner as module

    seen: list[dict] = []
    real = module.train_step

    def spy(model, loss_fn, optimizer, scheduler, token_lists, targets, *rest):
        guide = getattr(loss_fn, "guide", None)
        seen.append({"tokens": token_lists, "targets": targets.clone(),
                     "guide": tuple(g.shape for g in guide) if guide is not None else None})
        return real(model, loss_fn, optimizer, scheduler, token_lists, targets, *rest)

    monkeypatch.setattr(module, "train_step", spy)
    return seen


@pytest.fixture()
def triplets(tmp_path) -> dict:
    rows = [{"query": a, "pos": p, "neg": n} for a, p, n in zip(ANCHORS, POSITIVES, NEGATIVES, strict=True)]
    return {"name": "mine", "type": "triplets", "files": {"train": _jsonl(tmp_path / "t.jsonl", rows)},
            "columns": {"anchor": "query", "positive": "pos", "negative": "neg"}}


@pytest.fixture()
def config(tiny_bert, synthetic_data_dir, triplets):
    return {"model": tiny_bert, "task": "stsb", "train_data": triplets, "loss": "mnrl", "epochs": 1, "lr": 1e-3,
            "batch_size": 4, "max_eval_samples": 40, "data_dir": str(synthetic_data_dir), "device": "cpu",
            "group_by_length": False}


def test_a_batch_is_its_anchors_then_positives_then_negatives_with_each_positive_named(config, monkeypatch):
    steps = steps_of(monkeypatch)
    learner = FinetuneLearner(FinetuneConfig(**config), torch.device("cpu"), torch.float32)
    learner.train_round(1)
    assert len(steps) == 3  # 12 triplets, batches of 4
    covered = []
    for token_lists, targets in ((step["tokens"], step["targets"]) for step in steps):
        assert targets.tolist() == [0, 1, 2, 3] and len(token_lists) == 12
        rows = [next(i for i, a in enumerate(ANCHORS) if learner.tokens[a] == t) for t in token_lists[:4]]
        assert [learner.tokens[POSITIVES[i]] for i in rows] == token_lists[4:8]
        assert [learner.tokens[NEGATIVES[i]] for i in rows] == token_lists[8:]
        covered += rows
    assert sorted(covered) == list(range(12))  # an epoch: every triplet once


def test_a_trial_trains_on_train_data_and_scores_the_task(config, triplets, tmp_path):
    final = get_kind("finetune").run(config, collect([]))
    assert math.isfinite(final["test_spearman"]) and math.isfinite(final["best_dev_spearman"])
    pairs = {**triplets, "type": "pairs", "columns": {"anchor": "query", "positive": "pos"}}
    other = get_kind("finetune").run({**config, "train_data": pairs}, collect([]))  # no hard negatives
    assert other["dev_spearman"] != pytest.approx(final["dev_spearman"], abs=1e-7)
    cached = get_kind("finetune").run({**config, "loss": "cached_mnrl", "mini_batch_size": 3}, collect([]))
    assert math.isfinite(cached["test_spearman"])  # GradCache's own numbers: tests/trainables/test_gradient_cache.py
    on_task = get_kind("finetune").run({**config, "train_data": None, "loss": "cosine_mse"}, collect([]))
    assert on_task["dev_spearman"] != pytest.approx(final["dev_spearman"], abs=1e-7)


@pytest.mark.parametrize(("train_data", "loss", "key", "message"), [
    (None, "mnrl", "train.loss", "it trains on (anchor, positive) pairs with in-batch negatives; task stsb is an sts "
                                 "task: name training pairs as train.train_data"),
    ("sick_nli", "cosine_mse", "train.loss", "it trains sts tasks; train_data sick_nli needs one of: mnrl, "
                                             "mnrl_symmetric, gte, cached_mnrl, gist"),
    ("unlabeled_en", "mnrl", "train.train_data", "it is single sentences"),
    ("sts12", "mnrl", "train.train_data", "it has a test split only"),
    ("sick_nl", "mnrl", "train.train_data", "did you mean sick_nli"),
])
def test_what_cannot_train_is_one_line(tiny_bert, train_data, loss, key, message):
    cfg = FinetuneConfig(model=tiny_bert, task="stsb", train_data=train_data, loss=loss)
    with pytest.raises(UserInputError) as caught:
        get_kind("finetune").check_names(cfg, lambda name: f"train.{name}")
    assert caught.value.key == key and message in str(caught.value), str(caught.value)


def test_sick_nli_is_sick_trains_entailment_pairs(data_dir):
    found = load_task("sick_nli", None, str(data_dir))
    assert found.kind == "pairs" and list(found.train.columns) == ["anchor", "positive"] and found.dev is None
    assert len(found.train) == 1299  # SICK_train.txt's ENTAILMENT rows (PROVENANCE: 4500 pairs, 3 judgments)
    assert (found.train.iloc[0].anchor, found.train.iloc[0].positive) == (
        "The young boys are playing outdoors and the man is smiling nearby",
        "The kids are playing outdoors near a man with a smile")


def test_where_keeps_rows_and_positive_label_takes_one_class_of_several(tmp_path):
    rows = [{"s1": f"a{i}", "s2": f"b{i}", "label": ["ENTAILMENT", "NEUTRAL", "CONTRADICTION"][i % 3], "src": i % 2}
            for i in range(30)]
    files = {s: _jsonl(tmp_path / f"{s}.jsonl", rows) for s in ("train", "dev", "test")}
    declared = {"name": "nli", "type": "pair_classification", "files": files,
                "columns": {"sentence1": "s1", "sentence2": "s2"}, "positive_label": "ENTAILMENT"}
    found = load_task(declared)
    assert found.train.label.tolist() == [int(i % 3 == 0) for i in range(30)]
    kept = load_task({**declared, "where": {"src": 1, "label": ["ENTAILMENT", "NEUTRAL"]}})
    assert kept.train.sentence1.tolist() == [f"a{i}" for i in range(30) if i % 2 == 1 and i % 3 != 2]
    with pytest.raises(UserInputError, match="task.where.source: 1 is not valid; .* has no such column"):
        load_task({**declared, "where": {"source": 1}})
    with pytest.raises(UserInputError, match="no row of the train split"):
        load_task({**declared, "where": {"label": "UNKNOWN"}})
    with pytest.raises(UserInputError, match="name the matching one with positive_label"):
        load_task({**declared, "positive_label": None})


def test_gist_trains_with_its_guide_s_vectors_of_each_batch(config, tiny_bert, monkeypatch):
    steps = steps_of(monkeypatch)
    learner = FinetuneLearner(FinetuneConfig(**{**config, "loss": "gist", "guide_model": tiny_bert}),
                              torch.device("cpu"), torch.float32)
    assert len(learner.guide_rows) == 36 and learner.guide_vectors.shape == (36, 32)  # every distinct sentence
    learner.train_round(1)
    assert [step["guide"] for step in steps] == [((4, 32), (8, 32))] * 3  # anchors; positives then negatives


@pytest.mark.parametrize(("change", "key", "message"), [
    ({"loss": "gist"}, "train.guide_model", "judges its in-batch negatives with a guide model: name one"),
    ({"loss": "gist", "guide_model": "/nowhere/model"}, "train.guide_model", "/nowhere/model"),
    ({"loss": "mnrl", "gist_margin": 0.1}, "train.gist_margin", "only a guided loss reads it (gist)"),
    ({"loss": "gist", "guide_model": "TINY", "guide_pooling": "meen"}, "train.guide_pooling", "is not valid"),
])
def test_a_guide_where_it_cannot_apply_is_one_line(tiny_bert, change, key, message):
    change = {k: tiny_bert if v == "TINY" else v for k, v in change.items()}
    cfg = FinetuneConfig(model=tiny_bert, task="stsb", train_data="sick_nli", **change)
    with pytest.raises(UserInputError) as caught:
        get_kind("finetune").check_names(cfg, lambda name: f"train.{name}")
    assert caught.value.key == key and message in str(caught.value), str(caught.value)


def test_each_training_column_reads_its_own_prompt_and_the_task_is_scored_with_prompt(config, monkeypatch):
    steps = steps_of(monkeypatch)
    prompts = {"anchor": "query: ", "positive": "passage: "}
    learner = FinetuneLearner(FinetuneConfig(**{**config, "prompts": prompts, "prompt": "x: "}), torch.device("cpu"),
                              torch.float32)
    learner.train_round(1)
    tokenizer = learner.tokens.tokenizer
    query, passage, x = (tokenizer(text, add_special_tokens=False)["input_ids"] for text in ("query:", "passage:",
                                                                                             "x:"))
    for token_lists in (step["tokens"] for step in steps):
        for ids, prefix in zip(token_lists, [query] * 4 + [passage] * 4 + [x] * 4, strict=True):
            assert ids[1:1 + len(prefix)] == prefix, tokenizer.decode(ids)  # after [CLS]: the column's prompt
    assert learner.tokens.prompt == "x: "  # dev and test: the study's prompt


@pytest.mark.parametrize(("change", "key", "message"), [
    ({"prompts": {"query": "q: "}}, "train.prompts.query", "the columns of training pairs are anchor, positive, "
                                                           "negative"),
    ({"prompts": {"anchor": "q: "}, "train_data": None, "loss": "cosine_mse"}, "train.prompts",
     "the task's two sentences take one prompt: use prompt"),
    ({"prompts": {"anchor": "q: "}, "include_prompt": False}, "train.prompts", "use include_prompt: true with prompts"),
])
def test_prompts_where_they_cannot_apply_are_one_line(config, change, key, message):
    cfg = FinetuneConfig(**{**config, **change})
    with pytest.raises(UserInputError) as caught:
        get_kind("finetune").check_names(cfg, lambda name: f"train.{name}")
    assert caught.value.key == key and message in str(caught.value), str(caught.value)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=1, max_size=60),
       st.integers(1, 9), st.integers(0, 5), st.integers(0, 3))
def test_no_duplicates_batches_are_sentence_transformers_own(pairs, batch_size, seed, epoch):
    """The same batches as their NoDuplicatesBatchSampler on the same rows, seed and epoch, whatever the repeats."""
    datasets = pytest.importorskip("datasets")
    from sentence_transformers.base.sampler import NoDuplicatesBatchSampler

    from trainables.training.bi_encoder import no_duplicate_batches

    rows = [(f"s{a}", f"t{b}" if b % 3 else f"s{b}") for a, b in pairs]  # repeats within and across columns
    dataset = datasets.Dataset.from_dict({"anchor": [a for a, _ in rows], "positive": [b for _, b in rows]})
    sampler = NoDuplicatesBatchSampler(dataset, batch_size=batch_size, drop_last=False, generator=torch.Generator(),
                                       seed=seed)
    sampler.set_epoch(epoch)
    ours = no_duplicate_batches(rows, batch_size, seed, epoch)
    assert ours == list(sampler)
    assert sorted(i for batch in ours for i in batch) == list(range(len(rows)))  # every row once
    for batch in ours:
        sentences = [s for i in batch for s in set(rows[i])]
        assert len(sentences) == len(set(sentences))  # no sentence twice in a batch


def test_a_trial_with_no_duplicates_trains_on_batches_without_a_repeated_sentence(config, monkeypatch):
    steps = steps_of(monkeypatch)
    learner = FinetuneLearner(FinetuneConfig(**{**config, "no_duplicates": True}), torch.device("cpu"),
                              torch.float32)
    learner.first[1] = learner.first[0]  # two rows share an anchor: never in one batch
    learner.train_round(1)
    for token_lists in (step["tokens"] for step in steps):
        assert len({tuple(t) for t in token_lists}) == len(token_lists)
    assert sum(len(step["tokens"]) for step in steps) == 36  # every triplet once


def test_sbert_s_nli_softmax_trains_on_three_judgments(config, data_dir, tiny_bert):
    """`softmax_nli` (SBERT's NLI objective) on `sick_nli3`: SICK's pairs with their three judgments as 0/1/2."""
    found = load_task("sick_nli3", None, str(data_dir))
    assert found.kind == "nli" and found.train.label.value_counts().to_dict() == {1: 2536, 0: 1299, 2: 665}
    loss = build_loss("softmax_nli", "nli", 32)
    assert loss.classifier.out_features == 3
    final = get_kind("finetune").run({**config, "train_data": "sick_nli3", "loss": "softmax_nli",
                                      "data_dir": str(data_dir), "task": "stsb", "max_train_samples": 48},
                                     collect([]))
    assert math.isfinite(final["test_spearman"])
    with pytest.raises(UserInputError, match="it trains nli tasks; train_data sick_nli needs one of"):
        get_kind("finetune").check_names(FinetuneConfig(model=tiny_bert, task="stsb", train_data="sick_nli",
                                                        loss="softmax_nli"), lambda name: f"train.{name}")


def test_nli_labels_are_the_three_judgments_in_any_case_or_their_numbers(tmp_path):
    rows = [{"s1": f"a{i}", "s2": f"b{i}", "label": ["Entailment", "NEUTRAL", "contradiction", 1][i % 4]}
            for i in range(8)]
    declared = {"name": "mine", "type": "nli", "files": {"train": _jsonl(tmp_path / "t.jsonl", rows)},
                "columns": {"sentence1": "s1", "sentence2": "s2"}}
    assert load_task(declared).train.label.tolist() == [0, 1, 2, 1] * 2
    rows[3]["label"] = "maybe"
    declared["files"]["train"] = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(UserInputError, match="an nli data set's labels are entailment, neutral and contradiction "
                                             "\\(or 0, 1, 2\\); it has 'maybe'"):
        load_task(declared)
