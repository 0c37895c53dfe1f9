"""Sizes of Qwen3-Omni's thinker text decoder, read from the transformers checkpoint's config.json.

The file nests the decoder under `thinker_config.text_config` (transformers 5.25 `Qwen3OmniMoeTextConfig`);
absent keys take that class's defaults. The keys a part may hold at all are config_keys.py's policies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from vidloom.core.errors import CheckpointError
from vidloom.families.qwen3_omni import config_keys as keys
from vidloom.models.omni_media import POSITION_ID_PER_SECONDS


def _rope(raw: Mapping[str, Any], where: str) -> tuple[float, tuple[int, int, int]]:
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise CheckpointError(f"{where}: rope_type {kind!r} is not supported (default only)")
    section = tuple(int(s) for s in params.get("mrope_section", (24, 20, 20)))
    if len(section) != 3:
        raise CheckpointError(f"{where}: mrope_section {list(section)!r} needs three entries (t, h, w)")
    return float(params.get("rope_theta", raw.get("rope_theta", 1000000.0))), section  # type: ignore[return-value]


@dataclass(frozen=True)
class MoEDecoderConfig:
    """A Qwen3-MoE causal decoder: GQA attention with per-head q/k RMSNorm, sparse or dense MLP per layer."""

    vocab_size: int
    hidden_size: int
    dense_intermediate_size: int  # dense layers (mlp_only_layers, or off the decoder_sparse_step grid)
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    mrope_section: tuple[int, int, int]  # rotary pairs per (t, h, w) axis, interleaved t h w t h w ... (Qwen3-VL)
    attention_bias: bool
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool  # renormalise the top-k router probabilities to sum to one
    decoder_sparse_step: int
    mlp_only_layers: tuple[int, ...]
    shared_expert_intermediate_size: int = 0  # 0: no shared expert (the thinker); the talker has one
    every_layer_sparse: bool = False  # the talker: transformers builds its sparse block in every layer

    @property
    def intermediate_size(self) -> int:
        """The widest MLP activation per token: a dense layer's, or its top-k experts' and the shared expert's
        together (the runtime's decode working-set estimate reads this; runtime.paged_decode.memory_bytes)."""
        routed = self.num_experts_per_tok * self.moe_intermediate_size if self.num_experts else 0
        return max(self.dense_intermediate_size, routed + self.shared_expert_intermediate_size)

    def sparse(self, layer: int) -> bool:
        """Whether `layer` routes through experts (transformers' rule for Qwen3-MoE decoders)."""
        return self.every_layer_sparse or (layer not in self.mlp_only_layers and self.num_experts > 0
                                           and (layer + 1) % self.decoder_sparse_step == 0)

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], where: str, talker: bool = False) -> MoEDecoderConfig:
        """The thinker's text_config (or, `talker`, the talker's), with the transformers class's defaults for absent
        keys; head_dim falls back to hidden_size // num_attention_heads, as its attention does."""
        (keys.TALKER_TEXT if talker else keys.TEXT).check(raw, where)
        if talker and "shared_expert_intermediate_size" not in raw:
            raise CheckpointError(f"{where}: no shared_expert_intermediate_size (the talker's shared expert size)")
        raw = {**_TALKER_DEFAULTS, **raw} if talker else raw
        if raw.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"{where}: hidden_act {raw.get('hidden_act')!r} is not supported (silu only)")
        heads = int(raw.get("num_attention_heads", 28))
        hidden = int(raw.get("hidden_size", 2048))
        kv_heads = raw.get("num_key_value_heads", 4)
        theta, section = _rope(raw, where)
        head_dim = int(raw.get("head_dim") or hidden // heads)
        return cls(
            vocab_size=int(raw.get("vocab_size", 3584)), hidden_size=hidden,
            dense_intermediate_size=int(raw.get("intermediate_size", 18944)),
            num_hidden_layers=int(raw.get("num_hidden_layers", 28)), num_attention_heads=heads,
            num_key_value_heads=heads if kv_heads is None else int(kv_heads), head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), rope_theta=theta, mrope_section=section,
            attention_bias=bool(raw.get("attention_bias", False)),
            num_experts=int(raw.get("num_local_experts", raw.get("num_experts", 128))),
            num_experts_per_tok=int(raw.get("num_experts_per_tok", 8)),
            moe_intermediate_size=int(raw.get("moe_intermediate_size", 768)),
            norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
            decoder_sparse_step=int(raw.get("decoder_sparse_step", 1)),
            mlp_only_layers=tuple(int(n) for n in raw.get("mlp_only_layers") or ()),
            shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size", 0)),
            every_layer_sparse=talker,
        )


# transformers 5.25's Qwen3OmniMoeTalkerTextConfig defaults where they differ from Qwen3OmniMoeTextConfig's (the
# reader's own .get defaults).
_TALKER_DEFAULTS: dict[str, Any] = {"vocab_size": 3072, "hidden_size": 1024, "intermediate_size": 2048,
                                    "num_hidden_layers": 20, "num_attention_heads": 16, "num_key_value_heads": 2,
                                    "moe_intermediate_size": 384, "norm_topk_prob": False}


def predictor_config(raw: Mapping[str, Any], where: str) -> MoEDecoderConfig:
    """The code predictor's sizes (transformers 5.25 `Qwen3OmniMoeTalkerCodePredictorConfig` defaults): a dense
    Qwen3 decoder (q/k head norms, 1-d rotary) that never slides."""
    if raw.get("sliding_window") is not None:
        raise CheckpointError(f"{where}: sliding_window {raw['sliding_window']!r} is not supported (full attention)")
    if raw.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{where}: hidden_act {raw.get('hidden_act')!r} is not supported (silu only)")
    heads, hidden = int(raw.get("num_attention_heads", 16)), int(raw.get("hidden_size", 1024))
    kv_heads = raw.get("num_key_value_heads", 8)
    head_dim = int(raw.get("head_dim") or 128)
    theta, _ = _rope({**raw, "rope_parameters": {"mrope_section": (head_dim // 2, 0, 0),
                                                 **(raw.get("rope_parameters") or {})}}, where)
    return MoEDecoderConfig(
        vocab_size=int(raw.get("vocab_size", 2048)), hidden_size=hidden,
        dense_intermediate_size=int(raw.get("intermediate_size", 3072)),
        num_hidden_layers=int(raw.get("num_hidden_layers", 5)), num_attention_heads=heads,
        num_key_value_heads=heads if kv_heads is None else int(kv_heads), head_dim=head_dim,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), rope_theta=theta, mrope_section=(head_dim // 2, 0, 0),
        attention_bias=bool(raw.get("attention_bias", False)), num_experts=0, num_experts_per_tok=0,
        moe_intermediate_size=0, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=())


@dataclass(frozen=True)
class SpeechConfig:
    """What turns a thinker reply into codec codes: the talker's input ids, the code predictor, the voices."""

    predictor: MoEDecoderConfig  # the code predictor's decoder (dense, 1-d rotary)
    code_groups: int  # codebooks per codec frame: the talker emits the first, the predictor the rest
    accept_hidden_layer: int  # the thinker state a media placeholder's talker row reads (0: the embeddings)
    thinker_hidden_size: int
    codec_eos: int
    codec_nothink: int
    codec_think_bos: int
    codec_think_eos: int
    codec_pad: int
    codec_bos: int
    speakers: Mapping[str, int]  # voice name (lower case) -> codec id
    im_start: int
    user: int  # the id after <|im_start|> in a user turn (the talker reads every user turn)
    assistant: int
    tts_bos: int
    tts_eos: int
    tts_pad: int
    media_ids: tuple[int, ...]  # audio, image and video placeholders (their rows read thinker states)
    spatial_merge_size: int = 2  # an image's patches per talker row along each side (its rows' grid positions)
    position_id_per_seconds: float = POSITION_ID_PER_SECONDS  # a video's rows' time positions per second (talker's)

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], where: str) -> SpeechConfig:
        talker, thinker = raw["talker_config"], raw["thinker_config"]
        predictor = predictor_config(talker.get("code_predictor_config") or {}, f"{where}: code_predictor_config")
        groups = int(talker.get("num_code_groups", 32))
        layers = int(thinker["text_config"].get("num_hidden_layers", 28))
        accept = int(talker.get("accept_hidden_layer", 18))
        if not 0 <= accept <= layers:
            raise CheckpointError(f"{where}: talker_config.accept_hidden_layer {accept} is outside 0..{layers}")
        merge = int(talker.get("spatial_merge_size", 2))
        vision = thinker.get("vision_config")
        towers = int(vision.get("spatial_merge_size", 2)) if isinstance(vision, Mapping) else merge
        if towers != merge:  # an image's talker rows are its thinker placeholders: both merge the same patches
            raise CheckpointError(f"{where}: talker_config.spatial_merge_size {merge} differs from "
                                  f"thinker_config.vision_config.spatial_merge_size {towers}")
        return cls(predictor=predictor, code_groups=groups, accept_hidden_layer=accept,
                   thinker_hidden_size=int(talker.get("thinker_hidden_size", 2048)),
                   codec_eos=int(talker.get("codec_eos_token_id", 4198)),
                   codec_nothink=int(talker.get("codec_nothink_id", 4203)),
                   codec_think_bos=int(talker.get("codec_think_bos_id", 4204)),
                   codec_think_eos=int(talker.get("codec_think_eos_id", 4205)),
                   codec_pad=int(talker.get("codec_pad_id", 4196)), codec_bos=int(talker.get("codec_bos_id", 4197)),
                   speakers={str(k).lower(): int(v) for k, v in (talker.get("speaker_id") or {}).items()},
                   im_start=int(raw.get("im_start_token_id", 151644)), user=int(raw.get("user_token_id", 872)),
                   assistant=int(raw.get("assistant_token_id", 77091)),
                   tts_bos=int(raw.get("tts_bos_token_id", 151672)), tts_eos=int(raw.get("tts_eos_token_id", 151673)),
                   tts_pad=int(raw.get("tts_pad_token_id", 151671)),
                   media_ids=tuple(int(thinker.get(k, d)) for k, d in (("audio_token_id", 151646),
                                                                       ("image_token_id", 151655),
                                                                       ("video_token_id", 151656))),
                   spatial_merge_size=merge,
                   position_id_per_seconds=float(talker.get("position_id_per_seconds", POSITION_ID_PER_SECONDS)))


@dataclass(frozen=True)
class Qwen3OmniConfig:
    """The parts this runtime builds: the thinker's text decoder, and with audio output the talker (its decoder,
    input projections and code predictor; code2wav is not built yet)."""

    thinker: MoEDecoderConfig
    speaks: bool  # enable_audio_output: the checkpoint has a talker and code2wav
    talker: MoEDecoderConfig | None = None  # the talker's decoder
    speech: SpeechConfig | None = None  # the talker's inputs, code predictor and voices

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], where: str = "config.json") -> Qwen3OmniConfig:
        keys.ROOT.check(raw, where)
        thinker = raw.get("thinker_config")
        if not isinstance(thinker, Mapping) or not isinstance(thinker.get("text_config"), Mapping):
            raise CheckpointError(f"{where}: no thinker_config.text_config (not a Qwen3-Omni checkpoint)")
        keys.THINKER.check(thinker, f"{where}: thinker_config")
        text = MoEDecoderConfig.from_raw(thinker["text_config"], f"{where}: thinker_config.text_config")
        speaks = bool(raw.get("enable_audio_output", True))
        talker = raw.get("talker_config")
        if not speaks or not isinstance(talker, Mapping):
            return cls(text, speaks)
        keys.TALKER.check(talker, f"{where}: talker_config")
        return cls(text, speaks, MoEDecoderConfig.from_raw(talker.get("text_config") or {},
                                                           f"{where}: talker_config.text_config", talker=True),
                   SpeechConfig.from_raw(raw, where))
