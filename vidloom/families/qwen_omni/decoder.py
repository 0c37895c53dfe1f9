"""Qwen2.5-Omni's causal decoders (thinker text model and talker) over packed tokens and a pluggable KV store.

Qwen2 layout: per layer [RMSNorm -> GQA attention (q/k/v with bias, o without) with sectioned
multimodal rotary -> residual -> RMSNorm -> gated SiLU MLP -> residual], final RMSNorm. The thinker
reads token ids and ends in an lm head; the talker reads thinker-space embeddings (hidden state plus
token embedding of each thinker token, plus a codec-token embedding), projects them to its own width
and ends in a codec head. Both expose the final normed hidden states: the thinker's feed the talker.
Which sequence a packed token belongs to is the KV store's business (runtime paged pool, or a
contiguous cache for one sequence). Each layer is split around that attention call (PreAttention,
PostAttention): those parts are what the runtime compiles and stores in FP8 (`compile_units`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import DEFAULT_SDPA, SDPAScope
from vidloom.layers.fp8 import project
from vidloom.layers.grouped_attention import CausalAttention, KVAttention
from vidloom.layers.rms_norm import QwenRMSNorm
from vidloom.layers.rotary import apply_rotary, axis_frequencies, rotary_tables
from vidloom.loading.name_map import NameMap, causal_lm_map
from vidloom.families.qwen_omni.config import DecoderConfig

_LAYER_RULES = (
    ("layers.{n}.input_layernorm", "blocks.{n}.pre_attention.norm"),
    ("layers.{n}.self_attn.q_proj", "blocks.{n}.pre_attention.q"),
    ("layers.{n}.self_attn.k_proj", "blocks.{n}.pre_attention.k"),
    ("layers.{n}.self_attn.v_proj", "blocks.{n}.pre_attention.v"),
    ("layers.{n}.self_attn.o_proj", "blocks.{n}.post_attention.o"),
    ("layers.{n}.post_attention_layernorm", "blocks.{n}.post_attention.norm"),
    ("layers.{n}.mlp.gate_proj", "blocks.{n}.post_attention.gate"),
    ("layers.{n}.mlp.up_proj", "blocks.{n}.post_attention.up"),
    ("layers.{n}.mlp.down_proj", "blocks.{n}.post_attention.down"),
)
# transformers Qwen2_5OmniForConditionalGeneration keys -> ours (the thinker's audio and vision towers are
# transformers' modules, loaded apart: families.qwen_omni.encoders).
THINKER_NAME_MAP = causal_lm_map("thinker", _LAYER_RULES)
TALKER_NAME_MAP = NameMap((("talker.model.embed_tokens", "embed"), ("talker.thinker_to_talker_proj", "proj_in"),
                           *((f"talker.model.{a}", b) for a, b in _LAYER_RULES),
                           ("talker.model.norm", "norm"), ("talker.codec_head", "head")))
THINKER_KEYS = ("thinker.model.", "thinker.lm_head.")
TALKER_KEYS = ("talker.",)


class SectionedRotary(nn.Module):
    """Qwen2-VL mrope: consecutive frequency sections follow the t, h and w positions in turn.

    Follows transformers' `Qwen2_5OmniRotaryEmbedding` layout step by step (the weights were trained
    against it); with text positions (equal on all axes) it is plain 1-d rotary.
    """

    def __init__(self, head_dim: int, theta: float, section: tuple[int, ...]) -> None:
        super().__init__()
        self.head_dim, self.theta, self.section = head_dim, theta, tuple(section)

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions [3, T] -> cos, sin [T, head_dim] in `dtype`."""
        freqs = axis_frequencies(positions, self.head_dim, self.theta)  # [3, T, head_dim/2]
        chunks = freqs.split(list(self.section), dim=-1) if sum(self.section) == freqs.shape[-1] else (freqs,)
        return rotary_tables(torch.cat([chunk[i % 3] for i, chunk in enumerate(chunks)], dim=-1), dtype)


class PreAttention(nn.Module):
    """A block's work before attention: RMSNorm, q/k/v projections, rotary. Reads only this forward's tokens,
    so it compiles (a compile unit) while the KV store's attention stays outside the graph."""

    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.norm = QwenRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.q = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim)
        self.k = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim)
        self.v = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [T, hidden] -> q [T, H, D], k and v [T, KVH, D] (q and k rotated)."""
        t = x.shape[0]
        q, k, v = project(self.norm(x), self.q, self.k, self.v)  # FP8: one quantized activation for all three
        q = apply_rotary(q.view(t, self.heads, self.head_dim), cos, sin)
        k = apply_rotary(k.view(t, self.kv_heads, self.head_dim), cos, sin)
        return q, k, v.view(t, self.kv_heads, self.head_dim)


class PostAttention(nn.Module):
    """A block's work after attention: output projection and residual, RMSNorm, gated SiLU MLP and residual
    (a compile unit, like PreAttention)."""

    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.o = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.norm = QwenRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.gate = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: Tensor, attended: Tensor) -> Tensor:
        """x [T, hidden] (the block's input), attended [T, H * D] -> the block's output [T, hidden]."""
        x = x + self.o(attended)
        gate, up = project(self.norm(x), self.gate, self.up)
        return x + self.down(F.silu(gate) * up)


class Block(nn.Module):
    """One decoder layer, split around attention: only the KV store's attend (it reads and writes the cache of
    this forward's sequences) sits between the two compile units."""

    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.pre_attention, self.post_attention = PreAttention(c), PostAttention(c)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], kv: KVAttention, layer: int) -> Tensor:
        q, k, v = self.pre_attention(x, *rope)
        return self.post_attention(x, kv.attend(layer, q, k, v).reshape(x.shape[0], -1))


class OmniDecoder(nn.Module):
    """A causal decoder: embeddings [T, embedding_size] (or ids) in, normed hidden states and head logits out.

    `proj_in` exists for the talker only (thinker-space inputs -> its width); the head is the thinker's
    lm head or the talker's codec head.
    """

    compile_dynamic = True
    """The compile units see a different token count almost every call (prompt lengths, decode batches): one
    graph with a symbolic token axis serves them all (core.denoiser.CompileUnits)."""
    decode_graphs = True
    """Its decode step is capture-safe (runtime.decode_graphs): every op's shape follows its inputs' shapes and
    nothing reads a device value on the host, so cuda_graphs replays it per decode batch-size bucket."""

    def __init__(self, config: DecoderConfig, projects_input: bool = False,
                 sdpa: SDPAScope = DEFAULT_SDPA) -> None:
        super().__init__()
        self.config = config
        self.sdpa = sdpa  # the SDPA kernels attention_backend allows (chosen at load; the KV stores call SDPA)
        self.embed = nn.Embedding(config.vocab_size, config.embedding_size)
        self.proj_in = nn.Linear(config.embedding_size, config.hidden_size) if projects_input else None
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers))
        self.norm = QwenRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = SectionedRotary(config.head_dim, config.rope_theta, config.mrope_section)

    @property
    def attention_scale(self) -> float:
        return self.config.head_dim ** -0.5

    def compile_units(self) -> tuple[nn.Module, ...]:
        """What `--compile` wraps and `--fp8` quantizes (core.denoiser.CompileUnits): every block's work before
        and after attention; the embedding, input projection, final norm and head stay as loaded."""
        return (*(b.pre_attention for b in self.blocks), *(b.post_attention for b in self.blocks))

    def hidden(self, embeds: Tensor, positions: Tensor, kv: KVAttention | None = None) -> Tensor:
        """embeds [T, embedding_size] (packed), positions [3, T] -> final normed hidden states [T, hidden]."""
        kv = kv if kv is not None else CausalAttention(self.attention_scale)
        # 1. into the decoder's width (the talker projects thinker-space inputs)
        x = embeds if self.proj_in is None else self.proj_in(embeds)
        rope = self.rotary(positions, x.dtype)
        # 2. causal blocks (attention through the KV store, on the SDPA kernels the backend allows)
        with self.sdpa():
            for layer, block in enumerate(self.blocks):
                x = block(x, rope, kv, layer)
        return self.norm(x)

    def forward(self, input_ids: Tensor | None, positions: Tensor, kv: KVAttention | None = None,
                logits_at: Tensor | None = None, return_hidden: bool = False,
                embeds_at: tuple[Tensor, Tensor] | None = None,
                inputs_embeds: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """Token ids [T] -> logits [T or len(logits_at), vocab] (the runtime's paged decode contract); with
        `return_hidden`, also every token's final hidden state [T, hidden] (what a talker reads).
        `embeds_at` (index [K], rows [K, embedding_size]) replaces those tokens' embeddings (audio and image
        placeholders take their encoder's rows, as transformers' masked_scatter does). `inputs_embeds`
        [T, embedding_size] in place of ids: the talker's input rows."""
        embeds = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        if embeds_at is not None:
            index, rows = embeds_at
            embeds = embeds.index_copy(0, index, rows.to(embeds.dtype))
        x = self.hidden(embeds, positions, kv)
        logits = self.head(x if logits_at is None else x[logits_at])
        return (logits, x) if return_hidden else logits
