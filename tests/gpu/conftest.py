"""tests/gpu: everything here needs CUDA and is skipped cleanly without it (bench/gpu_check.sh runs it all)."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "tests/gpu/" in item.path.as_posix():
            item.add_marker(skip)
