"""Build loadable tiny checkpoints from the published-config corpus (tests/fixtures/published/<org>/<repo>).

Every config key is kept exactly as published (old keys included) except the size keys listed per class in
tests/helpers/published_sizes.py, which are replaced by tiny values that agree across components. Weights are random: the reference diffusers / transformers class is built
from the scaled config and saves its weights, then config.json is overwritten with the scaled published dict,
so a key today's class no longer has still reaches our loader. Tokenizers are the tiny offline ones of
tests/helpers (their vocabulary size becomes the text encoder's `vocab_size`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from tests.helpers.published_sizes import OMNI_MEL_BINS, SIZES, scaled

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "published"
CONFIG_FILES = ("config.json", "scheduler_config.json", "guider_config.json", "preprocessor_config.json")

def _wan_tokenizer():
    from vidloom.demo.tokenizer import train_t5_tokenizer

    return train_t5_tokenizer()


def _qwen_tokenizer():
    from tests.helpers.flux2_checkpoints import train_qwen_tokenizer

    return train_qwen_tokenizer()


def _qwen_vl_tokenizer():
    from tests.helpers.flux2_checkpoints import SPECIALS, train_qwen_tokenizer
    from tests.helpers.qwen_image_checkpoints import VISION_SPECIALS

    return train_qwen_tokenizer(specials=(*SPECIALS, *VISION_SPECIALS))  # Qwen2.5-VL's vision tokens too


def _byt5_tokenizer():
    from transformers import ByT5Tokenizer

    return ByT5Tokenizer()  # bytes: nothing to train


def _gemma_tokenizer():
    from tests.helpers.ltx2_checkpoints import train_gemma_tokenizer

    return train_gemma_tokenizer()


def _sana_wm_tokenizer():
    from tests.helpers.sana_wm_checkpoints import train_gemma_tokenizer  # its corpus holds SANA-WM's chi prompt

    return train_gemma_tokenizer()


def _cosmos3_tokenizer():
    from tests.helpers.cosmos3_checkpoints import train_tokenizer

    return train_tokenizer()


# model_index.json tokenizer class (or "<pipeline class>/<tokenizer class>" where one pipeline needs its own)
# -> the tiny offline tokenizer written in its place.
TOKENIZERS: dict[str, Callable[[], Any]] = {
    "SanaWMPipeline/GemmaTokenizerFast": _sana_wm_tokenizer,
    "Cosmos3OmniPipeline/Qwen2TokenizerFast": _cosmos3_tokenizer,
    "T5TokenizerFast": _wan_tokenizer,
    "Qwen2TokenizerFast": _qwen_tokenizer,
    "Qwen2Tokenizer": _qwen_vl_tokenizer,  # Qwen-Image's
    "PreTrainedTokenizerFast": _cosmos3_tokenizer,  # Cosmos3's text_tokenizer
    "GemmaTokenizer": _gemma_tokenizer,
    "ByT5Tokenizer": _byt5_tokenizer,
    "GemmaTokenizerFast": _gemma_tokenizer,
}


def corpus_repos() -> list[str]:
    """Every repo id in the corpus ("org/name"), sorted."""
    return sorted(f"{p.parent.parent.name}/{p.parent.name}" for p in CORPUS.glob("*/*/SOURCES.md"))


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _perturb(module: torch.nn.Module, seed: int) -> None:
    # diffusers zero-initialises some output projections; a small random offset keeps every path live
    # while activations stay far from float32 denormals.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def _diffusers_class(library: str, class_name: str) -> type:
    """A model class as model_index.json names it: from diffusers, or from a pipeline module ("ltx2")."""
    import diffusers

    module = diffusers if library == "diffusers" else importlib.import_module(f"diffusers.pipelines.{library}")
    return getattr(module, class_name)


def _diffusers_model(cls: type, config: dict[str, Any], folder: Path, seed: int) -> None:
    torch.manual_seed(seed)
    init = {k: v for k, v in config.items() if not k.startswith("_")}
    model = cls.from_config(init).eval()  # unknown (old) keys are ignored here
    _perturb(model, seed)
    model.save_pretrained(str(folder))


INIT_STD = 0.02  # transformers' initializer_range default (and every corpus config's)


def _transformers_model(class_name: str, config: dict[str, Any], folder: Path, seed: int) -> None:
    import transformers

    torch.manual_seed(seed)
    cls = getattr(transformers, class_name)
    with _uninitialised_as_nan():
        model = cls(cls.config_class.from_dict(config)).eval()
    _draw_uninitialised(model, seed)
    model.save_pretrained(str(folder))


@contextlib.contextmanager
def _uninitialised_as_nan() -> Iterator[None]:
    """torch.empty fills with NaN inside: a parameter the class's _init_weights never reaches is seen, not garbage."""
    import torch.utils.deterministic as deterministic

    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)
        deterministic.fill_uninitialized_memory = fill


def _draw_uninitialised(model: torch.nn.Module, seed: int) -> None:
    # transformers 5.25's Qwen3-Omni _init_weights covers the thinker's stacked experts and routers but not the
    # talker's: its experts (Qwen3OmniMoeTalkerTextExperts, torch.empty) held whatever memory did (denormals, 1e38,
    # inf/NaN bit patterns: the talker's codec logits were NaN in some runs, failing sampling while greedy's argmax
    # hid it) and its routers (Qwen3OmniMoeTalkerTextTopKRouter, torch.zeros) sent every token to the first
    # experts. Both get the std the thinker's get.
    g = torch.Generator().manual_seed(seed)
    empty = [t for t in model.state_dict().values() if t.is_floating_point() and t.isnan().any()]
    routers = [m.weight for m in model.modules() if type(m).__name__.endswith("TopKRouter") and not m.weight.any()]
    with torch.no_grad():
        for tensor in empty + routers:
            tensor.copy_(torch.randn(tensor.shape, generator=g) * INIT_STD)


def _component(src: Path, dst: Path, name: str, library: str, class_name: str, tokenizer: Any, seed: int) -> None:
    """Write component `name` of the scaled folder `dst` from its published files in `src`."""
    files = [f for f in CONFIG_FILES if (src / name / f).is_file()]
    if not files:
        raise FileNotFoundError(f"{src / name}: the corpus has no config file for component {name!r}")
    published = read_json(src / name / files[0])
    if files[0] in ("scheduler_config.json", "guider_config.json"):  # settings, no weights
        write_json(dst / name / files[0], published)
        return
    key = (published.get("architectures") or [class_name])[0] if library == "transformers" else class_name
    if files[0] == "preprocessor_config.json":
        write_json(dst / name / files[0], scaled(published, published.get("image_processor_type", key)))
        return
    config = scaled(published, key, tokenizer)
    if library == "transformers":
        _transformers_model(key, config, dst / name, seed)
    else:
        _diffusers_model(_diffusers_class(library, class_name), config, dst / name, seed)
    write_json(dst / name / "config.json", config)  # as published (scaled), old keys included


def _tokenizer(name: str, pipeline_class: str, tokenizer_class: str, src: Path, dst: Path) -> Any:
    tokenizer = TOKENIZERS.get(f"{pipeline_class}/{tokenizer_class}", TOKENIZERS[tokenizer_class])()
    published = src / name / "tokenizer_config.json"
    if published.is_file():  # the padding length is a setting of the checkpoint, not of the vocabulary
        tokenizer.model_max_length = read_json(published)["model_max_length"]
    tokenizer.save_pretrained(str(dst / name))
    return tokenizer


def build_scaled(repo: str, dst: Path, seed: int = 0) -> Path:
    """A loadable tiny checkpoint folder at `dst` from the corpus folder of `repo` ("org/name")."""
    src = CORPUS / repo
    dst.mkdir(parents=True, exist_ok=True)
    if not (src / "model_index.json").is_file():
        return _build_transformers(src, dst, seed)
    index = read_json(src / "model_index.json")
    for top in src.glob("*.json"):  # model_index.json and any other top-level file, as published
        shutil.copyfile(top, dst / top.name)
    components = {name: entry for name, entry in sorted(index.items())
                  if not name.startswith("_") and isinstance(entry, list) and entry[0] is not None}
    tokenizer = None
    for name in [n for n in components if "tokenizer" in n]:
        tokenizer = _tokenizer(name, index["_class_name"], components.pop(name)[1], src, dst)
    for i, (name, (library, class_name)) in enumerate(components.items()):
        if (src / name / "model_index.json").is_file():
            # A pipeline inside the pipeline (SANA-WM's stage-2 refiner): read only when a deployment turns it on
            # (--two-stage), so it is kept as published, without weights.
            shutil.copytree(src / name, dst / name)
            continue
        _component(src, dst, name, library, class_name, tokenizer, seed + i)
    return dst


def _qwen_omni_files(folder: Path, tokenizer: Any) -> None:
    """The speaker table and the processors' preprocessor_config.json the released folders hold beside the weights."""
    from tests.helpers.qwen_omni_checkpoints import AUDIO_MEL_BINS, OMNI_A, speakers, write_processors

    dit = SIZES["Qwen2_5OmniModel"]["token2wav_config"]["dit_config"]
    assert (OMNI_A.dit["mel_dim"], OMNI_A.dit["enc_emb_dim"], AUDIO_MEL_BINS) == (dit["mel_dim"], dit["enc_emb_dim"],
                                                                                 OMNI_MEL_BINS)
    torch.save(speakers(OMNI_A, tokenizer), folder / "spk_dict.pt")
    write_processors(folder)


def _qwen_omni_tokenizer():
    from tests.helpers.qwen_omni_checkpoints import train_tokenizer

    return train_tokenizer()


def _qwen3_omni_tokenizer():
    from tests.helpers.qwen3_omni_checkpoints import train_tokenizer

    return train_tokenizer()


def _no_files(folder: Path, tokenizer: Any) -> None:
    """Qwen3-Omni: config.json, the weights and the tokenizer (no preprocessor_config.json: chat reads text only)."""


# A transformers folder's config.json `architectures` name -> (the transformers class that builds it, its tiny
# tokenizer, the files written beside the weights). Qwen2.5-Omni's released files name "Qwen2_5OmniModel".
ARCHITECTURES: dict[str, tuple[str, Callable[[], Any], Callable[[Path, Any], None]]] = {
    "Qwen2_5OmniModel": ("Qwen2_5OmniForConditionalGeneration", _qwen_omni_tokenizer, _qwen_omni_files),
    "Qwen2_5OmniForConditionalGeneration": ("Qwen2_5OmniForConditionalGeneration", _qwen_omni_tokenizer,
                                            _qwen_omni_files),
    "Qwen3OmniMoeForConditionalGeneration": ("Qwen3OmniMoeForConditionalGeneration", _qwen3_omni_tokenizer,
                                             _no_files),
}


def _build_transformers(src: Path, dst: Path, seed: int) -> Path:
    """A transformers checkpoint (config.json, weights, tokenizer, the architecture's extra files)."""
    published = read_json(src / "config.json")
    architecture = published["architectures"][0]
    class_name, make_tokenizer, extra_files = ARCHITECTURES[architecture]
    tokenizer = make_tokenizer()
    tokenizer.save_pretrained(str(dst))
    config = scaled(published, architecture, tokenizer)
    _transformers_model(class_name, config, dst, seed)
    write_json(dst / "config.json", config)
    extra_files(dst, tokenizer)
    return dst


def hub_cache(repo: str, folder: Path, cache: Path, revision: str = "0" * 40) -> Path:
    """Lay `folder` out as huggingface_hub's cache holds a download of `repo` (refs/main -> snapshot)."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / revision
    if not snapshot.exists():
        shutil.copytree(folder, snapshot)
        (root / "refs").mkdir(parents=True, exist_ok=True)
        (root / "refs" / "main").write_text(revision)
    return snapshot
