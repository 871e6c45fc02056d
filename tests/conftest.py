import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tiny_models.py, tiny_chat_model.py


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """name -> (checkpoint dir, HF model); each tiny checkpoint is written once per session."""
    from tiny_models import make_tiny_model

    cache = {}

    def get(name: str):
        if name not in cache:
            out = tmp_path_factory.mktemp(name)
            cache[name] = (out, make_tiny_model(name, out))
        return cache[name]

    return get


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory) -> Path:
    """A tiny random Qwen2 checkpoint with a real BPE tokenizer and a ChatML template."""
    from tiny_chat_model import make_tiny_chat_model

    return make_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))
