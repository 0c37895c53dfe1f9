"""Sizes of Qwen2.5-Omni's parts, read from the transformers checkpoint's config.json.

The file nests one config per part (`thinker_config.text_config`, `talker_config`,
`token2wav_config.dit_config` / `bigvgan_config`); each dataclass here reads the keys its module
uses, with transformers' class defaults (5.25, `configuration_qwen2_5_omni.py`) where a key is absent; the
keys each part may hold at all are config_keys.py's policies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from vidloom.core.errors import CheckpointError
from vidloom.families.qwen_omni import config_keys as keys
from vidloom.loading.key_policy import KeyPolicy


def _rope(raw: Mapping[str, Any], where: str) -> tuple[float, tuple[int, ...]]:
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "mrope"):
        raise CheckpointError(f"{where}: rope_type {kind!r} is not supported (default / mrope only)")
    theta = params.get("rope_theta", raw.get("rope_theta", 1000000.0))
    return float(theta), tuple(params.get("mrope_section", (16, 24, 24)))


@dataclass(frozen=True)
class DecoderConfig:
    """A Qwen2 causal decoder (the thinker's text model, or the talker's)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    mrope_section: tuple[int, ...]  # frequencies per (t, h, w) axis, in consecutive sections (Qwen2-VL layout)
    embedding_size: int  # input width: the thinker's hidden size for both (the talker reads thinker states)

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], where: str, talker: bool = False) -> DecoderConfig:
        """The thinker's text_config, or (`talker`) the talker_config; absent keys take the transformers class's
        defaults, which differ for head_dim: the talker's class says 128, the text class has no such field and
        its attention falls back to hidden_size // num_attention_heads."""
        (keys.TALKER if talker else keys.TEXT).check(raw, where)
        if raw.get("use_sliding_window"):
            raise CheckpointError(f"{where}: use_sliding_window is not supported")
        if raw.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"{where}: hidden_act {raw.get('hidden_act')!r} is not supported (silu only)")
        heads = int(raw.get("num_attention_heads", 28))
        hidden = int(raw.get("hidden_size", 3584))
        theta, section = _rope(raw, where)
        head_dim = raw.get("head_dim", 128 if talker else hidden // heads)
        # Both classes default num_key_value_heads to 4; the text class turns an explicit null into
        # num_attention_heads, the talker class refuses it (an int field), as it refuses a null head_dim.
        kv_heads = raw.get("num_key_value_heads", 4)
        for key, value in (("head_dim", head_dim), ("num_key_value_heads", kv_heads if talker else 0)):
            if value is None:
                raise CheckpointError(f"{where}: {key} is null; transformers needs an integer here")
        return cls(
            vocab_size=int(raw.get("vocab_size", 8448 if talker else 152064)), hidden_size=hidden,
            intermediate_size=int(raw.get("intermediate_size", 18944)),
            num_hidden_layers=int(raw.get("num_hidden_layers", 28)), num_attention_heads=heads,
            num_key_value_heads=heads if kv_heads is None else int(kv_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=theta, mrope_section=section, embedding_size=int(raw.get("embedding_size", hidden)),
        )


@dataclass(frozen=True)
class TalkerTokens:
    """The talker's special ids: codec ids in its own vocabulary, text ids in the thinker's."""

    codec_pad: int
    codec_start: int
    codec_end: int
    codec_mask: int
    text_end: int
    text_pad: int

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> TalkerTokens:
        return cls(int(raw.get("tts_codec_pad_token_id", 8292)), int(raw.get("tts_codec_start_token_id", 8293)),
                   int(raw.get("tts_codec_end_token_id", 8294)), int(raw.get("tts_codec_mask_token_id", 8296)),
                   int(raw.get("tts_text_end_token_id", 151861)), int(raw.get("tts_text_pad_token_id", 151859)))


@dataclass(frozen=True)
class DiTConfig:
    """token2wav's flow-matching DiT (codes + speaker -> mel) and its ECAPA-TDNN reference-mel encoder."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    ff_mult: int
    emb_dim: int
    block_size: int
    look_ahead_layers: tuple[int, ...]
    look_backward_layers: tuple[int, ...]
    repeats: int
    num_embeds: int
    mel_dim: int
    rope_theta: float
    enc_emb_dim: int
    enc_dim: int
    enc_channels: tuple[int, ...]
    enc_kernel_sizes: tuple[int, ...]
    enc_dilations: tuple[int, ...]
    enc_attention_channels: int
    enc_res2net_scale: int
    enc_se_channels: int

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], where: str = "dit_config") -> DiTConfig:
        keys.DIT.check(raw, where)
        # transformers 4.x wrote rope_theta, 5.x rope_parameters; the class default is 10000 either way.
        params = raw.get("rope_parameters") or {"rope_theta": raw.get("rope_theta", 10000.0)}
        theta, _ = _rope({"rope_parameters": params}, where)
        get = raw.get
        return cls(
            int(get("hidden_size", 1024)), int(get("num_hidden_layers", 22)), int(get("num_attention_heads", 16)),
            int(get("head_dim", 64)), int(get("ff_mult", 2)), int(get("emb_dim", 512)), int(get("block_size", 24)),
            tuple(get("look_ahead_layers", (10,))), tuple(get("look_backward_layers", (0, 20))),
            int(get("repeats", 2)), int(get("num_embeds", 8193)), int(get("mel_dim", 80)), theta,
            int(get("enc_emb_dim", 192)), int(get("enc_dim", 128)), tuple(get("enc_channels", (256, 256, 256, 256, 768))),
            tuple(get("enc_kernel_sizes", (5, 3, 3, 3, 1))), tuple(get("enc_dilations", (1, 2, 3, 4, 1))),
            int(get("enc_attention_channels", 64)), int(get("enc_res2net_scale", 2)), int(get("enc_se_channels", 64)),
        )


@dataclass(frozen=True)
class VocoderConfig:
    """token2wav's BigVGAN vocoder (mel -> 24 kHz waveform)."""

    mel_dim: int
    upsample_initial_channel: int
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], where: str = "bigvgan_config") -> VocoderConfig:
        keys.BIGVGAN.check(raw, where)
        get = raw.get
        return cls(int(get("mel_dim", 80)), int(get("upsample_initial_channel", 1536)),
                   tuple(get("resblock_kernel_sizes", (3, 7, 11))),
                   tuple(tuple(d) for d in get("resblock_dilation_sizes", ((1, 3, 5),) * 3)),
                   tuple(get("upsample_rates", (5, 3, 2, 2, 2, 2))), tuple(get("upsample_kernel_sizes", (11, 7, 4, 4, 4, 4))))

    @property
    def hop(self) -> int:
        """Waveform samples per mel frame."""
        hop = 1
        for rate in self.upsample_rates:
            hop *= rate
        return hop


@dataclass(frozen=True)
class OmniConfig:
    """Every part's sizes; `talker` and `dit`/`vocoder` are None when the checkpoint has no audio output."""

    thinker: DecoderConfig
    talker: DecoderConfig | None
    talker_tokens: TalkerTokens | None
    dit: DiTConfig | None
    vocoder: VocoderConfig | None

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], where: str = "config.json") -> OmniConfig:
        """Every part's keys checked against its policy (the towers' too: they are built from the same file)."""
        keys.ROOT.check(raw, where)
        try:
            text = raw["thinker_config"]["text_config"]
        except (KeyError, TypeError):
            raise CheckpointError(f"{where}: no thinker_config.text_config (not a Qwen2.5-Omni checkpoint)") from None
        thinker_raw = raw["thinker_config"]
        _check_parts(thinker_raw, f"{where}: thinker_config", keys.THINKER,
                     {"audio_config": keys.AUDIO, "vision_config": keys.VISION})
        thinker = DecoderConfig.from_raw(text, f"{where}: thinker_config.text_config")
        if not raw.get("enable_audio_output", True) or "talker_config" not in raw:
            return cls(thinker, None, None, None, None)
        talker_raw = raw["talker_config"]
        token2wav = raw.get("token2wav_config") or {}
        _check_parts(token2wav, f"{where}: token2wav_config", keys.TOKEN2WAV, {})
        return cls(thinker, DecoderConfig.from_raw(talker_raw, f"{where}: talker_config", talker=True),
                   TalkerTokens.from_raw(talker_raw),
                   DiTConfig.from_raw(token2wav.get("dit_config") or {}, f"{where}: token2wav_config.dit_config"),
                   VocoderConfig.from_raw(token2wav.get("bigvgan_config") or {},
                                          f"{where}: token2wav_config.bigvgan_config"))


def _check_parts(raw: Mapping[str, Any], where: str, policy: KeyPolicy, parts: Mapping[str, KeyPolicy]) -> None:
    """`raw`'s own keys, then each nested part's (the ones no dataclass here reads, such as the towers')."""
    policy.check(raw, where)
    for name, part in parts.items():
        if isinstance(raw.get(name), Mapping):
            part.check(raw[name], f"{where}.{name}")
