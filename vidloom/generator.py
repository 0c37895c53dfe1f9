"""VideoGenerator: the offline Python API (from_pretrained, generate)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import torch

from vidloom import registry
from vidloom.core import plugin
from vidloom.core.card import ModelCard
from vidloom.core.chat import ChatResult, TokenDelta, build_chat_request
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import InvalidRequest
from vidloom.core.instance import ModelInstance
from vidloom.core.options import Option
from vidloom.core.output import ChunkEvent, Event, EventCallback, VideoChunk, VideoOutput
from vidloom.core.request import GenerationRequest, Task
from vidloom.lora.registry import LORA_SLOT, attach_registry
from vidloom.runtime.engine import CancellationToken, Engine
from vidloom.runtime.interface import SessionHost
from vidloom.runtime.results import result_of, video_output

if TYPE_CHECKING:
    from vidloom.core.parallel import ParallelPlan
    from vidloom.runtime.parallel.engine import ParallelEngine
    from vidloom.runtime.parallel.worker import PoolOptions


class VideoGenerator:
    """A loaded model plus a sync engine. One instance serves many `generate` calls.

    With devices > 1 the engine is a ParallelEngine over worker processes; call `close()`
    (or use the generator as a context manager) to stop them; they also stop at exit.
    """

    def __init__(self, engine: Engine | ParallelEngine) -> None:
        self.engine = engine
        self.load_seconds: dict[str, float] = {}
        """from_pretrained's phases: "checkpoint" (resolve, write a demo), "weights" (load), "warmup"."""

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path = registry.DEFAULT_MODEL,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        cache_dir: str | Path | None = None,
        deploy: DeployConfig | None = None,
        devices: int | None = None,
        parallel: ParallelPlan | None = None,
        pool_options: PoolOptions | None = None,
        max_loras: int | None = None,
        fuse_loras: Mapping[str, str | Path | tuple[str | Path, float]] | None = None,
        components: Mapping[str, str | Path] | None = None,
    ) -> "VideoGenerator":
        """Load a registered model id, a diffusers checkpoint directory or a Hugging Face repo id.

        A repo id ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers") resolves through huggingface_hub:
        downloaded with progress when online, read from the local cache when
        HF_HUB_OFFLINE=1. device: defaults to CUDA when available, else CPU; one that
        does not exist here raises DeployError. dtype: float32 | bfloat16 | float16,
        defaults to the card's precision on CUDA; on CPU to bfloat16 where the CPU multiplies it natively
        (AMX, AVX512-BF16; docs/performance-cpu.md), else float32: pass "float32" for exact parity. deploy:
        performance and memory options (default: the plain reference path).

        devices / parallel: run on several devices, one worker process each (they
        override deploy.devices / deploy.parallel; devices defaults to the plan's
        sp x cfg). An invalid plan raises DeployError before any process starts.
        pool_options: the pool's timeouts and debug checks (default: PoolOptions.from_env()).
        max_loras: how many LoRA adapters may be resident at once (default 4; see load_lora).
        fuse_loras: {name: path or (path, scale)} of LoRA adapters added into the base weights at load, before any
        warmup or compile (docs/lora.md, "Fused mode"): faster steps, but requests may then name no other
        adapters and load_lora / unload_lora refuse.
        components: {component: file} overrides ("transformer", "transformer_2", "vae"): that component's weights
        come from one .safetensors (diffusers, original or ComfyUI layout, FP8 with scales) or .gguf file, the
        folder gives the configs and the rest (docs/loading-checkpoints.md); they replace deploy.components' entries
        of the same name.

        Loading is as quiet as the CLI: transformers' logs and loading bars are off while it runs and
        restored after (`TRANSFORMERS_VERBOSITY=warning` shows them; Hub download bars always show).
        """
        from vidloom.generator_load import load_engine

        engine, load_seconds = load_engine(
            model, device=device, dtype=dtype, cache_dir=cache_dir, deploy=deploy, devices=devices, parallel=parallel,
            pool_options=pool_options, max_loras=max_loras, fuse_loras=fuse_loras, components=components)
        generator = cls(engine)
        generator.load_seconds = load_seconds
        return generator

    def close(self) -> None:
        """Stop the worker processes of a multi-device engine (nothing to do on one device)."""
        self.engine.close()

    def __enter__(self) -> "VideoGenerator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def card(self) -> ModelCard:
        return self.engine.card

    @property
    def accepted_config_keys(self) -> tuple[str, ...]:
        """Config keys the load accepted without effect, one line each (file, key, value, why; see
        docs/reference/config-keys.md). A multi-device pool's ranks log theirs instead."""
        instance = self.engine.instance
        return instance.accepted_config_keys if isinstance(instance, ModelInstance) else ()

    @property
    def notes(self) -> tuple[str, ...]:
        """What a user should read before the outputs: the card's notes, then one line naming the config keys
        the load accepted without effect (accepted_config_keys gives each with its reason)."""
        return (*self.card.notes, *accepted_keys_note(self.accepted_config_keys))

    def load_lora(self, name: str, path: str | Path, into: str | None = None) -> None:
        """Make the LoRA file `path` (diffusers/PEFT safetensors, as `save_lora_weights` writes it, or a community
        format, docs/lora-formats.md) selectable as `name` in `generate(loras={name: scale})`; the base weights
        stay as loaded. Loading a name again replaces it. `into="transformer_2"` loads it into a Wan2.2 A14B
        checkpoint's low-noise expert (diffusers' load_into_transformer_2=True); the default is the high-noise one.
        CheckpointError names the file and key for a file that does not fit this model. Past max_loras resident
        adapters the least recently used one no running request holds is evicted (InvalidRequest("name") when
        running requests hold them all)."""
        self._lora_registry().load(name, path, into)

    def unload_lora(self, name: str) -> None:
        """Forget adapter `name` (a run already using it finishes with it); InvalidRequest("name") if not loaded."""
        self._lora_registry().unload(name)

    @property
    def loras(self) -> list[str]:
        """Names of the resident LoRA adapters, in load order."""
        instance = self.engine.instance
        if not isinstance(instance, ModelInstance):
            return self.engine.lora_registry.names  # type: ignore[union-attr]
        adapters = instance.components.get(LORA_SLOT)
        return adapters.names if adapters else []

    def _lora_registry(self) -> Any:
        """One device's adapter registry (created on first use), or a pool's, which loads on every rank."""
        instance = self.engine.instance
        if not isinstance(instance, ModelInstance):  # each rank holds its own copy of the weights
            return self.engine.lora_registry  # type: ignore[union-attr]
        return attach_registry(instance)

    def generate(
        self,
        prompt: str,
        *,
        negative_prompt: str | None = None,
        height: int | None = None,
        width: int | None = None,
        num_frames: int | None = None,
        fps: int | None = None,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        flow_shift: float | None = None,
        sampler: str | None = None,
        seed: int | None = None,
        step_cache_threshold: float | None = None,
        image: Any = None,
        last_image: Any = None,
        video: Any = None,
        init_audio: Any = None,
        loras: Mapping[str, float] | None = None,
        on_event: EventCallback | None = None,
        cancel: CancellationToken | None = None,
        **options: Any,
    ) -> VideoOutput:
        """Generate a video (or, on an image model, a one-frame output); None fields take the card's defaults.

        step_cache_threshold overrides the deployment's step-cache threshold for this call.
        image: input images (PIL images, HxWx3 arrays, paths; one, or a list for reference images).
        On a model that serves image-to-video it is the first frame (last_image: the last one, on
        first-last-frame checkpoints); on an image model (Flux2) the reference images. video (a list
        of frames, an array or a file) makes it video-to-video (Wan, with the strength option) or a continuation
        of that clip (AnyFlow-FAR). init_audio (text-to-audio models): a waveform ([samples] or [channels,
        samples] at the model's rate, or an audio file) the clip starts from. The card says which it accepts
        (InvalidRequest names any other). Inputs are resized to the output size (height/width, else the card's
        default). One prompt per call: a list raises InvalidRequest("prompt").
        loras: {name: scale} of adapters loaded with load_lora, mixed in this order (scale 1.0: as trained).
        options: the options of the card's blocks (`self.options()` lists them; docs/reference/request-fields.md),
        such as guidance_scale_2 (two-expert Wan2.2 A14B), reason=True / sound=True (Cosmos3: the prompt it wrote
        is metadata["reasoned_prompt"]; the soundtrack is audio, sample_rate), extend_from (AnyFlow-FAR: a
        finished output of this model or its `.session`, continued under `prompt`; num_frames counts both),
        action (Cosmos3 with an action pathway: a vidloom.ActionInput; policy / inverse_dynamics return
        output.actions), camera / c2w / intrinsics (SANA-WM: an action string such as "w-80,jw-40" or [F, 4, 4]
        poses, and [fx, fy, cx, cy] in the first image's pixels; docs/world-models-sana.md), seconds /
        seconds_start (text-to-audio models: the clip's length and start; the output has audio and no frames).
        """
        request = build_request(
            self.card, prompt, negative_prompt=negative_prompt, height=height, width=width, num_frames=num_frames,
            fps=fps, num_inference_steps=num_inference_steps, guidance_scale=guidance_scale, flow_shift=flow_shift,
            sampler=sampler, seed=seed, step_cache_threshold=step_cache_threshold, image=image, last_image=last_image,
            video=video, init_audio=init_audio, loras=loras, **options,
        )
        return self.run(request, on_event=on_event, cancel=cancel)

    def options(self) -> dict[str, Option]:
        """The options `generate` takes on this model beyond the general fields (its card's blocks), by name."""
        return {option.name: option for spec in self.card.request_blocks.values() for option in spec.block.options}

    def open_session(self, prompt: str, *, image: Any, action: Any, **fields: Any) -> Any:
        """World models (a card whose action block has a session: Cosmos3 with an action pathway): a session
        stepped chunk by chunk, `session.step(actions)` -> the chunk's frames (and actions in policy mode), each
        chunk continuing from the last frame of the one before. `fields`: generate's (negative_prompt,
        num_inference_steps, guidance_scale, seed, fps). Close it (or use `with`) to free its resident state.
        """
        spec = self.card.request_blocks.get("action")
        if spec is None or spec.session is None:
            raise InvalidRequest("action", f"{self.card.model_id} has no action pathway to open a session on")
        host = SessionHost(self.card, self.engine.caches, self.run)
        return plugin.resolve(spec.session)(host, prompt, image=image, action=action, **fields)

    def release_session(self, source: Any) -> bool:
        """Free the resident KV of a finished causal video (its output, VideoSession or session id) now,
        instead of at its idle TTL; it can still be extended (the KV is then rebuilt). False if none was held."""
        session_id = getattr(getattr(source, "session", source), "session_id", source)
        caches = self.engine.caches
        return caches is not None and isinstance(session_id, str) and caches.release_session(session_id)

    def run(
        self,
        request: GenerationRequest,
        on_event: EventCallback | None = None,
        cancel: CancellationToken | None = None,
    ) -> VideoOutput:
        """Run a prepared request (InvalidRequest before any work; Cancelled at a step boundary)."""
        return self._finish(request, on_event, cancel)

    def generate_stream(
        self,
        prompt: str,
        *,
        on_event: EventCallback | None = None,
        cancel: CancellationToken | None = None,
        **fields: Any,
    ) -> Iterator[ChunkEvent]:
        """Like `generate` (same keyword fields), yielding the video in chunks as soon as each exists.

        Each ChunkEvent carries uint8 frames, the chunk's index and frame range and the fps;
        the chunks in order are the whole video. A causal model (AnyFlow-FAR) yields one per
        chunk while it runs; a model that produces the video at once yields it as one chunk.
        Stopping the iteration early releases everything the request held.
        """
        request = build_request(self.card, prompt, **fields)
        ready: list[ChunkEvent] = []

        def collect(event: Event) -> None:
            if isinstance(event, ChunkEvent):
                ready.append(event)
            if on_event is not None:
                on_event(event)

        run = self.engine.submit(request, collect, cancel)
        streamed = False
        try:
            while not run.step():
                streamed |= bool(ready)
                yield from ready
                ready.clear()
            streamed |= bool(ready)
            yield from ready
            if not streamed:
                output = video_output(self.card, run.outputs())
                chunk = VideoChunk(index=0, total=1, start_frame=0, frames=output.frames)
                yield ChunkEvent(run.request.request_id, chunk, output.fps)
        finally:
            run.close()

    def chat(self, messages: Any, audio: Mapping[str, Any] | None = None, **sampling: Any) -> Any:
        """Answer a conversation: `messages` as OpenAI-style dicts ({"role", "content"}) or ChatMessages.

        sampling: max_tokens, temperature (0: greedy), top_p, top_k, seed, stop (a string or a list).
        `audio` ({"voice": ..., optional "max_audio_tokens", "greedy"}) answers aloud too, on a model that speaks:
        the result is then a SpeechResult (`text` the reply, `audio` and `sample_rate` its speech). The speech codes
        are sampled as the checkpoint's talker samples them (seeded by `seed`); `greedy` picks the most likely ones.
        Raises InvalidRequest naming the field, InvalidRequest("model") on a model without chat (or, with
        `audio`, without a talker), or CacheBudgetExceeded when the KV pool cannot hold the prompt plus max_tokens.
        """
        if audio is not None:
            return self._chat_aloud(messages, audio, sampling)
        result = None
        for item in self.chat_stream(messages, **sampling):
            result = item
        assert isinstance(result, ChatResult)
        return result

    def chat_stream(self, messages: Any, **sampling: Any) -> Iterator[TokenDelta | ChatResult]:
        """Like `chat`, yielding TokenDeltas as tokens are decoded, then the ChatResult.

        Stopping the iteration early cancels the sequence and frees its KV blocks.
        """
        from vidloom.media.audio_upload import load_input_audio
        from vidloom.media.chat_video import load_chat_video
        from vidloom.media.image import load_image
        from vidloom.runtime.chat_stream import stream_alone

        yield from stream_alone(self.engine, build_chat_request(messages, load_image=load_image,
                                                                load_audio=load_input_audio,
                                                                load_video=load_chat_video, **sampling))

    def _chat_aloud(self, messages: Any, audio: Mapping[str, Any], sampling: dict[str, Any]) -> Any:
        from vidloom.core.speech import SpeechRequest
        from vidloom.media.audio_upload import load_input_audio
        from vidloom.media.chat_video import load_chat_video
        from vidloom.media.image import load_image
        from vidloom.core.chat import SamplingParams
        from vidloom.core.speech import TALKER_SAMPLING
        if not isinstance(audio, Mapping) or set(audio) - {"voice", "max_audio_tokens", "greedy"}:
            raise InvalidRequest("audio", "must be a mapping with voice (and optionally max_audio_tokens, greedy)")
        chat = build_chat_request(messages, load_image=load_image, load_audio=load_input_audio,
                                  load_video=load_chat_video, **sampling)
        greedy = audio.get("greedy", False)
        if not isinstance(greedy, bool):
            raise InvalidRequest("audio.greedy", f"must be true or false, got {greedy!r}")
        request = SpeechRequest(chat=chat, voice=audio.get("voice"), max_audio_tokens=audio.get("max_audio_tokens"),
                                seed=chat.sampling.seed,
                                talker_sampling=SamplingParams(temperature=0.0) if greedy else TALKER_SAMPLING)
        return self._finish(request)

    def speak(self, text: str, voice: str | None = None, *, instructions: str | None = None,
              seed: int | None = None, max_audio_tokens: int | None = None, greedy: bool = False,
              audio_chunk_codes: int | None = None, on_event: EventCallback | None = None,
              cancel: CancellationToken | None = None) -> Any:
        """Say `text` in `voice` (the checkpoint's speaker table; None: its first voice): a SpeechResult with
        `.audio` (float32 samples in [-1, 1]) and `.sample_rate`.

        The reply is forced (the thinker reads the text, it does not write one). `greedy` picks the talker's
        most likely codes instead of sampling them (seeded by `seed`, which also seeds token2wav's noise).
        Raises InvalidRequest naming the field (`voice` lists the available ones), InvalidRequest("model") on a
        model without a talker, CacheBudgetExceeded when the KV pool cannot hold the text. `audio_chunk_codes`
        streams: token2wav and the vocoder run on chunks of that many codes while the talker decodes, each
        reaching `on_event` as an AudioChunkEvent (the result's audio is their concatenation).
        """
        from vidloom.core.chat import SamplingParams
        from vidloom.core.speech import TALKER_SAMPLING, SpeechRequest

        request = SpeechRequest(text=text, voice=voice, instructions=instructions, seed=seed,
                                max_audio_tokens=max_audio_tokens, audio_chunk_codes=audio_chunk_codes,
                                talker_sampling=SamplingParams(temperature=0.0) if greedy else TALKER_SAMPLING)
        return self._finish(request, on_event, cancel)

    def _finish(self, work: Any, on_event: EventCallback | None = None,
                cancel: CancellationToken | None = None) -> Any:
        """Run `work` (any request kind) to the end in this thread: its result (runtime.results.result_of). Its
        KV and memory are returned however it ends."""
        return result_of(self.card, work)(self.engine.submit(work, on_event, cancel).finish())


def build_request(card: ModelCard, prompt: str, **fields: Any) -> GenerationRequest:
    """The request `generate` runs (`fields`: GenerationRequest's, as generate takes them), for the card's
    default task; resolve_request reads the media and picks image-to-video / video-to-video from them."""
    if not isinstance(prompt, str):
        raise InvalidRequest(
            "prompt", f"must be one string, got {type(prompt).__name__}; batches are not supported yet: "
            "call generate once per prompt (the model stays loaded)",
        )
    loras = fields.pop("loras", None)
    if loras is not None and not isinstance(loras, Mapping):
        raise InvalidRequest("loras", f"must map adapter names to scales, got {type(loras).__name__}")
    request = GenerationRequest(prompt=prompt, task=_default_task(card), loras=tuple((loras or {}).items()), **fields)
    registry.check_options(request.options, card)  # another model's option: refused with the reason
    return request


def _default_task(card: ModelCard) -> Task:
    """Text-to-image on image models; text-to-video elsewhere (resolve_request makes it image- or
    video-to-video when media are given, and names the missing input on I2V-only cards)."""
    if Task.T2A in card.tasks and Task.T2V not in card.tasks:
        return Task.T2A  # an audio model
    return Task.T2I if Task.T2I in card.tasks else Task.T2V


def accepted_keys_note(lines: tuple[str, ...]) -> tuple[str, ...]:
    """One note naming the keys of `lines` (ModelInstance.accepted_config_keys), or none."""
    if not lines:
        return ()
    names = ", ".join(dict.fromkeys(line.split("=", 1)[0] for line in lines))
    return (f"config key(s) accepted without effect: {names} (each with its reason: --verbose, "
            f"VideoGenerator.accepted_config_keys, GET /v1/models/{{id}}; docs/reference/config-keys.md)",)
