"""LoRA through peft (`train.lora_rank`): adapters on the blocks a cut keeps, the encoder's own weights
frozen, zero steps = the pretrained model, the saved model peft's merge, loadable without peft."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainables.contract import collect
from trainables.errors import UserInputError
from trainables.kinds import get_kind
from trainables.models.encoder import build_sentence_encoder, load_tokenizer, save_sentence_transformer
from trainables.models.lora import QUERY_VALUE, adapter_parameter_count, add_lora, has_lora, merged

finetune = get_kind("finetune")
IDS = torch.tensor([[2, 40, 41, 42, 3, 0], [2, 43, 44, 45, 46, 3]])
MASK = (IDS != 0).long()


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny models: one torch thread (conftest's `one_torch_thread`)."""


@pytest.fixture()
def config(tiny_bert, synthetic_data_dir):
    return {"model": tiny_bert, "task": "stsb", "layer": 2, "epochs": 2, "lr": 5e-3, "batch_size": 16,
            "data_dir": str(synthetic_data_dir), "precision": "fp32", "device": "cpu", "seed": 3,
            "max_train_samples": 64, "max_eval_samples": 32}


def test_adapters_sit_on_the_kept_blocks_only_they_train_and_before_a_step_nothing_changed(tiny_bert):
    """Cut at 2 of 3 blocks, rank 4 on BERT's query and value (peft's default for bert): 2 blocks x 2
    layers x 4 x (32 + 32) = 1,024 parameters train, none of the encoder's own; lora_B starts at zero, so
    the vectors are the plain cut model's."""
    plain = build_sentence_encoder(tiny_bert, 2, "mean").eval()
    adapted = build_sentence_encoder(tiny_bert, 2, "mean").eval()
    assert add_lora(adapted.encoder, rank=4) == 2 * 2 * 4 * (32 + 32) == adapter_parameter_count(adapted)
    trained = {name for name, p in adapted.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in name for name in trained)
    assert {name.split(".attention")[0] for name in trained} == {"encoder.encoder.layer.0", "encoder.encoder.layer.1"}
    assert {name.split(".")[-4] for name in trained} == {"query", "value"}
    with torch.no_grad():
        torch.testing.assert_close(adapted(IDS, MASK), plain(IDS, MASK), atol=1e-6, rtol=0)


def test_the_merged_model_is_peft_merge_and_unload_and_has_the_plain_model_names(tiny_bert):
    """Adapters with weights (as after training): our merge gives peft's own `merge_and_unload` numbers
    and the plain model's parameter names, and it scores as the adapted model does."""
    from peft import LoraConfig, get_peft_model

    adapted = build_sentence_encoder(tiny_bert, 2, "mean").eval()
    add_lora(adapted.encoder, rank=4, alpha=8)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)
    folded = merged(adapted.encoder)
    assert not has_lora(folded) and has_lora(adapted.encoder)  # the live model keeps its adapters
    plain = build_sentence_encoder(tiny_bert, 2, "mean").encoder
    assert list(folded.state_dict()) == list(plain.state_dict())
    theirs = get_peft_model(build_sentence_encoder(tiny_bert, 2, "mean").encoder,
                            LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"]))
    missing, unexpected = theirs.load_state_dict({f"base_model.model.{k}": v
                                                  for k, v in adapted.encoder.state_dict().items()}, strict=False)
    assert not missing and not unexpected  # the same layers, by the same names
    reference = theirs.merge_and_unload()
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(folded.state_dict()[key], value, atol=1e-6, rtol=0)
    assert any(not torch.allclose(folded.state_dict()[k], plain.state_dict()[k]) for k in plain.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(folded.eval()(IDS, MASK).last_hidden_state,
                                   adapted.encoder(IDS, MASK).last_hidden_state, atol=1e-5, rtol=0)


def test_a_lora_trial_trains_only_the_adapters_and_reports_the_models_size(config):
    """A finetune trial with lora_rank: its scores move, the encoder's own weights are those it loaded,
    `params` is the plain cut model's (the adapters fold into it) and `trained_params` what trained."""
    plain_reports, lora_reports = [], []
    finetune.run(config, collect(plain_reports))
    from trainables.kinds.finetune.learner import FinetuneLearner

    learner_models = []
    original_init = FinetuneLearner.__init__

    def keep(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        learner_models.append(self.model)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FinetuneLearner, "__init__", keep)
        final = finetune.run({**config, "lora_rank": 4}, collect(lora_reports))
    assert final["params"] == plain_reports[-1]["params"]
    assert final["trained_params"] == 1024
    model = learner_models[0]
    pretrained = build_sentence_encoder(config["model"], 2, "mean")
    own = {k: v for k, v in model.encoder.state_dict().items() if "lora_" not in k}
    for key, value in pretrained.encoder.state_dict().items():
        assert torch.equal(own[key.replace("attention.self.query.", "attention.self.query.base_layer.")
                               .replace("attention.self.value.", "attention.self.value.base_layer.")], value), key
    assert any(p.abs().sum() > 0 for n, p in model.named_parameters() if "lora_B" in n)  # the adapters moved
    assert [r["dev_spearman"] for r in lora_reports] != [r["dev_spearman"] for r in plain_reports]


def test_a_saved_lora_model_loads_without_adapters_and_gives_the_trials_vectors(tiny_bert, tmp_path):
    from sentence_transformers import SentenceTransformer

    adapted = build_sentence_encoder(tiny_bert, 2, "mean").eval()
    add_lora(adapted.encoder, rank=4)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)
    folder = save_sentence_transformer(adapted, load_tokenizer(tiny_bert), tmp_path / "m", 32)
    loaded = SentenceTransformer(str(folder), device="cpu")
    assert not any("lora" in name for name, _ in loaded.named_parameters())
    sentences = ["a cat plays in the park", "the dog runs"]
    tokens = load_tokenizer(tiny_bert)(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        ours = adapted(tokens["input_ids"], tokens["attention_mask"])
    torch.testing.assert_close(loaded.encode(sentences, convert_to_tensor=True), ours, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("family", "expected"), [
    ("llama", ["q_proj", "v_proj"]),  # peft's own default
    ("mpnet", ["q", "v"]),  # not in peft's table: the query and value projections by MPNet's names
    ("megatron-bert", ["query", "value"]),
])
def test_every_family_gets_its_query_and_value_projections(family, expected):
    from transformers import AutoConfig, AutoModel

    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=99)
    if family == "llama":
        sizes["num_key_value_heads"] = 1
    encoder = AutoModel.from_config(AutoConfig.for_model(family, **sizes))
    before = encoder.eval()(torch.tensor([[5, 6, 7]])).last_hidden_state
    add_lora(encoder, rank=2)
    adapted = {name.split(".")[-4] for name, p in encoder.named_parameters() if p.requires_grad}
    assert adapted == set(expected) and list(expected) in [list(q) for q in QUERY_VALUE]
    with torch.no_grad():
        torch.testing.assert_close(encoder(torch.tensor([[5, 6, 7]])).last_hidden_state, before, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("change", "message"), [
    ({"lora_alpha": 16}, "lora_alpha: 16.0 is not valid; LoRA is off without lora_rank: set lora_rank (8 is common), "
                          "or remove lora_alpha"),
    ({"lora_targets": ["query"]}, "LoRA is off without lora_rank"),
    ({"lora_rank": 4, "lora_targets": ["query", "nope"]},
     "lora_targets: ['query', 'nope'] is not valid; bert has no linear layer named 'nope'; its linear layers: "
     "dense, key, query, value (or all-linear)"),
    ({"lora_rank": 4, "lora_targets": "every"}, "give a list of linear layer names"),
    ({"lora_rank": 0}, "lora_rank: 0 is not valid; input should be greater than or equal to 1"),
])
def test_lora_settings_that_cannot_work_are_one_line_before_training(config, change, message):
    with pytest.raises(UserInputError) as error:
        finetune.check(finetune.parse({**config, **change}))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_all_linear_adapts_every_linear_layer_of_the_kept_blocks(tiny_bert):
    adapted = build_sentence_encoder(tiny_bert, 2, "mean")
    add_lora(adapted.encoder, rank=2, targets="all-linear")
    layers = {name.rsplit(".lora_", 1)[0] for name, p in adapted.named_parameters() if p.requires_grad}
    linears = [n for n, m in build_sentence_encoder(tiny_bert, 2, "mean").encoder.named_modules()
               if isinstance(m, nn.Linear) and n.startswith("encoder.layer.")]
    assert layers == {f"encoder.{n}" for n in linears} and len(linears) == 2 * 6


def test_validate_names_every_lora_mistake_of_a_study_and_takes_a_rank_axis(tiny_bert, synthetic_data_dir, tmp_path):
    """A study whose LoRA settings are never used (no rank anywhere), one whose targets the model lacks: one
    line each, exit 2, nothing written; `ablate: {lora_rank: [null, 4]}` with an alpha is a valid study."""
    import yaml
    from typer.testing import CliRunner

    from orchestrator.cli import app

    def study(**changes) -> str:
        path = tmp_path / "lora.yaml"
        path.write_text(yaml.safe_dump({
            "name": "lora", "trainable": "finetune", "model": tiny_bert, "data_dir": str(synthetic_data_dir),
            "ablate": {"layer": [1, 2], **changes.pop("ablate", {})}, "train": {"epochs": 1, **changes},
            "tracking": {"mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}))
        return str(path)

    unused = CliRunner().invoke(app, ["validate", study(lora_alpha=16)])
    assert unused.exit_code == 2 and unused.stderr.strip().splitlines() == [
        "error: train.lora_alpha: 16.0 is not valid; LoRA is off without train.lora_rank: set lora_rank (8 is "
        "common), or remove lora_alpha"], unused.output
    bad = CliRunner().invoke(app, ["validate", study(lora_targets=["query", "nope"], ablate={"lora_rank": [None, 4]})])
    assert bad.exit_code == 2 and bad.stderr.strip().splitlines() == [
        "error: train.lora_targets: ['query', 'nope'] is not valid; bert has no linear layer named 'nope'; its "
        "linear layers: dense, key, query, value (or all-linear)"], bad.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lora.yaml"]
    good = CliRunner().invoke(app, ["validate", study(lora_alpha=16, ablate={"lora_rank": [None, 4]})])
    assert good.exit_code == 0 and "4 cells" in good.stdout, good.output


def test_a_contrastive_trial_with_lora_trains_the_adapters_and_its_head_only(tiny_bert, synthetic_data_dir, tmp_path):
    """SimCSE with lora_rank: the encoder's own weights stay as loaded, the adapters move, `params` is the plain cut
    encoder's and `trained_params` the adapters' 1,024 (2 blocks x query and value x 4 x 64) plus SimCSE's MLP
    head used in training (32 x 32 + 32), which trains whole."""
    from tests.trainables.test_contrastive import short_simcse
    from trainables.kinds.contrastive.learner import ContrastiveLearner

    config = short_simcse(tiny_bert, synthetic_data_dir, tmp_path)
    contrastive = get_kind("contrastive")
    plain = contrastive.run(config, collect([]))
    models = []
    original_init = ContrastiveLearner.__init__

    def keep(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        models.append(self.model)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ContrastiveLearner, "__init__", keep)
        final = contrastive.run({**config, "lora_rank": 4}, collect([]))
    assert final["params"] == plain["params"] and final["trained_params"] == 1024 + 32 * 32 + 32
    encoder = models[0].sentence_encoder.encoder
    own = {k.replace(".base_layer.", "."): v for k, v in encoder.state_dict().items() if "lora_" not in k}
    for key, value in build_sentence_encoder(tiny_bert, 2, "mean").encoder.state_dict().items():
        assert torch.equal(own[key], value), key
    assert any(p.abs().sum() > 0 for n, p in encoder.named_parameters() if "lora_B" in n)
    assert final["dev_spearman"] != plain["dev_spearman"]


def test_a_distill_trial_with_lora_trains_the_bi_encoders_adapters_and_restarts_them_as_they_began(
        tiny_bert, synthetic_data_dir, tmp_path):
    """Trans-Encoder with lora_rank: the bi-encoder's own weights stay as loaded and its adapters move, the
    cross-encoder trains whole; `params` is the plain cut bi-encoder's and `trained_params` its adapters' 1,024;
    with restart_each_cycle the restarted bi-encoder gets the adapters it started with (seeded apart from the
    global generator, which the adapters leave as it was)."""
    from trainables.kinds.distill import learner as distill_module
    from trainables.kinds.distill.learner import DistillLearner, restart_bi

    config = {"model": tiny_bert, "task": "stsb", "data_dir": str(synthetic_data_dir), "layer": 2, "cycles": 2,
              "bi_epochs": 1, "bi_lr": 1e-3, "bi_batch_size": 32, "cross_epochs": 1, "cross_lr": 1e-3,
              "cross_batch_size": 32, "bi_max_seq_length": 24, "cross_max_seq_length": 48, "max_train_samples": 96,
              "num_threads": 1, "device": "cpu", "precision": "fp32", "cache_dir": str(tmp_path / "stages")}
    distill = get_kind("distill")
    plain = distill.run(config, collect([]))
    learners = []
    original_init = DistillLearner.__init__

    def keep(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        learners.append(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DistillLearner, "__init__", keep)
        final = distill.run({**config, "lora_rank": 4}, collect([]))
    assert final["params"] == plain["params"] and final["trained_params"] == 1024
    side = learners[0].sides[0]
    own = {k.replace(".base_layer.", "."): v for k, v in side.bi.encoder.state_dict().items() if "lora_" not in k}
    for key, value in build_sentence_encoder(tiny_bert, 2, "mean").encoder.state_dict().items():
        assert torch.equal(own[key], value), key
    assert any(p.abs().sum() > 0 for n, p in side.bi.encoder.named_parameters() if "lora_B" in n)
    assert final["dev_spearman"] != plain["dev_spearman"]
    trained = {k: v.clone() for k, v in side.bi.state_dict().items() if "lora_A" in k}
    state = torch.random.get_rng_state()
    restart_bi(side, learners[0].cfg)
    assert torch.equal(torch.random.get_rng_state(), state)
    began = distill_module.with_adapters(build_sentence_encoder(tiny_bert, 2, "mean"), learners[0].cfg).state_dict()
    restarted = side.bi.state_dict()
    assert all(torch.equal(restarted[k], began[k]) and not torch.equal(restarted[k], trained[k]) for k in trained)
    assert all(not p.abs().sum() for n, p in side.bi.named_parameters() if "lora_B" in n)  # B back at zero
