"""The Flux2 (Klein) image transformer: double-stream blocks, then single-stream (parallel) blocks.

Loads diffusers `Flux2Transformer2DModel` checkpoints through FLUX2_TRANSFORMER_NAME_MAP.
Timesteps are per sample ([B]), so one forward can carry the steps of several requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import AttentionFn, attention
from vidloom.layers.sequence import WHOLE_SEQUENCE, SequenceLayout
from vidloom.loading.config_keys import check_class_name, read_key, strict_bool
from vidloom.loading.key_policy import KeyPolicy
from vidloom.loading.name_map import NameMap
from vidloom.families.flux2.blocks import DoubleStreamBlock, SingleStreamBlock, TimeEmbedding
from vidloom.families.flux2.ops import norm_modulate, rope_freqs


DIFFUSERS_CLASS_NAME = "Flux2Transformer2DModel"
# Every Flux2Transformer2DModel.__init__ argument (diffusers 0.42); patch_size is checked (only 1), the rest read.
CONFIG_KEYS = frozenset({
    "patch_size", "in_channels", "out_channels", "num_layers", "num_single_layers", "attention_head_dim",
    "num_attention_heads", "joint_attention_dim", "timestep_guidance_channels", "mlp_ratio", "axes_dims_rope",
    "rope_theta", "eps", "guidance_embeds",
})


@dataclass(frozen=True)
class Flux2TransformerConfig:
    """Static shape of a Flux2 transformer (diffusers config.json field names in comments)."""

    in_channels: int = 128
    out_channels: int = 128
    num_double_layers: int = 8  # num_layers
    num_single_layers: int = 48
    head_dim: int = 128  # attention_head_dim
    num_heads: int = 48  # num_attention_heads
    text_dim: int = 15360  # joint_attention_dim: 3 x the text encoder's hidden size
    timestep_channels: int = 256  # timestep_guidance_channels
    mlp_ratio: float = 3.0
    rope_axes: tuple[int, ...] = (32, 32, 32, 32)  # axes_dims_rope, over (t, h, w, l) ids
    rope_theta: float = 2000.0
    eps: float = 1e-6
    guidance_embeds: bool = False

    def __post_init__(self) -> None:
        if sum(self.rope_axes) != self.head_dim:
            raise ValueError(f"axes_dims_rope {self.rope_axes} must sum to attention_head_dim {self.head_dim}")

    @property
    def dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def mlp_dim(self) -> int:
        return int(self.dim * self.mlp_ratio)

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> Flux2TransformerConfig:
        check_class_name(cfg, (DIFFUSERS_CLASS_NAME,), "transformer config")
        KeyPolicy(CONFIG_KEYS).check(cfg, "transformer config")
        if cfg.get("patch_size", 1) != 1:
            raise ValueError(f"patch_size {cfg['patch_size']} is not supported (Flux2 patchifies in the pipeline)")
        in_channels = int(cfg.get("in_channels", 128))
        return cls(
            in_channels=in_channels,
            out_channels=int(cfg.get("out_channels") or in_channels),
            num_double_layers=int(cfg.get("num_layers", 8)),
            num_single_layers=int(cfg.get("num_single_layers", 48)),
            head_dim=int(cfg.get("attention_head_dim", 128)),
            num_heads=int(cfg.get("num_attention_heads", 48)),
            text_dim=int(cfg.get("joint_attention_dim", 15360)),
            timestep_channels=int(cfg.get("timestep_guidance_channels", 256)),
            mlp_ratio=float(cfg.get("mlp_ratio", 3.0)),
            rope_axes=tuple(int(a) for a in cfg.get("axes_dims_rope", (32, 32, 32, 32))),
            rope_theta=float(cfg.get("rope_theta", 2000)),
            eps=float(cfg.get("eps", 1e-6)),
            guidance_embeds=read_key(cfg, "guidance_embeds", True, strict_bool, "transformer config"),
        )


# diffusers Flux2Transformer2DModel key prefixes -> ours.
FLUX2_TRANSFORMER_NAME_MAP = NameMap(
    (
        ("time_guidance_embed.timestep_embedder.linear_1", "time_embed.up"),
        ("time_guidance_embed.timestep_embedder.linear_2", "time_embed.down"),
        ("time_guidance_embed.guidance_embedder.linear_1", "guidance_embed.up"),
        ("time_guidance_embed.guidance_embedder.linear_2", "guidance_embed.down"),
        ("double_stream_modulation_img.linear", "mod_img"),
        ("double_stream_modulation_txt.linear", "mod_txt"),
        ("single_stream_modulation.linear", "mod_single"),
        ("x_embedder", "img_in"),
        ("context_embedder", "txt_in"),
        ("transformer_blocks.{n}.attn.to_q", "double_blocks.{n}.img_q"),
        ("transformer_blocks.{n}.attn.to_k", "double_blocks.{n}.img_k"),
        ("transformer_blocks.{n}.attn.to_v", "double_blocks.{n}.img_v"),
        ("transformer_blocks.{n}.attn.norm_q", "double_blocks.{n}.img_norm_q"),
        ("transformer_blocks.{n}.attn.norm_k", "double_blocks.{n}.img_norm_k"),
        ("transformer_blocks.{n}.attn.to_out.0", "double_blocks.{n}.img_out"),
        ("transformer_blocks.{n}.attn.add_q_proj", "double_blocks.{n}.txt_q"),
        ("transformer_blocks.{n}.attn.add_k_proj", "double_blocks.{n}.txt_k"),
        ("transformer_blocks.{n}.attn.add_v_proj", "double_blocks.{n}.txt_v"),
        ("transformer_blocks.{n}.attn.norm_added_q", "double_blocks.{n}.txt_norm_q"),
        ("transformer_blocks.{n}.attn.norm_added_k", "double_blocks.{n}.txt_norm_k"),
        ("transformer_blocks.{n}.attn.to_add_out", "double_blocks.{n}.txt_out"),
        ("transformer_blocks.{n}.ff.linear_in", "double_blocks.{n}.img_mlp.up"),
        ("transformer_blocks.{n}.ff.linear_out", "double_blocks.{n}.img_mlp.down"),
        ("transformer_blocks.{n}.ff_context.linear_in", "double_blocks.{n}.txt_mlp.up"),
        ("transformer_blocks.{n}.ff_context.linear_out", "double_blocks.{n}.txt_mlp.down"),
        ("single_transformer_blocks.{n}.attn.to_qkv_mlp_proj", "single_blocks.{n}.qkv_mlp"),
        ("single_transformer_blocks.{n}.attn.norm_q", "single_blocks.{n}.norm_q"),
        ("single_transformer_blocks.{n}.attn.norm_k", "single_blocks.{n}.norm_k"),
        ("single_transformer_blocks.{n}.attn.to_out", "single_blocks.{n}.out"),
        ("norm_out.linear", "out_mod"),
        ("proj_out", "proj_out"),
    )
)


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Flux2Timing:
    """Everything one timestep (per sample) conditions: the embedding and every modulation, float32 under
    the bf16 cast. Equal timesteps give equal timings, so CFG branches of one step can share one."""

    temb: Tensor  # [B, dim]
    mod_img: Tensor  # [B, 1, 6 * dim]: (shift, scale, gate) for attention, then for the MLP
    mod_txt: Tensor  # [B, 1, 6 * dim]
    mod_single: Tensor  # [B, 1, 3 * dim]
    out_shift: Tensor  # [B, 1, dim]: the output head's adaptive norm
    out_scale: Tensor  # [B, 1, dim]


@dataclass(frozen=True)
class Flux2Conditioning:
    """What every block of one forward reads: timing, rotary frequencies, the text length, the compute dtype;
    under sequence parallel, this rank's rows of them (Flux2Transformer.sequence)."""

    timing: Flux2Timing
    freqs: Tensor  # [L + N, head_dim // 2] complex64 (Flux2Transformer.rope): this rank's rows
    text_tokens: int  # the joint stream is [text (L), image (N)]: the text rows this rank holds (L on one device)
    dtype: torch.dtype  # what the linears and attention compute in; the joint stream itself is float32
    text_total: int = 0  # L: the text rows of the whole stream (the head keeps what follows them)
    length: int = 0  # L + N: the whole stream's rows before any padding
    key_mask: Tensor | None = None  # the padded stream's key mask (layers.sequence.JointPart), None unpadded


class Flux2Transformer(nn.Module):
    """Predicts the flow velocity of packed image tokens given text tokens and per-sample timesteps."""

    # float32 islands under a bf16 cast (loading.precision.cast_module): the timestep embedding and every
    # modulation. A bf16 timestep (750 -> 752) alone cut one forward's SNR to 2-3.5 dB on the mid-size
    # random checkpoint (bench/flux2_precision.py); the sinusoid, embedding and modulations stay float32.
    # The blocks also keep the residual stream float32 and normalize, modulate and add in float32 (ops.py).
    KEEP_FP32: ClassVar[frozenset[str]] = frozenset(
        {"time_embed", "guidance_embed", "mod_img", "mod_txt", "mod_single", "out_mod"}
    )

    # Which rows of the joint stream this device holds: all of them, unless sequence parallel swapped in a
    # sharded layout from outside (runtime.parallel.ulysses.apply_sp, with self_attentions()).
    sequence: SequenceLayout = WHOLE_SEQUENCE

    def __init__(self, config: Flux2TransformerConfig, attention_fn: AttentionFn = attention) -> None:
        super().__init__()
        self.config = config
        dim = config.dim
        self.time_embed = TimeEmbedding(config.timestep_channels, dim)
        self.guidance_embed = TimeEmbedding(config.timestep_channels, dim) if config.guidance_embeds else None
        self.mod_img = nn.Linear(dim, 6 * dim, bias=False)
        self.mod_txt = nn.Linear(dim, 6 * dim, bias=False)
        self.mod_single = nn.Linear(dim, 3 * dim, bias=False)
        self.img_in = nn.Linear(config.in_channels, dim, bias=False)
        self.txt_in = nn.Linear(config.text_dim, dim, bias=False)
        block = (dim, config.head_dim, config.mlp_dim, config.eps, attention_fn)
        self.double_blocks = nn.ModuleList(DoubleStreamBlock(*block) for _ in range(config.num_double_layers))
        self.single_blocks = nn.ModuleList(SingleStreamBlock(*block) for _ in range(config.num_single_layers))
        self.out_mod = nn.Linear(dim, 2 * dim, bias=False)
        self.proj_out = nn.Linear(dim, config.out_channels, bias=False)

    @property
    def num_blocks(self) -> int:
        """Double-stream blocks then single-stream blocks, indexed in that order (run_blocks)."""
        return len(self.double_blocks) + len(self.single_blocks)

    def compile_units(self) -> tuple[nn.Module, ...]:
        """The blocks `--compile` wraps, one graph per shape bucket (core.denoiser.CompileUnits)."""
        return tuple((*self.double_blocks, *self.single_blocks))

    def self_attentions(self) -> Iterator[DoubleStreamBlock | SingleStreamBlock]:
        """Every block: each attends over the whole joint stream (sequence parallel wraps their attention)."""
        yield from self.double_blocks
        yield from self.single_blocks

    def forward(
        self,
        img: Tensor,
        txt: Tensor,
        timestep: Tensor,
        img_ids: Tensor,
        txt_ids: Tensor,
        guidance: Tensor | None = None,
    ) -> Tensor:
        """img [B, N, C_in] (target tokens then reference tokens), txt [B, L, text_dim],
        timestep [B] in [0, 1], ids [N, 4] / [L, 4] shared by the batch -> [B, N, C_out]."""
        h, cond = self.embed(img, txt, timestep, img_ids, txt_ids, guidance)
        return self.head(self.run_blocks(h, cond), cond)

    # The stages below are the denoiser contract step caches call (runtime.step_cache.StagedNetwork);
    # forward() is exactly their composition. The residual stream is the joint [text, image] token
    # sequence throughout, in float32: the double-stream blocks read their two sides as views of it.

    def timing(self, timestep: Tensor, guidance: Tensor | None = None) -> Flux2Timing:
        """The timestep embedding and every modulation of timesteps [B] in [0, 1] (guidance [B] too, if any)."""
        # The timestep (x1000, like the reference) drives every modulation. Unlike the reference's bf16
        # path, the timestep is never rounded to the compute dtype (see KEEP_FP32).
        temb = self.time_embed(timestep.float() * 1000)
        if guidance is not None and self.guidance_embed is not None:
            temb = temb + self.guidance_embed(guidance.float() * 1000)
        silu = F.silu(temb)[:, None, :].to(self.mod_img.weight.dtype)  # [B, 1, dim]
        out_scale, out_shift = self.out_mod(F.silu(temb).to(self.out_mod.weight.dtype)).chunk(2, dim=-1)
        return Flux2Timing(temb, self.mod_img(silu), self.mod_txt(silu), self.mod_single(silu),
                           out_shift[:, None], out_scale[:, None])

    def rope(self, img_ids: Tensor, txt_ids: Tensor) -> Tensor:
        """Rotary frequencies [L + N, head_dim // 2] over (text, image) ids, in attention order."""
        axes, theta = self.config.rope_axes, self.config.rope_theta
        return torch.cat([rope_freqs(txt_ids, axes, theta), rope_freqs(img_ids, axes, theta)])

    def embed(
        self, img: Tensor, txt: Tensor, timestep: Tensor, img_ids: Tensor, txt_ids: Tensor,
        guidance: Tensor | None = None, timing: Flux2Timing | None = None, freqs: Tensor | None = None,
    ) -> tuple[Tensor, Flux2Conditioning]:
        """Tokens -> the joint stream [B, L + N, dim] (float32) and what every block reads.

        `timing` / `freqs`: this timestep's and these ids' own, already computed (a CFG branch's twin, a
        request's earlier step); None computes them.
        """
        timing = self.timing(timestep, guidance) if timing is None else timing
        freqs = self.rope(img_ids, txt_ids) if freqs is None else freqs
        x = self.img_in(img)
        c = self.txt_in(txt)
        part = self.sequence.shard_joint(torch.cat([c, x], dim=1).float(), (freqs,), c.shape[1])
        cond = Flux2Conditioning(timing, part.tables[0], part.prefix, x.dtype, c.shape[1], part.length, part.key_mask)
        return part.tokens, cond

    def run_blocks(self, h: Tensor, cond: Flux2Conditioning, start: int = 0, end: int | None = None) -> Tensor:
        """Blocks [start, end) over the joint stream: double-stream ones first, then single-stream ones."""
        end = self.num_blocks if end is None else end
        doubles = len(self.double_blocks)
        t = cond.timing
        for index in range(start, end):
            if index < doubles:
                h = self.double_blocks[index](h, cond.text_tokens, t.mod_img, t.mod_txt, cond.freqs, cond.dtype,
                                              cond.key_mask)
            else:
                h = self.single_blocks[index - doubles](h, t.mod_single, cond.freqs, cond.dtype, cond.key_mask)
        return h

    def block_input(self, h: Tensor, cond: Flux2Conditioning, index: int = 0) -> Tensor:
        """The modulated tokens block `index` normalizes before attention (TeaCache's change indicator)."""
        doubles = len(self.double_blocks)
        eps, t = self.config.eps, cond.timing
        if index >= doubles:
            shift, scale, _ = t.mod_single.chunk(3, dim=-1)
            return norm_modulate(h, shift, scale, eps, cond.dtype)
        t_shift, t_scale = t.mod_txt.chunk(6, dim=-1)[:2]
        i_shift, i_scale = t.mod_img.chunk(6, dim=-1)[:2]
        text, image = h[:, : cond.text_tokens], h[:, cond.text_tokens :]
        return torch.cat([norm_modulate(text, t_shift, t_scale, eps, cond.dtype),
                          norm_modulate(image, i_shift, i_scale, eps, cond.dtype)], dim=1)

    def head(self, h: Tensor, cond: Flux2Conditioning) -> Tensor:
        """The joint stream after the last block -> the image tokens' prediction [B, N, C_out]."""
        # Adaptive norm (the reference's AdaLayerNormContinuous: scale first, then shift) and projection.
        t = cond.timing
        h = self.sequence.gather_joint(h, cond.length)
        return self.proj_out(norm_modulate(h[:, cond.text_total :], t.out_shift, t.out_scale, self.config.eps,
                                           cond.dtype))
