import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tiny_models.py, tiny_chat_model.py


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """name -> (checkpoint dir, HF model); each tiny checkpoint is written once per session.
    `vocab_size` (default make_tiny_model's 512) gives the checkpoint of that vocabulary."""
    from tiny_models import make_tiny_model

    cache = {}

    def get(name: str, vocab_size: int | None = None):
        if (name, vocab_size) not in cache:
            out = tmp_path_factory.mktemp(name if vocab_size is None else f"{name}-vocab{vocab_size}")
            kwargs = {} if vocab_size is None else {"vocab_size": vocab_size}
            cache[name, vocab_size] = (out, make_tiny_model(name, out, **kwargs))
        return cache[name, vocab_size]

    return get


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory) -> Path:
    """A tiny random Qwen2 checkpoint with a real BPE tokenizer and a ChatML template."""
    from tiny_chat_model import make_tiny_chat_model

    return make_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))


@pytest.fixture(scope="session")
def hf_gguf_models():
    """name -> transformers' own model of a real GGUF (`hotpath.assets` name; fp32, eval), the
    reference of tests/loader/test_gguf.py and tests/models/test_real_gguf.py. Loaded once a
    session: transformers parses and dequantizes the GGUF in Python (about a minute for the 0.5B
    model on a 2-core machine). `pop(name)` hands a model back (its last user)."""
    import torch
    from transformers import AutoModelForCausalLM

    from hotpath.assets import fetch_model

    cache = {}

    class Models:
        def get(self, name: str):
            if name not in cache:
                gguf = fetch_model(name)
                cache[name] = AutoModelForCausalLM.from_pretrained(
                    str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
            return cache[name]

        def pop(self, name: str) -> None:
            cache.pop(name, None)

    return Models()
