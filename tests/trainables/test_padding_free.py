"""Padding-free batches (trainables.models.padding_free, `padding: packed`): a packed row gives the padded path's
token states, sentence vectors, gradients and trials, to fp32 rounding; the families that cannot run it are
refused, and the list that says which can is the check's own answer on every family."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModel, BertConfig

import trainables.models.padding_free as padding_free
from orchestrator.testing.fixtures import distinct_sts_data
from tests.trainables.test_architectures import DEPTH, FAMILIES, build, poolings
from trainables.errors import UserInputError
from trainables.kinds import KINDS, load_kind
from trainables.models.architectures import cut_view
from trainables.models.batching import encode_tokens
from trainables.models.encoder import SentenceEncoder, prepare_for_training
from trainables.names import PACKED_FAMILIES
from trainables.objectives.sts import CosineMSELoss
from trainables.runtime import linear_schedule
from trainables.training.bi_encoder import build_optimizer, train_step
from trainables.training.checkpoints import PREDICTIONS

CPU = torch.device("cpu")


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny models: one torch thread (conftest's `one_torch_thread`)."""


def sentences(count: int, seed: int, longest: int = 30) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 100) for _ in range(rng.randint(1, longest))] for _ in range(count)]


def tiny_bert(dropout: float = 0.0, masks: str = "fast") -> SentenceEncoder:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout)
    return SentenceEncoder(prepare_for_training(AutoModel.from_config(config), masks), "mean")


def test_the_packed_families_are_those_the_check_passes():
    """PACKED_FAMILIES (what `validate` and `auto` read) is exactly the families whose encoder passes the check:
    BERT's, RoBERTa's (positions from padding_idx + 1), the decoders with causal and sliding-window masks, ModernBERT
    (local attention both ways), not MPNet, DeBERTa (attention of their own) or MobileBERT (its 3-gram embeddings
    read the neighbouring sentence's tokens)."""
    passing = {FAMILIES[f]().model_type for f in FAMILIES if padding_free.packing_refusal(build(f)) is None}
    refused = {FAMILIES[f]().model_type for f in FAMILIES} - passing
    assert passing == PACKED_FAMILIES
    assert {"mpnet", "deberta", "deberta-v2", "mobilebert", "gemma2"} <= refused
    assert "other token states" in padding_free.packing_refusal(build("mobilebert"))


@pytest.mark.parametrize("family", ["bert", "roberta", "modernbert", "qwen3", "gpt2", "embeddinggemma"])
def test_packed_vectors_equal_padded_ones_at_every_cut(family):
    """Every layer k, each pooling the family takes: a packed row's sentence vectors are the padded batch's.
    The sentences (1-9 tokens) are longer than the sliding windows (4), so the local masks matter."""
    model = build(family)
    lists = sentences(6, 1, longest=9)
    for k in range(DEPTH + 1):
        with cut_view(model, k):
            for pooling in poolings(model):
                encoder = SentenceEncoder(model, pooling).eval()
                with torch.no_grad():
                    padded = encode_tokens(encoder, lists, 0, CPU)
                    packed = encode_tokens(encoder, lists, 0, CPU, packed=True)
                torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5, msg=f"{family} k={k} {pooling}")


def test_prompt_and_special_tokens_are_left_out_as_padded():
    torch.manual_seed(0)
    model = tiny_bert().encoder
    lists = [[1, *ids, 2] for ids in sentences(7, 2, longest=12)]
    for prompt_tokens, skipped in ((2, None), (0, [1, 2]), (1, [2])):
        encoder = SentenceEncoder(model, "mean", prompt_tokens=prompt_tokens, skipped_ids=skipped).eval()
        with torch.no_grad():
            torch.testing.assert_close(encode_tokens(encoder, lists, 0, CPU, packed=True),
                                       encode_tokens(encoder, lists, 0, CPU), rtol=1e-5, atol=1e-5)


MODEL = tiny_bert()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=24), budget=st.sampled_from([8, 64, 4096]))
def test_any_batch_packs_to_the_padded_vectors(lengths, budget):
    """Any sentence lengths (1 token to 40, one sentence to 24) and any row budget (rows of one sentence up to all
    of them): the vectors come back in input order and equal the padded path's."""
    rng = random.Random(len(lengths))
    lists = [[rng.randrange(5, 100) for _ in range(n)] for n in lengths]
    encoder = MODEL.eval()
    with torch.no_grad():
        padded = encode_tokens(encoder, lists, 0, CPU)
        packed = encode_tokens(encoder, lists, 0, CPU, tokens_per_chunk=budget, packed=True)
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)


def test_pack_lays_sentences_end_to_end():
    plan = padding_free.pack([[7, 8, 9], [4], [5, 6]], CPU, position_offset=2, attention_groups=[[0], [2, 1]])
    assert plan.input_ids.tolist() == [[7, 8, 9, 4, 5, 6]]
    assert plan.position_ids.tolist() == [[2, 3, 4, 2, 2, 3]]
    assert plan.cu_seqlens.tolist() == [0, 3, 4, 6] and plan.cu_seqlens.dtype == torch.int32
    assert plan.padded_ids(0).tolist() == [[7, 8, 9], [4, 0, 0], [5, 6, 0]]
    assert plan.attention_mask().tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    # the groups' outputs (sentence 0; then 2 and 1) put back in row order
    order = torch.tensor([0, 1, 2, 4, 5, 3])
    assert order[plan.inverse].tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError):
        padding_free.pack([[1], [2]], CPU, attention_groups=[[0]])


def steps(model: SentenceEncoder, packed: bool, count: int = 20, batch: int = 8) -> list[float]:
    """`count` train_step's of cosine MSE on fixed random pairs, as a finetune trial takes them."""
    rng = random.Random(3)
    optimizer = build_optimizer(list(model.named_parameters()), 1e-3, 0.01)
    scheduler = linear_schedule(optimizer, 2, count)
    losses = []
    model.train()
    for step in range(count):
        lists = sentences(2 * batch, 100 + step, longest=24)
        targets = torch.tensor([rng.random() for _ in range(batch)])
        losses.append(train_step(model, CosineMSELoss(), optimizer, scheduler, lists, targets, 0, CPU,
                                 torch.float32, 1.0, packed=packed).item())
    return losses


def test_training_without_dropout_is_the_padded_training():
    """20 steps without dropout: the loss curve and every weight equal the padded path's to fp32 rounding."""
    padded, packed = tiny_bert(), tiny_bert()
    assert steps(padded, False) == pytest.approx(steps(packed, True), rel=1e-5, abs=1e-7)
    for (name, a), (_, b) in zip(padded.named_parameters(), packed.named_parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("masks", ["fast", "torch"])
def test_training_with_dropout_draws_masks(masks):
    """With dropout the packed path drops (its losses are not the dropout-free ones) through the caller's own
    attention dropout, and trains (its loss falls as the padded path's does)."""
    dropped, plain = tiny_bert(0.1, masks), tiny_bert(0.0, masks)
    with_masks, without = steps(dropped, True, count=30), steps(plain, True, count=30)
    assert with_masks != pytest.approx(without, rel=1e-3)
    assert sum(with_masks[-5:]) < sum(with_masks[:5])


def reference_varlen(query, key, value, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                     enable_gqa=False):
    """torch's varlen_attn as its documentation states it, on a CPU: each sequence alone, key j seen by query i
    when i - left <= j <= i + right (-1: no limit)."""
    out = []
    left, right = window_size
    for start, end in zip(cu_q.tolist()[:-1], cu_q.tolist()[1:], strict=True):
        q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))
        i = torch.arange(end - start)[:, None]
        j = torch.arange(end - start)[None, :]
        seen = ((j >= i - left) if left >= 0 else True) & ((j <= i + right) if right >= 0 else True)
        seen = torch.as_tensor(seen).expand(end - start, end - start)
        out.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=seen, scale=scale,
                                                                    enable_gqa=enable_gqa).transpose(0, 1))
    return torch.cat(out)


@pytest.mark.parametrize("family", ["bert", "qwen3", "modernbert"])
def test_the_varlen_call_is_the_padded_attention(monkeypatch, family):
    """The CUDA varlen path's arguments (layout, scale, causal and sliding windows, grouped-query heads), with
    torch's kernel replaced by its documented semantics on a CPU: the same vectors as the padded path."""
    import torch.nn.attention.varlen as varlen

    model = build(family)
    lists = sentences(5, 4, longest=9)
    encoder = SentenceEncoder(model, poolings(model)[0]).eval()
    with torch.no_grad():
        padded = encode_tokens(encoder, lists, 0, CPU)
        calls = []
        monkeypatch.setattr(padding_free, "varlen_usable", lambda *a: True)
        monkeypatch.setattr(varlen, "varlen_attn", lambda *a, **k: calls.append(k) or reference_varlen(*a, **k))
        packed = encode_tokens(encoder, lists, 0, CPU, packed=True)
    assert len(calls) == DEPTH
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)


def test_varlen_runs_only_where_flash_can():
    q = torch.zeros(1, 2, 5, 8)
    assert not padding_free.varlen_usable(q, 0.0, {})  # a CPU
    assert not padding_free.varlen_usable(q.bfloat16(), 0.0, {})


def test_choose_packing():
    model = tiny_bert()
    assert padding_free.choose_packing("padded", model, CPU) == (False, "padding: padded")
    packs, why = padding_free.choose_packing("auto", model, CPU)
    assert not packs and "CPU" in why
    assert padding_free.choose_packing("packed", model, CPU)[0]
    mpnet = SentenceEncoder(build("mpnet"), "mean")
    with pytest.raises(UserInputError) as refused:
        padding_free.choose_packing("packed", mpnet, CPU)
    assert refused.value.key == "padding" and "attention interface" in str(refused.value)


@pytest.fixture(scope="module")
def undropped(tiny_bert_path) -> str:
    """The session's tiny BERT with dropout 0: a packed trial is then the padded trial to rounding."""
    folder = Path(tiny_bert_path).parent / "undropped"
    if not folder.exists():
        shutil.copytree(tiny_bert_path, folder)
        config = json.loads((folder / "config.json").read_text())
        config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return distinct_sts_data(tmp_path_factory.mktemp("distinct"))


@pytest.fixture(scope="module")
def tiny_bert_path(tiny_bert) -> str:
    return tiny_bert


def trial(model: str, data: Path, **changes) -> list[dict]:
    """A `finetune` trial's reports; the last one holds its per-pair test predictions (`predictions`)."""
    reports: list[dict] = []

    def report(metrics: dict, checkpoint_dir: str | None = None) -> None:
        reports.append(dict(metrics))
        if checkpoint_dir is not None and (Path(checkpoint_dir) / PREDICTIONS).exists():
            reports[-1]["predictions"] = pd.read_csv(Path(checkpoint_dir) / PREDICTIONS)

    cfg = {"model": model, "data_dir": str(data), "layer": 2, "epochs": 2, "batch_size": 16, "lr": 1e-3,
           "max_train_samples": 96, "max_eval_samples": 60, "device": "cpu", "num_threads": 1, "precision": "fp32",
           **changes}
    load_kind(KINDS["finetune"]).run(cfg, report)
    return reports


def test_a_packed_trial_reports_the_padded_trials_numbers(undropped, data_dir):
    """A `finetune` trial with `padding: packed` (no dropout): each epoch's loss and dev Spearman, and the test
    Spearman, are the padded trial's; `padding_free` says which way it trained."""
    padded = trial(undropped, data_dir, padding="padded")
    packed = trial(undropped, data_dir, padding="packed")
    assert [r["padding_free"] for r in padded] == [0.0, 0.0] and [r["padding_free"] for r in packed] == [1.0, 1.0]
    for a, b in zip(padded, packed, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
        # Spearman x 100 (no sentence paired with itself: test_fused_trials' data), to the issue's 0.05
        assert b["dev_spearman"] == pytest.approx(a["dev_spearman"], abs=0.05)
    assert packed[-1]["test_spearman"] == pytest.approx(padded[-1]["test_spearman"], abs=0.05)
    pd.testing.assert_frame_equal(packed[-1]["predictions"], padded[-1]["predictions"], check_exact=False,
                                  atol=1e-5, rtol=0)
    assert packed[-1]["test_spearman"] > 30  # it learned the word overlap


def test_packed_trials_with_dropout_score_as_padded_ones(tiny_bert, synthetic_data_dir):
    """With dropout (0.1, its masks drawn over a row instead of a padded grid) a packed trial is another draw of
    the same training, not the same draw: over six seeds its test Spearman's mean is the padded trials' within
    one point (x100; one seed's own spread here reaches 2.4 points either way)."""
    padded = [trial(tiny_bert, synthetic_data_dir, padding="padded", epochs=3, seed=seed) for seed in range(6)]
    packed = [trial(tiny_bert, synthetic_data_dir, padding="packed", epochs=3, seed=seed) for seed in range(6)]
    assert packed[0][0]["train_loss"] != pytest.approx(padded[0][0]["train_loss"], rel=1e-6)  # other masks
    means = [sum(runs[-1]["test_spearman"] for runs in side) / 6 for side in (padded, packed)]
    assert means[1] == pytest.approx(means[0], abs=1.0)
    assert min(means) > 85


def test_packed_is_refused_at_validate_where_it_cannot_train(tiny_bert, synthetic_data_dir, tmp_path):
    """`padding: packed` with a family that does not pack (from its config.json alone), with a mix of layers, or
    with a fixed fused array: one line each, naming the key, the value and the fix; `padded` and `auto` pass."""
    from orchestrator.study.config import parse_study
    from orchestrator.study.plan import build_plan
    from trainables.contract import parse_config
    from trainables.kinds.finetune import FinetuneConfig

    kind = load_kind(KINDS["finetune"])
    mpnet = tmp_path / "mpnet"
    mpnet.mkdir()
    (mpnet / "config.json").write_text(json.dumps({"model_type": "mpnet", "num_hidden_layers": 4}))
    with pytest.raises(UserInputError) as refused:
        kind.check(parse_config(FinetuneConfig, {"model": str(mpnet), "padding": "packed"}))
    assert str(refused.value).startswith(f"padding: 'packed' is not valid; {mpnet} (model_type mpnet) does not "
                                         "run a packed row")
    assert str(refused.value).endswith("use padding: auto or padded")
    kind.check(parse_config(FinetuneConfig, {"model": str(mpnet), "padding": "auto"}))
    with pytest.raises(UserInputError) as mixed:
        kind.check(parse_config(FinetuneConfig, {"model": tiny_bert, "padding": "packed",
                                                 "pooling_layers": "first_last"}))
    assert "pooling_layers: first_last mixes layers" in str(mixed.value)
    with pytest.raises(UserInputError) as unknown:
        kind.check(parse_config(FinetuneConfig, {"model": tiny_bert, "padding": "none"}))
    assert str(unknown.value).startswith("padding: 'none' is not valid") and "packed" in str(unknown.value)

    def study(**changes):
        return parse_study({"name": "s", "model": tiny_bert, "ablate": {"padding": ["padded", "packed"]},
                            "replicate": {"seeds": [0, 1]}, "train": {"epochs": 1}, "data_dir": str(synthetic_data_dir),
                            "tracking": {"mlflow_uri": "sqlite:///x.db"}, **changes})

    plan = build_plan(study(), tmp_path)  # an ablation of the padding itself: two cells
    assert [cell.values["padding"] for cell in plan.cells] == ["padded", "packed"]
    with pytest.raises(UserInputError) as fused:
        build_plan(study(resources={"cpu": 1, "fuse": 2}), tmp_path)
    assert "padding: packed (an array pads its members' batches)" in str(fused.value)
