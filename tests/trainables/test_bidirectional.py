"""`bidirectional: true`: a causal decoder attends both ways (LLM2Vec's first step), every token seeing the whole
sentence and no padding. Checked against references the switch does not compute: the causal model fed a
padding-only 4D mask built here by hand, and transformers' own EmbeddingGemma (Gemma 3 built with
`use_bidirectional_attention`); then the same in a trial and the probe, and one line for what cannot be."""

from __future__ import annotations

import pytest
import torch
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from tests.trainables.test_architectures import FAMILIES
from tests.trainables.test_zero_step import save_family
from trainables.contract import parse_config
from trainables.errors import UserInputError
from trainables.evaluation.probe import probe_layers
from trainables.kinds import get_kind
from trainables.kinds.finetune.learner import FinetuneLearner
from trainables.kinds.probe import ProbeConfig
from trainables.models.architectures import is_causal
from trainables.models.encoder import build_sentence_encoder, load_encoder, save_sentence_transformer

BATCHES = {"padded": [7, 5, 3], "unpadded": [7, 7, 7]}  # unpadded: transformers hands SDPA no mask at all


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny models: one torch thread (conftest's `one_torch_thread`)."""


def inputs(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 100, (len(lengths), max(lengths)), generator=generator)
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


def padding_only(mask: torch.Tensor) -> torch.Tensor:
    """Every query sees every real key of its row: the bidirectional mask, as an additive 4D mask."""
    keys = mask.bool()[:, None, None, :].expand(-1, 1, mask.shape[1], -1)
    return torch.zeros(keys.shape).masked_fill(~keys, torch.finfo(torch.float32).min)


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("family", ["llama", "qwen3-full", "gpt2"])
def test_a_decoder_attending_both_ways_is_the_causal_model_under_a_padding_only_mask(family, batch, tmp_path,
                                                                                      monkeypatch):
    """Qwen3 without its sliding window here: a sliding layer keeps transformers' bidirectional window."""
    import transformers as T

    from tests.trainables.test_architectures import DECODER

    monkeypatch.setitem(FAMILIES, "qwen3-full", lambda: T.Qwen3Config(**DECODER, head_dim=16))
    folder = save_family(family, tmp_path / family)
    ids, mask = inputs(BATCHES[batch])
    both, causal = load_encoder(folder, bidirectional=True).eval(), load_encoder(folder).eval()
    assert not is_causal(both) and is_causal(causal)
    with torch.no_grad():
        got = both(input_ids=ids, attention_mask=mask).last_hidden_state
        reference = causal(input_ids=ids, attention_mask=padding_only(mask)).last_hidden_state
        today = causal(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(got[real], reference[real], atol=1e-5, rtol=0)
    assert (today[real] - reference[real]).abs().max() > 1e-2  # causal it is another model
    changed = ids.clone()
    changed[0, 6] = (changed[0, 6] + 1) % 97 + 3  # the first sentence's last token
    with torch.no_grad():
        first = both(input_ids=changed, attention_mask=mask).last_hidden_state[0, 0]
    assert (first - got[0, 0]).abs().max() > 1e-4  # the first token sees the last one


def test_gemma3_attending_both_ways_is_embeddinggemma(tmp_path):
    """Gemma 3 has a switch of its own: built with it, as EmbeddingGemma's config builds the model (its sliding
    window halved, as transformers does for it), so the same weights give EmbeddingGemma's states exactly."""
    import transformers as T

    folder = save_family("gemma3_text", tmp_path / "gemma3")
    ours = load_encoder(folder, bidirectional=True).eval()
    switched = {**FAMILIES["gemma3_text"]().to_dict(), "use_bidirectional_attention": True}  # the same layer types
    embeddinggemma = T.AutoModel.from_config(T.Gemma3TextConfig(**switched)).eval()
    embeddinggemma.load_state_dict(ours.state_dict())
    assert ours.config.use_bidirectional_attention
    assert ours.config.sliding_window == embeddinggemma.config.sliding_window == 3  # 4 halved, + 1
    ids, mask = inputs(BATCHES["padded"])
    with torch.no_grad():
        got = ours(input_ids=ids, attention_mask=mask).last_hidden_state
        expected = embeddinggemma(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=1e-5, rtol=0)


def test_a_trial_before_its_first_step_scores_as_the_probe_and_cls_is_allowed(synthetic_data_dir, tmp_path):
    """Fine-tuning and the probe read the same bidirectional model: a zero-step trial's dev score is the
    probe's; `cls`, refused for a causal decoder, pools a first token that now sees the sentence."""
    model = save_family("llama", tmp_path / "llama")
    scores = {}
    for bidirectional, pooling in ((True, "cls"), (True, "mean"), (False, "mean")):
        cfg = get_kind("finetune").parse({
            "model": model, "data_dir": str(synthetic_data_dir), "layer": 3, "pooling": pooling,
            "bidirectional": bidirectional, "max_train_samples": 16, "max_eval_samples": 40, "precision": "fp32",
            "device": "cpu"})
        trial, _ = FinetuneLearner(cfg, torch.device("cpu"), torch.float32).evaluate("dev")
        probed = probe_layers(parse_config(ProbeConfig, {
            "model": model, "data_dir": str(synthetic_data_dir), "layers": [3], "pooling": pooling,
            "bidirectional": bidirectional, "splits": ["dev"], "max_eval_samples": 40, "precision": "fp32",
            "device": "cpu"}))[0]
        assert trial["dev_spearman"] == pytest.approx(probed["dev_spearman"], abs=1e-6), (bidirectional, pooling)
        scores[bidirectional, pooling] = trial["dev_spearman"]
    assert scores[True, "mean"] != pytest.approx(scores[False, "mean"], abs=1e-4)
    with pytest.raises(UserInputError, match="attends causally"):
        build_sentence_encoder(model, 3, "cls")
    encoder = build_sentence_encoder(model, 3, "mean", bidirectional=True)
    with pytest.raises(UserInputError, match="bidirectional: True is not valid; sentence-transformers would build"):
        save_sentence_transformer(encoder, None, tmp_path / "saved", 16)


runner = CliRunner()


@pytest.mark.parametrize(("model", "changes", "message"), [
    ("bert", {"train": {"epochs": 1, "bidirectional": True}},
     "train.bidirectional: True is not valid; bert attends both ways already (an encoder): leave it false"),
    ("llama", {"train": {"epochs": 1, "pooling": "cls"}},
     "train.pooling: 'cls' is not valid; llama attends causally"),
    ("llama", {"train": {"epochs": 1, "bidirectional": True}, "save": "best_per_cell"},
     "train.bidirectional: True is not valid; save: best_per_cell writes sentence-transformers folders, which build a "
     "decoder causal again when loaded"),
])
def test_what_cannot_attend_both_ways_is_one_line_in_validate(model, changes, message, tmp_path, synthetic_data_dir,
                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = save_family(model, tmp_path / model)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "both", "model": folder, "ablate": {"layer": [1, 2]},
                                    "data_dir": str(synthetic_data_dir), **changes}))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["study.yaml", model])  # nothing written
    fixed = {**changes, "train": {**changes["train"], "bidirectional": model == "llama"}, "save": "none"}
    path.write_text(yaml.safe_dump({"name": "both", "model": folder, "ablate": {"layer": [1, 2]},
                                    "data_dir": str(synthetic_data_dir), **fixed}))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output


def test_a_model_that_attends_both_ways_already_is_not_switched_twice(tmp_path):
    """EmbeddingGemma's config switches it already: switching again would halve its sliding window twice."""
    folder = save_family("embeddinggemma", tmp_path / "embeddinggemma")
    with pytest.raises(UserInputError, match=r"bidirectional: True is not valid; gemma3_text attends both ways "
                                             r"already \(its config says so\): leave it false"):
        load_encoder(folder, bidirectional=True)


def test_probe_bidirectional_on_an_encoder_is_one_line(tmp_path, synthetic_data_dir):
    folder = save_family("bert", tmp_path / "bert")
    result = runner.invoke(app, ["probe", "--model", folder, "--bidirectional", "--data-dir", str(synthetic_data_dir)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        "error: --bidirectional: True is not valid; bert attends both ways already (an encoder): leave it false"]


def test_a_probe_studys_decoder_settings_are_checked_before_any_trial(tmp_path, synthetic_data_dir, monkeypatch):
    """A study of the `probe` kind (its trials score every layer) gets the model checks a cutting kind gets:
    `bidirectional` on an encoder, `cls` on a causal decoder, one line each, before any trial."""
    monkeypatch.chdir(tmp_path)
    for model, train, expected in (
            ("bert", {"bidirectional": True, "append_eos": True},  # this word-level tokenizer names an EOS
             ["error: train.bidirectional: True is not valid; bert attends both ways already (an encoder): leave it "
              "false"]),
            ("llama", {}, ["error: ablate.pooling: 'cls' is not valid; llama attends causally, so its first token "
                           "sees nothing after it: use last_token or mean"])):
        folder = save_family(model, tmp_path / model)
        path = tmp_path / f"{model}.yaml"
        path.write_text(yaml.safe_dump({"name": "probed", "trainable": "probe", "model": folder, "train": train,
                                        "ablate": {"pooling": ["mean", "cls"]}, "data_dir": str(synthetic_data_dir)}))
        result = runner.invoke(app, ["validate", str(path)])
        assert result.exit_code == 2, result.output
        assert result.stderr.strip().splitlines() == [line.format(folder=folder) for line in expected]
