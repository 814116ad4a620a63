"""A saved model's card: sentence-transformers' README.md, its layout kept, with how the model was trained."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml

from orchestrator.run.saved_models import CARD_SECTION, write_card
from orchestrator.study.journal import Outcome, TrialRecord
from reports.record import DataRecord, SplitRecord
from trainables.models.encoder import build_sentence_encoder, load_tokenizer, save_sentence_transformer


@pytest.fixture(scope="module")
def saved(tiny_bert, tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved") / "model"
    save_sentence_transformer(build_sentence_encoder(tiny_bert, 2, "mean"), load_tokenizer(tiny_bert), folder, 32)
    return folder


def plan_and_record(model: str):
    study = SimpleNamespace(name="layers", trainable="finetune")
    data = (DataRecord(name="stsb", splits={"train": SplitRecord(rows=5749, sha256="ab" * 32),
                                            "test": SplitRecord(rows=1379, sha256="cd" * 32)}),)
    plan = SimpleNamespace(study=study, metric="dev_spearman", cells=[SimpleNamespace(key="layer=2")], data=data)
    results = [{"dev_spearman": 70.5, "attempt": 1, "attempt_s": 30.0},
               {"dev_spearman": 71.25, "test_spearman": 68.125, "attempt": 1, "attempt_s": 61.0,
                "hardware_cpu": "AMD EPYC"}]
    record = TrialRecord(key="c0-s1", cell=0, phase="replicate", seed=1, tuned={},
                         config={"model": model, "layer": 2, "pooling": "mean", "lr": 2e-5, "epochs": 2},
                         results=results, outcome=Outcome.COMPLETED, cell_key="layer=2")
    return plan, record


def test_the_card_keeps_sentence_transformers_layout_and_says_how_the_model_was_trained(saved):
    from sentence_transformers import SentenceTransformer

    plan, record = plan_and_record("sentence-transformers/all-MiniLM-L6-v2")
    before = (saved / "README.md").read_text()
    card = write_card(saved, plan, record, 71.25)
    write_card(saved, plan, record, 71.25)  # written again (a resumed study): still one section
    text = card.read_text()
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["library_name"] == "sentence-transformers" and front["pipeline_tag"] == "sentence-similarity"
    assert "sentence-transformers" in front["tags"] and "ablation-orchestrator" in front["tags"]
    assert front["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert text.count(CARD_SECTION) == 1 and text.index(CARD_SECTION) < text.index("## Usage")
    assert "study `layers`, cell `layer=2`, seed 1, kind `finetune`" in text
    assert "(best epoch, what selection read):** 71.2500" in text
    assert "(scored once, never selected on):** 68.1250" in text
    assert "- **Wall time of the trial:** 61 s" in text and "- **Hardware:** cpu AMD EPYC" in text
    assert "| `lr` | `2e-05` |" in text and "| stsb (en) | test | 1,379 | `cdcdcdcdcdcdcdcd` |" in text
    assert "## Model Details" in text and before.split("## Usage")[1] in text  # ST's own sections all kept
    model = SentenceTransformer(str(saved), device="cpu")
    assert model.encode(["a man plays a guitar"]).shape == (1, 32)


def test_a_local_base_model_is_named_but_not_claimed_as_a_hub_id(saved, tiny_bert):
    plan, record = plan_and_record(tiny_bert)
    text = write_card(saved, plan, record, None).read_text()
    assert "base_model" not in yaml.safe_load(text.split("---\n")[1])
    assert f"- **Base model:** `{tiny_bert}`" in text and "what selection read):** none" in text


def test_a_card_that_cannot_be_read_leaves_the_kept_model_and_says_so(saved, tmp_path, caplog):
    """Lose no results: a README.md the card cannot parse (or write) is a warning; the model stays where it was
    copied."""
    import shutil

    from orchestrator.run import saved_models

    folder = tmp_path / "broken"
    shutil.copytree(saved, folder)
    (folder / "README.md").write_text("---\ntags: [unclosed\n---\n# card\n")
    plan, record = plan_and_record("sentence-transformers/all-MiniLM-L6-v2")
    with pytest.raises(yaml.YAMLError):
        write_card(folder, plan, record, 1.0)
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(folder, checkpoint / "model")
    record.checkpoint = str(checkpoint)
    plan.study.save = "all_replicates"
    state = SimpleNamespace(plan=plan, _value=lambda r: 71.25)
    tracker = SimpleNamespace(set_tag=lambda *a: None)
    kept = saved_models.keep_model(state, tracker, record, tmp_path / "models")
    assert (kept / "model.safetensors").is_file()
    assert "the model card of" in caplog.text
