"""Qwen3-Omni's MoE decoders (the thinker's text model, the talker's) over packed tokens and a pluggable KV store.

Per layer [RMSNorm -> GQA attention (q/k/v/o, biases when attention_bias) with a per-head RMSNorm on q and k
before the interleaved multimodal rotary -> residual -> RMSNorm -> sparse MoE or dense MLP -> residual], final
RMSNorm, lm head. Prompt media (`embeds_at`) replace their placeholders' embeddings, and an image's deepstack
features are added to its tokens' states after the first blocks. Which sequence a packed token belongs to is the KV store's business (the runtime's paged
pool, or one causal sequence); each layer is split around that attention call (PreAttention, PostAttention).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vidloom.layers.attention import DEFAULT_SDPA, SDPAScope
from vidloom.layers.grouped_attention import CausalAttention, KVAttention
from vidloom.layers.rms_norm import QwenRMSNorm
from vidloom.layers.rotary import apply_rotary, axis_frequencies, rotary_tables
from vidloom.loading.name_map import NameMap, causal_lm_map
from vidloom.families.qwen3_omni.config import MoEDecoderConfig
from vidloom.families.qwen3_omni.moe import GatedMLP, SparseMoE

LAYER_RULES = (
    ("layers.{n}.input_layernorm", "blocks.{n}.pre_attention.norm"),
    ("layers.{n}.self_attn.q_proj", "blocks.{n}.pre_attention.q"),
    ("layers.{n}.self_attn.k_proj", "blocks.{n}.pre_attention.k"),
    ("layers.{n}.self_attn.v_proj", "blocks.{n}.pre_attention.v"),
    ("layers.{n}.self_attn.q_norm", "blocks.{n}.pre_attention.q_norm"),
    ("layers.{n}.self_attn.k_norm", "blocks.{n}.pre_attention.k_norm"),
    ("layers.{n}.self_attn.o_proj", "blocks.{n}.post_attention.o"),
    ("layers.{n}.post_attention_layernorm", "blocks.{n}.post_attention.norm"),
    # Sparse layers: one tensor per expert on disk, one row of a stacked parameter here.
    ("layers.{n}.mlp.experts.{n}.gate_proj.weight", "blocks.{n}.post_attention.mlp.gate.{n}"),
    ("layers.{n}.mlp.experts.{n}.up_proj.weight", "blocks.{n}.post_attention.mlp.up.{n}"),
    ("layers.{n}.mlp.experts.{n}.down_proj.weight", "blocks.{n}.post_attention.mlp.down.{n}"),
    ("layers.{n}.mlp.gate.weight", "blocks.{n}.post_attention.mlp.router"),
    ("layers.{n}.mlp.shared_expert_gate", "blocks.{n}.post_attention.mlp.shared_gate"),
    ("layers.{n}.mlp.shared_expert.gate_proj", "blocks.{n}.post_attention.mlp.shared.gate"),
    ("layers.{n}.mlp.shared_expert.up_proj", "blocks.{n}.post_attention.mlp.shared.up"),
    ("layers.{n}.mlp.shared_expert.down_proj", "blocks.{n}.post_attention.mlp.shared.down"),
    # Dense layers (mlp_only_layers, or off the decoder_sparse_step grid).
    ("layers.{n}.mlp.gate_proj", "blocks.{n}.post_attention.mlp.gate"),
    ("layers.{n}.mlp.up_proj", "blocks.{n}.post_attention.mlp.up"),
    ("layers.{n}.mlp.down_proj", "blocks.{n}.post_attention.mlp.down"),
)
# transformers Qwen3OmniMoeForConditionalGeneration keys -> ours (the towers, talker and code2wav load apart).
THINKER_NAME_MAP = causal_lm_map("thinker", LAYER_RULES)
THINKER_KEYS = ("thinker.model.", "thinker.lm_head.")
DENSE_LAYER_RULES = LAYER_RULES[:8] + LAYER_RULES[-3:]  # attention and a dense MLP (the code predictor's layers)


class InterleavedRotary(nn.Module):
    """Qwen3-VL's interleaved mrope: rotary pair i follows the h position when i % 3 == 1 and i < 3 * section[1],
    the w position when i % 3 == 2 and i < 3 * section[2], else the t position.

    Follows transformers' `Qwen3OmniMoeThinkerTextRotaryEmbedding` layout (the weights were trained against it);
    with text positions (equal on all axes) it is plain 1-d rotary.
    """

    def __init__(self, head_dim: int, theta: float, section: tuple[int, int, int]) -> None:
        super().__init__()
        self.head_dim, self.theta, self.section = head_dim, theta, tuple(section)

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions [3, T] -> cos, sin [T, head_dim] in `dtype`."""
        freqs = axis_frequencies(positions, self.head_dim, self.theta)  # [3, T, head_dim/2]
        mixed = freqs[0].clone()
        for axis in (1, 2):
            picked = slice(axis, 3 * self.section[axis], 3)
            mixed[..., picked] = freqs[axis, ..., picked]
        return rotary_tables(mixed, dtype)


class PreAttention(nn.Module):
    """A block's work before attention: RMSNorm, q/k/v projections, q/k head norms, rotary."""

    def __init__(self, c: MoEDecoderConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.norm = QwenRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.q = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=c.attention_bias)
        self.k = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=c.attention_bias)
        self.v = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=c.attention_bias)
        self.q_norm = QwenRMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = QwenRMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [T, hidden] -> q [T, H, D], k and v [T, KVH, D] (q and k normed per head, then rotated)."""
        t, h = x.shape[0], self.norm(x)
        q = self.q_norm(self.q(h).view(t, self.heads, self.head_dim))
        k = self.k_norm(self.k(h).view(t, self.kv_heads, self.head_dim))
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), self.v(h).view(t, self.kv_heads, self.head_dim)


class PostAttention(nn.Module):
    """A block's work after attention: output projection and residual, RMSNorm, MoE (or dense MLP) and residual."""

    def __init__(self, c: MoEDecoderConfig, sparse: bool) -> None:
        super().__init__()
        self.o = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=c.attention_bias)
        self.norm = QwenRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp: nn.Module = (SparseMoE(c.hidden_size, c.moe_intermediate_size, c.num_experts, c.num_experts_per_tok,
                                         c.norm_topk_prob, c.shared_expert_intermediate_size) if sparse
                               else GatedMLP(c.hidden_size, c.dense_intermediate_size))

    def forward(self, x: Tensor, attended: Tensor, fixed_shapes: bool = False) -> Tensor:
        """x [T, hidden] (the block's input), attended [T, H * D] -> the block's output [T, hidden].
        `fixed_shapes`: a captured step's, where the MoE may not size its groups on the host."""
        x = x + self.o(attended)
        normed = self.norm(x)
        return x + (self.mlp(normed, fixed_shapes) if isinstance(self.mlp, SparseMoE) else self.mlp(normed))


class Block(nn.Module):
    def __init__(self, c: MoEDecoderConfig, layer: int) -> None:
        super().__init__()
        self.pre_attention, self.post_attention = PreAttention(c), PostAttention(c, c.sparse(layer))

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], kv: KVAttention, layer: int) -> Tensor:
        q, k, v = self.pre_attention(x, *rope)
        # A KV store that fixes every shape (a captured decode step's) asks the MoE for its host-free path too.
        return self.post_attention(x, kv.attend(layer, q, k, v).reshape(x.shape[0], -1),
                                   getattr(kv, "fixed_shapes", False))


class MoEDecoder(nn.Module):
    """Token ids (or embeddings) in, final normed hidden states and lm-head logits out (the runtime's paged decode
    contract: `forward(ids, positions, kv=, logits_at=)`)."""

    decode_graphs = True
    """Its decode step is capture-safe (runtime.decode_graphs): under a KV store with `fixed_shapes` (the captured
    step's) the MoE layers dispatch without reading group sizes on the host (SparseMoE.fixed_experts)."""

    def __init__(self, config: MoEDecoderConfig, sdpa: SDPAScope = DEFAULT_SDPA, tap_layer: int | None = None) -> None:
        super().__init__()
        self.config = config
        # What `return_hidden` gives: None, the final normed states; n, transformers' hidden_states[n] (0: the input
        # embeddings, n: block n's output; the last is the normed one) -- the thinker's state the talker reads.
        self.tap_layer = tap_layer
        self.sdpa = sdpa  # the SDPA kernels attention_backend allows (chosen at load; the KV stores call SDPA)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(Block(config, n) for n in range(config.num_hidden_layers))
        self.norm = QwenRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = InterleavedRotary(config.head_dim, config.rope_theta, config.mrope_section)

    @property
    def attention_scale(self) -> float:
        return self.config.head_dim ** -0.5

    def hidden(self, embeds: Tensor, positions: Tensor, kv: KVAttention | None = None) -> Tensor:
        """embeds [T, hidden] (packed), positions [3, T] -> final normed hidden states [T, hidden]."""
        return self._run(embeds, positions, kv)[0]

    def _run(self, embeds: Tensor, positions: Tensor, kv: KVAttention | None,
             deepstack: tuple[Tensor, list[Tensor]] | None = None) -> tuple[Tensor, Tensor]:
        """-> (final normed states, the states at tap_layer (the final ones when untapped)) [T, hidden].
        `deepstack` (index [K], one [K, hidden] per block) is added to those tokens after blocks 0, 1, ... (after
        the tap: a tapped block's output is read without it)."""
        kv = kv if kv is not None else CausalAttention(self.attention_scale)
        rope = self.rotary(positions, embeds.dtype)
        x = tapped = embeds
        with self.sdpa():
            for layer, block in enumerate(self.blocks):
                x = block(x, rope, kv, layer)
                if layer + 1 == self.tap_layer:  # the block's output, before deepstack (transformers records it so)
                    tapped = x
                if deepstack is not None and layer < len(deepstack[1]):
                    x = x.index_add(0, deepstack[0], deepstack[1][layer].to(x.dtype))
        x = self.norm(x)
        return x, (x if self.tap_layer in (None, len(self.blocks)) else tapped)

    def forward(self, input_ids: Tensor | None, positions: Tensor, kv: KVAttention | None = None,
                logits_at: Tensor | None = None, return_hidden: bool = False,
                inputs_embeds: Tensor | None = None,
                embeds_at: tuple[Tensor, Tensor] | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """Token ids [T] (or `inputs_embeds` [T, hidden]) -> logits [T or len(logits_at), vocab]; with
        `return_hidden`, also every token's hidden state at tap_layer [T, hidden] (the final one untapped).
        `embeds_at` (index [K], rows [K, hidden * (1 + deepstack)]) replaces those tokens' embeddings with the
        rows' first hidden columns (the towers' output) and adds the next ones after blocks 0, 1, ... (deepstack)."""
        embeds = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        deepstack = None
        if embeds_at is not None:
            index, rows = embeds_at
            parts = rows.to(embeds.dtype).split(self.config.hidden_size, dim=-1)
            embeds = embeds.index_copy(0, index, parts[0])
            deepstack = (index, list(parts[1:])) if len(parts) > 1 else None
        x, tapped = self._run(embeds, positions, kv, deepstack)
        logits = self.head(x if logits_at is None else x[logits_at])
        return (logits, tapped) if return_hidden else logits
