"""The HunyuanVideo-1.5 transformer: dual-stream blocks over [video tokens, condition tokens], where the condition
is the refined Qwen2.5-VL text, the ByT5 glyph text and (image to video) SigLIP image tokens.

Loads diffusers `HunyuanVideo15Transformer3DModel` checkpoints (the `transformer/` folder) through
HUNYUAN15_TRANSFORMER_NAME_MAP. Condition tokens that their masks mark invalid never reach attention: the reference
zeroes and masks them (fully masked rows give 0 there), which leaves the video tokens exactly what attending to the
valid ones alone gives; a batch whose samples keep different counts pads with a key mask. Given the valid counts on
the host (ConditionCounts: the denoise loop's prompts are unpadded, so their lengths are), a forward gathers by
slicing and reads nothing back from the device, so a CUDA graph can capture it; from masks alone (the reference's
calling convention) it reads their valid rows from the device first. Given bucket-padded prompts (`padded`: the
--cuda-graphs path, text.bucketed) it keeps every condition row in place and masks the padding keys instead, as the
reference masks its own max-length padding (boolean SDPA key mask: the padding's attention weights are exactly zero),
so the shapes follow the buckets and one graph serves every prompt length of a bucket.

Under sequence parallel (runtime.parallel.ulysses.apply_sp swaps `sequence` and wraps every block's attention) the
joint stream is sharded right after embedding, padded at its end when it does not split, and gathered before the
head: a rank's rows are video rows, then condition rows, and each block runs each side's weights on its own rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import AttentionFn, attention
from vidloom.layers.sequence import WHOLE_SEQUENCE, SequenceLayout
from vidloom.loading.config_keys import check_class_name
from vidloom.loading.key_policy import KeyPolicy, Refusal
from vidloom.loading.name_map import NameMap
from vidloom.families.hunyuan15.layers import (
    EPS, DualStreamBlock, GlyphProjection, ImageProjection, TimestepMLP, TokenRefiner, video_rotations,
)

DIFFUSERS_CLASS_NAME = "HunyuanVideo15Transformer3DModel"
GLYPH_HIDDEN = 2048  # the glyph projection's inner width (fixed in the reference)
TEXT, GLYPH, IMAGE = 0, 1, 2  # rows of the condition-type embedding
# Every HunyuanVideo15Transformer3DModel.__init__ argument (diffusers 0.42; the published configs carry exactly
# these): read, or refused where a value needs code this family does not have.
TRANSFORMER_POLICY = KeyPolicy(
    frozenset({"in_channels", "out_channels", "num_attention_heads", "attention_head_dim", "num_layers",
               "num_refiner_layers", "mlp_ratio", "patch_size", "patch_size_t", "text_embed_dim",
               "text_embed_2_dim", "image_embed_dim", "rope_theta", "rope_axes_dim", "target_size", "task_type",
               "use_meanflow"}),
    refused={"qk_norm": Refusal(("rms_norm",), "a query/key norm other than rms_norm")},
)


@dataclass(frozen=True)
class Hunyuan15TransformerConfig:
    """Static shape of a HunyuanVideo-1.5 transformer (diffusers config.json names in comments)."""

    in_channels: int = 65  # noisy latents + condition latents + 1 mask channel
    out_channels: int = 32
    num_heads: int = 16  # num_attention_heads
    head_dim: int = 128  # attention_head_dim
    num_layers: int = 54
    num_refiner_layers: int = 2
    mlp_ratio: float = 4.0
    patch_size: int = 1
    patch_size_t: int = 1
    text_dim: int = 3584  # text_embed_dim: Qwen2.5-VL's hidden size
    glyph_dim: int = 1472  # text_embed_2_dim: ByT5's d_model
    image_dim: int = 1152  # image_embed_dim: SigLIP's hidden size
    rope_theta: float = 256.0
    rope_axes: tuple[int, int, int] = (16, 56, 56)  # rope_axes_dim over (frame, height, width)
    target_size: int = 640  # the pixel size the default resolution and I2V's aspect buckets come from
    task_type: str = "i2v"  # "t2v" or "i2v": informational, both take the same inputs
    use_meanflow: bool = False  # a second timestep embedding (timestep_r): the distilled I2V checkpoints

    def __post_init__(self) -> None:
        if sum(self.rope_axes) != self.head_dim or any(a % 2 for a in self.rope_axes):
            raise ValueError(f"rope_axes_dim {list(self.rope_axes)} must be even and sum to attention_head_dim "
                             f"{self.head_dim}")

    @property
    def dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def latent_channels(self) -> int:
        """The VAE's latent channels: in_channels = 2 x latents + 1 mask channel."""
        return (self.in_channels - 1) // 2

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> Hunyuan15TransformerConfig:
        check_class_name(cfg, (DIFFUSERS_CLASS_NAME,), "transformer config")
        TRANSFORMER_POLICY.check(cfg, "transformer config")
        d = cls()
        return cls(
            in_channels=int(cfg.get("in_channels", d.in_channels)),
            out_channels=int(cfg.get("out_channels") or cfg.get("in_channels", d.in_channels)),
            num_heads=int(cfg.get("num_attention_heads", d.num_heads)),
            head_dim=int(cfg.get("attention_head_dim", d.head_dim)),
            num_layers=int(cfg.get("num_layers", d.num_layers)),
            num_refiner_layers=int(cfg.get("num_refiner_layers", d.num_refiner_layers)),
            mlp_ratio=float(cfg.get("mlp_ratio", d.mlp_ratio)),
            patch_size=int(cfg.get("patch_size", d.patch_size)),
            patch_size_t=int(cfg.get("patch_size_t", d.patch_size_t)),
            text_dim=int(cfg.get("text_embed_dim", d.text_dim)),
            glyph_dim=int(cfg.get("text_embed_2_dim", d.glyph_dim)),
            image_dim=int(cfg.get("image_embed_dim", d.image_dim)),
            rope_theta=float(cfg.get("rope_theta", d.rope_theta)),
            rope_axes=tuple(int(a) for a in cfg.get("rope_axes_dim", d.rope_axes)),  # type: ignore[arg-type]
            target_size=int(cfg.get("target_size", d.target_size)),
            task_type=str(cfg.get("task_type", d.task_type)),
            use_meanflow=bool(cfg.get("use_meanflow", d.use_meanflow)),
        )


_REFINER = "context_embedder.token_refiner.refiner_blocks.{n}"
# Per dual-stream block: our name under blocks.{n}.<side> <- diffusers' name under transformer_blocks.{n}.
_BLOCK_PARTS = ("mod", "q", "k", "v", "out", "norm_q", "norm_k", "mlp.up", "mlp.down")
_BLOCK_SIDES = {
    "video": ("norm1.linear", "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.norm_q", "attn.norm_k",
              "ff.net.0.proj", "ff.net.2"),
    "cond": ("norm1_context.linear", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
             "attn.norm_added_q", "attn.norm_added_k", "ff_context.net.0.proj", "ff_context.net.2"),
}
HUNYUAN15_TRANSFORMER_NAME_MAP = NameMap((
    ("x_embedder.proj", "patch_embed"),
    ("image_embedder.linear_1", "image_in.up"),
    ("image_embedder.linear_2", "image_in.down"),
    ("image_embedder", "image_in"),
    ("context_embedder_2.linear_1", "glyph_in.up"),
    ("context_embedder_2.linear_2", "glyph_in.mid"),
    ("context_embedder_2.linear_3", "glyph_in.down"),
    ("context_embedder_2", "glyph_in"),
    ("context_embedder.time_text_embed.timestep_embedder.linear_1", "text_in.time.up"),
    ("context_embedder.time_text_embed.timestep_embedder.linear_2", "text_in.time.down"),
    ("context_embedder.time_text_embed.text_embedder.linear_1", "text_in.pooled.up"),
    ("context_embedder.time_text_embed.text_embedder.linear_2", "text_in.pooled.down"),
    ("context_embedder.proj_in", "text_in.proj_in"),
    (f"{_REFINER}.attn.to_q", "text_in.blocks.{n}.q"),
    (f"{_REFINER}.attn.to_k", "text_in.blocks.{n}.k"),
    (f"{_REFINER}.attn.to_v", "text_in.blocks.{n}.v"),
    (f"{_REFINER}.attn.to_out.0", "text_in.blocks.{n}.out"),
    (f"{_REFINER}.ff.net.0.proj", "text_in.blocks.{n}.mlp.up"),
    (f"{_REFINER}.ff.net.2", "text_in.blocks.{n}.mlp.down"),
    (f"{_REFINER}.norm_out.linear", "text_in.blocks.{n}.gates"),
    (_REFINER, "text_in.blocks.{n}"),
    ("time_embed.timestep_embedder.linear_1", "time_embed.up"),
    ("time_embed.timestep_embedder.linear_2", "time_embed.down"),
    ("time_embed.timestep_embedder_r.linear_1", "time_embed_r.up"),
    ("time_embed.timestep_embedder_r.linear_2", "time_embed_r.down"),
    ("cond_type_embed", "cond_type"),
    ("norm_out.linear", "out_mod"),
    *((f"transformer_blocks.{{n}}.{theirs}", f"blocks.{{n}}.{side}.{ours}")
      for side, names in _BLOCK_SIDES.items() for theirs, ours in zip(names, _BLOCK_PARTS)),
))


@dataclass(frozen=True)
class ConditionCounts:
    """Per sample, how many of its text and glyph rows are valid: the first `text[b]` and `glyph[b]` (prompts pad on
    the right). Host ints, so a forward given them slices instead of boolean-indexing and decides its key masks
    without a device-to-host read (the eager path's unpadded prompts: their lengths are their shapes)."""

    text: tuple[int, ...]
    glyph: tuple[int, ...]


Rows = list[slice] | list[Tensor]  # per sample, which rows of a part are valid: a prefix, or indices read from a mask


@dataclass(frozen=True)
class Hunyuan15Conditioning:
    """What every block of one forward reads."""

    temb: Tensor  # [B, dim] timestep embedding (float32)
    video_tokens: int  # the video rows of this device's part of the joint stream [video (N), condition (L)]
    mask: Tensor | None  # [B, 1, 1, N + L] valid keys over [video, condition], or a sharded stream's pad mask
    rotations: tuple[Tensor, Tensor]  # cos, sin [video_tokens, head_dim] of those video rows
    grid: tuple[int, int, int]  # the token grid (frames, height, width) after patching
    dtype: torch.dtype  # what linears and attention compute in
    length: int = 0  # N + L: the joint stream's rows before a sharded layout padded it


class Hunyuan15Transformer(nn.Module):
    """Predicts the flow velocity of a video latent given text, glyph and image condition tokens."""

    # float32 islands under a bf16 cast (loading.precision.cast_module): the timestep embeddings and modulations.
    KEEP_FP32: ClassVar[frozenset[str]] = frozenset({"time_embed", "time_embed_r", "mod", "out_mod"})

    # Which rows of the joint stream this device holds: all of them, unless sequence parallel swapped in a
    # sharded layout from outside (runtime.parallel.ulysses.apply_sp, with self_attentions()).
    sequence: SequenceLayout = WHOLE_SEQUENCE

    def __init__(self, config: Hunyuan15TransformerConfig, attention_fn: AttentionFn = attention) -> None:
        super().__init__()
        self.config = config
        dim, patch = config.dim, (config.patch_size_t, config.patch_size, config.patch_size)
        self.patch_embed = nn.Conv3d(config.in_channels, dim, kernel_size=patch, stride=patch)
        self.image_in = ImageProjection(config.image_dim, dim)
        self.text_in = TokenRefiner(config.text_dim, dim, config.num_heads, config.num_refiner_layers, attention_fn)
        self.glyph_in = GlyphProjection(config.glyph_dim, GLYPH_HIDDEN, dim)
        self.time_embed = TimestepMLP(dim)
        self.time_embed_r = TimestepMLP(dim) if config.use_meanflow else None
        self.cond_type = nn.Embedding(3, dim)
        self.blocks = nn.ModuleList(DualStreamBlock(dim, config.head_dim, config.mlp_ratio, attention_fn)
                                    for _ in range(config.num_layers))
        self.out_mod = nn.Linear(dim, 2 * dim)
        self.proj_out = nn.Linear(dim, config.patch_size_t * config.patch_size ** 2 * config.out_channels)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def self_attentions(self) -> Iterator[DualStreamBlock]:
        """Every dual-stream block: each attends over the whole joint stream (sequence parallel wraps it). The
        token refiner attends over the text alone, on every rank."""
        yield from self.blocks

    def compile_units(self) -> tuple[nn.Module, ...]:
        """The blocks `--compile` wraps (core.denoiser.CompileUnits)."""
        return tuple(self.blocks)

    def forward(self, latents: Tensor, timestep: Tensor, text: Tensor, text_mask: Tensor, glyph: Tensor,
                glyph_mask: Tensor, image: Tensor | None = None, timestep_r: Tensor | None = None,
                counts: ConditionCounts | None = None, padded: bool = False) -> Tensor:
        """latents [B, in_channels, F, H, W] (noisy latents, condition latents, mask channel), timestep [B] in
        [0, 1000], text [B, L, text_dim] + text_mask [B, L], glyph [B, Lg, glyph_dim] + glyph_mask [B, Lg],
        image [B, Li, image_dim] or None (no image tokens: text to video), timestep_r [B] (meanflow), counts: the
        masks' valid rows as host ints (None: read from the masks), padded: keep the masks' invalid rows as masked
        keys instead (bucket-padded prompts) -> the prediction [B, out_channels, F, H, W]."""
        x, cond = self.embed(latents, timestep, text, text_mask, glyph, glyph_mask, image, timestep_r, counts, padded)
        return self.head(self.run_blocks(x, cond), cond)

    # The stages below are the denoiser contract step caches call (runtime.step_cache.StagedNetwork); forward()
    # is exactly their composition. The residual stream is the joint [video, condition] sequence, in float32
    # (condition tokens: the valid ones of each sample first, as the reference orders them).

    def embed(self, latents: Tensor, timestep: Tensor, text: Tensor, text_mask: Tensor, glyph: Tensor,
              glyph_mask: Tensor, image: Tensor | None = None, timestep_r: Tensor | None = None,
              counts: ConditionCounts | None = None, padded: bool = False) -> tuple[Tensor, Hunyuan15Conditioning]:
        """Inputs -> the joint stream [B, N + L, dim] (float32) and what every block reads. With `counts` (which
        must agree with the masks) or `padded` nothing is read back from the device: shapes follow from host ints
        (the counts, or the padded shapes) alone."""
        config, dtype = self.config, self.patch_embed.weight.dtype
        batch, _, frames, height, width = latents.shape
        grid = (frames // config.patch_size_t, height // config.patch_size, width // config.patch_size)
        temb = self.time_embed.embed_time(timestep.float()).float()
        if timestep_r is not None:
            if self.time_embed_r is None:
                raise ValueError("timestep_r needs a meanflow transformer (use_meanflow)")
            temb = temb + self.time_embed_r.embed_time(timestep_r.float()).float()
        x = self.patch_embed(latents.to(dtype)).flatten(2).transpose(1, 2).float()
        text_mask = text_mask.bool()
        if padded:
            cond, valid = self._padded_condition(text, text_mask, glyph, glyph_mask.bool(), image, timestep, dtype)
            mask = torch.cat([valid.new_ones(batch, x.shape[1]), valid], 1)[:, None, None, :]
        else:
            cond, mask = self._valid_condition(text, text_mask, glyph, glyph_mask, image, timestep, dtype, counts,
                                               x.shape[1])
        cos, sin = video_rotations(grid, config.rope_axes, config.rope_theta, latents.device)
        h = torch.cat([x, cond], dim=1)
        if self.sequence is WHOLE_SEQUENCE:
            return h, Hunyuan15Conditioning(temb, x.shape[1], mask, (cos, sin), grid, dtype, h.shape[1])
        if mask is not None:  # one sample per forward: the guider runs its branches one after the other
            raise ValueError("sequence parallel runs one sample per forward over unpadded prompts (condition counts "
                             "that differ across a batch, or bucket padding, would need a per-sample key mask)")
        # Per-row tables over the joint stream (condition rows have no rotation), so a rank takes its rows' ones.
        tables = tuple(F.pad(t, (0, 0, 0, cond.shape[1])) for t in (cos, sin))
        part = self.sequence.shard_joint(h, tables, x.shape[1])
        video = part.prefix
        return part.tokens, Hunyuan15Conditioning(temb, video, part.key_mask,
                                                  tuple(t[:video] for t in part.tables), grid, dtype, part.length)

    def _valid_condition(self, text: Tensor, text_mask: Tensor, glyph: Tensor, glyph_mask: Tensor,
                         image: Tensor | None, timestep: Tensor, dtype: torch.dtype, counts: ConditionCounts | None,
                         video: int) -> tuple[Tensor, Tensor | None]:
        """The valid condition rows of each sample, in the reference's order (image, glyph, text) -> [B, L, dim]
        (float32, shorter samples zero-padded at the end) and the joint key mask where samples' counts differ."""
        batch = text.shape[0]
        if counts is None:  # masks alone: their valid rows, read from the device
            text_rows, glyph_rows = _rows_of(text_mask), _rows_of(glyph_mask.bool())
        else:
            text_rows = _prefixes(counts.text, batch, text.shape[1], "text")
            glyph_rows = _prefixes(counts.glyph, batch, glyph.shape[1], "glyph")
        padded = any(_count(rows, text.shape[1]) < text.shape[1] for rows in text_rows)
        parts = [(self.text_in(text.to(dtype), timestep, text_mask, padded), text_rows, TEXT),
                 (self.glyph_in(glyph.to(dtype)), glyph_rows, GLYPH)]
        if image is not None:  # every image token is valid
            parts.append((self.image_in(image.to(dtype)), [slice(0, image.shape[1])] * batch, IMAGE))
        # The reference's order: image, glyph, text; valid tokens only.
        parts = [(tokens.float() + self.cond_type.weight[kind].float(), rows) for tokens, rows, kind in parts[::-1]]
        cond, lengths = _gather_valid(parts)
        return cond, _key_mask(lengths, video, cond.device)

    def _padded_condition(self, text: Tensor, text_mask: Tensor, glyph: Tensor, glyph_mask: Tensor,
                          image: Tensor | None, timestep: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Every condition row in place, in the reference's order (image, glyph, text) -> [B, L, dim] (float32; the
        padding rows zeroed, as the reference zeroes its invalid ones) and which rows are valid [B, L] bool. The
        refiner masks the text padding as its keys whatever the counts (decided without reading them)."""
        parts = [(self.text_in(text.to(dtype), timestep, text_mask, True), text_mask, TEXT),
                 (self.glyph_in(glyph.to(dtype)), glyph_mask, GLYPH)]
        if image is not None:  # every image token is valid
            parts.append((self.image_in(image.to(dtype)), text_mask.new_ones(image.shape[:2]), IMAGE))
        parts = parts[::-1]
        tokens = [torch.where(valid[..., None], t.float() + self.cond_type.weight[kind].float(), 0.0)
                  for t, valid, kind in parts]
        return torch.cat(tokens, dim=1), torch.cat([valid for _, valid, _ in parts], dim=1)

    def run_blocks(self, h: Tensor, cond: Hunyuan15Conditioning, start: int = 0, end: int | None = None) -> Tensor:
        """Blocks [start, end) over the joint stream."""
        for block in self.blocks[start:end]:
            h = block(h, cond.video_tokens, cond.temb, cond.mask, cond.rotations, cond.dtype)
        return h

    def block_input(self, h: Tensor, cond: Hunyuan15Conditioning, index: int = 0) -> Tensor:
        """The modulated video tokens block `index` feeds to attention (TeaCache's change indicator)."""
        return self.blocks[index].attention_input(h, cond.video_tokens, cond.temb, cond.dtype)

    def head(self, h: Tensor, cond: Hunyuan15Conditioning) -> Tensor:
        """The joint stream after the last block -> the video prediction [B, out_channels, F, H, W]."""
        config, h = self.config, self.sequence.gather_joint(h, cond.length)
        x = h[:, :math.prod(cond.grid)]
        # The final norm chunks (scale, shift), the opposite of the blocks' order.
        scale, shift = self.out_mod(F.silu(cond.temb).to(self.out_mod.weight.dtype))[:, None].float().chunk(2, -1)
        out = self.proj_out((F.layer_norm(x, x.shape[-1:], eps=EPS) * (1 + scale) + shift).to(cond.dtype))
        f, h, w = cond.grid
        pt, p = config.patch_size_t, config.patch_size
        out = out.float().reshape(x.shape[0], f, h, w, config.out_channels, pt, p, p)
        return out.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(x.shape[0], config.out_channels, f * pt, h * p, w * p)


def _rows_of(mask: Tensor) -> list[Tensor]:
    """Per sample, the indices of its valid rows ([B, L] bool mask): a device-to-host read (eager forwards only)."""
    return [row.nonzero()[:, 0] for row in mask]


def _prefixes(counts: tuple[int, ...], batch: int, length: int, name: str) -> list[slice]:
    """Per sample, its first counts[b] rows of `length`."""
    if len(counts) != batch or not all(0 <= n <= length for n in counts):
        raise ValueError(f"counts.{name} {list(counts)} must give 0..{length} valid rows for each of {batch} samples")
    return [slice(0, n) for n in counts]


def _count(rows: slice | Tensor, length: int) -> int:
    """How many rows a selection keeps, from host data alone."""
    return len(range(length)[rows]) if isinstance(rows, slice) else rows.shape[0]


def _gather_valid(parts: list[tuple[Tensor, Rows]]) -> tuple[Tensor, list[int]]:
    """Per sample, the valid rows of every part in order -> [B, L, dim] padded with zeros at the end, and each
    sample's count of valid rows (host ints; L: the largest)."""
    rows = [torch.cat([tokens[b][select[b]] for tokens, select in parts]) for b in range(parts[0][0].shape[0])]
    lengths = [r.shape[0] for r in rows]
    length = max(lengths)
    return torch.stack([F.pad(r, (0, 0, 0, length - r.shape[0])) for r in rows]), lengths


def _key_mask(lengths: list[int], video: int, device: torch.device) -> Tensor | None:
    """The SDPA key mask [B, 1, 1, video + L] over [video, condition] when samples keep different condition counts
    (their shorter rows padded), else None; built from host ints, without reading the device."""
    length = max(lengths)
    if all(n == length for n in lengths):
        return None
    valid = torch.stack([torch.arange(video + length, device=device) < video + n for n in lengths])
    return valid[:, None, None, :]
