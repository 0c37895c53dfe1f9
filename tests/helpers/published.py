"""Build loadable tiny checkpoints from the published-config corpus (tests/fixtures/published/<org>/<repo>).

Every config key is kept exactly as published (old keys included) except the size keys listed per class in
SIZES, which are replaced by tiny values that agree across components (text width = the encoder's hidden size,
image width = the CLIP tower's, ...). Weights are random: the reference diffusers / transformers class is built
from the scaled config and saves its weights, then config.json is overwritten with the scaled published dict,
so a key today's class no longer has still reaches our loader. Tokenizers are the tiny offline ones of
tests/helpers (their vocabulary size becomes the text encoder's `vocab_size`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "published"
CONFIG_FILES = ("config.json", "scheduler_config.json", "preprocessor_config.json")

_CLIP_SIDE = 32  # tiny CLIP input side; patch 8 -> 16 patches + CLS = 17 tokens
_QWEN3 = dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
              num_hidden_layers=28)  # FLUX.2-klein reads hidden states 9, 18 and 27: at least 28 layers

# Size keys per class (diffusers `_class_name` or transformers `architectures[0]`) -> tiny value. A key is only
# replaced where the published file has it with a non-null value; every other key is kept as published.
SIZES: dict[str, dict[str, Any]] = {
    "WanTransformer3DModel": dict(num_attention_heads=2, attention_head_dim=12, ffn_dim=32, num_layers=2,
                                  text_dim=32, freq_dim=16, image_dim=24, added_kv_proj_dim=24,
                                  pos_embed_seq_len=2 * ((_CLIP_SIDE // 8) ** 2 + 1)),
    "AutoencoderKLWan": dict(base_dim=8, decoder_base_dim=12, num_res_blocks=1),
    "UMT5EncoderModel": dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                             relative_attention_num_buckets=8, relative_attention_max_distance=32),
    "CLIPVisionModelWithProjection": dict(hidden_size=24, intermediate_size=48, num_hidden_layers=3,
                                          num_attention_heads=2, image_size=_CLIP_SIDE, patch_size=8,
                                          projection_dim=16),
    "CLIPImageProcessor": dict(size={"shortest_edge": _CLIP_SIDE}, crop_size={"height": _CLIP_SIDE,
                                                                              "width": _CLIP_SIDE}),
    "Flux2Transformer2DModel": dict(num_layers=1, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
                                    joint_attention_dim=3 * _QWEN3["hidden_size"], timestep_guidance_channels=32,
                                    axes_dims_rope=[4, 4, 4, 4]),
    "AutoencoderKLFlux2": dict(block_out_channels=[8, 8, 16, 16], layers_per_block=1, norm_num_groups=4),
    "Qwen3ForCausalLM": dict(_QWEN3, layer_types=["full_attention"] * _QWEN3["num_hidden_layers"]),
    # rope_axes_dim sums to head_dim / 2; the published rope_scaling holds only mrope_section (= rope_axes_dim).
    "Cosmos3OmniTransformer": dict(hidden_size=32, head_dim=8, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, num_hidden_layers=2, rope_axes_dim=[2, 1, 1],
                                   rope_scaling={"mrope_section": [2, 1, 1]}),
}
# Rows a transformer keeps past the tokenizer's vocabulary (the released Cosmos3 checkpoints pad theirs).
VOCAB_PAD = 37


def _wan_tokenizer():
    from vidloom.recipes.wan.demo import train_tokenizer

    return train_tokenizer()


def _qwen_tokenizer():
    from tests.helpers.flux2_checkpoints import train_qwen_tokenizer

    return train_qwen_tokenizer()


def _cosmos3_tokenizer():
    from tests.helpers.cosmos3_checkpoints import train_tokenizer

    return train_tokenizer()


# model_index.json tokenizer class -> the tiny offline tokenizer written in its place.
TOKENIZERS: dict[str, Callable[[], Any]] = {
    "T5TokenizerFast": _wan_tokenizer,
    "Qwen2TokenizerFast": _qwen_tokenizer,
    "PreTrainedTokenizerFast": _cosmos3_tokenizer,  # Cosmos3's text_tokenizer
}


def corpus_repos() -> list[str]:
    """Every repo id in the corpus ("org/name"), sorted."""
    return sorted(f"{p.parent.parent.name}/{p.parent.name}" for p in CORPUS.glob("*/*/SOURCES.md"))


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def scaled(config: dict[str, Any], class_name: str, vocab_size: int | None = None) -> dict[str, Any]:
    """`config` with the size keys of `class_name` replaced (only where published and non-null)."""
    sizes = dict(SIZES.get(class_name, {}))
    if vocab_size is not None:
        sizes["vocab_size"] = vocab_size
    return {key: (sizes[key] if key in sizes and value is not None else value) for key, value in config.items()}


def _perturb(module: torch.nn.Module, seed: int) -> None:
    # diffusers zero-initialises some output projections; a small random offset keeps every path live
    # while activations stay far from float32 denormals.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def _diffusers_model(class_name: str, config: dict[str, Any], folder: Path, seed: int) -> None:
    import diffusers

    torch.manual_seed(seed)
    init = {k: v for k, v in config.items() if not k.startswith("_")}
    model = getattr(diffusers, class_name).from_config(init).eval()  # unknown (old) keys are ignored here
    _perturb(model, seed)
    model.save_pretrained(str(folder))


def _transformers_model(class_name: str, config: dict[str, Any], folder: Path, seed: int) -> None:
    import transformers

    torch.manual_seed(seed)
    cls = getattr(transformers, class_name)
    cls(cls.config_class.from_dict(config)).eval().save_pretrained(str(folder))


def _component(src: Path, dst: Path, name: str, library: str, class_name: str, vocab: int | None, seed: int) -> None:
    """Write component `name` of the scaled folder `dst` from its published files in `src`."""
    files = [f for f in CONFIG_FILES if (src / name / f).is_file()]
    if not files:
        raise FileNotFoundError(f"{src / name}: the corpus has no config file for component {name!r}")
    published = read_json(src / name / files[0])
    if files[0] == "scheduler_config.json":
        write_json(dst / name / files[0], published)
        return
    key = class_name if library == "diffusers" else (published.get("architectures") or [class_name])[0]
    if files[0] == "preprocessor_config.json":
        write_json(dst / name / files[0], scaled(published, published.get("image_processor_type", key)))
        return
    if vocab is not None and library == "diffusers":
        vocab += VOCAB_PAD
    config = scaled(published, key, vocab)
    if library == "diffusers":
        _diffusers_model(class_name, config, dst / name, seed)
    else:
        _transformers_model(key, config, dst / name, seed)
    write_json(dst / name / "config.json", config)  # as published (scaled), old keys included


def build_scaled(repo: str, dst: Path, seed: int = 0) -> Path:
    """A loadable tiny checkpoint folder at `dst` from the corpus folder of `repo` ("org/name")."""
    src = CORPUS / repo
    index = read_json(src / "model_index.json")
    dst.mkdir(parents=True, exist_ok=True)
    for top in src.glob("*.json"):  # model_index.json and any other top-level file, as published
        shutil.copyfile(top, dst / top.name)
    components = {name: entry for name, entry in sorted(index.items())
                  if not name.startswith("_") and isinstance(entry, list) and entry[0] is not None}
    vocab = None
    for name in [n for n in components if "tokenizer" in n]:
        tokenizer = TOKENIZERS[components.pop(name)[1]]()
        tokenizer.save_pretrained(str(dst / name))
        vocab = len(tokenizer)
    for i, (name, (library, class_name)) in enumerate(components.items()):
        _component(src, dst, name, library, class_name, vocab, seed + i)
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
