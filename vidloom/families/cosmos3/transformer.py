"""Cosmos3 Omni's causal text backbone (the understanding pathway), over packed tokens and a pluggable KV store.

Qwen3-VL layout: token embedding, per layer [RMSNorm -> GQA attention with per-head q/k RMSNorm and
interleaved multimodal rotary (mrope) -> residual -> RMSNorm -> gated SiLU MLP -> residual], final
RMSNorm, lm head. Tokens of several sequences are packed along one axis (no padding); which
sequence a token belongs to, and what it attends to, is the KV store's business (`KVAttention`):
the runtime's paged cache for serving, `CausalAttention` for a single uncached sequence.

The generation pathways (vision/sound tokens sharing these attention layers, issue #13) extend
this module with their own projections next to the ones here, so one copy of the weights serves both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import DEFAULT_SDPA, SDPAScope
from vidloom.layers.grouped_attention import CausalAttention, KVAttention
from vidloom.layers.rms_norm import QwenRMSNorm
from vidloom.layers.rotary import apply_rotary
from vidloom.loading.name_map import NameMap
from vidloom.families.cosmos3.config import Cosmos3TextConfig

# diffusers Cosmos3OmniTransformer key prefix -> our parameter prefix (understanding pathway).
TEXT_NAME_MAP = NameMap((
    ("embed_tokens", "embed"),
    ("layers.{n}.self_attn.to_q", "blocks.{n}.attn.q"),
    ("layers.{n}.self_attn.to_k", "blocks.{n}.attn.k"),
    ("layers.{n}.self_attn.to_v", "blocks.{n}.attn.v"),
    ("layers.{n}.self_attn.to_out", "blocks.{n}.attn.o"),
    ("layers.{n}.self_attn.norm_q", "blocks.{n}.attn.q_norm"),
    ("layers.{n}.self_attn.norm_k", "blocks.{n}.attn.k_norm"),
    ("layers.{n}.input_layernorm", "blocks.{n}.attn_norm"),
    ("layers.{n}.post_attention_layernorm", "blocks.{n}.mlp_norm"),
    ("layers.{n}.mlp.gate_proj", "blocks.{n}.mlp.gate"),
    ("layers.{n}.mlp.up_proj", "blocks.{n}.mlp.up"),
    ("layers.{n}.mlp.down_proj", "blocks.{n}.mlp.down"),
    ("norm", "norm"),
    ("lm_head", "lm_head"),
))
# Checkpoint keys of the generation pathways (vision/sound/action towers, their attention and MLP
# experts): loaded by the generation side (issue #13), skipped by the understanding-only model.
GENERATION_KEY_PARTS = (".add_q_proj.", ".add_k_proj.", ".add_v_proj.", ".to_add_out.", ".norm_added_q.",
                        ".norm_added_k.", ".k_norm_und_for_gen.", "_moe_gen.")
GENERATION_KEY_PREFIXES = ("proj_in.", "proj_out.", "time_embedder.", "audio_proj_in.", "audio_proj_out.",
                           "audio_modality_embed", "action_proj_in.", "action_proj_out.", "action_modality_embed")


def is_generation_key(key: str) -> bool:
    """A checkpoint key that belongs to a generation pathway, not the understanding one."""
    return key.startswith(GENERATION_KEY_PREFIXES) or any(part in key for part in GENERATION_KEY_PARTS)


class MultimodalRotary(nn.Module):
    """Interleaved mrope: frequency i follows the t, h or w position by a fixed t,h,w,t,h,w... pattern.

    Follows Qwen3-VL's layout step by step (transformers `Qwen3VLTextRotaryEmbedding`, diffusers
    `Cosmos3VLTextRotaryEmbedding`), because the checkpoint's weights were trained against it.
    """

    def __init__(self, head_dim: int, theta: float, axes: tuple[int, int, int]) -> None:
        super().__init__()
        # No buffer: the frequencies are derived on use, so the module builds on the meta device.
        self.head_dim, self.theta, self.axes = head_dim, theta, axes

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions [3, T] -> cos, sin [T, head_dim] in `dtype`."""
        steps = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=positions.device)
        inv_freq = 1.0 / (self.theta ** (steps / self.head_dim))
        freqs = positions.float()[..., None] * inv_freq  # [3, T, head_dim/2]
        mixed = freqs[0].clone()
        for axis in (1, 2):  # h then w take every third frequency, starting at 1 and 2
            chosen = slice(axis, self.axes[axis] * 3, 3)
            mixed[..., chosen] = freqs[axis, ..., chosen]
        emb = torch.cat((mixed, mixed), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class TextAttention(nn.Module):
    def __init__(self, c: Cosmos3TextConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=c.attention_bias)
        self.k = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=c.attention_bias)
        self.v = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=c.attention_bias)
        self.o = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=c.attention_bias)
        self.q_norm: nn.Module = QwenRMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else nn.Identity()
        self.k_norm: nn.Module = QwenRMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else nn.Identity()

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], kv: KVAttention, layer: int) -> Tensor:
        rows = x.shape[:-1]  # [T], or [B, T] for a batch of generation requests (rope rows shared)
        q = self.q_norm(self.q(x).view(*rows, self.heads, self.head_dim))
        k = self.k_norm(self.k(x).view(*rows, self.kv_heads, self.head_dim))
        v = self.v(x).view(*rows, self.kv_heads, self.head_dim)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        return self.o(kv.attend(layer, q, k, v).reshape(*rows, -1))


class TextMLP(nn.Module):
    def __init__(self, c: Cosmos3TextConfig) -> None:
        super().__init__()
        self.gated = c.hidden_act == "silu"
        if self.gated:
            self.gate = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.gated:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(torch.relu(self.up(x)).square())  # Nemotron's squared ReLU


class TextBlock(nn.Module):
    def __init__(self, c: Cosmos3TextConfig) -> None:
        super().__init__()
        self.attn_norm = QwenRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.attn = TextAttention(c)
        self.mlp_norm = QwenRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = TextMLP(c)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], kv: KVAttention, layer: int) -> Tensor:
        x = x + self.attn(self.attn_norm(x), rope, kv, layer)
        return x + self.mlp(self.mlp_norm(x))


class Cosmos3Transformer(nn.Module):
    """The understanding pathway: packed token ids in, next-token logits out."""

    decode_graphs = True
    """Its decode step is capture-safe (runtime.decode_graphs): the interleaved mrope is computed on the device from the
    [3, B] positions buffer (its frequency pattern is fixed by the config, not by a value), attention and the causal
    mask are the KV store's (DecodeKV masks on the device), and the dense layers have no host-sized path; no op reads
    a device value on the host, so cuda_graphs replays a chat's decode per batch-size bucket."""

    def __init__(self, config: Cosmos3TextConfig, sdpa: SDPAScope = DEFAULT_SDPA) -> None:
        super().__init__()
        self.config = config
        self.sdpa = sdpa  # the SDPA kernels attention_backend allows (chosen at load; the KV stores call SDPA)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(TextBlock(config) for _ in range(config.num_hidden_layers))
        self.norm = QwenRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = MultimodalRotary(config.head_dim, config.rope_theta, config.rope_axes_dim)

    @property
    def attention_scale(self) -> float:
        return self.config.head_dim ** -0.5

    def forward(self, input_ids: Tensor, positions: Tensor, kv: KVAttention | None = None,
                logits_at: Tensor | None = None) -> Tensor:
        """input_ids [T] (packed sequences), positions [3, T] -> logits [T or len(logits_at), vocab]; or [B, T] ids
        of B uncached sequences of one length, positions alike (a batch of generation prompts' prefills).

        `logits_at` picks the tokens whose logits are wanted (each sequence's last while decoding), so
        the lm head runs on those rows only. Without `kv`, the T tokens are one uncached sequence.
        """
        kv = kv if kv is not None else CausalAttention(self.attention_scale)
        # 1. embed
        x = self.embed(input_ids)  # [T, hidden]
        rope = self.rotary(positions, x.dtype)  # cos, sin [T, head_dim]
        # 2. causal blocks (attention goes through the KV store, on the SDPA kernels the backend allows)
        with self.sdpa():
            for layer, block in enumerate(self.blocks):
                x = block(x, rope, kv, layer)
        # 3. head on the wanted rows
        if logits_at is not None:
            x = x[logits_at]
        return self.lm_head(self.norm(x))
