"""The Qwen-Image transformer (MMDiT): dual-stream blocks over [text, image] tokens with Qwen-Image's rotary layout.

Loads diffusers `QwenImageTransformer2DModel` checkpoints (the `transformer/` folder) through
QWEN_IMAGE_TRANSFORMER_NAME_MAP. Timesteps are per sample ([B]), so one forward can carry several requests' steps.
With `zero_cond_t` (Qwen-Image-Edit-2511) the reference images' tokens are modulated as at timestep 0, the
target's and the text's (and the head) at the step's timestep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import AttentionFn, attention
from vidloom.layers.rms_norm import RMSNorm
from vidloom.layers.sequence import WHOLE_SEQUENCE, SequenceLayout
from vidloom.loading.config_keys import check_class_name
from vidloom.loading.key_policy import KeyPolicy, Refusal
from vidloom.loading.name_map import NameMap
from vidloom.families.qwen_image.blocks import DualStreamBlock, ImageModulation, TimeEmbedding, norm_modulate
from vidloom.families.qwen_image.rope import joint_rotations

DIFFUSERS_CLASS_NAME = "QwenImageTransformer2DModel"
EPS = 1e-6  # every norm of the reference model
# Every QwenImageTransformer2DModel.__init__ argument (diffusers 0.42): read, or refused where a variant needs code
# this family does not have.
TRANSFORMER_POLICY = KeyPolicy(
    frozenset({"patch_size", "in_channels", "out_channels", "num_layers", "attention_head_dim",
               "num_attention_heads", "joint_attention_dim", "axes_dims_rope", "zero_cond_t"}),
    # Qwen/Qwen-Image's transformer/config.json carries it; QwenImageTransformer2DModel takes no such argument
    # (diffusers ignores it with a warning) and the model has no pooled projection.
    harmless={"pooled_projection_dim": "the model has no pooled text projection; diffusers' class ignores the key"},
    refused={
        "guidance_embeds": Refusal((False,), "a guidance embedding (the reference pipeline cannot run it either)"),
        "use_additional_t_cond": Refusal((False,), "Qwen-Image-Layered's extra timestep condition, not implemented"),
        "use_layer3d_rope": Refusal((False,), "Qwen-Image-Layered's layered rotary layout, not implemented"),
    },
)


@dataclass(frozen=True)
class QwenImageTransformerConfig:
    """Static shape of a Qwen-Image transformer (diffusers config.json names in comments)."""

    patch_size: int = 2
    in_channels: int = 64  # packed latent channels: VAE channels x patch^2
    out_channels: int = 16  # per patch pixel: the head predicts patch^2 x out_channels
    num_layers: int = 60
    head_dim: int = 128  # attention_head_dim
    num_heads: int = 24  # num_attention_heads
    text_dim: int = 3584  # joint_attention_dim: the text encoder's hidden size
    rope_axes: tuple[int, int, int] = (16, 56, 56)  # axes_dims_rope over (frame, height, width)
    zero_cond_t: bool = False  # reference images' tokens modulated at timestep 0 (Qwen-Image-Edit-2511)

    def __post_init__(self) -> None:
        if sum(self.rope_axes) != self.head_dim or any(a % 2 for a in self.rope_axes):
            raise ValueError(f"axes_dims_rope {list(self.rope_axes)} must be even and sum to attention_head_dim "
                             f"{self.head_dim}")
        if self.in_channels % (self.patch_size ** 2):
            raise ValueError(f"in_channels {self.in_channels} is not a multiple of patch_size^2")

    @property
    def dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def latent_channels(self) -> int:
        """The VAE's latent channels (in_channels unpacked)."""
        return self.in_channels // self.patch_size ** 2

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> QwenImageTransformerConfig:
        check_class_name(cfg, (DIFFUSERS_CLASS_NAME,), "transformer config")
        TRANSFORMER_POLICY.check(cfg, "transformer config")
        d = cls()
        return cls(
            patch_size=int(cfg.get("patch_size", d.patch_size)),
            in_channels=int(cfg.get("in_channels", d.in_channels)),
            out_channels=int(cfg.get("out_channels") or cfg.get("in_channels", d.in_channels)),
            num_layers=int(cfg.get("num_layers", d.num_layers)),
            head_dim=int(cfg.get("attention_head_dim", d.head_dim)),
            num_heads=int(cfg.get("num_attention_heads", d.num_heads)),
            text_dim=int(cfg.get("joint_attention_dim", d.text_dim)),
            rope_axes=tuple(int(a) for a in cfg.get("axes_dims_rope", d.rope_axes)),  # type: ignore[arg-type]
            zero_cond_t=bool(cfg.get("zero_cond_t", d.zero_cond_t)),
        )


# diffusers QwenImageTransformer2DModel key prefixes -> ours (unlisted: img_in, txt_in, txt_norm, proj_out).
_SIDES = (("img", "to_q", "to_k", "to_v", "to_out.0", "norm_q", "norm_k"),
          ("txt", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "norm_added_q", "norm_added_k"))
QWEN_IMAGE_TRANSFORMER_NAME_MAP = NameMap((
    ("time_text_embed.timestep_embedder.linear_1", "time_embed.up"),
    ("time_text_embed.timestep_embedder.linear_2", "time_embed.down"),
    ("norm_out.linear", "out_mod"),
    *(pair for side, q, k, v, out, nq, nk in _SIDES for pair in (
        (f"transformer_blocks.{{n}}.{side}_mod.1", f"blocks.{{n}}.{side}.mod"),
        (f"transformer_blocks.{{n}}.attn.{q}", f"blocks.{{n}}.{side}.q"),
        (f"transformer_blocks.{{n}}.attn.{k}", f"blocks.{{n}}.{side}.k"),
        (f"transformer_blocks.{{n}}.attn.{v}", f"blocks.{{n}}.{side}.v"),
        (f"transformer_blocks.{{n}}.attn.{out}", f"blocks.{{n}}.{side}.out"),
        (f"transformer_blocks.{{n}}.attn.{nq}", f"blocks.{{n}}.{side}.norm_q"),
        (f"transformer_blocks.{{n}}.attn.{nk}", f"blocks.{{n}}.{side}.norm_k"),
        (f"transformer_blocks.{{n}}.{side}_mlp.net.0.proj", f"blocks.{{n}}.{side}.mlp.up"),
        (f"transformer_blocks.{{n}}.{side}_mlp.net.2", f"blocks.{{n}}.{side}.mlp.down"),
    )),
))


@dataclass(frozen=True)
class QwenImageConditioning:
    """What every block of one forward reads: the timestep embedding, rotations, text length, compute dtype;
    under sequence parallel, this rank's rows of them (QwenImageTransformer.sequence)."""

    silu_temb: Tensor  # [B, dim]: silu of the timestep embedding, in the modulation's dtype
    rotations: Tensor  # [L + N, head_dim // 2] complex64, attention order: this rank's rows
    text_tokens: int  # the joint stream is [text (L), image (N)]: the text rows this rank holds (L on one device)
    dtype: torch.dtype  # what linears and attention compute in; the joint stream is float32
    text_total: int = 0  # L: the text rows of the whole stream (the head keeps what follows them)
    length: int = 0  # L + N: the whole stream's rows before any padding
    # The padded stream's key mask (layers.sequence.JointPart: [L + N + pad]), or a padded text's ([B, 1, 1, L + N]:
    # batched CFG over prompts of two lengths); None unpadded.
    key_mask: Tensor | None = None
    # zero_cond_t with references: silu of the timestep-0 embedding ([B, dim]) and, per image row this rank holds
    # ([N_local] bool), True where the row takes it (a reference's token); None: every image row takes silu_temb.
    silu_zero: Tensor | None = None
    zero_rows: Tensor | None = None

    @property
    def image_modulation(self) -> ImageModulation:
        return ImageModulation(self.silu_temb, self.silu_zero, self.zero_rows)


class QwenImageTransformer(nn.Module):
    """Predicts the flow velocity of packed image tokens given text tokens and per-sample timesteps."""

    # float32 islands under a bf16 cast (loading.precision.cast_module): the timestep embedding and every
    # modulation, as Flux2 keeps them; a bf16-rounded timestep shifts every modulation of a step.
    KEEP_FP32: ClassVar[frozenset[str]] = frozenset({"time_embed", "mod", "out_mod"})

    # Which rows of the joint stream this device holds: all of them, unless sequence parallel swapped in a
    # sharded layout from outside (runtime.parallel.ulysses.apply_sp, with self_attentions()).
    sequence: SequenceLayout = WHOLE_SEQUENCE

    def __init__(self, config: QwenImageTransformerConfig, attention_fn: AttentionFn = attention) -> None:
        super().__init__()
        self.config = config
        dim = config.dim
        self.time_embed = TimeEmbedding(dim)
        self.txt_norm = RMSNorm(config.text_dim, eps=EPS)
        self.img_in = nn.Linear(config.in_channels, dim)
        self.txt_in = nn.Linear(config.text_dim, dim)
        self.blocks = nn.ModuleList(DualStreamBlock(dim, config.head_dim, EPS, attention_fn)
                                    for _ in range(config.num_layers))
        self.out_mod = nn.Linear(dim, 2 * dim)
        self.proj_out = nn.Linear(dim, config.patch_size ** 2 * config.out_channels)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def compile_units(self) -> tuple[nn.Module, ...]:
        """The blocks `--compile` wraps (core.denoiser.CompileUnits)."""
        return tuple(self.blocks)

    def self_attentions(self) -> Iterator[DualStreamBlock]:
        """Every block: each attends over the whole joint stream (sequence parallel wraps their attention)."""
        yield from self.blocks

    def forward(self, img: Tensor, txt: Tensor, timestep: Tensor, grids: tuple[tuple[int, int], ...],
                text_mask: Tensor | None = None) -> Tensor:
        """img [B, N, in_channels] (each grid's tokens, row-major, target first), txt [B, L, text_dim],
        timestep [B] in [0, 1], grids: the (h, w) token grid of the target and of each reference, text_mask:
        [B, L] bool, True for real text tokens (prompts padded at their end to one length), None: all real
        -> [B, N, C_out]."""
        h, cond = self.embed(img, txt, timestep, grids, text_mask=text_mask)
        return self.head(self.run_blocks(h, cond), cond)

    # The stages below are the denoiser contract step caches call (runtime.step_cache.StagedNetwork); forward()
    # is exactly their composition. The residual stream is the joint [text, image] sequence, in float32.

    def rotations(self, grids: tuple[tuple[int, int], ...], text_tokens: int, device: torch.device) -> Tensor:
        return joint_rotations(grids, text_tokens, self.config.rope_axes).to(device)

    def embed(self, img: Tensor, txt: Tensor, timestep: Tensor, grids: tuple[tuple[int, int], ...],
              rotations: Tensor | None = None, text_mask: Tensor | None = None) -> tuple[Tensor, QwenImageConditioning]:
        """Tokens -> the joint stream [B, L + N, dim] (float32) and what every block reads; a padded text's
        `text_mask` [B, L] makes its padding no key of the joint attention (padded rows are computed, never read)."""
        # Unlike the reference's bf16 path the timestep is not rounded to the compute dtype (KEEP_FP32).
        zero_t = self.config.zero_cond_t and len(grids) > 1  # without a reference every token takes t
        t = timestep.float()
        temb = self.time_embed(torch.cat([t, torch.zeros_like(t)]) if zero_t else t)
        x = self.img_in(img)
        c = self.txt_in(self.txt_norm(txt))
        if rotations is None:
            rotations = self.rotations(grids, c.shape[1], img.device)
        silu = F.silu(temb).to(self.out_mod.weight.dtype)
        silu, silu_zero = silu.chunk(2) if zero_t else (silu, None)
        tables = (rotations,)
        if zero_t:  # per joint row: a reference's token (after the text and the target); sharded with its rows
            h0, w0 = grids[0]
            tables += (torch.arange(rotations.shape[0], device=img.device) >= c.shape[1] + h0 * w0,)
        part = self.sequence.shard_joint(torch.cat([c, x], dim=1).float(), tables, c.shape[1])
        key_mask = part.key_mask
        if text_mask is not None:  # per sample: [B, 1, 1, L + N], broadcast over heads and queries
            if key_mask is not None:
                raise ValueError("a padded text mask cannot run on a sequence-parallel shard")
            image = torch.ones(img.shape[:2], dtype=torch.bool, device=img.device)
            key_mask = torch.cat([text_mask.to(img.device, torch.bool), image], dim=1)[:, None, None]
        cond = QwenImageConditioning(silu, part.tables[0], part.prefix, x.dtype, c.shape[1], part.length, key_mask,
                                     silu_zero, part.tables[1][part.prefix:] if zero_t else None)
        return part.tokens, cond

    def run_blocks(self, h: Tensor, cond: QwenImageConditioning, start: int = 0, end: int | None = None) -> Tensor:
        """Blocks [start, end) over the joint stream. The model's last block leaves the text rows as they came in
        (only the head reads its output, and only the image rows); not under sequence parallel, whose attention
        exchanges every row's queries."""
        last = len(self.blocks) - 1 if self.sequence is WHOLE_SEQUENCE else -1
        for index in range(len(self.blocks))[start:end]:
            h = self.blocks[index](h, cond.text_tokens, cond.image_modulation, cond.rotations, cond.dtype,
                                   cond.key_mask, text_out=index != last)
        return h

    def block_input(self, h: Tensor, cond: QwenImageConditioning, index: int = 0) -> Tensor:
        """The modulated tokens block `index` feeds to attention (TeaCache's change indicator)."""
        return self.blocks[index].attention_input(h, cond.text_tokens, cond.image_modulation, cond.dtype)

    def head(self, h: Tensor, cond: QwenImageConditioning) -> Tensor:
        """The joint stream after the last block -> the image tokens' prediction [B, N, patch^2 * out_channels]."""
        # AdaLayerNormContinuous: the modulation chunks (scale, shift), the opposite of the blocks' order.
        scale, shift = self.out_mod(cond.silu_temb)[:, None].float().chunk(2, dim=-1)
        h = self.sequence.gather_joint(h, cond.length)
        return self.proj_out(norm_modulate(h[:, cond.text_total:], shift, scale, EPS, cond.dtype))
