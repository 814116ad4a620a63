"""Layer k has one meaning per architecture (trainables.models.architectures): for every family in the
table, the encoder cut at k (the surgery fine-tuning does, through its pooling head) gives exactly what
the probe scores as layer k from one pass of the whole model; pre-norm stacks included, where scoring
`hidden_states[k]` as transformers returns it differs from the cut by up to ~4. An architecture outside
the table is one line, and the layer check catches an entry that does not describe its model."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
import transformers as T
from transformers import AutoModel

from trainables.errors import UserInputError
from trainables.evaluation.probe import AllLayers
from trainables.models import layer_check
from trainables.models.architectures import (
    ARCHITECTURES,
    Architecture,
    UnknownArchitectureError,
    architecture_of,
    is_causal,
    layer_states,
    require_architecture,
    stack_depth,
)
from trainables.models.encoder import (
    SentenceEncoder,
    count_parameters,
    last_hidden_state,
    pool,
    prepare_for_training,
    truncate_encoder,
    truncated_parameter_count,
)
from trainables.models.layer_check import LayerMismatchError, check_layers

SMALL = dict(vocab_size=100, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=64)
DECODER = dict(SMALL, num_key_value_heads=1, pad_token_id=0, bos_token_id=1, eos_token_id=2)
SLIDING = dict(sliding_window=4)  # shorter than the test sentences: the local masks matter
FAMILIES = {
    "bert": lambda: T.BertConfig(**SMALL),
    "roberta": lambda: T.RobertaConfig(**SMALL, pad_token_id=1),
    "xlm-roberta": lambda: T.XLMRobertaConfig(**SMALL, pad_token_id=1),
    "camembert": lambda: T.CamembertConfig(**SMALL, pad_token_id=1),
    "distilbert": lambda: T.DistilBertConfig(vocab_size=100, dim=32, n_layers=4, n_heads=2, hidden_dim=64,
                                             max_position_embeddings=64),
    "mpnet": lambda: T.MPNetConfig(**SMALL),
    "electra": lambda: T.ElectraConfig(**SMALL, embedding_size=16),
    "deberta": lambda: T.DebertaConfig(**SMALL, relative_attention=True, pos_att_type=["p2c", "c2p"]),
    "deberta-v2": lambda: T.DebertaV2Config(**SMALL, relative_attention=True, position_buckets=8,
                                            pos_att_type=["p2c", "c2p"]),
    "rembert": lambda: T.RemBertConfig(**SMALL, input_embedding_size=16, output_embedding_size=16,
                                       bos_token_id=None, eos_token_id=None),
    "roformer": lambda: T.RoFormerConfig(**SMALL, embedding_size=16),
    "convbert": lambda: T.ConvBertConfig(**SMALL, embedding_size=16),
    "ernie": lambda: T.ErnieConfig(**SMALL),
    "mobilebert": lambda: T.MobileBertConfig(**SMALL, embedding_size=16, intra_bottleneck_size=16,
                                             true_hidden_size=16, num_feedforward_networks=2),
    "data2vec-text": lambda: T.Data2VecTextConfig(**SMALL, pad_token_id=1),
    "nomic_bert": lambda: T.NomicBertConfig(**SMALL),
    "gte": lambda: T.GteConfig(**SMALL),
    "albert": lambda: T.AlbertConfig(**SMALL, embedding_size=16),
    "megatron-bert": lambda: T.MegatronBertConfig(**SMALL),
    "xlm-roberta-xl": lambda: T.XLMRobertaXLConfig(**SMALL, pad_token_id=1),
    "roberta-prelayernorm": lambda: T.RobertaPreLayerNormConfig(**SMALL, pad_token_id=1),
    "modernbert": lambda: T.ModernBertConfig(**SMALL, global_attn_every_n_layers=2, local_attention=4,
                                             pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                             sep_token_id=2),
    "eurobert": lambda: T.EuroBertConfig(**DECODER, mask_token_id=3),
    "gpt2": lambda: T.GPT2Config(vocab_size=100, n_embd=32, n_layer=4, n_head=2, n_positions=64, bos_token_id=1,
                                 eos_token_id=2),
    "llama": lambda: T.LlamaConfig(**DECODER),
    "mistral": lambda: T.MistralConfig(**DECODER, **SLIDING),
    "qwen2": lambda: T.Qwen2Config(**DECODER, **SLIDING, use_sliding_window=True, max_window_layers=2),
    "qwen3": lambda: T.Qwen3Config(**DECODER, **SLIDING, head_dim=16, use_sliding_window=True, max_window_layers=2),
    "gemma": lambda: T.GemmaConfig(**DECODER, head_dim=16),
    "gemma2": lambda: T.Gemma2Config(**DECODER, **SLIDING, head_dim=16),
    "gemma3_text": lambda: T.Gemma3TextConfig(**DECODER, **SLIDING, head_dim=16, layer_types=[
        "sliding_attention", "full_attention", "sliding_attention", "full_attention"]),
    # EmbeddingGemma: gemma3_text with bidirectional attention
    "embeddinggemma": lambda: T.Gemma3TextConfig(**DECODER, **SLIDING, head_dim=16, use_bidirectional_attention=True),
}
PRE_NORM_ENCODERS = ("megatron-bert", "xlm-roberta-xl", "roberta-prelayernorm")
DEPTH = 4


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny models: one torch thread (conftest's `one_torch_thread`)."""


def build(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return prepare_for_training(AutoModel.from_config(FAMILIES[family]()), "torch").eval()


def inputs() -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(5, 100, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    return {"input_ids": ids, "attention_mask": mask}


class WordTokenizer:
    """A stand-in for a tokenizer: one id per word (in the tiny models' vocabulary), after a start id."""

    pad_token_id = 0

    def __init__(self, padding_side: str = "right"):
        self.padding_side = padding_side

    def __call__(self, sentence: str, truncation: bool = True, max_length: int = 64) -> dict:
        return {"input_ids": [1] + [5 + sum(map(ord, word)) % 95 for word in sentence.split()][: max_length - 1]}


def poolings(model) -> list[str]:
    return ["mean", "last_token"] if is_causal(model.config) else ["mean", "cls"]


def test_every_family_is_in_the_table():
    assert {build_config().model_type for build_config in FAMILIES.values()} <= set(ARCHITECTURES)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cut_at_every_k_equals_the_probes_layer_k(family):
    full = build(family)
    batch = inputs()
    real = batch["attention_mask"].bool()
    first, second = poolings(full)
    with torch.no_grad():
        reference = layer_states(full, batch, list(range(DEPTH + 1)))
        probed = AllLayers(full, range(DEPTH + 1), first)(**batch)
        # the probe cuts after the deepest layer asked for: layers 0..2 of a model cut at 2
        probed_cut = AllLayers(truncate_encoder(copy.deepcopy(full), 2), [0, 1, 2], second)(**batch)
        for k in range(DEPTH + 1):
            cut = truncate_encoder(copy.deepcopy(full), k)
            assert count_parameters(cut) == truncated_parameter_count(full, k)
            states = last_hidden_state(cut, **batch)
            torch.testing.assert_close(states[real], reference[k][real], atol=1e-5, rtol=0)
            # fine-tuning's path: the cut encoder under its pooling head
            torch.testing.assert_close(SentenceEncoder(cut, first)(**batch), probed[:, k], atol=1e-5, rtol=0)
            if k <= 2:
                torch.testing.assert_close(pool(states, batch["attention_mask"], second), probed_cut[:, k],
                                           atol=1e-5, rtol=0)
    assert architecture_of(full).pre_norm == (family in PRE_NORM_ENCODERS or is_causal(full.config)
                                              or family in ("modernbert", "eurobert", "embeddinggemma"))


@pytest.mark.parametrize("family", PRE_NORM_ENCODERS)
def test_pre_norm_encoders_probe_the_cut_not_the_raw_hidden_state(family):
    """What issue 52 measured: the cut returns norm(h_k) while hidden_states[k] is h_k (off by up to 3);
    the probe now scores the former, so probe and fine-tuning see the same vectors at every k."""
    full = build(family)
    batch = inputs()
    with torch.no_grad():
        raw = full(**batch, output_hidden_states=True).hidden_states
        probed = AllLayers(full, range(DEPTH + 1), "mean")(**batch)
        for k in range(DEPTH + 1):
            tuned = SentenceEncoder(truncate_encoder(copy.deepcopy(full), k), "mean")(**batch)
            torch.testing.assert_close(probed[:, k], tuned, atol=1e-5, rtol=0)
            gap = (pool(raw[k], batch["attention_mask"], "mean") - tuned).abs().max()
            if 0 < k < DEPTH:  # (RoBERTa-PreLN's embedding output is itself layer-normed: k = 0 differs little)
                assert gap > 1e-3
            assert gap == 0 or k < DEPTH  # k = L: transformers' last hidden state already has the norm


@pytest.mark.parametrize("family", ["bert", "albert", "modernbert", "gemma2", "gpt2"])
def test_layer_check_passes_once_and_leaves_the_model_whole(family, tmp_path, monkeypatch):
    monkeypatch.setattr(layer_check, "_passed", {})
    full = build(family).train()
    batch = inputs()
    with torch.no_grad():
        before = full.eval()(**batch).last_hidden_state
    full.train()
    found = check_layers(full, WordTokenizer("left" if family == "gemma2" else "right"), None, cache_dir=tmp_path)
    assert sorted(found) == list(range(DEPTH + 1)) and max(found.values()) < 1e-5
    assert full.training and stack_depth(full) == full.config.num_hidden_layers == DEPTH
    with torch.no_grad():
        torch.testing.assert_close(full.eval()(**batch).last_hidden_state, before, atol=0, rtol=0)
    assert check_layers(full, WordTokenizer(), [1, 3], cache_dir=tmp_path) == {}  # remembered in memory
    layer_check._passed.clear()
    assert check_layers(full, WordTokenizer(), [2], cache_dir=tmp_path) == {}  # and in the cache folder
    record = json.loads((tmp_path / layer_check.CACHE_FILE).read_text())
    assert list(record.values()) == [{"model_type": full.config.model_type, "layers": [0, 1, 2, 3, 4]}]


BROKEN_MEGATRON = Architecture("encoder.layer")  # says post-LN: its final LayerNorm (encoder.ln) is left out
MISPLACED = Architecture("encoder.blocks")


def test_layer_check_catches_an_entry_that_does_not_describe_the_model(monkeypatch, tmp_path):
    monkeypatch.setattr(layer_check, "_passed", {})
    model = build("megatron-bert")
    monkeypatch.setitem(ARCHITECTURES.builtins, "megatron-bert", "tests.trainables.test_architectures:BROKEN_MEGATRON")
    with pytest.raises(LayerMismatchError) as caught:
        check_layers(model, WordTokenizer(), [0, 2, 4], cache_dir=tmp_path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("model: 'megatron-bert' fails the layer check; cut at layer ")
    assert "the megatron-bert entry tests.trainables.test_architectures:BROKEN_MEGATRON (blocks encoder.layer, " \
           "final norm None) does not describe this model; fix it: add an entry" in message
    assert not (tmp_path / layer_check.CACHE_FILE).exists()
    monkeypatch.setitem(ARCHITECTURES.builtins, "megatron-bert", "tests.trainables.test_architectures:MISPLACED")
    with pytest.raises(UserInputError, match=re.escape("MegatronBertModel has no block list at 'encoder.blocks'")):
        check_layers(model, WordTokenizer(), [1], cache_dir=tmp_path)


def test_unknown_architecture_is_refused_in_one_line(tmp_path):
    config = T.T5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2)
    model = T.T5EncoderModel(config)
    for refused in (lambda: truncate_encoder(model, 1), lambda: check_layers(model, WordTokenizer(), [1]),
                    lambda: SentenceEncoder(model, "mean")):
        with pytest.raises(UnknownArchitectureError) as caught:
            refused()
        assert "\n" not in str(caught.value)
        assert str(caught.value).startswith("model: 't5' has an architecture without a layer table entry; its "
                                            "model_type 't5' is not one of: albert, bert, camembert, ")
        assert str(caught.value).endswith("under the entry-point group ablation_orchestrator.architectures, named "
                                          "by the model_type; see docs/reference/models.md")
    folder = tmp_path / "t5-folder"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "t5", "num_layers": 2}))
    with pytest.raises(UnknownArchitectureError, match=re.escape(f"model: '{folder}' has an architecture without")):
        require_architecture(str(folder))  # from config.json alone: what validate calls


T5_ENCODER = Architecture("encoder.block", final_norm="encoder.final_layer_norm")


def test_a_registered_entry_makes_a_new_architecture_work(monkeypatch, tmp_path):
    """A plugin's entry (here registered in-process, as the entry-point group does): T5's encoder,
    blocks at encoder.block, a final RMS norm after them."""
    monkeypatch.setattr(layer_check, "_passed", {})
    monkeypatch.setitem(ARCHITECTURES.builtins, "t5", "tests.trainables.test_architectures:T5_ENCODER")
    torch.manual_seed(0)
    model = T.T5EncoderModel(T.T5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=3,
                                        num_heads=2)).eval()
    assert max(check_layers(model, WordTokenizer(), None, cache_dir=tmp_path).values()) < 1e-5
    cut = truncate_encoder(copy.deepcopy(model), 2)
    assert len(cut.encoder.block) == 2 and cut.config.num_layers == 2


def test_last_token_pooling_under_left_and_right_padding():
    hidden = torch.arange(2 * 4 * 2, dtype=torch.float32).reshape(2, 4, 2)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    torch.testing.assert_close(pool(hidden, right, "last_token"), hidden[[0, 1], [1, 3]])
    torch.testing.assert_close(pool(hidden, left, "last_token"), hidden[[0, 1], [3, 3]])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_decoder_sentence_vectors_do_not_depend_on_padding(family):
    """A decoder's last-token and mean vectors of a short sentence in a batch, padded on either side,
    are those of the sentence alone (rotary positions: a left pad shifts every position alike)."""
    model = build(family)
    long, short = torch.randint(5, 100, (1, 7)), torch.randint(5, 100, (1, 3))
    pads = torch.zeros(1, 4, dtype=torch.long)
    with torch.no_grad():
        for p in ("last_token", "mean"):
            encoder = SentenceEncoder(truncate_encoder(copy.deepcopy(model), 3), p)
            alone = encoder(short, torch.ones_like(short))
            for ids, mask in ((torch.cat([short, pads], 1), [1] * 3 + [0] * 4),
                              (torch.cat([pads, short], 1), [0] * 4 + [1] * 3)):
                batch = torch.cat([long, ids]), torch.tensor([[1] * 7, mask])
                torch.testing.assert_close(encoder(*batch)[1], alone[0], atol=1e-5, rtol=0)


def test_cls_is_refused_for_causal_models_only():
    message = ("pooling: 'cls' is not valid; llama attends causally, so its first token sees nothing after it: "
               "use last_token or mean")
    llama = build("llama")
    for refused in (lambda: SentenceEncoder(llama, "cls"), lambda: AllLayers(llama, [1], "cls")):
        with pytest.raises(UserInputError, match=re.escape(message)):
            refused()
    SentenceEncoder(build("embeddinggemma"), "cls")  # bidirectional attention: its first token sees the sentence
    SentenceEncoder(build("bert"), "last_token")


def test_albert_with_several_layer_groups_is_refused():
    model = AutoModel.from_config(T.AlbertConfig(**SMALL, embedding_size=16, num_hidden_groups=2))
    with pytest.raises(UserInputError, match="ALBERT with num_hidden_groups=2 and inner_group_num=1 cannot be cut"):
        truncate_encoder(model, 2)


def test_validate_runs_the_layer_check_in_a_child_process_and_says_its_refusal_in_one_line(tiny_bert, monkeypatch):
    """validate and plan import no torch: the check runs in `python -m trainables.models.layer_check`; a pass
    is exit 0, a refusal its one line, anything else a line saying the check could not run."""
    import subprocess
    from types import SimpleNamespace

    from orchestrator.study.model_check import check_cut_apart

    check_cut_apart(tiny_bert, [1, 3])  # the real child: the tiny BERT passes
    line = json.dumps({"key": "model", "value": "m", "fix": "layer 2 differs by 3.1 (tolerance 1e-4)"})
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=2, stdout=line + "\n",
                                                                            stderr=""))
    with pytest.raises(UserInputError, match=re.escape("model: 'm' is not valid; layer 2 differs by 3.1")):
        check_cut_apart("m", [2])
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=1, stdout="",
                                                                            stderr="Traceback\nMemoryError"))
    with pytest.raises(UserInputError, match=re.escape("its layer check could not run (MemoryError)")):
        check_cut_apart("m", [2])
