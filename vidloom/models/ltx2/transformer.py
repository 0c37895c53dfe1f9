"""The LTX-2 joint audio-video transformer: a video stream and an audio stream that cross-attend.

Each block runs, per stream: self-attention (rotary positions), text cross-attention, then
audio->video and video->audio cross-attention (each side rotated by its own time positions),
then a feed-forward; every sub-layer is AdaLN-modulated by the stream's timestep. Loads diffusers
`LTX2VideoTransformer3DModel` checkpoints through LTX2_TRANSFORMER_NAME_MAP; the block and forward
follow diffusers' order of operations (parity at 1e-5), the module layout is ours. Under sequence parallel
(runtime.parallel.ulysses.apply_sp) each stream is sharded after embedding and gathered before the head (shards.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Hashable, Iterable, Mapping, Sequence

import torch
from torch import Tensor, nn

from vidloom.layers.attention import AttentionFn, attention
from vidloom.layers.block_stack import BlockStack
from vidloom.layers.prompt_kv import PromptKV
from vidloom.layers.sharded import each_resident
from vidloom.loading.key_policy import KeyPolicy, Refusal
from vidloom.models.ltx2.blocks import JointBlock, StreamConditioning, TextKV
from vidloom.models.ltx2.layers import CaptionProjection, TimestepModulation
from vidloom.models.ltx2.rope import RopeSpec, RopeTables, rope_tables
from vidloom.models.ltx2.shards import WHOLE_STREAMS, StreamSharding, StreamShards
# Loaders, the LoRA targets and SANA-WM's refiner name the map here, beside the module it maps onto.
from vidloom.models.ltx2.transformer_names import LTX2_TRANSFORMER_NAME_MAP  # noqa: F401


@dataclass(frozen=True)
class LTX2TransformerConfig:
    """Static shape of the transformer; field names are diffusers' config.json keys."""

    in_channels: int = 128
    out_channels: int = 128
    patch_size: int = 1
    patch_size_t: int = 1
    num_attention_heads: int = 32
    attention_head_dim: int = 128
    cross_attention_dim: int = 4096
    vae_scale_factors: tuple[int, int, int] = (8, 32, 32)
    pos_embed_max_pos: int = 20
    base_height: int = 2048
    base_width: int = 2048
    gated_attn: bool = False
    cross_attn_mod: bool = False
    audio_in_channels: int = 128
    audio_out_channels: int = 128
    audio_patch_size: int = 1
    audio_patch_size_t: int = 1
    audio_num_attention_heads: int = 32
    audio_attention_head_dim: int = 64
    audio_cross_attention_dim: int = 2048
    audio_scale_factor: int = 4
    audio_pos_embed_max_pos: int = 20
    audio_sampling_rate: int = 16000
    audio_hop_length: int = 160
    audio_gated_attn: bool = False
    audio_cross_attn_mod: bool = False
    num_layers: int = 48
    norm_elementwise_affine: bool = False
    norm_eps: float = 1e-6
    caption_channels: int = 3840
    attention_bias: bool = True
    attention_out_bias: bool = True
    rope_theta: float = 10000.0
    rope_double_precision: bool = True
    causal_offset: int = 1
    timestep_scale_multiplier: int = 1000
    cross_attn_timestep_scale_multiplier: int = 1000
    rope_type: str = "interleaved"
    use_prompt_embeddings: bool = True
    perturbed_attn: bool = False
    ff_bias: bool = True
    audio_ff_bias: bool = True
    use_prompt_adaln_single: bool = True

    @property
    def dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def audio_dim(self) -> int:
        return self.audio_num_attention_heads * self.audio_attention_head_dim

    @property
    def prompt_modulation(self) -> bool:
        """LTX-2.3's timestep-modulated text cross-attention."""
        return self.cross_attn_mod or self.audio_cross_attn_mod

    @classmethod
    def config_keys(cls) -> frozenset[str]:
        """Every config.json key from_diffusers classifies (TRANSFORMER_POLICY); any other is refused."""
        return TRANSFORMER_POLICY.known

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any], where: str = "transformer/config.json") -> LTX2TransformerConfig:
        """Every key is read or refused (TRANSFORMER_POLICY): an unknown or unsupported key is a CheckpointError."""
        TRANSFORMER_POLICY.check(cfg, where)
        values = {f.name: tuple(cfg[f.name]) if isinstance(cfg[f.name], list) else cfg[f.name]
                  for f in fields(cls) if f.name in cfg}
        values["out_channels"] = values.get("out_channels") or values.get("in_channels", cls.in_channels)
        values["audio_out_channels"] = values.get("audio_out_channels") or values.get(
            "audio_in_channels", cls.audio_in_channels)
        config = cls(**values)
        RopeSpec(1, 1, 1.0, True, config.rope_type)  # refuses an unknown rope_type
        if config.audio_cross_attention_dim != config.audio_dim:
            raise ValueError(f"audio_cross_attention_dim {config.audio_cross_attention_dim} must equal the audio "
                             f"width {config.audio_dim} (the audio<->video rotary tables cover it)")
        return config


# diffusers' LTX2VideoTransformer3DModel has had the same __init__ keys since LTX-2's first release (diffusers
# 2026-01, "Add LTX 2.0 Video Pipelines"); convert_ltx2_to_diffusers.py writes only those. Three select layers we
# implement one way only.
TRANSFORMER_POLICY = KeyPolicy(frozenset(f.name for f in fields(LTX2TransformerConfig)), refused={
    "activation_fn": Refusal(("gelu-approximate",), "the feed-forward is built with tanh-approximated GELU"),
    "qk_norm": Refusal(("rms_norm_across_heads",), "query/key RMS norm spans all heads, as every release has it"),
    "use_keyframes_abs_pos_embedding": Refusal((False,), "absolute keyframe position embeddings are not "
                                                         "implemented (no released checkpoint enables them)"),
})


@dataclass(frozen=True)
class LTX2Positions:
    """Patch bounds of one request's tokens (see rope.video_positions / audio_positions)."""

    video: Tensor  # [B, 3, N, 2]
    audio: Tensor  # [B, 1, Na, 2]


LTX2Ropes = tuple[RopeTables, RopeTables, RopeTables, RopeTables]
"""Rotary tables of one call: video, audio, video cross, audio cross (LTX2Transformer.rope_tables)."""


@dataclass(frozen=True)
class LTX2PreparedText:
    """Encoded prompts as every block reads them (LTX2Transformer.prepare_text): what a request's steps read in place
    of its text, prepared once per request and CFG branch (core.denoiser.PreparesPrompt, through LTX2Network and
    diffusion.prompt_kv). Rows follow the prompts' rows and stack like them (the guidance's CFG pair, cross-request
    batching)."""

    video: PromptKV  # every block's video-stream text keys/values
    audio: PromptKV  # every block's audio-stream text keys/values
    mask: Tensor | None  # additive [B, 1, 1, L]; None when every text token is attended

    def block(self, index: int) -> TextKV:
        """Block `index`'s video k, video v, audio k, audio v."""
        return (*self.video.block(index), *self.audio.block(index))

    @property
    def nbytes(self) -> int:
        return self.video.nbytes + self.audio.nbytes + (0 if self.mask is None else self.mask.nbytes)

    def batch_key(self) -> Hashable:
        """Prepared texts stack (runtime.batching) when their streams do; a mask kept or elided stacks either way."""
        return (self.video.batch_key(), self.audio.batch_key())

    def cat(self, other: LTX2PreparedText) -> LTX2PreparedText:
        return self.stack([self, other])

    @staticmethod
    def stack(batches: Sequence[LTX2PreparedText]) -> LTX2PreparedText:
        """The batches' rows in order; an elided mask (every token attended) is the zeros it stands for when
        another batch keeps one."""
        masks = [b.mask for b in batches]
        kept = next((m for m in masks if m is not None), None)
        if kept is not None:
            masks = [kept.new_zeros(b.video.batch, *kept.shape[1:]) if m is None else m for b, m in zip(batches, masks)]
        return LTX2PreparedText(PromptKV.stack([b.video for b in batches]), PromptKV.stack([b.audio for b in batches]),
                                None if kept is None else torch.cat(masks))


@dataclass(frozen=True)
class LTX2Conditioning:
    """What every block and the head read for one call (LTX2Transformer.embed builds it)."""

    video_text: Tensor | None  # None where text_kv holds what the blocks read of it
    audio_text: Tensor | None
    mask: Tensor | None  # additive text mask [B, 1, 1, L]
    video: StreamConditioning
    audio: StreamConditioning
    ropes: LTX2Ropes
    video_emb: Tensor  # the output modulation's embedded timestep
    audio_emb: Tensor
    cross: bool  # audio<->video attention on (off: modalities isolated, a guidance pass)
    skip: frozenset[int]  # blocks whose self-attention is perturbed (STG)
    text_kv: LTX2PreparedText | None = None  # prepared text keys/values per block (else from video/audio_text)
    shards: StreamShards = WHOLE_STREAMS  # how the streams lie over sequence-parallel ranks (shards.py)


class LTX2Transformer(BlockStack, StreamSharding, nn.Module):
    """Velocity for packed video tokens [B, N, C] and audio tokens [B, Na, Ca] at per-sample timesteps."""

    def __init__(self, config: LTX2TransformerConfig, attention_fn: AttentionFn = attention) -> None:
        super().__init__()
        c = self.config = config
        dim, adim = c.dim, c.audio_dim
        self.video_in = nn.Linear(c.in_channels, dim)
        self.audio_in = nn.Linear(c.audio_in_channels, adim)
        if c.use_prompt_embeddings:
            self.video_caption = CaptionProjection(c.caption_channels, dim)
            self.audio_caption = CaptionProjection(c.caption_channels, adim)
        self.video_time = TimestepModulation(dim, 9 if c.cross_attn_mod else 6)
        self.audio_time = TimestepModulation(adim, 9 if c.audio_cross_attn_mod else 6)
        self.video_cross_time = TimestepModulation(dim, 4)
        self.audio_cross_time = TimestepModulation(adim, 4)
        self.video_cross_gate_time = TimestepModulation(dim, 1)
        self.audio_cross_gate_time = TimestepModulation(adim, 1)
        if c.prompt_modulation and c.use_prompt_adaln_single:
            self.video_text_time = TimestepModulation(dim, 2)
            self.audio_text_time = TimestepModulation(adim, 2)
        self.video_out_table = nn.Parameter(torch.zeros(2, dim))
        self.audio_out_table = nn.Parameter(torch.zeros(2, adim))
        self.blocks = nn.ModuleList(JointBlock(c, attention_fn) for _ in range(c.num_layers))
        self.video_out = nn.Linear(dim, c.out_channels)
        self.audio_out = nn.Linear(adim, c.audio_out_channels)
        layout, theta, double = c.rope_type, c.rope_theta, c.rope_double_precision
        self.video_rope = RopeSpec(dim, c.num_attention_heads, theta, double, layout)
        self.audio_rope = RopeSpec(adim, c.audio_num_attention_heads, theta, double, layout)
        # The cross-modal tables rotate the audio-width q/k of a2v / v2a attention by time alone.
        self.video_cross_rope = RopeSpec(c.audio_cross_attention_dim, c.num_attention_heads, theta, double, layout)
        self.audio_cross_rope = RopeSpec(c.audio_cross_attention_dim, c.audio_num_attention_heads, theta, double,
                                         layout)

    def forward(
        self, video: Tensor, audio: Tensor, video_text: Tensor, audio_text: Tensor, text_mask: Tensor | None,
        timestep: Tensor, audio_timestep: Tensor, sigma: Tensor, positions: LTX2Positions, *,
        use_cross_timestep: bool = False,
        isolate_modalities: bool = False, skip_self_attention: frozenset[int] = frozenset(),
    ) -> tuple[Tensor, Tensor]:
        """timestep: [B] or per token [B, N] (sigma x timestep_scale_multiplier); audio_timestep [B] or [B, Na];
        sigma [B]: the step's scaled sigma, which LTX-2.3 conditions text and cross-modal attention on.
        text_mask [B, L]: 1 keeps a text token. `skip_self_attention`: blocks whose self-attention is
        perturbed (spatio-temporal guidance; only on checkpoints built with `perturbed_attn`)."""
        stream, cond = self.embed(
            video, audio, video_text, audio_text, text_mask, timestep, audio_timestep, sigma, positions,
            use_cross_timestep=use_cross_timestep, isolate_modalities=isolate_modalities,
            skip_self_attention=skip_self_attention,
        )
        return self.head(self.run_blocks(stream, cond), cond)

    # The stages below are the denoiser contract (core.denoiser.StagedDenoiser); forward() is exactly their
    # composition. The residual stream is the pair (video tokens [B, N, D], audio tokens [B, Na, Da]).

    def embed(
        self, video: Tensor, audio: Tensor, video_text: Tensor | None, audio_text: Tensor | None,
        text_mask: Tensor | None, timestep: Tensor, audio_timestep: Tensor, sigma: Tensor, positions: LTX2Positions, *,
        use_cross_timestep: bool = False,
        isolate_modalities: bool = False, skip_self_attention: frozenset[int] = frozenset(),
        ropes: LTX2Ropes | None = None, text: LTX2PreparedText | None = None,
    ) -> tuple[tuple[Tensor, Tensor], LTX2Conditioning]:
        """Inputs (as forward) -> the (video, audio) token streams and what every block and the head read.
        `ropes`: rope_tables(positions), computed earlier; `text`: prepare_text(...) of this call's prompts
        (video_text, audio_text and text_mask are then not read)."""
        batch = video.shape[0]
        # 1. Rotary tables from patch bounds.
        ropes = self.rope_tables(positions) if ropes is None else ropes
        # 2. Timestep conditioning of both streams.
        video_cond, video_emb, audio_cond, audio_emb = self._conditioning(
            timestep, audio_timestep, sigma, batch, video.dtype, use_cross_timestep)
        # 3. Text embeddings (LTX-2.0 projects the caption here; LTX-2.3's connectors already did).
        text_kv = None
        if text is not None:
            mask, text_kv = text.mask, text
        else:
            video_text, audio_text = self._project_text(video_text, audio_text)
            mask = self._text_mask(text_mask, video.dtype)
        cond = LTX2Conditioning(
            video_text, audio_text, mask, video_cond, audio_cond, ropes, video_emb, audio_emb,
            cross=not isolate_modalities, skip=self.perturbed_blocks(skip_self_attention), text_kv=text_kv,
        )
        return self.shard_streams((self.video_in(video), self.audio_in(audio)), cond, self.config.rope_type)

    def rope_tables(self, positions: LTX2Positions) -> LTX2Ropes:
        """The rotary tables of `positions` (a function of the positions alone: reusable across steps)."""
        c = self.config
        cross_max = (float(max(c.pos_embed_max_pos, c.audio_pos_embed_max_pos)),)
        return (
            rope_tables(positions.video, (c.pos_embed_max_pos, c.base_height, c.base_width), self.video_rope),
            rope_tables(positions.audio, (c.audio_pos_embed_max_pos,), self.audio_rope),
            rope_tables(positions.video[:, 0:1], cross_max, self.video_cross_rope),
            rope_tables(positions.audio[:, 0:1], cross_max, self.audio_cross_rope),
        )

    @property
    def static_text(self) -> bool:
        """The blocks' text keys and values do not depend on the timestep (no prompt AdaLN), so prepare_text's
        result holds for every step of a request."""
        return not (self.config.prompt_modulation and self.config.use_prompt_adaln_single)

    def prepare_text(self, video_text: Tensor, audio_text: Tensor, text_mask: Tensor | None,
                     dtype: torch.dtype) -> LTX2PreparedText:
        """What embed's `text` takes: every block's text keys/values, and the additive mask (None when it keeps
        every token, which adds nothing). Only for a static_text checkpoint."""
        if not self.static_text:
            raise ValueError("this checkpoint modulates the text by the timestep (prompt AdaLN): its text keys "
                             "and values change every step")
        video_text, audio_text = self._project_text(video_text, audio_text)
        kv = each_resident(self.blocks, lambda block: block.text_kv(video_text, audio_text))  # gathered if sharded
        keep_all = text_mask is None or bool(text_mask.bool().all())
        return LTX2PreparedText(PromptKV(tuple(k[0] for k in kv), tuple(k[1] for k in kv)),
                                PromptKV(tuple(k[2] for k in kv), tuple(k[3] for k in kv)),
                                None if keep_all else self._text_mask(text_mask, dtype))

    def perturbed_blocks(self, blocks: Iterable[int]) -> frozenset[int]:
        """The blocks of `blocks` whose self-attention STG perturbs: none unless the checkpoint was built with
        `perturbed_attn`, and an index past the last block perturbs nothing (as in diffusers)."""
        if not self.config.perturbed_attn:
            return frozenset()
        return frozenset(b for b in blocks if 0 <= b < self.num_blocks)

    def _project_text(self, video_text: Tensor, audio_text: Tensor) -> tuple[Tensor, Tensor]:
        c, batch = self.config, video_text.shape[0]
        if c.use_prompt_embeddings:
            video_text = self.video_caption(video_text).view(batch, -1, c.dim)
            audio_text = self.audio_caption(audio_text).view(batch, -1, c.audio_dim)
        return video_text, audio_text

    @staticmethod
    def _text_mask(text_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
        if text_mask is None:
            return None
        return ((1 - text_mask.to(dtype)) * -10000.0)[:, None, None, :]  # additive, over heads and queries

    def run_blocks(
        self, stream: tuple[Tensor, Tensor], cond: LTX2Conditioning, start: int = 0, end: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Blocks [start, end) over the (video, audio) streams."""
        # 4. Blocks.
        x, a = stream
        for i in range(start, self.num_blocks if end is None else end):
            x, a = self.blocks[i](
                x, a, cond.video_text, cond.audio_text, cond.mask, cond.video, cond.audio, cond.ropes,
                cross=cond.cross, skip_self=i in cond.skip,
                text_kv=None if cond.text_kv is None else cond.text_kv.block(i),
                keys=(cond.shards.video_keys, cond.shards.audio_keys),
            )
        return x, a

    def block_input(self, stream: tuple[Tensor, Tensor], cond: LTX2Conditioning, index: int = 0) -> Tensor:
        """The modulated video tokens block `index` feeds to self-attention (TeaCache's indicator)."""
        return self.blocks[index].self_attention_input(stream[0], cond.video)

    def head(self, stream: tuple[Tensor, Tensor], cond: LTX2Conditioning) -> tuple[Tensor, Tensor]:
        """The streams after the last block -> (video velocity [B, N, C], audio velocity [B, Na, Ca])."""
        # 5. Output modulation and projection (over every token: a sharded stream is gathered first).
        x, a = self.gather_streams(stream, cond.shards)
        return self._out(x, cond.video_emb, self.video_out_table, self.video_out), \
            self._out(a, cond.audio_emb, self.audio_out_table, self.audio_out)

    def _conditioning(
        self, timestep: Tensor, audio_timestep: Tensor, sigma: Tensor, batch: int, dtype: torch.dtype,
        use_cross_timestep: bool,
    ) -> tuple[StreamConditioning, Tensor, StreamConditioning, Tensor]:
        c = self.config
        gate_factor = c.cross_attn_timestep_scale_multiplier / c.timestep_scale_multiplier
        video_mod, video_emb = self.video_time(timestep, batch, dtype)
        audio_mod, audio_emb = self.audio_time(audio_timestep, batch, dtype)
        video_text_mod = audio_text_mod = None
        if c.prompt_modulation and c.use_prompt_adaln_single:
            video_text_mod = self.video_text_time(sigma, batch, dtype)[0]
            audio_text_mod = self.audio_text_time(sigma, batch, dtype)[0]
        # LTX-2.3 conditions cross-modal attention on the other stream's sigma (the pipelines pass one
        # sigma for both streams), LTX-2.0 on the stream's own timestep.
        video_ca_t = sigma.flatten() if use_cross_timestep else timestep.flatten()
        audio_ca_t = sigma.flatten() if use_cross_timestep else audio_timestep.flatten()
        video = StreamConditioning(
            mod=video_mod, text_mod=video_text_mod, cross_mod=self.video_cross_time(video_ca_t, batch, dtype)[0],
            cross_gate=self.video_cross_gate_time(video_ca_t * gate_factor, batch, dtype)[0],
        )
        audio = StreamConditioning(
            mod=audio_mod, text_mod=audio_text_mod, cross_mod=self.audio_cross_time(audio_ca_t, batch, dtype)[0],
            cross_gate=self.audio_cross_gate_time(audio_ca_t * gate_factor, batch, dtype)[0],
        )
        return video, video_emb, audio, audio_emb

    @staticmethod
    def _out(x: Tensor, embedded: Tensor, table: Tensor, proj: nn.Linear) -> Tensor:
        values = table[None, None] + embedded[:, :, None]
        shift, scale = values[:, :, 0], values[:, :, 1]
        x = torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-6)
        return proj(x * (1 + scale) + shift)
