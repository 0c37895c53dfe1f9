"""Cosmos3 Omni's generation pathways: vision (sound, action) tokens attending to a cached text prefix.

Cosmos3OmniTransformer is a mixture of transformers: every layer has the text (understanding)
projections, which `Cosmos3Transformer` holds, and a second set for the generated tokens. Text
tokens attend causally to text only; generated tokens attend to all text keys/values plus each
other. So the text prefix's per-layer K/V never depend on the generated tokens nor on the step:
`prefill` computes them once per request (through the shared backbone, one copy of its weights)
and `forward` runs only the generated tokens against them, every step.

A generation layer has the same shape as a text layer (RMSNorm, GQA attention with per-head q/k
norms and interleaved mrope, RMSNorm, MLP), so it is a `TextBlock` holding the `*_moe_gen` /
`add_*` weights, whose attention reads the prefix through `PrefixAttention`.

Under sequence parallel (runtime.parallel.ulysses.apply_sp swaps `sequence` and wraps `joint`'s attention) the
generated stream [vision | sound | action] is sharded right after embedding with its rotary rows, padded at its end
when it does not split, and gathered before the heads. The prefix K/V stay whole on every rank (each rank prefills
them as one device does): they are a few hundred text rows against thousands of generated ones, computed once per
request by the causal text pathway, which never reads a generated token; sharding them would put that pathway under
sequence parallel too for little memory. Each rank's queries read its heads' slice of them (Ulysses) or all of them
(ring), with no exchange (runtime.parallel.ulysses.PrefixedUlysses, ring.PrefixedRing).

Checkpoints trained with `action_gen` add an action pathway: one token per action step, projected in and
out by per-embodiment weights (`DomainLinear`), joining the vision tokens in the same joint attention.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import DEFAULT_SDPA, SDPAScope
from vidloom.layers.block_stack import BlockStack
from vidloom.layers.grouped_attention import grouped_attention
from vidloom.layers.sequence import WHOLE_SEQUENCE, SequenceLayout
from vidloom.layers.rms_norm import QwenRMSNorm
from vidloom.layers.rotary import apply_rotary
from vidloom.loading.name_map import NameMap
from vidloom.families.cosmos3.gen_config import Cosmos3GenConfig
from vidloom.families.cosmos3.layout import GenLayout, patchify, unpatchify
from vidloom.families.cosmos3.transformer import Cosmos3Transformer, TextBlock, is_generation_key
from vidloom.layers.timestep import timestep_features

# diffusers Cosmos3OmniTransformer key prefix -> our parameter prefix (generation pathways).
GEN_NAME_MAP = NameMap((
    ("layers.{n}.self_attn.add_q_proj", "blocks.{n}.attn.q"),
    ("layers.{n}.self_attn.add_k_proj", "blocks.{n}.attn.k"),
    ("layers.{n}.self_attn.add_v_proj", "blocks.{n}.attn.v"),
    ("layers.{n}.self_attn.to_add_out", "blocks.{n}.attn.o"),
    ("layers.{n}.self_attn.norm_added_q", "blocks.{n}.attn.q_norm"),
    ("layers.{n}.self_attn.norm_added_k", "blocks.{n}.attn.k_norm"),
    ("layers.{n}.self_attn.k_norm_und_for_gen", "und_k_norms.{n}"),
    ("layers.{n}.input_layernorm_moe_gen", "blocks.{n}.attn_norm"),
    ("layers.{n}.post_attention_layernorm_moe_gen", "blocks.{n}.mlp_norm"),
    ("layers.{n}.mlp_moe_gen.gate_proj", "blocks.{n}.mlp.gate"),
    ("layers.{n}.mlp_moe_gen.up_proj", "blocks.{n}.mlp.up"),
    ("layers.{n}.mlp_moe_gen.down_proj", "blocks.{n}.mlp.down"),
    ("norm_moe_gen", "norm"),
    ("time_embedder.linear_1", "time_in"),
    ("time_embedder.linear_2", "time_out"),
))
TIME_FEATURES = 256  # diffusers Timesteps(num_channels=256, flip_sin_to_cos=True, downscale_freq_shift=0)
ACTION_PREFIXES = ("action_proj_in.", "action_proj_out.", "action_modality_embed")


def is_loaded_key(config: Cosmos3GenConfig):
    """Which checkpoint keys this module loads: the generation weights (the action heads when it has them)."""
    def wanted(key: str) -> bool:
        return is_generation_key(key) and (config.action_dim is not None or not key.startswith(ACTION_PREFIXES))
    return wanted


class DomainLinear(nn.Module):
    """A linear layer with one weight [in, out] and bias per embodiment domain, stored as embedding rows.

    The storage (`fc` rows of in*out, `bias` rows of out) is the checkpoint's (diffusers DomainAwareLinear);
    a request uses one domain, so its weight is a row lookup and one matmul.
    """

    def __init__(self, in_features: int, out_features: int, domains: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.fc = nn.Embedding(domains, in_features * out_features)
        self.bias = nn.Embedding(domains, out_features)

    def forward(self, x: Tensor, domain: int) -> Tensor:
        weight = self.fc.weight[domain].view(self.in_features, self.out_features)
        return x @ weight + self.bias.weight[domain]


@dataclass(frozen=True)
class ActionTokens:
    """The action streams of a forward: [B, T, action_dim] values (one row per request) and the embodiment's domain
    id, one for the whole batch (its projections are the domain's weights)."""

    values: Tensor
    domain: int

    def batch_key(self) -> tuple[object, ...]:
        """Requests of one embodiment and stream shape stack (runtime.batching's per-sample value)."""
        v = self.values
        return (self.domain, tuple(v.shape[1:]), v.dtype, v.device)

    @staticmethod
    def stack(streams: list[ActionTokens]) -> ActionTokens:
        return ActionTokens(torch.cat([s.values for s in streams]), streams[0].domain)


class CapturePrefix:
    """KVAttention for the prefix prefill: causal text attention, writing each layer's K/V into `buffer`.

    `buffer` [B, layers, 2, L, kv_heads, head_dim] holds, per prompt of the batch and per layer, the keys the
    generation pathway reads (after the optional `und_k_norms`) and the values.
    """

    def __init__(self, buffer: Tensor, scale: float, rope: tuple[Tensor, Tensor],
                 und_k_norms: nn.ModuleList | None) -> None:
        self.buffer, self.scale, self.rope, self.und_k_norms = buffer, scale, rope, und_k_norms

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        k_gen = k
        if self.und_k_norms is not None:
            # This only exists without text q/k norms, so k is the raw projection rotated: undo the
            # rotation (a rotation by -angle), normalise, rotate again, as the reference orders it.
            cos, sin = self.rope
            raw = apply_rotary(k, cos, -sin)
            k_gen = apply_rotary(self.und_k_norms[layer](raw), cos, sin)
        self.buffer[:, layer, 0].copy_(k_gen)
        self.buffer[:, layer, 1].copy_(v)
        return grouped_attention(q, k, v, self.scale, causal=True)


def prefixed_attention(q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor, prefix_v: Tensor,
                       mask: Tensor | None = None, prefix_mask: Tensor | None = None) -> Tensor:
    """One device's generated queries [(B,) S, H, Dh] over [prefix keys | generated keys] (scale 1/sqrt(head_dim), the
    backbone's); every row is here, so there is no pad `mask` (runtime.parallel.ulysses.PrefixedAttentionFn). A
    batch of requests (a leading B) brings one prefix per request, all of one length (gen_loop.Cosmos3View).

    `prefix_mask` [Lb] bool (True: a prompt key): a prefix padded to its prompt-length bucket under cuda_graphs
    (runtime.prompt_buckets.PROMPT_BUCKET); its padding keys are masked out (SDPA's boolean mask: their weights are
    exactly zero), every generated key kept. None: the prefix is the prompt's own length, attended unmasked (the reference's call)."""
    keys, values = torch.cat([prefix_k, k], dim=-3), torch.cat([prefix_v, v], dim=-3)
    if prefix_mask is None:
        return grouped_attention(q, keys, values, q.shape[-1] ** -0.5)
    kept = torch.cat([prefix_mask, prefix_mask.new_ones(k.shape[-3])])  # [Lb + S]: every query row alike
    return grouped_attention(q, keys, values, q.shape[-1] ** -0.5, key_mask=kept)


class JointAttention:
    """The generation blocks' attention function (one for every layer): what sequence parallel wraps."""

    def __init__(self, num_heads: int, kv_heads: int) -> None:
        self.num_heads, self.kv_heads = num_heads, kv_heads
        self.attention_fn = prefixed_attention


class PrefixAttention:
    """KVAttention for generated tokens: full attention over the cached prefix K/V plus their own (this device's
    rows of them; `key_mask`: the sharded stream's pad mask, or None).

    `prefix` [B, layers, 2, L, kv_heads, head_dim]: one request's (B = 1: its tokens run as [S, ...] rows, as a
    sharded stream's attention takes them) or a batch's, one per request (q [B, S, H, Dh]). `prefix_mask` [L] bool:
    which of its rows are prompt keys when it is padded to a prompt-length bucket (cuda_graphs), else None.
    """

    def __init__(self, prefix: Tensor, joint: JointAttention, key_mask: Tensor | None = None,
                 prefix_mask: Tensor | None = None) -> None:
        self.prefix, self.joint, self.key_mask, self.prefix_mask = prefix, joint, key_mask, prefix_mask

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        prefix = self.prefix[0] if q.dim() == 3 else self.prefix
        keys, values = prefix[..., layer, 0, :, :, :], prefix[..., layer, 1, :, :, :]
        if self.prefix_mask is None:
            return self.joint.attention_fn(q, k, v, keys, values, self.key_mask)
        # A bucket-padded prefix (cuda_graphs, one device: the card refuses graphs with a parallel plan).
        return prefixed_attention(q, k, v, keys, values, self.key_mask, self.prefix_mask)


@dataclass(frozen=True)
class GenConditioning:
    """What the generation blocks and the head read in one call (Cosmos3Generator.embed)."""

    rope: tuple[Tensor, Tensor]
    attention: PrefixAttention  # over this branch's cached prefix
    layout: GenLayout
    noisy: Tensor  # indices of the frames being generated
    action: ActionTokens | None = None  # the action stream; its domain picks the head's projection
    sdpa: SDPAScope = DEFAULT_SDPA  # the backbone's SDPA kernels (attention_backend)
    length: int = 0  # generated tokens of the whole stream before a sharded layout padded it


class Cosmos3Generator(BlockStack, nn.Module):
    """The vision/sound/action pathways; the text backbone is passed in, never copied or owned."""

    # Which rows of the generated stream this device holds: all of them, unless sequence parallel swapped in a
    # sharded layout from outside (runtime.parallel.ulysses.apply_sp, with prefixed_attentions()).
    sequence: SequenceLayout = WHOLE_SEQUENCE

    def __init__(self, config: Cosmos3GenConfig) -> None:
        super().__init__()
        self.config = config
        text = config.text
        self.joint = JointAttention(text.num_attention_heads, text.num_key_value_heads)
        gen_layer = dataclasses.replace(text, qk_norm=True)  # generation q/k norms always exist
        self.blocks = nn.ModuleList(TextBlock(gen_layer) for _ in range(text.num_hidden_layers))
        self.norm = QwenRMSNorm(text.hidden_size, text.rms_norm_eps)
        self.proj_in = nn.Linear(config.patch_latent_dim, text.hidden_size)
        self.proj_out = nn.Linear(text.hidden_size, config.patch_latent_dim)
        self.time_in = nn.Linear(TIME_FEATURES, text.hidden_size)
        self.time_out = nn.Linear(text.hidden_size, text.hidden_size)
        self.und_k_norms = (nn.ModuleList(QwenRMSNorm(text.head_dim, text.rms_norm_eps)
                                          for _ in range(text.num_hidden_layers))
                            if config.und_k_norm_for_gen else None)
        if config.sound_dim is not None:
            self.audio_proj_in = nn.Linear(config.sound_dim, text.hidden_size)
            self.audio_proj_out = nn.Linear(text.hidden_size, config.sound_dim)
            self.audio_modality_embed = nn.Parameter(torch.zeros(text.hidden_size))
        if config.action_dim is not None:
            self.action_proj_in = DomainLinear(config.action_dim, text.hidden_size, config.action_domains)
            self.action_proj_out = DomainLinear(text.hidden_size, config.action_dim, config.action_domains)
            self.action_modality_embed = nn.Parameter(torch.zeros(text.hidden_size))

    def self_attentions(self) -> tuple[()]:
        """None over the generated rows alone: every generation layer also reads the prefix (prefixed_attentions)."""
        return ()

    def prefixed_attentions(self) -> tuple[JointAttention]:
        """The one attention function of every generation layer: generated queries over the prefix and the
        generated keys (sequence parallel wraps it: runtime.parallel.ulysses.apply_sp)."""
        return (self.joint,)

    def prefix_shape(self, length: int) -> tuple[int, ...]:
        t = self.config.text
        return (t.num_hidden_layers, 2, length, t.num_key_value_heads, t.head_dim)

    @torch.no_grad()
    def prefill(self, backbone: Cosmos3Transformer, input_ids: Tensor, positions: Tensor, out: Tensor) -> Tensor:
        """Run the prompt through the text pathway once, writing every layer's K/V into `out`; returns it.

        One prompt: input_ids [L], out [layers, 2, L, kv_heads, head_dim]; or a batch of prompts of one length (their
        positions alike): input_ids [B, L], out [B, layers, 2, L, kv_heads, head_dim]."""
        if input_ids.dim() == 1:
            self.prefill(backbone, input_ids[None], positions, out[None])
            return out
        positions = positions.to(input_ids.device)
        rope = backbone.rotary(positions, out.dtype)
        capture = CapturePrefix(out, backbone.attention_scale, rope, self.und_k_norms)
        # No row needs logits: the head runs on zero rows.
        backbone(input_ids, positions, kv=capture, logits_at=input_ids.new_zeros(0))
        return out

    def _time_embedding(self, timestep: Tensor, dtype: torch.dtype) -> Tensor:
        """timestep [B] (one per request of a batch) -> [B, hidden]."""
        features = timestep_features((timestep.float() * self.config.timestep_scale).reshape(-1), TIME_FEATURES)
        weight_dtype = self.time_in.weight.dtype
        return self.time_out(F.silu(self.time_in(features.to(weight_dtype)))).to(dtype)

    @torch.no_grad()
    def forward(self, backbone: Cosmos3Transformer, prefix: Tensor, layout: GenLayout, latents: Tensor,
                timestep: Tensor, sound: Tensor | None = None,
                action: ActionTokens | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """One velocity prediction per request for the generated tokens against its cached prefix.

        A batch of B requests of one layout (B = 1: one request): prefix [B, layers, 2, L, kv_heads, head_dim],
        latents [B, C, T, h, w] (all frames; clean conditioning frames included), timestep [B], sound [B, C_s, T_s]
        or None, action: the action streams [B, T_a, action_dim] (clean conditioning steps included) or None.
        Returns the velocity [B, C, T, h, w] (zero at clean frames), the sound velocity or None, and the action
        velocity [B, T_a, action_dim] (zero at clean steps) or None.
        """
        x, cond = self.embed(backbone, prefix, layout, latents, timestep, sound, action)
        return self.head(self.run_blocks(x, cond), cond)

    # The stages below are the denoiser contract (core.denoiser.StagedDenoiser); forward() is exactly their
    # composition. The residual stream is the generated tokens, [B, S, hidden] (row b: request b of a batch).

    def embed(self, backbone: Cosmos3Transformer, prefix: Tensor, layout: GenLayout, latents: Tensor,
              timestep: Tensor, sound: Tensor | None = None, action: ActionTokens | None = None,
              prefix_mask: Tensor | None = None) -> tuple[Tensor, GenConditioning]:
        """The generated tokens (time-embedded where noisy) and what the blocks and the head read (`prefix_mask`:
        PrefixAttention's, for a bucket-padded prefix)."""
        dtype = prefix.dtype
        c = self.config
        batch = latents.shape[0]
        emb = self._time_embedding(timestep, dtype)[:, None]  # [B, 1, hidden]: each request's one timestep
        vision = self.proj_in(torch.stack([patchify(one.to(dtype), c.latent_patch_size) for one in latents]))
        per_frame = vision.view(batch, layout.grid[0], layout.frame_tokens, -1)
        noisy = layout.noisy_index if layout.noisy_index is not None else \
            torch.tensor(layout.noisy_frames, dtype=torch.long, device=vision.device)
        per_frame[:, noisy] = per_frame[:, noisy] + emb[:, None]
        parts = [vision]
        if sound is not None:
            parts.append(self.audio_proj_in(sound.to(dtype).transpose(1, 2)) + self.audio_modality_embed + emb)
        if action is not None:
            tokens = self.action_proj_in(action.values.to(dtype), action.domain) + self.action_modality_embed
            noisy_steps = list(layout.action_noisy)
            tokens[:, noisy_steps] = tokens[:, noisy_steps] + emb
            parts.append(tokens)
        x = torch.cat(parts, dim=1)
        cos, sin = backbone.rotary(layout.positions.to(x.device), dtype)
        # This device's rows of the generated stream (all of them on one device), with their rotary rows
        part = self.sequence.shard_joint(x, (cos, sin), 0)
        attention = PrefixAttention(prefix, self.joint, part.key_mask, prefix_mask)
        rope = (part.tables[0], part.tables[1])
        return part.tokens, GenConditioning(rope, attention, layout, noisy, action, backbone.sdpa, part.length)

    def run_blocks(self, x: Tensor, cond: GenConditioning, start: int = 0, end: int | None = None) -> Tensor:
        """Blocks [start, end) over the tokens [B, S, hidden]; one request's run as [S, hidden] rows (the shape its
        attention takes when sequence parallel shards them)."""
        h = x[0] if x.shape[0] == 1 else x
        with cond.sdpa():
            for layer in range(start, self.num_blocks if end is None else end):
                h = self.blocks[layer](h, cond.rope, cond.attention, layer)
        return h[None] if x.shape[0] == 1 else h

    def block_input(self, x: Tensor, cond: GenConditioning, index: int = 0) -> Tensor:
        """The normed tokens block `index` feeds to attention (TeaCache's indicator; the time embedding is
        in the tokens themselves)."""
        return self.blocks[index].attn_norm(x)

    def head(self, x: Tensor, cond: GenConditioning) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Tokens after the last block -> (vision velocity, sound velocity or None, action velocity or None)."""
        h = self.norm(self.sequence.gather_joint(x, cond.length))
        return (self._vision_out(h, cond.layout, cond.noisy), self._sound_out(h, cond.layout),
                self._action_out(h, cond.layout, cond.action))

    def _vision_out(self, x: Tensor, layout: GenLayout, noisy: Tensor) -> Tensor:
        batch = x.shape[0]
        tokens = x[:, : layout.vision_tokens].view(batch, layout.grid[0], layout.frame_tokens, -1)[:, noisy]
        pred = self.proj_out(tokens.reshape(batch, -1, tokens.shape[-1]))
        out = pred.new_zeros(batch, *layout.latent_shape)
        if len(layout.noisy_frames):
            for b in range(batch):
                out[b][:, noisy] = unpatchify(pred[b], len(layout.noisy_frames), layout.latent_shape, layout.patch)
        return out

    def _sound_out(self, x: Tensor, layout: GenLayout) -> Tensor | None:
        if not layout.sound_len:
            return None
        return self.audio_proj_out(x[:, layout.vision_tokens: layout.vision_tokens + layout.sound_len]).transpose(1, 2)

    def _action_out(self, x: Tensor, layout: GenLayout, action: ActionTokens | None) -> Tensor | None:
        if action is None:
            return None
        out = x.new_zeros(x.shape[0], layout.action_len, self.config.action_dim)
        if layout.action_noisy:
            rows = x[:, layout.vision_tokens + layout.sound_len:][:, list(layout.action_noisy)]
            out[:, list(layout.action_noisy)] = self.action_proj_out(rows, action.domain)
        return out
