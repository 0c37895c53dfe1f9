"""Chat on CUDA: the paged pool, packed batches and host-side sampling on a device (skipped without CUDA)."""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.chat import build_chat_request
from vidloom.generator import VideoGenerator
from vidloom.layers.rotary import text_positions

MESSAGES = [{"role": "user", "content": "hello world, tell me a story about robots"}]


def test_cuda_greedy_and_seeded_chat_match_cpu(cosmos3_dir: Path):
    cpu = VideoGenerator.from_pretrained(cosmos3_dir, device="cpu")
    gpu = VideoGenerator.from_pretrained(cosmos3_dir, device="cuda", dtype="float32")
    model_cpu, model_gpu = cpu.engine.instance["transformer"], gpu.engine.instance["transformer"]
    ids = cpu.engine.decoder.loop.prompt(build_chat_request(MESSAGES))
    with torch.no_grad():
        a = model_cpu(torch.tensor(ids), text_positions(0, len(ids)))
        b = model_gpu(torch.tensor(ids, device="cuda"), text_positions(0, len(ids), torch.device("cuda"))).cpu()
    assert (a - b).abs().max().item() < 1e-3  # fp32 on both; CUDA kernels reorder sums
    greedy_cpu = cpu.chat(MESSAGES, max_tokens=16, temperature=0)
    greedy_gpu = gpu.chat(MESSAGES, max_tokens=16, temperature=0)
    assert greedy_gpu.token_ids[:8] == greedy_cpu.token_ids[:8]
    seeded = [gpu.chat(MESSAGES, max_tokens=16, temperature=0.8, seed=3).token_ids for _ in range(2)]
    assert seeded[0] == seeded[1]
    assert gpu.engine.decoder.stats()["kv_blocks_in_use"] == 0


def test_cuda_bf16_chat_runs(cosmos3_dir: Path):
    gpu = VideoGenerator.from_pretrained(cosmos3_dir, device="cuda", dtype="bfloat16")
    assert gpu.engine.decoder.pool.k.dtype == torch.bfloat16 and gpu.engine.decoder.pool.k.is_cuda
    result = gpu.chat(MESSAGES, max_tokens=12, temperature=0)
    assert result.completion_tokens >= 1 and result.finish_reason in ("stop", "length")
