"""token2wav's flow-matching DiT: codec codes + a voice -> a mel spectrogram, one ODE step at a time.

The velocity network follows transformers' `Qwen2_5OmniToken2WavDiTModel` (5.24) step by step, as
the checkpoint's weights require: AdaLN-zero blocks over [noisy mel | ECAPA(reference mel) | code
embedding (each code repeated `repeats` times) | speaker vector], attention limited to neighbouring
blocks of `block_size` frames (per layer: one block back and/or ahead), rotary on the first head
only, in the interleaved layout the checkpoint was trained with. Sampling (RK4 with the 3/8 rule
over a swayed time grid, classifier-free guidance against a code/voice-free branch) lives in
`MelSampler`, one interval per call, so the runtime can step, report and cancel it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import DEFAULT_SDPA, SDPAScope
from vidloom.layers.fused_linear import linear_gelu_tanh
from vidloom.loading.name_map import NameMap
from vidloom.families.qwen_omni.config import DiTConfig
from vidloom.families.qwen_omni.speaker_encoder import SpeakerEncoder

# transformers keys (under token2wav.code2wav_dit_model.) -> ours.
DIT_NAME_MAP = NameMap((
    ("token2wav.code2wav_dit_model.time_embed.time_mlp.0", "time_fc1"),
    ("token2wav.code2wav_dit_model.time_embed.time_mlp.2", "time_fc2"),
    ("token2wav.code2wav_dit_model.text_embed.codec_embed", "code_embed"),
    ("token2wav.code2wav_dit_model.input_embed.proj", "in_proj"),
    ("token2wav.code2wav_dit_model.input_embed.spk_encoder", "speaker_encoder"),
    ("token2wav.code2wav_dit_model.transformer_blocks.{n}.attn_norm.linear", "blocks.{n}.attn_mod"),
    ("token2wav.code2wav_dit_model.transformer_blocks.{n}.attn.to_q", "blocks.{n}.q"),
    ("token2wav.code2wav_dit_model.transformer_blocks.{n}.attn.to_k", "blocks.{n}.k"),
    ("token2wav.code2wav_dit_model.transformer_blocks.{n}.attn.to_v", "blocks.{n}.v"),
    ("token2wav.code2wav_dit_model.transformer_blocks.{n}.attn.to_out.0", "blocks.{n}.o"),
    ("token2wav.code2wav_dit_model.transformer_blocks.{n}.ff.ff.0", "blocks.{n}.ff1"),
    ("token2wav.code2wav_dit_model.transformer_blocks.{n}.ff.ff.3", "blocks.{n}.ff2"),
    ("token2wav.code2wav_dit_model.norm_out.linear", "out_mod"),
    ("token2wav.code2wav_dit_model.proj_out", "proj_out"),
))
DIT_KEYS = ("token2wav.code2wav_dit_model.",)
TIME_FREQ_DIM = 256  # sinusoidal timestep features (F5-TTS / transformers DiTTimestepEmbedding)


def _layer_norm(x: Tensor) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], eps=1e-6)


def _rotate_first_head(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, H, T, D]: rotary on head 0 only, after moving its interleaved pairs to the half-split layout."""
    head = x[:, :1]
    head = torch.cat((head[..., 0::2], head[..., 1::2]), dim=-1)
    half = head.shape[-1] // 2
    rotated = torch.cat((-head[..., half:], head[..., :half]), dim=-1)
    head = head * cos[:, None] + rotated * sin[:, None]
    return torch.cat([head, x[:, 1:]], dim=1)


class DiTBlock(nn.Module):
    def __init__(self, c: DiTConfig, look_back: int, look_ahead: int) -> None:
        super().__init__()
        inner = c.head_dim * c.num_attention_heads
        self.heads, self.look_back, self.look_ahead = c.num_attention_heads, look_back, look_ahead
        self.attn_mod = nn.Linear(c.hidden_size, 6 * c.hidden_size)
        self.q, self.k, self.v = (nn.Linear(c.hidden_size, inner) for _ in range(3))
        self.o = nn.Linear(inner, c.hidden_size)
        self.ff1 = nn.Linear(c.hidden_size, c.hidden_size * c.ff_mult)
        self.ff2 = nn.Linear(c.hidden_size * c.ff_mult, c.hidden_size)

    def forward(self, x: Tensor, t_emb: Tensor, rope: tuple[Tensor, Tensor], block_diff: Tensor) -> Tensor:
        b, n, _ = x.shape
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = self.attn_mod(F.silu(t_emb)).chunk(6, dim=1)
        # 1. modulated attention over neighbouring blocks
        h = _layer_norm(x) * (1 + scale_a[:, None]) + shift_a[:, None]
        q, k, v = (proj(h).view(b, n, self.heads, -1).transpose(1, 2) for proj in (self.q, self.k, self.v))
        q, k = _rotate_first_head(q, *rope), _rotate_first_head(k, *rope)
        mask = (block_diff >= -self.look_back) & (block_diff <= self.look_ahead)  # [n, n]
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + gate_a[:, None] * self.o(attn.transpose(1, 2).reshape(b, n, -1))
        # 2. modulated MLP (ff1 and its tanh-GELU: one oneDNN GEMM in float32 CPU inference, layers.fused_linear)
        h = _layer_norm(x) * (1 + scale_f[:, None]) + shift_f[:, None]
        return x + gate_f[:, None] * self.ff2(linear_gelu_tanh(self.ff1, h))


class CodeToMelDiT(nn.Module):
    """The velocity network v(x_t, t | codes, voice)."""

    def __init__(self, config: DiTConfig, sdpa: SDPAScope = DEFAULT_SDPA) -> None:
        super().__init__()
        c = self.config = config
        self.sdpa = sdpa  # the SDPA kernels attention_backend allows (its attention is masked to nearby blocks)
        self.time_fc1, self.time_fc2 = nn.Linear(TIME_FREQ_DIM, c.hidden_size), nn.Linear(c.hidden_size, c.hidden_size)
        self.code_embed = nn.Embedding(c.num_embeds + 1, c.emb_dim)
        self.in_proj = nn.Linear(c.mel_dim + c.enc_dim + c.enc_emb_dim + c.emb_dim, c.hidden_size)
        self.speaker_encoder = SpeakerEncoder(c)
        self.blocks = nn.ModuleList(
            DiTBlock(c, int(i in c.look_backward_layers), int(i in c.look_ahead_layers))
            for i in range(c.num_hidden_layers))
        self.out_mod = nn.Linear(c.hidden_size, 2 * c.hidden_size)
        self.proj_out = nn.Linear(c.hidden_size, c.mel_dim)

    def time_embedding(self, t: Tensor) -> Tensor:
        """t [B] in [0, 1] -> [B, hidden] (sinusoids at scale 1000, then an MLP)."""
        half = TIME_FREQ_DIM // 2
        freqs = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
        angles = 1000 * t.unsqueeze(1) * freqs.unsqueeze(0)
        feats = torch.cat((angles.sin(), angles.cos()), dim=-1).to(t.dtype)
        return self.time_fc2(F.silu(self.time_fc1(feats)))

    def rope(self, frames: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        d = self.config.head_dim
        inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float, device=device) / d))
        freqs = torch.arange(frames, device=device).float()[:, None] * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[None]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, x: Tensor, t: Tensor, code_embed: Tensor, voice: Tensor, speaker: Tensor) -> Tensor:
        """x [B, frames, mel] at time t [B]; code_embed [B, frames, emb_dim]; voice [B, frames, enc_emb_dim]
        (the speaker vector, repeated); speaker [B, enc_dim] (ECAPA of the reference mel) -> velocity."""
        frames = x.shape[1]
        t_emb = self.time_embedding(t)
        h = self.in_proj(torch.cat((x, speaker[:, None].expand(-1, frames, -1), code_embed, voice), dim=-1))
        rope = self.rope(frames, x.device, h.dtype)
        blocks = torch.arange(frames, device=x.device) // self.config.block_size
        block_diff = blocks[None, :] - blocks[:, None]
        with self.sdpa():
            for block in self.blocks:
                h = block(h, t_emb, rope, block_diff)
        scale, shift = self.out_mod(F.silu(t_emb)).chunk(2, dim=1)
        return self.proj_out(_layer_norm(h) * (1 + scale[:, None]) + shift[:, None])


@dataclass
class MelState:
    """One request's ODE state (never on the module): the current mel, the time grid, the conditioning."""

    x: Tensor  # [1, frames, mel_dim]
    times: Tensor  # [num_steps] swayed grid from 0 to 1
    code_embed: Tensor  # [2, frames, emb_dim]: conditional, then code-free
    voice: Tensor  # [2, frames, enc_emb_dim]: the voice, then zeros
    speaker: Tensor  # [2, enc_dim]: ECAPA of the reference mel, then of a silent one
    step: int = 0

    @property
    def total(self) -> int:
        return self.times.shape[0] - 1


class MelSampler:
    """RK4 (3/8 rule) integration of the DiT's velocity field with classifier-free guidance, one interval
    per `step`. Defaults are transformers' `Qwen2_5OmniToken2WavModel.forward` (10 grid points, guidance
    0.5, sway -1)."""

    def __init__(self, dit: CodeToMelDiT, num_steps: int = 10, guidance_scale: float = 0.5,
                 sway_coefficient: float = -1.0) -> None:
        self.dit, self.num_steps = dit, num_steps
        self.guidance_scale, self.sway = guidance_scale, sway_coefficient

    def start(self, codes: Tensor, cond: Tensor, ref_mel: Tensor, generator: torch.Generator | None,
              noise: Tensor | None = None) -> MelState:
        """codes [N] (no end token), cond [1, enc_emb_dim], ref_mel [1, frames, mel_dim] -> the state at t=0.
        `noise` [1, frames, mel_dim]: the initial mel (a window of a streamed utterance's); None: drawn here."""
        c = self.dit.config
        frames = codes.shape[0] * c.repeats
        device, dtype = cond.device, cond.dtype
        if noise is None:
            noise = torch.randn((1, frames, c.mel_dim), generator=generator, dtype=dtype, device="cpu")
        x = noise.to(device, dtype)
        times = torch.linspace(0, 1, self.num_steps, device=device, dtype=dtype)
        if self.sway is not None:
            times = times + self.sway * (torch.cos(torch.pi / 2 * times) - 1 + times)
        embed = self.dit.code_embed(torch.stack([codes, torch.zeros_like(codes)]))
        code_embed = embed.repeat_interleave(c.repeats, dim=1)
        voice = torch.cat([cond, torch.zeros_like(cond)]).unsqueeze(1).expand(-1, frames, -1)
        speaker = self.dit.speaker_encoder(torch.cat([ref_mel, torch.zeros_like(ref_mel)]))
        return MelState(x, times, code_embed, voice, speaker)

    def velocity(self, state: MelState, t: Tensor, x: Tensor) -> Tensor:
        if self.guidance_scale < 1e-5:
            return self.dit(x, t.reshape(1), state.code_embed[:1], state.voice[:1], state.speaker[:1])
        both = self.dit(torch.cat([x, x]), t.reshape(1).expand(2), state.code_embed, state.voice, state.speaker)
        cond, free = both.chunk(2)
        return cond + (cond - free) * self.guidance_scale

    def step(self, state: MelState) -> MelState:
        """One RK4 interval (3/8 rule, as transformers' RungeKutta4ODESolver)."""
        t0, t1 = state.times[state.step], state.times[state.step + 1]
        h, x = t1 - t0, state.x
        third, two_thirds = 1 / 3, 2 / 3  # multiplied, not divided: the reference's rounding
        k1 = self.velocity(state, t0, x)
        k2 = self.velocity(state, t0 + h * third, x + h * k1 * third)
        k3 = self.velocity(state, t0 + h * two_thirds, x + h * (k2 - k1 * third))
        k4 = self.velocity(state, t1, x + h * (k1 - k2 + k3))
        state.x = x + (k1 + 3 * (k2 + k3) + k4) * h / 8
        state.step += 1
        return state

    @staticmethod
    def mel(state: MelState) -> Tensor:
        """The finished mel [1, mel_dim, frames] (the vocoder's layout)."""
        return state.x.permute(0, 2, 1)
