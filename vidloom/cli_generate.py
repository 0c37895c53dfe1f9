"""`vidloom generate`: check everything the user typed, load, generate with progress, write the file."""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
import time
import warnings
from pathlib import Path
from types import FrameType
from typing import Any, Callable

from vidloom import registry
from vidloom.core.deploy import DeployConfig
from vidloom.core.card import ModelCard
from vidloom.core.errors import Cancelled, InvalidRequest
from vidloom.core.output import Event, ProgressEvent
from vidloom.core.request import GenerationRequest, Task, resolve_request
from vidloom.deploy_args import deploy_config

# GenerationRequest / setting field -> the flag a CLI user typed, so errors name what they can change.
FLAG_OF_FIELD: dict[str, str] = {
    "prompt": "--prompt", "negative_prompt": "--negative-prompt", "height": "--height", "width": "--width",
    "num_frames": "--frames", "fps": "--fps", "num_inference_steps": "--steps", "guidance_scale": "--guidance",
    "flow_shift": "--shift", "sampler": "--sampler", "seed": "--seed",
    "step_cache_threshold": "--step-cache-threshold", "output": "--output", "model": "--model",
    "device": "--device", "dtype": "--dtype", "data_dir": "--data-dir", "image": "--image", "video": "--video",
    "last_image": "--last-image", "strength": "--strength", "guidance_scale_2": "--guidance-2",
    "audio_out": "--audio-out",
}
EXIT_INTERRUPTED = 130
AFTER_DENOISE_PHASES = ("decode", "audio")  # progress phases past the last step a Ctrl-C can stop at


def generate_command(args: argparse.Namespace, torchrun_place: Callable[[], Any],
                     follow: Callable[[str, argparse.Namespace, DeployConfig], int]) -> int:
    quiet_third_party(args.verbose)
    place = torchrun_place()
    deploy = deploy_config(args, place.world_size if place else None)  # a bad plan fails here, before any process starts
    if place is not None and place.rank != 0:
        return follow(args.model, args, deploy)
    from vidloom.generator import build_request
    from vidloom.media.output import check_output_path

    card = registry.resolve_card(args.model)
    output = Path(args.output or ("out.mp4" if Task.T2I not in card.tasks else "out.png"))
    check_output_path(output)
    audio_out = check_audio_paths(card, output, args.audio_out)
    request = resolve_request(build_request(
        card, args.prompt, negative_prompt=args.negative_prompt, height=args.height,
        width=args.width, num_frames=args.frames, fps=args.fps, num_inference_steps=args.steps,
        guidance_scale=args.guidance, flow_shift=args.shift, sampler=args.sampler, seed=args.seed,
        image=_one_or_list(args.image), last_image=args.last_image, video=args.video, strength=args.strength,
        guidance_scale_2=args.guidance_2,
    ), card)
    check_device(args.device)
    for note in card.notes:
        print(f"note: {note}", file=sys.stderr)
    return _load_and_run(args, deploy, request, output, audio_out)


def check_audio_paths(card: ModelCard, output: Path, audio_out: str | None) -> Path | None:
    """--audio-out's path (a writable .wav), and neither it nor a .wav --output for a model without sound;
    before anything loads. Returns the --audio-out path, if any."""
    from vidloom.media.output import AUDIO_ONLY_FORMATS, check_output_path

    silent = f"{card.model_id} makes no sound (its outputs have no audio)"
    if output.suffix.lower() == ".wav" and not card.produces_audio:
        raise InvalidRequest("output", f"{output.name}: {silent}; write the video as .mp4")
    if audio_out is None:
        return None
    path = Path(audio_out)
    check_output_path(path, "audio_out", AUDIO_ONLY_FORMATS)
    if not card.produces_audio:
        raise InvalidRequest("audio_out", f"{silent}; drop --audio-out")
    if path.resolve() == output.resolve():
        raise InvalidRequest("audio_out", f"{path} is also the --output file; give the audio its own name")
    return path


def _load_and_run(args: argparse.Namespace, deploy: DeployConfig, request: GenerationRequest, output: Path,
                  audio_out: Path | None = None) -> int:
    from vidloom.generator import VideoGenerator
    from vidloom.media.audio import track_of
    from vidloom.media.output import SOUND_FORMATS, write_audio_file, write_output
    from vidloom.runtime.engine import CancellationToken

    started = time.perf_counter()
    with VideoGenerator.from_pretrained(args.model, device=args.device, dtype=args.dtype, deploy=deploy) as generator:
        bars = ProgressBars()
        token = CancellationToken()
        try:
            with bars, _cancel_on_sigint(token):
                video = generator.run(request, on_event=bars, cancel=token)
        except Cancelled:
            print(_cancelled_line(bars.last_denoise), file=sys.stderr)
            return EXIT_INTERRUPTED
    if token.cancelled:  # Ctrl-C after the last step boundary (during decode): still write nothing
        print(_cancelled_line(bars.last_denoise) + " (during decode)", file=sys.stderr)
        return EXIT_INTERRUPTED
    track = track_of(video.audio, video.sample_rate)
    if audio_out is not None:  # first, so a model that unexpectedly made no sound leaves no video either
        write_audio_file(track, video.duration_s, audio_out, field="audio_out")
    paths = write_output(video.frames, video.fps, output, audio=video.audio, sample_rate=video.sample_rate)
    meta = video.metadata
    shown = str(paths[0].resolve()) if len(paths) == 1 else f"{paths[0].resolve()} .. {paths[-1].name}"
    sound = f", {track.samples.shape[0]}-channel audio @ {track.sample_rate} Hz" if track else ""
    print(
        f"wrote {shown}  ({meta['num_frames']} frames {meta['width']}x{meta['height']} @ {meta['fps']} fps{sound}, "
        f"seed {meta['seed']}, {meta['sampler']} x{meta['num_inference_steps']})"
    )
    if audio_out is not None:
        print(f"wrote {audio_out.resolve()}  (audio, {video.duration_s:.3f}s)")
    elif track is not None and output.suffix.lower() not in SOUND_FORMATS:
        print(f"note: {output.suffix} carries no sound; add --audio-out FILE.wav to keep it", file=sys.stderr)
    print(f"wall time {time.perf_counter() - started:.1f}s (generation {meta['elapsed_s']:.1f}s), peak memory {_peak_memory()}")
    return 0


def _one_or_list(paths: list[str] | None) -> str | list[str] | None:
    """--image once is one image (an I2V first frame); repeated, a list (reference images)."""
    return paths[0] if paths and len(paths) == 1 else paths


def _cancelled_line(progress: tuple[int, int]) -> str:
    step, total = progress
    return f"cancelled at step {step}/{total}" if total else "cancelled before the first denoise step"


class _cancel_on_sigint:
    """First Ctrl-C cancels the run through its token (it stops at the next step); a second one interrupts."""

    def __init__(self, token: Any) -> None:
        self._token = token
        self._previous: Any = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._token.cancelled:
            raise KeyboardInterrupt
        self._token.cancel()

    def __enter__(self) -> "_cancel_on_sigint":
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)


def check_device(device: str | None) -> None:
    """A device string torch understands and that exists here, before any weights load."""
    from vidloom.generator import resolve_device

    resolve_device(device)


def quiet_third_party(verbose: bool) -> None:
    """Hide transformers/diffusers loading bars and info logs (ours stay); --verbose shows them.

    Hugging Face Hub download bars stay on: a multi-GB download without progress looks hung.
    """
    warnings.showwarning = _one_line_warning
    if verbose:
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    from huggingface_hub.utils import enable_progress_bars

    enable_progress_bars()  # transformers' switch also turned off the Hub's download bars: those stay
    try:
        from diffusers.utils import logging as diffusers_logging
    except ImportError:  # diffusers is only a test dependency
        return
    diffusers_logging.disable_progress_bar()
    diffusers_logging.set_verbosity_error()


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: Any = None, line: str | None = None) -> None:
    print(f"warning: {message}", file=sys.stderr)


class ProgressBars:
    """One tqdm bar per phase (denoise, decode), fed by the engine's progress events.

    A phase's bar closes when the next phase starts (or its last step is done), so its
    rate covers only its own steps.
    """

    def __init__(self) -> None:
        self._bars: dict[str, Any] = {}
        self.last_denoise: tuple[int, int] = (0, 0)  # (steps done, total) of the loop phase, for the cancel line

    def __enter__(self) -> "ProgressBars":
        return self

    def __call__(self, event: Event) -> None:
        from tqdm import tqdm

        if not isinstance(event, ProgressEvent):
            return
        if event.phase not in AFTER_DENOISE_PHASES:
            self.last_denoise = (event.step, event.total)
        bar = self._bars.get(event.phase)
        if bar is None:
            self._close_all()
            bar = self._bars[event.phase] = tqdm(total=event.total, desc=event.phase, unit="step", file=sys.stderr)
        bar.update(event.step - bar.n)
        if event.step >= event.total:
            bar.close()

    def _close_all(self) -> None:
        for bar in self._bars.values():
            bar.close()

    def __exit__(self, *exc: object) -> None:
        self._close_all()


def _peak_memory() -> str:
    import torch

    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    text = f"{rss_mib:.0f} MiB RSS"
    if torch.cuda.is_available() and torch.cuda.max_memory_allocated() > 0:
        text += f", {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB CUDA"
    return text
