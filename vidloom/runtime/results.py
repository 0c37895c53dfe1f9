"""Turn a finished run's output slots into what its caller reads: a VideoOutput, a ChatResult or a SpeechResult."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from vidloom.core.card import ModelCard
from vidloom.core.chat import ChatRequest, ChatResult
from vidloom.core.output import VideoOutput
from vidloom.core.request import GenerationRequest
from vidloom.core.session import VideoSession, model_key
from vidloom.core.speech import SpeechRequest, SpeechResult
from vidloom.media.output import save_output
from vidloom.media.frames import to_uint8


def result_of(card: ModelCard, work: Any) -> Callable[[dict[str, Any]], Any]:
    """What a finished run of `work` (any request kind an engine takes) resolves to, from its output slots."""
    if isinstance(work, ChatRequest):
        return chat_result
    if isinstance(work, SpeechRequest):
        return speech_result
    return lambda outputs: video_output(card, outputs)


def chat_result(outputs: dict[str, Any]) -> ChatResult:
    """A finished chat run's result (its program's `completion` slot)."""
    return outputs["completion"]


def speech_result(outputs: dict[str, Any]) -> SpeechResult:
    """A finished speech run's result (its program's `thinker`, `codes`, `audio`, `sample_rate` slots)."""
    request: SpeechRequest = outputs["request"]
    thinker = outputs["thinker"]
    return SpeechResult(request_id=request.request_id, audio=outputs["audio"], sample_rate=int(outputs["sample_rate"]),
                        text=thinker.text, voice=outputs["voice"], audio_tokens=int(outputs["codes"].numel()),
                        text_tokens=len(thinker.reply_ids), elapsed_s=float(outputs.get("elapsed_s", 0.0)))


def video_output(card: ModelCard, outputs: dict[str, Any]) -> VideoOutput:
    """uint8 frames plus the metadata a user needs to reproduce the run."""
    r: GenerationRequest = outputs["request"]
    metadata = {
        "model": card.model_id,
        "request_id": r.request_id,
        "task": r.task.value,
        "prompt": r.prompt,
        "negative_prompt": r.negative_prompt,
        "height": r.height,
        "width": r.width,
        "num_frames": r.num_frames,
        "fps": r.fps,
        "num_inference_steps": r.num_inference_steps,
        "guidance_scale": r.guidance_scale,
        "flow_shift": r.flow_shift,
        "sampler": r.sampler,
        "seed": r.seed,
        "elapsed_s": round(outputs["elapsed_s"], 3),
    }
    if r.option("seconds") is not None:  # an audio-only card: the clip's timeline instead of frames and size
        for name in ("height", "width", "num_frames", "fps"):
            metadata.pop(name)
        metadata.update(seconds=r.option("seconds"), seconds_start=r.option("seconds_start"))
    for slot in card.metadata_slots:  # what the family reports of its own (e.g. a reasoned prompt)
        if outputs.get(slot) is not None:
            metadata[slot] = outputs[slot]
    if "step_cache" in outputs:  # only when the deployment runs a step cache
        metadata["step_cache"] = outputs["step_cache"]
    if "disabled" in outputs:  # deployed features this run ran without, and why (runtime.turned_off)
        metadata["disabled"] = outputs["disabled"]
    session = None
    if "session" in outputs:  # a causal rollout: the video can be extended
        session = video_session(card, r, outputs["session"])
        if outputs["session"]["resumed"]:
            metadata["extension"] = {"extend_from": session_source(r), "kv": outputs["session"]["resumed"]}
    audio, sample_rate = output_audio(outputs)
    return VideoOutput(frames=to_uint8(outputs["video"]), fps=r.fps, metadata=metadata, audio=audio,
                       sample_rate=sample_rate, session=session, actions=outputs.get("actions"), writer=save_output)


def video_session(card: ModelCard, r: GenerationRequest, rollout: dict[str, Any]) -> VideoSession:
    """The finished rollout as an extension source; its id is the request id (the resident KV's owner)."""
    return VideoSession(
        session_id=r.request_id, model=model_key(card), latents=rollout["latents"], partition=tuple(rollout["partition"]),
        prompt=r.prompt, negative_prompt=r.negative_prompt or "", guidance_scale=float(r.guidance_scale or 0.0),
        height=int(r.height or 0), width=int(r.width or 0), num_frames=int(r.num_frames or 0), fps=int(r.fps or 0),
    )


def session_source(r: GenerationRequest) -> str | None:
    return r.option("extend_from").session_id if isinstance(r.option("extend_from"), VideoSession) else None


def output_audio(outputs: dict[str, Any]) -> tuple[np.ndarray | None, int | None]:
    """The program's "audio" slot (a waveform [channels, samples], or [1, channels, samples] for a batch of
    one, tensor or array) as float32 numpy, with its "sample_rate" slot; (None, None) for a silent program."""
    audio = outputs.get("audio")
    if audio is None:
        return None, None
    if isinstance(audio, torch.Tensor):
        audio = audio.detach().to(device="cpu", dtype=torch.float32).numpy()
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim == 3 and audio.shape[0] == 1:
        audio = audio[0]
    return np.ascontiguousarray(audio), outputs.get("sample_rate")
