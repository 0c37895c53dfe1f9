"""`vidloom serve`'s argument parser (cli/commands.py builds the rest of the command line)."""

from __future__ import annotations

import argparse

from vidloom.runtime.scheduler import DEFAULT_DECODE_SLOTS


def add_serve_parser(sub: argparse._SubParsersAction, dtypes: tuple[str, ...]) -> None:
    """`vidloom serve`'s flags: the model, scheduling, storage, limits, deployment and security."""
    from vidloom import registry
    from vidloom.cli.deploy_args import add_deploy_arguments

    srv = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    srv.add_argument("--config", default=None, metavar="CARD.yaml",
                     help="deployment card: YAML with any setting below (and more); flags you type override it")
    srv.add_argument("--print-config", action="store_true", help="print the effective deployment card and exit")
    srv.add_argument("model_arg", nargs="?", default=None, metavar="MODEL",
                     help="registered id, diffusers checkpoint dir or Hugging Face repo id (same as --model)")
    srv.add_argument("--model", default=None,
                     help=f"registered id, diffusers checkpoint dir or Hugging Face repo id "
                          f"(default: {registry.DEFAULT_MODEL})")
    srv.add_argument("--served-model-name", default=None, metavar="NAME",
                     help="model name clients send and see in /v1/models (default: the card's id)")
    srv.add_argument("--lora", action="append", default=None, metavar="NAME=PATH",
                     help="a LoRA adapter to load at start, chosen per request by its name (repeatable); "
                          "NAME=PATH[:SCALE] with --fuse-loras")
    srv.add_argument("--fuse-loras", action="store_true",
                     help="add the --lora adapters into the base weights at load (faster steps; requests may "
                          "name no other adapters, runtime load/unload refused)")
    srv.add_argument("--max-loras", type=int, default=None, metavar="N",
                     help="LoRA adapters resident at once (default: 4)")
    srv.add_argument("--lora-dir", action="append", default=None, metavar="DIR",
                     help="a folder POST /v1/loras may load adapter files from (repeatable; none: run-time "
                          "loading is off)")
    srv.add_argument("--max-lora-rank", type=int, default=None, metavar="R",
                     help="largest adapter rank POST /v1/loras accepts (default: 1024)")
    srv.add_argument("--max-lora-mb", type=float, default=None, metavar="MB",
                     help="largest adapter file POST /v1/loras reads (default: 4096)")
    srv.add_argument("--host", default="127.0.0.1", help="interface to bind (default: 127.0.0.1)")
    srv.add_argument("--port", type=int, default=8000, help="TCP port; 0 picks a free one (default: 8000)")
    srv.add_argument("--slots", type=int, default=1, help="requests resident on the device at once (default: 1)")
    srv.add_argument("--queue-size", type=int, default=16, help="requests that may wait; more get 429 (default: 16)")
    srv.add_argument("--decode-slots", type=int, default=DEFAULT_DECODE_SLOTS, metavar="N",
                     help="chats (AR sequences) decoding in one batched step at most; more wait in the queue "
                          f"(default: {DEFAULT_DECODE_SLOTS})")
    srv.add_argument("--policy", default="fifo",
                     help="fifo | interleave | batch (compatible steps of resident requests share a forward) (default: fifo)")
    srv.add_argument("--max-batch", type=int, default=None, help="batch policy: requests per forward (default: --slots)")
    srv.add_argument("--batch-wait-ms", type=float, default=0.0,
                     help="batch policy: wait up to this long for more requests before a step with room (default: 0)")
    srv.add_argument("--data-dir", default="vidloom-data", help="job database and videos (default: ./vidloom-data)")
    srv.add_argument("--store", default=None, metavar="URL",
                     help="job table: sqlite (default, in --data-dir) or postgresql://USER@HOST/DB (shared)")
    srv.add_argument("--lost-jobs", default="fail", choices=("fail", "requeue"),
                     help="jobs of a server that died: fail them, or requeue them for a live server (default: fail)")
    srv.add_argument("--device", default=None, help="cuda | cpu (default: cuda if available)")
    srv.add_argument("--dtype", default=None, choices=dtypes, help="float32 | bfloat16 | float16")
    srv.add_argument("--verbose", action="store_true", help="show third-party loading bars and logs")
    add_limit_arguments(srv)
    add_deploy_arguments(srv)
    add_security_arguments(srv)


def add_security_arguments(srv: argparse.ArgumentParser) -> None:
    """Who may call the server, and how it stops (ServeConfig's security block, plus graceful_shutdown_s)."""
    from vidloom.serving.api_keys import API_KEY_ENV

    srv.add_argument("--api-key", default=None, metavar="KEY",
                     help=f"require 'Authorization: Bearer KEY' on every route but /health "
                          f"(default: ${API_KEY_ENV}; unset = no authentication)")
    srv.add_argument("--api-keys-file", default=None, metavar="FILE",
                     help="several API keys, one 'KEY ROLE OWNER' a line (ROLE: admin | user) or a JSON list of "
                          "{key, role, owner}; each key sees only its owner's jobs and sessions")
    srv.add_argument("--metrics-need-key", action="store_true", help="require the API key on /metrics too")
    srv.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                     help="accept this Host name besides the bind address, localhost and IP literals; "
                          "repeatable; '*' accepts any")
    srv.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                     help="let a web app at ORIGIN (e.g. https://app.example.com) call the API; repeatable")
    srv.add_argument("--enable-docs", action="store_true", help="serve /docs, /redoc and /openapi.json")
    srv.add_argument("--ui", action=argparse.BooleanOptionalAction, default=None,
                     help="the web playground at / (default: on when bound to loopback); --no-ui turns it off")
    srv.add_argument("--shutdown-grace", type=float, default=5.0, metavar="SECONDS",
                     help="on SIGTERM, running jobs get this long to finish before they fail (default: 5)")


def add_limit_arguments(srv: argparse.ArgumentParser) -> None:
    """Per-request work limits and connection bounds (ServeConfig); unset limits derive from the model card."""
    lim = srv.add_argument_group("request and connection limits")
    lim.add_argument("--max-pixels", type=int, default=None, help="width*height per frame (default: 4x the card's size)")
    lim.add_argument("--max-frames", type=int, default=None, help="frames per video (default: 4x the card's)")
    lim.add_argument("--max-steps", type=int, default=None, help="denoise steps (default: 20x the card's)")
    lim.add_argument("--max-prompt-chars", type=int, default=None, help="prompt length (default: from the text encoder)")
    lim.add_argument("--max-request-memory-gb", type=float, default=None,
                     help="estimated peak memory per request (default: the runtime's budget, 90%% of what is free "
                          "after loading, shared by the running requests)")
    lim.add_argument("--max-body-mb", type=float, default=1.0,
                     help="request body size in MiB, image uploads included; larger get 413 (default: 1)")
    lim.add_argument("--max-init-audio-seconds", type=float, default=None,
                     help="longest init_audio upload to /v1/audio/generations, seconds (default: the model's window)")
    lim.add_argument("--max-request-seconds", type=float, default=300.0,
                     help="wall time of one speech run (speech, chats answered aloud): refused up front at the "
                          "measured pace, stopped with a 504 past it (default: 300)")
    lim.add_argument("--max-chat-media-bytes", type=int, default=32 << 20,
                     help="what one chat's audio and image parts decode to, from their headers (default: 32 MiB)")
    lim.add_argument("--chat-media-budget-bytes", type=int, default=128 << 20,
                     help="decoded media of the chats being prepared at once; past it a 429 (default: 128 MiB)")
    lim.add_argument("--header-timeout", type=float, default=10.0, help="seconds to send a request head (default: 10)")
    lim.add_argument("--keep-alive-timeout", type=float, default=5.0, help="idle keep-alive seconds (default: 5)")
    lim.add_argument("--max-connections", type=int, default=256,
                     help="open API connections; at the cap the one idle longest is closed, and if all are busy "
                          "new ones may call /health and /metrics only (default: 256)")
    lim.add_argument("--probe-connections", type=int, default=16,
                     help="connections reserved for /health and /metrics past --max-connections; "
                          "also the cap of --health-port (default: 16)")
    lim.add_argument("--health-port", type=int, default=None, metavar="PORT",
                     help="also serve /health and /metrics (only) on this port, apart from API clients")
