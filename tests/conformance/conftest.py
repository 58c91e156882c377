"""The conformance suite runs tiny tensors: one intra-op thread each (more threads only contend)."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
