"""Option blocks several families or the runtime read (core.options); a family's own blocks live in its folder.

The runtime reads these by name: an extension's source session (results, job recovery), an audio clip's
timeline (results), video-to-video strength and the second expert's guidance (request_media, request_checks).
"""

from __future__ import annotations

from vidloom.core.options import Option, OptionBlock

EXTEND_FROM = "extend_from"
"""The request field (and ModelCard.request_blocks entry) of an extension; its rules live in the causal
family's recipe (families/wan_causal/extension.py). Here, not in core.session, which imports torch."""

EXTENSION = OptionBlock(
    EXTEND_FROM,
    (Option(EXTEND_FROM, "str", "continue a finished video: its id (HTTP) or its VideoOutput / VideoSession "
                                "(Python); the new prompt picks up where it ended", cli=False),),
    summary="chunked video models (AnyFlow-FAR, Helios): extend a finished video",
    refusal="it is not a chunked video model; only those (AnyFlow-FAR, Helios) can extend a video",
)
AUDIO_LENGTH = OptionBlock(
    "audio_length",
    (Option("seconds", "float", "the clip's length in seconds (default: the model's window)"),
     Option("seconds_start", "float", "where the clip starts in the model's timeline, in seconds (default 0)")),
    summary="text-to-audio models (Stable Audio): the clip's timeline",
    refusal="its clips have no length to choose (text-to-audio models whose length is an input take seconds)",
)
VIDEO_TO_VIDEO = OptionBlock(
    "video_to_video",
    (Option("strength", "float", "video-to-video: how much of the input video to change, in (0, 1] "
                                 "(default 0.8)"),),
    summary="video-to-video models (Wan): how far to move from the input video",
    refusal="it serves no video-to-video task",
)
TWO_EXPERTS = OptionBlock(
    "two_experts",
    (Option("guidance_scale_2", "float", "two-expert models: the low-noise expert's CFG scale",
            flag="--guidance-2"),),
    summary="two-expert models (Wan2.2 A14B): the second expert's guidance",
    refusal="it has one denoiser, not two experts",
)
ACTION = OptionBlock(
    "action",
    # The CLI spells the block as several flags from --action-mode on (cli/actions.py), the HTTP body as one
    # object (serving.protocol.ActionBlock).
    (Option("action", "json", "an action-conditioned run: mode, domain_name, raw_actions, chunk_size, "
                              "view_point, resolution_tier (see ActionInput)", flag="--action-mode", cli=False),),
    summary="world models with an action pathway (Cosmos3)",
    refusal="it has no action pathway",
)
