"""The Flux2 (Klein) image transformer: double-stream blocks, then single-stream (parallel) blocks.

Loads diffusers `Flux2Transformer2DModel` checkpoints through FLUX2_TRANSFORMER_NAME_MAP.
Timesteps are per sample ([B]), so one forward can carry the steps of several requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import AttentionFn, attention
from vidloom.loading.config_keys import check_class_name, read_key, refuse_unknown_keys, strict_bool
from vidloom.loading.name_map import NameMap
from vidloom.models.wan.transformer import timestep_features


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
        refuse_unknown_keys(cfg, CONFIG_KEYS, "transformer config")
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
# Building blocks
# ---------------------------------------------------------------------------


def rope_tables(ids: Tensor, axes: tuple[int, ...], theta: float) -> tuple[Tensor, Tensor]:
    """cos/sin tables [S, head_dim] for integer position ids [S, len(axes)], pairs interleaved.

    Follows diffusers' get_1d_rotary_pos_embed (float64 frequencies, then float32) step by
    step: parity at 1e-5 needs the same rounding.
    """
    pos = ids.float()
    cos, sin = [], []
    for axis, dim in enumerate(axes):
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=ids.device)[: dim // 2] / dim))
        angles = torch.outer(pos[:, axis], freqs)
        cos.append(angles.cos().repeat_interleave(2, dim=1).float())
        sin.append(angles.sin().repeat_interleave(2, dim=1).float())
    return torch.cat(cos, dim=-1), torch.cat(sin, dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate interleaved (real, imag) pairs of x [B, S, H, D] by tables [S, D]."""
    real, imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    rotated = torch.stack([-imag, real], dim=-1).flatten(3)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return (1 + scale) * x + shift


def norm_modulate(x: Tensor, shift: Tensor, scale: Tensor, eps: float) -> Tensor:
    """LayerNorm then (shift, scale) in float32 (the modulation island), back in x's dtype for the next linear."""
    return modulate(F.layer_norm(x.float(), x.shape[-1:], eps=eps), shift, scale).to(x.dtype)


def gated_add(x: Tensor, gate: Tensor, update: Tensor) -> Tensor:
    """x + gate * update with the product in float32, the residual stream kept in x's dtype."""
    return (x.float() + gate * update.float()).to(x.dtype)


def swiglu(x: Tensor) -> Tensor:
    gate, value = x.chunk(2, dim=-1)
    return F.silu(gate) * value


class TimeEmbedding(nn.Module):
    def __init__(self, channels: int, dim: int) -> None:
        super().__init__()
        self.channels = channels
        self.up = nn.Linear(channels, dim, bias=False)
        self.down = nn.Linear(dim, dim, bias=False)

    def forward(self, t: Tensor) -> Tensor:
        """t [B] (x1000, float32) -> [B, dim] in this module's dtype (float32 when kept as an island)."""
        features = timestep_features(t, self.channels).to(self.up.weight.dtype)
        return self.down(F.silu(self.up(features)))


class GatedMLP(nn.Module):
    """SwiGLU feed-forward whose gate and value share the input projection."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden * 2, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(swiglu(self.up(x)))


def _heads(x: Tensor, head_dim: int) -> Tensor:
    return x.unflatten(-1, (-1, head_dim))


class DoubleStreamBlock(nn.Module):
    """Image and text tokens with their own weights, attending jointly (text first)."""

    def __init__(self, cfg: Flux2TransformerConfig, attention_fn: AttentionFn) -> None:
        super().__init__()
        dim, hd, eps = cfg.dim, cfg.head_dim, cfg.eps
        self.head_dim, self.eps, self.attention_fn = hd, eps, attention_fn
        for side in ("img", "txt"):
            for name in ("q", "k", "v", "out"):
                setattr(self, f"{side}_{name}", nn.Linear(dim, dim, bias=False))
            setattr(self, f"{side}_norm_q", nn.RMSNorm(hd, eps=eps))
            setattr(self, f"{side}_norm_k", nn.RMSNorm(hd, eps=eps))
            setattr(self, f"{side}_mlp", GatedMLP(dim, cfg.mlp_dim))

    def _qkv(self, side: str, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q = getattr(self, f"{side}_norm_q")(_heads(getattr(self, f"{side}_q")(x), self.head_dim))
        k = getattr(self, f"{side}_norm_k")(_heads(getattr(self, f"{side}_k")(x), self.head_dim))
        return q, k, _heads(getattr(self, f"{side}_v")(x), self.head_dim)

    def forward(
        self, img: Tensor, txt: Tensor, mod_img: Tensor, mod_txt: Tensor, rope: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, Tensor]:
        # mod_*: [B, 1, 6 * dim] = (shift, scale, gate) for attention, then for the MLP.
        i_shift, i_scale, i_gate, i_shift2, i_scale2, i_gate2 = mod_img.chunk(6, dim=-1)
        t_shift, t_scale, t_gate, t_shift2, t_scale2, t_gate2 = mod_txt.chunk(6, dim=-1)
        img_in = norm_modulate(img, i_shift, i_scale, self.eps)
        txt_in = norm_modulate(txt, t_shift, t_scale, self.eps)
        iq, ik, iv = self._qkv("img", img_in)
        tq, tk, tv = self._qkv("txt", txt_in)
        q, k, v = torch.cat([tq, iq], dim=1), torch.cat([tk, ik], dim=1), torch.cat([tv, iv], dim=1)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        joint = self.attention_fn(q, k, v).flatten(2, 3).to(q.dtype)
        txt_attn, img_attn = joint.split([txt.shape[1], img.shape[1]], dim=1)

        img = gated_add(img, i_gate, self.img_out(img_attn))
        img = gated_add(img, i_gate2, self.img_mlp(norm_modulate(img, i_shift2, i_scale2, self.eps)))
        txt = gated_add(txt, t_gate, self.txt_out(txt_attn))
        txt = gated_add(txt, t_gate2, self.txt_mlp(norm_modulate(txt, t_shift2, t_scale2, self.eps)))
        return img, txt


class SingleStreamBlock(nn.Module):
    """One token stream; attention and MLP run in parallel off one fused input projection."""

    def __init__(self, cfg: Flux2TransformerConfig, attention_fn: AttentionFn) -> None:
        super().__init__()
        dim, hd = cfg.dim, cfg.head_dim
        self.head_dim, self.eps, self.attention_fn = hd, cfg.eps, attention_fn
        self.dim, self.mlp_dim = dim, cfg.mlp_dim
        self.qkv_mlp = nn.Linear(dim, 3 * dim + 2 * cfg.mlp_dim, bias=False)
        self.norm_q = nn.RMSNorm(hd, eps=cfg.eps)
        self.norm_k = nn.RMSNorm(hd, eps=cfg.eps)
        self.out = nn.Linear(dim + cfg.mlp_dim, dim, bias=False)

    def forward(self, x: Tensor, mod: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        shift, scale, gate = mod.chunk(3, dim=-1)
        h = norm_modulate(x, shift, scale, self.eps)
        qkv, mlp = self.qkv_mlp(h).split([3 * self.dim, 2 * self.mlp_dim], dim=-1)
        q, k, v = (_heads(part, self.head_dim) for part in qkv.chunk(3, dim=-1))
        q, k = apply_rope(self.norm_q(q), *rope), apply_rope(self.norm_k(k), *rope)
        attn = self.attention_fn(q, k, v).flatten(2, 3).to(q.dtype)
        return gated_add(x, gate, self.out(torch.cat([attn, swiglu(mlp)], dim=-1)))


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Flux2Conditioning:
    """What every block of one forward reads: timestep embedding, modulations, rotary tables."""

    temb: Tensor  # [B, dim]
    mod_img: Tensor  # [B, 1, 6 * dim]
    mod_txt: Tensor  # [B, 1, 6 * dim]
    mod_single: Tensor  # [B, 1, 3 * dim]
    rope: tuple[Tensor, Tensor]
    text_tokens: int  # L: the joint stream is [text (L), image (N)]



class Flux2Transformer(nn.Module):
    """Predicts the flow velocity of packed image tokens given text tokens and per-sample timesteps."""

    # float32 islands under a bf16 cast (loading.precision.cast_module): the timestep embedding and every
    # modulation. A bf16 timestep (750 -> 752) alone cut one forward's SNR to 2-3.5 dB on the mid-size
    # random checkpoint (bench/flux2_precision.py); the sinusoid, embedding and modulations stay float32.
    KEEP_FP32: ClassVar[frozenset[str]] = frozenset(
        {"time_embed", "guidance_embed", "mod_img", "mod_txt", "mod_single", "out_mod"}
    )

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
        self.double_blocks = nn.ModuleList(DoubleStreamBlock(config, attention_fn) for _ in range(config.num_double_layers))
        self.single_blocks = nn.ModuleList(SingleStreamBlock(config, attention_fn) for _ in range(config.num_single_layers))
        self.out_mod = nn.Linear(dim, 2 * dim, bias=False)
        self.proj_out = nn.Linear(dim, config.out_channels, bias=False)

    @property
    def num_blocks(self) -> int:
        """Double-stream blocks then single-stream blocks, indexed in that order (run_blocks)."""
        return len(self.double_blocks) + len(self.single_blocks)

    def compile_units(self) -> tuple[nn.Module, ...]:
        """The blocks `--compile` wraps, one graph per shape bucket (core.denoiser.CompileUnits)."""
        return tuple((*self.double_blocks, *self.single_blocks))

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
    # sequence throughout: the double-stream blocks split it and join it again (exact copies).

    def embed(
        self, img: Tensor, txt: Tensor, timestep: Tensor, img_ids: Tensor, txt_ids: Tensor,
        guidance: Tensor | None = None,
    ) -> tuple[Tensor, Flux2Conditioning]:
        """Tokens -> the joint stream [B, L + N, dim] and what every block reads."""
        # 1. Conditioning: the timestep (x1000, like the reference) drives every modulation. Unlike the
        # reference's bf16 path, the timestep is never rounded to the compute dtype (see KEEP_FP32).
        temb = self.time_embed(timestep.float() * 1000)
        if guidance is not None and self.guidance_embed is not None:
            temb = temb + self.guidance_embed(guidance.float() * 1000)
        silu = F.silu(temb)[:, None, :]  # [B, 1, dim]
        mod_dtype = self.mod_img.weight.dtype

        # 2. Embed tokens; rotary tables over (text, image) ids in attention order.
        x = self.img_in(img)
        c = self.txt_in(txt)
        cos_t, sin_t = rope_tables(txt_ids, self.config.rope_axes, self.config.rope_theta)
        cos_i, sin_i = rope_tables(img_ids, self.config.rope_axes, self.config.rope_theta)
        rope = (torch.cat([cos_t, cos_i]), torch.cat([sin_t, sin_i]))
        silu = silu.to(mod_dtype)
        cond = Flux2Conditioning(temb, self.mod_img(silu), self.mod_txt(silu), self.mod_single(silu), rope, c.shape[1])
        return torch.cat([c, x], dim=1), cond

    def run_blocks(self, h: Tensor, cond: Flux2Conditioning, start: int = 0, end: int | None = None) -> Tensor:
        """Blocks [start, end) over the joint stream: double-stream ones first, then single-stream ones."""
        # 3. Double-stream blocks on (image, text) apart, then one joint stream [B, L + N, dim].
        end = self.num_blocks if end is None else end
        doubles = len(self.double_blocks)
        for index in range(start, end):
            if index < doubles:
                c, x = h[:, : cond.text_tokens], h[:, cond.text_tokens :]
                x, c = self.double_blocks[index](x, c, cond.mod_img, cond.mod_txt, cond.rope)
                h = torch.cat([c, x], dim=1)
            else:
                h = self.single_blocks[index - doubles](h, cond.mod_single, cond.rope)
        return h

    def block_input(self, h: Tensor, cond: Flux2Conditioning, index: int = 0) -> Tensor:
        """The modulated tokens block `index` normalizes before attention (TeaCache's change indicator)."""
        doubles = len(self.double_blocks)
        eps = self.config.eps
        if index >= doubles:
            shift, scale, _ = cond.mod_single.chunk(3, dim=-1)
            return norm_modulate(h, shift, scale, eps)
        t_shift, t_scale = cond.mod_txt.chunk(6, dim=-1)[:2]
        i_shift, i_scale = cond.mod_img.chunk(6, dim=-1)[:2]
        text, image = h[:, : cond.text_tokens], h[:, cond.text_tokens :]
        return torch.cat([norm_modulate(text, t_shift, t_scale, eps), norm_modulate(image, i_shift, i_scale, eps)], dim=1)

    def head(self, h: Tensor, cond: Flux2Conditioning) -> Tensor:
        """The joint stream after the last block -> the image tokens' prediction [B, N, C_out]."""
        # 4. Output head: adaptive norm (scale first, then shift) and projection.
        h = h[:, cond.text_tokens :]
        scale, shift = self.out_mod(F.silu(cond.temb).to(self.out_mod.weight.dtype)).chunk(2, dim=-1)
        return self.proj_out(norm_modulate(h, shift[:, None], scale[:, None], self.config.eps))
