"""Qwen3-Omni's talker: thinker rows projected in, a MoE decoder choosing each codec frame's first code, and a code
predictor (a small dense decoder) choosing the frame's other codebooks from the talker's state.

Follows transformers 5.25 `Qwen3OmniMoeTalkerForConditionalGeneration` (its `text_projection` /
`hidden_projection` resize MLPs, `codec_head`, and `code_predictor`, run as its `prepare_inputs_for_generation`
runs it: prefill [talker state, first code's embedding], then one code per step through that group's embedding).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import DEFAULT_SDPA, SDPAScope
from vidloom.layers.grouped_attention import grouped_attention
from vidloom.layers.rms_norm import QwenRMSNorm
from vidloom.layers.rotary import text_positions
from vidloom.loading.name_map import NameMap
from vidloom.families.qwen3_omni.config import MoEDecoderConfig, Qwen3OmniConfig
from vidloom.families.qwen3_omni.decoder import LAYER_RULES, DENSE_LAYER_RULES, Block, InterleavedRotary, MoEDecoder

# transformers' talker keys -> ours (the thinker's and code2wav's load apart).
TALKER_NAME_MAP = NameMap((
    ("talker.model.codec_embedding", "decoder.embed"),
    *((f"talker.model.{a}", f"decoder.{b}") for a, b in LAYER_RULES),
    ("talker.model.norm", "decoder.norm"), ("talker.codec_head", "decoder.head"),
    ("talker.text_projection", "text_projection"), ("talker.hidden_projection", "hidden_projection"),
    ("talker.code_predictor.model.codec_embedding", "predictor.embeds"),
    *((f"talker.code_predictor.model.{a}", f"predictor.{b}") for a, b in DENSE_LAYER_RULES),
    ("talker.code_predictor.model.norm", "predictor.norm"), ("talker.code_predictor.lm_head", "predictor.heads"),
))
TALKER_KEYS = ("talker.",)

Pick = Callable[[Tensor, int], Tensor]
"""(logits [B, vocab] of codebook g, g) -> chosen ids [B]: greedy or each sequence's sampler."""


class ResizeMLP(nn.Module):
    """Thinker width -> talker width: fc1, SiLU, fc2 (both with biases)."""

    def __init__(self, width_in: int, inner: int, width_out: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(width_in, inner)
        self.linear_fc2 = nn.Linear(inner, width_out)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class EqualRowsCache:
    """KV for B sequences of equal length packed sequence-major: prefill attends causally, a step attends to all."""

    def __init__(self, batch: int, scale: float) -> None:
        self.batch, self.scale = batch, scale
        self.kv: dict[int, tuple[Tensor, Tensor]] = {}

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        b = self.batch
        q, k, v = (t.reshape(b, -1, *t.shape[1:]) for t in (q, k, v))
        if layer in self.kv:
            k, v = torch.cat([self.kv[layer][0], k], 1), torch.cat([self.kv[layer][1], v], 1)
        self.kv[layer] = (k, v)
        out = grouped_attention(q, k, v, self.scale, causal=q.shape[1] > 1)
        return out.reshape(-1, *out.shape[2:])


class CodePredictor(nn.Module):
    """The codebooks after the first: group g (1..G-1) has its own input embedding and head over one decoder."""

    def __init__(self, config: MoEDecoderConfig, groups: int) -> None:
        super().__init__()
        self.config = config
        self.blocks = nn.ModuleList(Block(config, n) for n in range(config.num_hidden_layers))
        self.norm = QwenRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = InterleavedRotary(config.head_dim, config.rope_theta, config.mrope_section)
        self.embeds = nn.ModuleList(nn.Embedding(config.vocab_size, config.hidden_size) for _ in range(groups - 1))
        self.heads = nn.ModuleList(nn.Linear(config.hidden_size, config.vocab_size, bias=False)
                                   for _ in range(groups - 1))

    def _step(self, x: Tensor, start: int, kv: EqualRowsCache) -> Tensor:
        """x [B, S, hidden] at positions start.. -> the last position's normed state [B, hidden]."""
        b, s, _ = x.shape
        rope = self.rotary(text_positions(start, s, x.device).repeat(1, b), x.dtype)
        x = x.reshape(b * s, -1)
        for layer, block in enumerate(self.blocks):
            x = block(x, rope, kv, layer)
        return self.norm(x.view(b, s, -1)[:, -1])

    def forward(self, state: Tensor, first: Tensor, pick: Pick) -> tuple[Tensor, Tensor]:
        """state [B, hidden] (the talker's last state), first [B, hidden] (its code's codec embedding) ->
        (codes [B, G-1], the sum of their embeddings [B, hidden])."""
        kv = EqualRowsCache(state.shape[0], self.config.head_dim ** -0.5)
        x, codes, total = torch.stack([state, first], 1), [], torch.zeros_like(state)
        for g, head in enumerate(self.heads):
            code = pick(head(self._step(x, 0 if g == 0 else g + 1, kv)).float(), g + 1)
            row = self.embeds[g](code)
            codes.append(code)
            total = total + row
            x = row[:, None]
        return torch.stack(codes, 1), total


class Talker(nn.Module):
    """The talker's parts: input projections, MoE decoder (codec embedding in, codec head out), code predictor."""

    def __init__(self, config: Qwen3OmniConfig, sdpa: SDPAScope = DEFAULT_SDPA) -> None:
        super().__init__()
        assert config.talker is not None and config.speech is not None
        talker, speech = config.talker, config.speech
        self.speech = speech
        self.decoder = MoEDecoder(talker, sdpa=sdpa)
        width = (speech.thinker_hidden_size, talker.dense_intermediate_size, talker.hidden_size)
        self.text_projection, self.hidden_projection = ResizeMLP(*width), ResizeMLP(*width)
        self.predictor = CodePredictor(speech.predictor, speech.code_groups)
