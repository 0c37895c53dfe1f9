"""token2wav as runtime steps: the DiT's ODE one RK4 interval per step, then the BigVGAN vocoder node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from vidloom.core.loop import DONE, Done, LoopContext, StepPlan
from vidloom.core.program import NodeContext
from vidloom.families.qwen_omni.dit import MelSampler, MelState
from vidloom.families.qwen_omni.vocoder import BigVGAN
from vidloom.families.qwen_omni.thinker_loop import SpeechPrompt

TOKEN2WAV = "token2wav"
VOCODER = "vocoder"
SAMPLE_RATE = 24000  # Qwen2.5-Omni speaks at 24 kHz (model card; 50 codes/s x 2 mel frames x 240 samples)


@dataclass
class MelRun:
    """One request's sampler (its step count and guidance) and ODE state."""

    sampler: MelSampler
    state: MelState


def run_step(sampler: MelSampler, state: MelState) -> MelState:
    return sampler.step(state)


class Token2WavLoop:
    """Codes -> mel: `ode_steps - 1` RK4 intervals, each a step the runtime runs (progress, cancel)."""

    name = TOKEN2WAV

    def __init__(self, dit: Any) -> None:
        self.dit = dit

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> MelRun | None:
        prompt: SpeechPrompt = slots["speech"]
        codes: torch.Tensor = slots["codes"]
        if codes.numel() == 0 or prompt.request.audio_chunk_codes is not None:  # none, or streamed by the talker
            return None
        voice, device = prompt.voice, next(self.dit.parameters()).device
        # The initial noise comes from the request's seed (transformers draws it from the global RNG:
        # seeding that with the same number gives the same draw).
        generator = torch.Generator().manual_seed(prompt.request.seed) if prompt.request.seed is not None else None
        sampler = MelSampler(self.dit, num_steps=prompt.request.ode_steps)
        dtype = next(self.dit.parameters()).dtype
        state = sampler.start(codes.to(device), voice.cond.to(device, dtype), voice.ref_mel.to(device, dtype),
                              generator)
        return MelRun(sampler, state)

    def next(self, run: MelRun | None) -> StepPlan | Done:
        if run is None or run.state.step >= run.state.total:
            return DONE
        return StepPlan(loop=TOKEN2WAV, index=run.state.step, total=run.state.total, call=run_step,
                        inputs={"sampler": run.sampler, "state": run.state})

    def advance(self, run: MelRun, result: MelState) -> MelRun:
        run.state = result
        return run

    def finalize(self, run: MelRun | None) -> dict[str, Any]:
        return {"mel": None if run is None else MelSampler.mel(run.state)}


def vocoder_node(vocoder: BigVGAN):
    """The vocoder as a component node: mel -> float32 samples on the host."""

    def run(reads: Mapping[str, Any], ctx: NodeContext) -> Mapping[str, Any]:
        import numpy as np

        mel, voice = reads["mel"], reads["speech"].voice.name
        if reads.get("streamed") is not None:  # the talker's chunks, already sent: the whole is their sum
            return {"audio": reads["streamed"], "sample_rate": SAMPLE_RATE, "voice": voice}
        if mel is None:
            return {"audio": np.zeros(0, dtype=np.float32), "sample_rate": SAMPLE_RATE, "voice": voice}
        with torch.inference_mode():
            wave = vocoder(mel)[0].float().cpu().numpy()
        ctx.progress(VOCODER, 1, 1)
        return {"audio": wave, "sample_rate": SAMPLE_RATE, "voice": voice}

    return run
