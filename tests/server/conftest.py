"""Server test fixtures: a tiny chat checkpoint and a real `hotpath serve` process on a free
loopback port, driven over HTTP like any client would."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # server_utils.py

from server_utils import API_KEY, start_server  # noqa: E402


@pytest.fixture(scope="session")
def server(tiny_chat_model, tmp_path_factory):
    """One server for the API tests: tiny model, API key required, a small body limit, no access
    log (a line per request would crowd out the log's tail that a failure shows)."""
    srv = start_server(tiny_chat_model, tmp_path_factory.mktemp("server"), "--api-key", API_KEY,
                       "--served-model-name", "tiny", "--max-request-bytes", "65536",
                       "--disable-uvicorn-access-log")
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


@pytest.fixture
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
