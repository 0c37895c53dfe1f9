"""Cosmos3 generation prompts: the metadata templates and chat template the model was trained with.

The wording of the system prompts and templates is data the checkpoint was trained on (diffusers'
Cosmos3OmniPipeline.tokenize_prompt carries the same strings, typos included); reproducing them
exactly is what makes our token ids, and so our frames, equal to the pipeline's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SYSTEM_IMAGE = "You are a helpful assistant who will generate images from a give prompt."
SYSTEM_VIDEO = "You are a helpful assistant who will generate videos from a give prompt."
DURATION = "The video is {duration:.1f} seconds long and is of {fps:.0f} FPS."
INVERSE_DURATION = "The video is not {duration:.1f} seconds long and is not of {fps:.0f} FPS."
IMAGE_RESOLUTION = "This image is of {height}x{width} resolution."
INVERSE_IMAGE_RESOLUTION = "This image is not of {height}x{width} resolution."
VIDEO_RESOLUTION = "This video is of {height}x{width} resolution."
INVERSE_VIDEO_RESOLUTION = "This video is not of {height}x{width} resolution."
VISION_START = "<|vision_start|>"  # the token after which the generated modalities begin


@dataclass(frozen=True)
class Shape:
    """What the templates describe: the output's size, length and frame rate."""

    height: int
    width: int
    num_frames: int
    fps: float

    @property
    def is_image(self) -> bool:
        return self.num_frames == 1


def _append(base: str, addition: str) -> str:
    base = base.rstrip(".")
    return f"{base}. {addition}" if base else addition


def describe(text: str, shape: Shape, negative: bool = False) -> str:
    """`text` with the duration (video) and resolution sentences appended (their negations for negatives)."""
    if not shape.is_image:
        template = INVERSE_DURATION if negative else DURATION
        text = _append(text, template.format(duration=shape.num_frames / shape.fps, fps=shape.fps))
    if shape.is_image:
        template = INVERSE_IMAGE_RESOLUTION if negative else IMAGE_RESOLUTION
    else:
        template = INVERSE_VIDEO_RESOLUTION if negative else VIDEO_RESOLUTION
    return _append(text, template.format(height=shape.height, width=shape.width))


def generation_ids(tokenizer: Any, text: str, shape: Shape, negative: bool = False,
                   system_prompt: bool = True) -> list[int]:
    """Token ids of one branch's prefix: [system +] user turn, assistant header, then eos and vision-start.

    `system_prompt` is the checkpoint's model_index.json `default_use_system_prompt`.
    """
    return chat_ids(tokenizer, describe(text, shape, negative), shape.is_image, system_prompt)


def chat_ids(tokenizer: Any, content: str, is_image: bool, system_prompt: bool = True) -> list[int]:
    """Token ids of a prefix whose user turn is `content` as given (an action run's JSON caption, say)."""
    system = SYSTEM_IMAGE if is_image else SYSTEM_VIDEO
    messages = [{"role": "system", "content": system}] if system_prompt else []
    messages.append({"role": "user", "content": content})
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                        add_vision_id=False, return_dict=True)["input_ids"]
    return [*ids, tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(VISION_START)]
