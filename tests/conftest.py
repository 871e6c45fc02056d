import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/tiny_models.py


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
