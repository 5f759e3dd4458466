"""Shared pytest fixtures: one tiny random Qwen3.5 checkpoint per pytest run (shapes/tiny_model.py)."""
import pytest

from model import Embedder
from shapes.tiny_model import make_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """Path of a tiny Qwen3.5 folder in the layout of a real release."""
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny_qwen3_5")), seed=0)


@pytest.fixture(scope="session")
def tiny_embedder(tiny_checkpoint):
    """The tiny checkpoint loaded as an Embedder (float32, eval mode). Tests must not modify it."""
    return Embedder.from_pretrained(tiny_checkpoint).eval()
