"""Peak RSS of one request against its memory estimate, in a fresh interpreter (the memory-estimate test's probe).

RSS belongs to the process, so other work on a shared machine does not move it, but threads of other
tests in the same process would: hence a subprocess per model. The kernel's high-water mark (VmHWM) is
reset through /proc/self/clear_refs just before the request, so the peak is that request's alone; a
warm-up request first pays the one-time costs (lazy initialisation, allocator arenas, thread pools).

    python -m tests.helpers.memory_probe '{"model": DIR, "cache_dir": ..., "deploy": {...}, "warm": {...},
                                          "request": {...}}'
prints one JSON line: {"measured": bytes, "estimate": bytes}. With "speech": true the requests are
SpeechRequest fields (`gen.speak`), the talker speaking every code of its budget (its end codes disabled):
the longest utterance a request may make, which is what its estimate is for.
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
    from vidloom.core.chat import SamplingParams
    from vidloom.core.speech import SpeechRequest
    from vidloom.recipes.qwen_omni.speech import speech_prompt
    from vidloom.runtime.speech_run import speak_alone

    engine = generator.engine
    [talker] = [node.loop for node in engine.program.nodes if node.name == "talker"]
    talker.end_ids = frozenset()  # a random talker stops anywhere: speak the whole budget

    def request(fields: dict) -> SpeechRequest:
        return SpeechRequest(voice="Chelsie", talker_sampling=SamplingParams(temperature=0.0), seed=0, **fields)

    speak_alone(engine, request(spec["warm"]))
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = _status("VmRSS")
    result = speak_alone(engine, request(spec["request"]))
    measured = _status("VmHWM") - before
    assert result.audio_tokens == spec["request"]["max_audio_tokens"], result.audio_tokens
    estimate = engine.estimator(speech_prompt(engine.instance, engine.decoder.limits, request(spec["request"])))
    return {"measured": measured, "estimate": estimate}


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))))
