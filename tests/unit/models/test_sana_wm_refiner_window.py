"""The refiner's preallocated sliding window holds exactly what concatenating every captured chunk and
keeping the newest `capacity` tokens holds (the reference's cat-and-trim), for any chunk sizes."""

from __future__ import annotations

import pytest
import torch

from vidloom.families.sana_wm.refiner import RefinerWindow


@pytest.mark.parametrize("capacity,chunks", [(6, (2, 2, 2, 2, 1)), (4, (3, 3, 3)), (3, (5, 1, 2)), (10, (2, 3))])
def test_window_equals_concatenate_and_trim(capacity, chunks):
    layers, batch, inner = 2, 1, 4
    window = RefinerWindow(layers, batch, inner, 1, capacity, 1, torch.device("cpu"), torch.float32)
    assert window.nbytes == RefinerWindow.nbytes_for(layers, batch, inner, 1, capacity, torch.float32)
    everything: list[list[torch.Tensor]] = [[] for _ in range(layers)]
    g = torch.Generator().manual_seed(0)
    for n in chunks:
        window.captured = [(torch.randn(batch, n, inner, generator=g), torch.randn(batch, n, inner, generator=g))
                           for _ in range(layers)]
        for layer, (k, v) in enumerate(window.captured):
            everything[layer].append(torch.stack([k, v]))
        window.append_history()
        for layer in range(layers):
            expected = torch.cat(everything[layer], dim=2)[:, :, -capacity:]
            _, _, hk, hv = window.layer_kv(layer)
            torch.testing.assert_close(torch.stack([hk, hv]), expected, atol=0, rtol=0)
    assert window.filled == min(sum(chunks), capacity)


def test_store_without_capture_is_an_error():
    window = RefinerWindow(1, 1, 4, 1, 2, 1, torch.device("cpu"), torch.float32)
    with pytest.raises(RuntimeError, match="captured"):
        window.append_history()
