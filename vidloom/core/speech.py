"""Speech contracts: a request to speak (a given text, or the model's answer to a chat) and its result.

Shared by the speech program (recipes with a talker), the Python API (`speak`), the CLI and the
server's /v1/audio/speech. Validation raises InvalidRequest naming the request field (`input`,
`voice`, `speed`, ...), so every front end reports bad input alike.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Mapping

from vidloom.core.chat import ChatRequest, SamplingParams
from vidloom.core.errors import InvalidRequest, LimitExceeded
from vidloom.core.request_checks import MAX_SEED
from vidloom.core.request_checks import check_int as _check_int

MAX_INPUT_CHARS = 4096  # OpenAI's /v1/audio/speech limit on `input`
MAX_INSTRUCTIONS_CHARS = 4096
MAX_AUDIO_TOKENS = 4096  # transformers' talker_max_new_tokens default (~80 s of speech at 50 codes/s)
MAX_ODE_STEPS = 64
# The talker's samplers' defaults (transformers `Qwen2_5OmniForConditionalGeneration.generate`).
TALKER_SAMPLING = SamplingParams(temperature=0.9, top_k=40, top_p=0.8)


def voice_from_openai(value: object, field: str) -> str | None:
    """OpenAI's `voice`: a name, or a custom voice's object {"id": name}; None (the first voice) when not given.
    InvalidRequest(field) for anything else, an object without `id` or with other keys included."""
    if isinstance(value, Mapping):
        if set(value) != {"id"}:
            raise InvalidRequest(field, 'a voice object must be exactly {"id": voice name}')
        value = value["id"]
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(field, 'must be a voice name or {"id": voice name}')
    return value


@dataclass(frozen=True)
class SpeechRequest:
    """Speak `text` (forced: the reply is the text, not generated) or answer `chat` aloud (exactly one)."""

    text: str | None = None
    chat: ChatRequest | None = None
    voice: str | None = None  # a voice of the checkpoint's speaker table; None: its first
    instructions: str | None = None  # how to say it: the user turn the forced reply answers
    max_audio_tokens: int | None = None  # talker codes at most; None: from the reply's length (see the recipe)
    talker_sampling: SamplingParams = TALKER_SAMPLING  # temperature 0: greedy codes
    seed: int | None = None  # the talker's sampling and token2wav's initial noise
    ode_steps: int = 10  # token2wav's time grid points (transformers' num_steps default)
    # Stream the audio: token2wav and the vocoder run on chunks of this many codes while the talker decodes
    # (AudioChunkEvents); None: once, on every code, after the talker (transformers' exact path).
    audio_chunk_codes: int | None = None
    request_id: str = field(default_factory=lambda: f"speech-{uuid.uuid4().hex}")

    def validate(self) -> None:
        """Raise InvalidRequest naming the first bad field."""
        if (self.text is None) == (self.chat is None):
            raise InvalidRequest("input", "give exactly one of a text to speak or a chat to answer")
        if self.text is not None:
            if not isinstance(self.text, str) or not self.text.strip():
                raise InvalidRequest("input", "must be a non-empty string")
            if len(self.text) > MAX_INPUT_CHARS:
                raise LimitExceeded("input", f"{len(self.text)} characters is more than the limit of "
                                             f"{MAX_INPUT_CHARS}", "max_input_chars")
        if self.instructions is not None:
            if not isinstance(self.instructions, str):
                raise InvalidRequest("instructions", "must be a string")
            if len(self.instructions) > MAX_INSTRUCTIONS_CHARS:
                raise LimitExceeded("instructions", f"{len(self.instructions)} characters is more than the limit "
                                                    f"of {MAX_INSTRUCTIONS_CHARS}", "max_instructions_chars")
        if self.voice is not None and (not isinstance(self.voice, str) or not self.voice):
            raise InvalidRequest("voice", "must be a non-empty string")
        if self.max_audio_tokens is not None:
            _check_int("max_audio_tokens", self.max_audio_tokens, 1, MAX_AUDIO_TOKENS)
        _check_int("ode_steps", self.ode_steps, 2, MAX_ODE_STEPS)
        if self.audio_chunk_codes is not None:
            _check_int("audio_chunk_codes", self.audio_chunk_codes, 1, MAX_AUDIO_TOKENS)
        if self.seed is not None:
            _check_int("seed", self.seed, 0, MAX_SEED)
        self.talker_sampling.validate()


@dataclass(frozen=True)
class SpeechResult:
    """The spoken reply: mono float32 samples in [-1, 1], its text, and what it took."""

    request_id: str
    audio: object  # numpy float32 [samples]
    sample_rate: int
    text: str  # the transcript (the forced text, or the generated reply)
    voice: str
    audio_tokens: int  # talker codes spoken
    text_tokens: int
    elapsed_s: float = 0.0

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate  # type: ignore[arg-type]
