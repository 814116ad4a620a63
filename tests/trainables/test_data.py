from __future__ import annotations

import pandas as pd
import pytest

from trainables.data.tasks import STSB_LANGUAGES, TASKS, load_task
from trainables.errors import DataNotFoundError, UserInputError

# (task, language, train, dev, test): the published split sizes of every data set
SIZES = [("stsb", None, 5749, 1500, 1379), ("korsts", None, 5749, 1500, 1379),
         ("sick", None, 4500, 500, 4927), ("sick_full", None, 4439, 495, 4906), ("mrpc", None, 3668, 408, 1725)]
SIZES += [("stsb_multi_mt", lang, 5749, 1500, 1379) for lang in STSB_LANGUAGES]


@pytest.mark.parametrize(("task", "language", "train", "dev", "test"), SIZES)
def test_every_task_and_language_loads_with_its_published_sizes(data_dir, task, language, train, dev, test):
    data = load_task(task, language, data_dir)
    assert (len(data.train), len(data.dev), len(data.test)) == (train, dev, test)
    target = "score" if data.kind == "sts" else "label"
    for frame in (data.train, data.dev, data.test):
        assert list(frame.columns) == ["sentence1", "sentence2", target]
        assert frame["sentence1"].str.len().min() > 0 and frame["sentence2"].str.len().min() > 0
    if data.kind == "sts":
        scores = pd.concat([data.train.score, data.dev.score, data.test.score])
        assert scores.min() == 0.0 and scores.max() == 1.0
    else:
        assert set(data.test.label) == {0, 1}
        assert data.train.label.sum() == 2474  # GLUE's positive count


def test_translations_are_aligned_with_the_original(data_dir):
    english, german = load_task("stsb", None, data_dir), load_task("stsb_multi_mt", "de", data_dir)
    assert (english.test.score.to_numpy() == german.test.score.to_numpy()).all()
    assert german.test.sentence1[0] != english.test.sentence1[0]


def test_unlabeled_corpus_has_only_sentences(data_dir):
    data = load_task("unlabeled_en", None, data_dir)
    assert len(data.train) == 11914 and list(data.train.columns) == ["sentence"]
    assert data.dev is None and data.test is None
    with pytest.raises(UserInputError, match="use one of: train"):
        data.split("dev")


def test_caps_take_the_same_rows_in_their_original_order(synthetic_data_dir):
    full = load_task("stsb", None, synthetic_data_dir)
    a = load_task("stsb", None, synthetic_data_dir, max_train_samples=50, max_eval_samples=20)
    b = load_task("stsb", None, synthetic_data_dir, max_train_samples=50, max_eval_samples=20)
    assert (len(a.train), len(a.dev), len(a.test)) == (50, 20, 20)
    pd.testing.assert_frame_equal(a.train, b.train)
    positions = [full.train.index[full.train.sentence1 == s][0] for s in a.train.sentence1]
    assert positions == sorted(positions) and positions != list(range(50))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"task": "stsbb"}, "task: 'stsbb' is not valid; use one of: korsts, mrpc, sick, sick_full, sick_nli, sick_nli3, "
                        "sts12, sts13, sts14, sts15, sts16, stsb, stsb_multi_mt, unlabeled_en"),
    ({"task": "stsb_multi_mt"}, "language: None is not valid; task stsb_multi_mt needs a language, one of: de, en"),
    ({"task": "stsb_multi_mt", "language": "ko"}, "(Korean STS-B is the task korsts)"),
    ({"task": "stsb", "language": "de"}, "language: 'de' is not valid; task stsb has the languages: en"),
])
def test_bad_task_arguments_name_the_key_and_the_fix(kwargs, message):
    with pytest.raises(UserInputError) as error:
        load_task(**kwargs)
    assert message in str(error.value)


def test_missing_data_offline_says_which_files_to_put_where(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataNotFoundError) as error:
        load_task("stsb_multi_mt", "fr", tmp_path)
    message = str(error.value)
    assert "stsb-multi-mt/stsb-fr-train.csv" in message and str(tmp_path) in message
    assert "PhilipMay/stsb_multi_mt" in message and "\n" not in message


def test_data_folder_comes_from_the_environment(synthetic_data_dir, monkeypatch):
    monkeypatch.setenv("ORCHESTRATOR_DATA_DIR", str(synthetic_data_dir))
    assert len(load_task("stsb").train) == 240


def test_hub_copy_is_used_when_the_folder_lacks_the_files(tmp_path, monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(dataset_id, config, split):
        calls.append((dataset_id, config, split))
        return datasets.Dataset.from_dict({"sentence1": ["a b", "c"], "sentence2": ["a", "d"],
                                           "similarity_score": [5.0, 1.0]})

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr("trainables.data.tasks.hub_reachable", lambda: True)
    data = load_task("stsb_multi_mt", "de", tmp_path)
    assert calls == [("PhilipMay/stsb_multi_mt", "de", s) for s in ("train", "dev", "test")]
    assert data.test.score.tolist() == [1.0, 0.2]


def test_registry_is_closed_and_every_task_names_its_files():
    assert set(TASKS) == {"stsb", "stsb_multi_mt", "korsts", "sick", "sick_full", "sick_nli", "sick_nli3", "mrpc",
                          "unlabeled_en", "sts12", "sts13", "sts14", "sts15", "sts16"}
    for spec in TASKS.values():
        assert spec.local_files(spec.languages[0])
    assert all(spec.local_files(language) for spec in TASKS.values() for language in spec.languages)


# SemEval STS years: scored pairs per subset, as PROVENANCE.md and SentEval count them
STS_YEARS = {"sts12": {"MSRpar": 750, "MSRvid": 750, "SMTeuroparl": 459, "surprise.OnWN": 750,
                       "surprise.SMTnews": 399},
             "sts13": {"FNWN": 189, "headlines": 750, "OnWN": 561},
             "sts14": {"deft-forum": 450, "deft-news": 300, "headlines": 750, "images": 750, "OnWN": 750,
                       "tweet-news": 750},
             "sts15": {"answers-forums": 375, "answers-students": 750, "belief": 375, "headlines": 750, "images": 750},
             "sts16": {"answer-answer": 254, "headlines": 249, "plagiarism": 230, "postediting": 244,
                       "question-question": 209}}


@pytest.mark.parametrize("task", sorted(STS_YEARS))
def test_every_sts_year_loads_its_scored_pairs_per_subset(data_dir, task):
    data = load_task(task, None, data_dir)
    assert data.dev is None and len(data.train) == 0  # evaluation only
    assert data.test.groupby("subset").size().to_dict() == STS_YEARS[task]
    assert list(data.test.columns) == ["sentence1", "sentence2", "score", "subset"]
    assert data.test.score.between(0, 1).all() and data.test.sentence1.str.len().min() > 0
    assert not data.test.sentence1.str.startswith(" ").any() and not data.test.sentence2.str.endswith(" ").any()


def test_an_sts_year_is_not_a_study_task(synthetic_data_dir):
    from orchestrator.study.plan_checks import task_names as _task_names

    assert "sts12" not in _task_names() and "stsb" in _task_names()
