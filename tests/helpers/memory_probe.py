"""Peak RSS of one request against its memory estimate, in a fresh interpreter (the memory-estimate test's probe).

RSS belongs to the process, so other work on a shared machine does not move it, but threads of other
tests in the same process would: hence a subprocess per model. The kernel's high-water mark (VmHWM) is
reset through /proc/self/clear_refs just before the request, so the peak is that request's alone; a
warm-up request first pays the one-time costs (lazy initialisation, allocator arenas, thread pools).

    python -m tests.helpers.memory_probe '{"model": DIR, "cache_dir": ..., "deploy": {...}, "warm": {...},
                                          "request": {...}}'
prints one JSON line: {"measured": bytes, "estimate": bytes}. With "speech": true the requests are
SpeechRequest fields (`gen.speak`), the talker speaking every code of its budget (its end codes disabled):
the longest utterance a request may make, which is what its estimate is for. With "chat": true they are a
text-answer chat's: {"image": [width, height], "audio_s": seconds, "max_tokens": n} (a seeded PNG and wav in one
user turn, run through the towers; `gen.chat`), against the engine's chat estimate (PagedDecoder.memory_bytes).
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def measure(spec: dict) -> dict[str, int]:
    from vidloom.core.deploy import DeployConfig
    from vidloom.core.request import GenerationRequest, Task
    from vidloom.media.request_inputs import resolve_request
    from vidloom.generator import VideoGenerator

    torch.set_num_threads(1)  # one intra-op pool: fewer per-thread buffers, the same peak every run
    generator = VideoGenerator.from_pretrained(spec["model"], device="cpu", cache_dir=spec.get("cache_dir"),
                                               deploy=DeployConfig(**spec.get("deploy", {})))
    if spec.get("speech"):
        return _measure_speech(generator, spec)
    if spec.get("chat"):
        return _measure_chat(generator, spec)
    generator.generate("a red fox in the snow", seed=0, **spec["warm"])
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status("VmRSS")
    generator.generate("a red fox in the snow", seed=0, **spec["request"])
    measured = _status("VmHWM") - before
    card = generator.engine.instance.card
    task = Task.T2I if Task.T2I in card.tasks else Task.T2V  # what generate() asked for (its default task)
    request = GenerationRequest("a red fox in the snow", seed=0, task=task, **spec["request"])
    estimate = generator.engine.estimator(resolve_request(request, card))
    return {"measured": measured, "estimate": estimate}


def _measure_speech(generator, spec: dict) -> dict[str, int]:
    from tests.helpers.speech_runs import speak_whole_budget
    from vidloom.core import plugin
    from vidloom.core.chat import SamplingParams
    from vidloom.core.speech import SpeechRequest
    from vidloom.runtime.results import speech_result

    engine = generator.engine
    [talker] = [node.loop for node in engine.program.nodes if node.name == "talker"]
    speak_whole_budget(talker)  # a random talker stops anywhere

    def request(fields: dict) -> SpeechRequest:
        return SpeechRequest(voice="Chelsie", talker_sampling=SamplingParams(temperature=0.0), seed=0, **fields)

    engine.run(request(spec["warm"]))
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = _status("VmRSS")
    result = speech_result(engine.run(request(spec["request"])))
    measured = _status("VmHWM") - before
    assert result.audio_tokens == spec["request"]["max_audio_tokens"], result.audio_tokens
    _, estimate = plugin.resolve(engine.instance.card.speech)(engine, request(spec["request"]))
    return {"measured": measured, "estimate": estimate}



def _chat_messages(fields: dict) -> list[dict]:
    """One user turn: a seeded noise PNG of `image` [width, height] and `audio_s` seconds of tones, then a question."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    from tests.helpers.wav import pcm16_wav

    rng = np.random.RandomState(0)
    content: list[dict] = []
    if fields.get("image"):
        width, height = fields["image"]
        png = io.BytesIO()
        Image.fromarray((rng.rand(height, width, 3) * 255).astype(np.uint8)).save(png, format="PNG")
        url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
        content.append({"type": "image_url", "image_url": {"url": url}})
    if fields.get("audio_s"):
        t = np.arange(int(16000 * fields["audio_s"])) / 16000
        pcm = (0.2 * np.sin(2 * np.pi * 440 * t) * 32767).astype(np.int16)
        data = base64.b64encode(pcm16_wav(pcm, 16000)).decode()
        content.append({"type": "input_audio", "input_audio": {"data": data, "format": "wav"}})
    content.append({"type": "text", "text": "what is in this?"})
    return [{"role": "user", "content": content}]


def _measure_chat(generator, spec: dict) -> dict[str, int]:
    from vidloom.core.chat import build_chat_request
    from vidloom.media.audio_upload import load_input_audio
    from vidloom.media.image import load_image

    engine = generator.engine

    def chat(fields: dict):
        return generator.chat(_chat_messages(fields), temperature=0.0, max_tokens=fields["max_tokens"])

    chat(spec["warm"])
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = _status("VmRSS")
    chat(spec["request"])
    measured = _status("VmHWM") - before
    request = build_chat_request(_chat_messages(spec["request"]), load_image=load_image, load_audio=load_input_audio,
                                 temperature=0.0, max_tokens=spec["request"]["max_tokens"])
    estimate = engine.decoder.memory_bytes(engine.decoder.chat_slots(request)["chat"])
    return {"measured": measured, "estimate": estimate}


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))))
