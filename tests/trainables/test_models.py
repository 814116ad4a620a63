from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModel,
    BertConfig,
    DebertaV2Config,
    DistilBertConfig,
    ElectraConfig,
    MPNetConfig,
    RobertaConfig,
)

from tests.conftest import MINILM
from trainables.errors import UserInputError
from trainables.models.encoder import (
    SentenceEncoder,
    build_sentence_encoder,
    count_parameters,
    encoder_layers,
    last_hidden_state,
    load_config,
    load_encoder,
    load_tokenizer,
    pool,
    resolve_model_path,
    truncate_encoder,
    truncated_parameter_count,
)

SMALL = dict(vocab_size=100, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=64)
CONFIGS = {
    "bert": lambda: BertConfig(**SMALL),
    "electra": lambda: ElectraConfig(**SMALL, embedding_size=16),
    "roberta": lambda: RobertaConfig(**SMALL, pad_token_id=1),
    "deberta-v2": lambda: DebertaV2Config(**SMALL, relative_attention=True, position_buckets=8,
                                          pos_att_type=["p2c", "c2p"]),
    # MPNet: its relative position bias lives in the encoder, shared by every block (a cut must keep it)
    "mpnet": lambda: MPNetConfig(**SMALL),
    "distilbert": lambda: DistilBertConfig(vocab_size=100, dim=32, n_layers=4, n_heads=2, hidden_dim=64,
                                           max_position_embeddings=64),
}


def _inputs():
    torch.manual_seed(1)
    ids = torch.randint(5, 100, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    return ids, mask


@pytest.mark.parametrize("family", sorted(CONFIGS))
@pytest.mark.parametrize("k", [0, 1, 3, 4])
def test_truncation_is_exact_surgery(family, k):
    torch.manual_seed(0)
    full = AutoModel.from_config(CONFIGS[family]()).eval()
    ids, mask = _inputs()
    with torch.no_grad():
        expected = full(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[k]
    before = count_parameters(full)
    predicted = truncated_parameter_count(full, k)
    cut = truncate_encoder(full, k)
    assert len(encoder_layers(cut)) == k
    assert count_parameters(cut) == predicted
    assert count_parameters(cut) < before or k == 4
    with torch.no_grad():
        got = last_hidden_state(cut, ids, mask)
    valid = mask.bool()
    torch.testing.assert_close(got[valid], expected[valid], atol=1e-5, rtol=1e-5)


def test_truncating_removes_the_compute_of_later_layers():
    model = AutoModel.from_config(BertConfig(**SMALL))
    per_layer = count_parameters(encoder_layers(model)[0])
    pooler = count_parameters(model.pooler)
    full = count_parameters(model)
    truncate_encoder(model, 1)
    assert count_parameters(model) == full - 3 * per_layer - pooler
    assert model.config.num_hidden_layers == 1


def test_layer_above_depth_names_the_depth():
    model = AutoModel.from_config(BertConfig(**SMALL))
    with pytest.raises(UserInputError, match=r"layer: 5 is not valid; this model has 4 layers: use 0\.\.4"):
        truncate_encoder(model, 5)


def test_pooling_methods_ignore_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 6.0], [100.0, -100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    torch.testing.assert_close(pool(hidden, mask, "mean"), torch.tensor([[2.0, 4.0]]))
    torch.testing.assert_close(pool(hidden, mask, "cls"), torch.tensor([[1.0, 2.0]]))
    torch.testing.assert_close(pool(hidden, mask, "max"), torch.tensor([[3.0, 6.0]]))
    torch.testing.assert_close(pool(hidden, mask, "mean_sqrt_len"), torch.tensor([[4.0, 8.0]]) / 2 ** 0.5)
    with pytest.raises(UserInputError,
                       match="pooling: 'sum' is not valid; use one of: cls, last_token, max, mean, mean_sqrt_len"):
        pool(hidden, mask, "sum")


def test_projection_head_and_random_init(tiny_bert):
    pretrained = build_sentence_encoder(tiny_bert, layer=2, projection_dim=8)
    assert pretrained(*_inputs()).shape == (3, 8)
    a = build_sentence_encoder(tiny_bert, layer=2, random_init=True, seed=3)
    b = build_sentence_encoder(tiny_bert, layer=2, random_init=True, seed=3)
    c = build_sentence_encoder(tiny_bert, layer=2, random_init=True, seed=4)
    word = "encoder.embeddings.word_embeddings.weight"
    assert torch.equal(a.state_dict()[word], b.state_dict()[word])
    assert not torch.equal(a.state_dict()[word], c.state_dict()[word])
    assert not torch.equal(a.state_dict()[word], pretrained.state_dict()[word])
    assert count_parameters(a) == count_parameters(pretrained) - (32 * 8 + 8)


def test_packaged_minilm_resolves_offline(minilm_path):
    assert resolve_model_path(MINILM) == str(minilm_path)
    model = load_encoder(MINILM)
    assert model.config.num_hidden_layers == 6 and model.config.hidden_size == 384
    encoder = SentenceEncoder(model).eval()
    from transformers import AutoTokenizer

    batch = AutoTokenizer.from_pretrained(minilm_path)(["a man plays a guitar", "a dog"], padding=True,
                                                      return_tensors="pt")
    with torch.no_grad():
        vectors = encoder(batch["input_ids"], batch["attention_mask"])
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    torch.testing.assert_close(vectors, (hidden * mask).sum(1) / mask.sum(1))  # mean over real tokens only
    assert not torch.allclose(vectors[1], hidden[1].mean(0))  # the padded row's plain mean differs


def test_local_folder_wins_and_unknown_model_is_a_clear_error(tiny_bert, tmp_path, monkeypatch):
    assert resolve_model_path(tiny_bert) == tiny_bert
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserInputError, match="model: 'no-such-org/no-such-model' is not valid"):
        load_encoder("no-such-org/no-such-model")


def test_a_model_folder_that_asks_to_run_its_own_code_is_refused_before_loading(tiny_bert, tmp_path):
    """transformers would ask "run the custom code? [y/N]" and, answered y, run the folder's Python inside
    `validate`; the folder is refused in one line before transformers reads it. A folder whose auto_map
    names code for an architecture transformers has natively (real nomic-embed and gte folders) loads that
    native class, and its code is never run."""
    import json
    import shutil

    from trainables.errors import UserInputError
    from trainables.models.encoder import load_config, load_encoder, load_tokenizer

    ran = tmp_path / "pwned"
    config = json.loads((Path(tiny_bert) / "config.json").read_text())
    hostile, native = tmp_path / "hostile", tmp_path / "native"
    for folder, model_type in ((hostile, "evil_bert"), (native, "bert")):
        shutil.copytree(tiny_bert, folder)
        (folder / "evil.py").write_text(f"open({str(ran)!r}, 'w').write('ran')\n")
        (folder / "config.json").write_text(json.dumps({**config, "model_type": model_type,
                                                        "auto_map": {"AutoConfig": "evil.EvilConfig",
                                                                     "AutoModel": "evil.EvilModel"}}))
    for load in (load_config, load_tokenizer):
        with pytest.raises(UserInputError, match=r"config.json has an auto_map and its model_type 'evil_bert' is "
                                                 r"not one transformers has natively: the folder asks to run its own"):
            load(str(hostile))
    assert type(load_encoder(str(native))).__name__ == "BertModel" and load_tokenizer(str(native)) is not None
    assert not ran.exists()
    load_config(tiny_bert)  # an ordinary folder still loads


class Hostile:
    def __reduce__(self):  # a plain-Python function: its pickle names shutil.rmtree whatever patched builtins
        return (shutil.rmtree, ("/nonexistent-never-run",))


def test_pickled_weights_load_and_a_pickle_with_code_is_refused_in_one_line(tiny_bert, tmp_path):
    """A folder with only `pytorch_model.bin` loads as before; one whose pickle names any other Python
    object used to pass `validate` and fail every trial with a Ray traceback per retry."""
    import torch
    from safetensors.torch import load_file

    weights = load_file(Path(tiny_bert) / "model.safetensors")
    pickled = tmp_path / "pickled"
    shutil.copytree(tiny_bert, pickled)
    (pickled / "model.safetensors").unlink()
    torch.save(weights, pickled / "pytorch_model.bin")
    loaded = load_encoder(str(pickled))
    name = next(iter(weights))
    assert torch.equal(dict(loaded.named_parameters())[name.removeprefix("bert.")], weights[name])

    hostile = tmp_path / "hostile"
    shutil.copytree(pickled, hostile)
    torch.save({**weights, "extra": Hostile()}, hostile / "pytorch_model.bin")
    for load in (load_config, load_tokenizer, load_encoder):
        with pytest.raises(UserInputError, match=r"^model: '.*hostile' is not valid; pytorch_model.bin holds more "
                                                 r"than tensors \(it names shutil\.rmtree\); .* model.safetensors$"):
            load(str(hostile))
