"""A model's files without torch or transformers: where a hub id or folder resolves, checks of a
folder before anything in it is loaded, and what its `config.json` says (depth, architecture), so
that `validate` and the plan read a model's depth in milliseconds."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from trainables.errors import UserInputError
from trainables.models.packaged import install_hint, packaged_model_path

DEPTH_KEYS = ("num_hidden_layers", "n_layers", "n_layer", "num_layers")  # BERT & co., DistilBERT, GPT-2, T5


def resolve_model_path(name: str) -> str:
    """A local folder as given; a hub id with a packaged copy resolves to that copy (same weights,
    no network); any other hub id is returned for transformers to fetch or read from its cache."""
    if Path(name).expanduser().is_dir():
        refuse_custom_code(Path(name).expanduser(), name)
        refuse_unsafe_weights(Path(name).expanduser(), name)
        return str(Path(name).expanduser())
    packaged = packaged_model_path(name)
    if packaged is not None:
        return str(packaged)
    from trainables.hub import offline_unless_reachable

    offline_unless_reachable()  # a hub id: from the cache only, at once, when the hub cannot be reached
    return name


def refuse_custom_code(folder: Path, name: str) -> None:
    """A model folder that names its own Python classes (`auto_map`) would run that code when loaded with
    trust_remote_code, which no load here passes. Such a folder loads when transformers has its architecture
    natively (its `model_type`, and a tokenizer class transformers ships): the folder's code is then never
    read (real nomic-embed and gte folders). Any other is refused before transformers sees it."""
    import json

    texts = {}
    for file in ("config.json", "tokenizer_config.json"):
        try:
            texts[file] = (folder / file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    for file, text in texts.items():
        if '"auto_map"' not in text:
            continue
        try:
            declared = json.loads(text)
            config = json.loads(texts.get("config.json", "{}"))
        except ValueError:
            declared, config = {}, {}
        native = _native_model_type(config.get("model_type"))
        tokenizer = declared.get("tokenizer_class") if file == "tokenizer_config.json" else None
        if native and (tokenizer is None or _native_tokenizer(tokenizer)):
            continue
        what = (f"its tokenizer class {tokenizer} is not one transformers ships" if native
                else f"its model_type {config.get('model_type')!r} is not one transformers has natively")
        raise UserInputError("model", name, f"{file} has an auto_map and {what}: the folder asks to run its own "
                                            "Python code, which orchestrator never does; use a model of a "
                                            "transformers architecture")


def _native_model_type(model_type: object) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return isinstance(model_type, str) and model_type in CONFIG_MAPPING_NAMES


def _native_tokenizer(name: object) -> bool:
    import transformers

    return isinstance(name, str) and hasattr(transformers, name.removesuffix("Fast")) or (
        isinstance(name, str) and hasattr(transformers, name))


def refuse_unsafe_weights(folder: Path, name: str) -> None:
    """A folder whose weights are only pickles (`pytorch_model*.bin`, no safetensors) is loaded by
    transformers with torch's weights-only unpickler, which refuses any other Python object: checked
    here (once per file) so that such a folder is one line at `validate`, not a failed trial with a
    Ray traceback per retry. Nothing in the file is ever executed."""
    if any(folder.glob("*.safetensors")):
        return
    for file in sorted(folder.glob("pytorch_model*.bin")):
        problem = _unsafe_pickle(str(file), file.stat().st_mtime_ns)
        if problem:
            raise UserInputError("model", name, f"{file.name} holds more than tensors ({problem}); torch loads weights "
                                                "only, and orchestrator never runs a pickle's code: give the "
                                                "folder's weights as model.safetensors")


@functools.lru_cache(maxsize=64)
def _unsafe_pickle(path: str, mtime_ns: int) -> str | None:
    import torch  # only for a folder whose weights are pickles

    try:
        torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 (any refusal or damage is the answer)
        text = str(exc)
        found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
        return f"it names {found.group(1)}" if found else text.strip().splitlines()[0][:160]
    return None


def config_file(name: str) -> Path:
    """The `config.json` of a model folder, of a packaged copy, or of a hub id from the Hugging Face
    cache (fetched once when online, as transformers would)."""
    path = resolve_model_path(name)
    if Path(path).is_dir():
        found = Path(path) / "config.json"
        if not found.is_file():
            raise UserInputError("model", name, "the folder has no config.json: give a transformers model folder")
        return found
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:  # offline when the hub is unreachable (resolve_model_path): the cache only, no retries
        return Path(hf_hub_download(name, "config.json"))
    except (OSError, ValueError, EntryNotFoundError) as exc:
        raise UserInputError("model", name, install_hint(name)) from exc


@functools.lru_cache(maxsize=64)
def _read_config(path: str, mtime_ns: int) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def model_config(name: str) -> dict:
    """The model's `config.json` as a dict."""
    path = config_file(name)
    try:
        return _read_config(str(path), path.stat().st_mtime_ns)
    except (OSError, ValueError) as exc:
        raise UserInputError("model", name, f"its config.json cannot be read ({exc}): re-download the model") from None


def model_depth(name: str) -> int:
    """Number of transformer layers, from `config.json`; an architecture that names it otherwise
    is asked of transformers' own config class."""
    config = model_config(name)
    for key in DEPTH_KEYS:
        if isinstance(config.get(key), int):
            return config[key]
    from transformers import AutoConfig

    return encoder_depth(AutoConfig.from_pretrained(resolve_model_path(name), trust_remote_code=False))


def encoder_depth(config) -> int:
    """Number of transformer layers of a transformers config (DistilBERT calls it n_layers)."""
    depth = getattr(config, "num_hidden_layers", None)
    return int(depth if depth is not None else config.n_layers)


def model_type(name: str) -> str | None:
    return model_config(name).get("model_type")


@functools.lru_cache(maxsize=64)
def declares_eos(name: str) -> bool | None:
    """Whether the model's tokenizer names an EOS token (`tokenizer_config.json`, else
    `special_tokens_map.json`), for `append_eos` before any trial; None when neither file can be read
    (the trial's tokenizer then decides, in its one line)."""
    path = resolve_model_path(name)
    said = None
    for file in ("tokenizer_config.json", "special_tokens_map.json"):
        try:
            if Path(path).is_dir():
                found = Path(path) / file
            else:
                from huggingface_hub import hf_hub_download

                found = Path(hf_hub_download(name, file))
            values = json.loads(found.read_text(encoding="utf-8"))
        except Exception:  # noqa: BLE001 (absent, not cached or damaged: the next file, else unknown)
            continue
        if not isinstance(values, dict):
            continue
        eos = values.get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str) and eos:
            return True
        said = False
    return said


def refuse_append_eos(name: str, key: str = "append_eos") -> None:
    """One line before any trial when `append_eos` asks for an EOS token the model's tokenizer does not name."""
    if declares_eos(name) is False:
        raise UserInputError(key, True, f"the tokenizer of {name} has no EOS token to append: leave it false")
