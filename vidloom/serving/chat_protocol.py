"""Pydantic models of the OpenAI Chat Completions API: the request body, the answer and the streamed chunks.

Messages are kept as raw JSON here and checked one by one in chat_params, so an error can name
`messages[2].content[1].image_url` rather than pydantic's location tuple.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from vidloom.serving.protocol import ApiBool, ApiFloat, ApiInt


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: ApiBool = False  # one more chunk before [DONE], with empty choices and the usage counts


class AudioParams(BaseModel):
    """`audio` of a chat completion that answers aloud (modalities ["text", "audio"])."""

    model_config = ConfigDict(extra="forbid")

    voice: Any = None
    format: Any = None


class ChatCompletionBody(BaseModel):
    """POST /v1/chat/completions. `top_k` is a vidloom (and vLLM) extension; fields OpenAI defines that we do
    not implement are accepted only at their no-op value (chat_params refuses others by name)."""

    model_config = ConfigDict(extra="allow")  # unknown fields are refused by name in chat_params

    messages: Any  # list of {role, content}; checked in chat_params
    model: str | None = None
    max_tokens: ApiInt | None = None  # deprecated by OpenAI in favour of max_completion_tokens; both accepted
    max_completion_tokens: ApiInt | None = None
    temperature: ApiFloat | None = None
    top_p: ApiFloat | None = None
    top_k: ApiInt | None = None
    seed: ApiInt | None = None
    stop: str | list[str] | None = None
    n: ApiInt | None = None
    stream: ApiBool | None = None
    stream_options: StreamOptions | None = None
    modalities: list[str] | None = None  # ["text"] (default) or ["text", "audio"] on a model that speaks
    audio: AudioParams | None = None  # voice and format of the spoken answer
    user: str | None = None  # accepted and ignored, as OpenAI uses it only for abuse tracking
    # No-op values accepted so clients that send their defaults work; anything else is refused by name.
    frequency_penalty: ApiFloat | None = None
    presence_penalty: ApiFloat | None = None
    logprobs: ApiBool | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AudioAnswer(BaseModel):
    """`message.audio` of a spoken answer: the encoded audio (base64), its transcript, and when its id expires."""

    id: str
    data: str
    expires_at: int
    transcript: str


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    audio: AudioAnswer | None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class ChatCompletion(BaseModel):
    """The non-streamed answer (object `chat.completion`)."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    audio: dict[str, Any] | None = None  # a spoken answer's pieces: {id, transcript}, {id, data}, {id, expires_at}


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    """One streamed event (object `chat.completion.chunk`); the usage chunk has no choices."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
