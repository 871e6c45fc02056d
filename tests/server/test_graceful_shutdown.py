"""SIGTERM / SIGINT: stop accepting, finish (or after --shutdown-timeout abort) in-flight requests,
stop the engine process, exit 0."""

import json
import signal
import threading

import httpx
import pytest

from server_utils import process_alive, start_server

REQUEST = {"prompt": "Hello", "max_tokens": 300, "temperature": 0, "ignore_eos": True, "stream": True}


def stream_in_thread(url: str):
    """Starts a streaming request; returns (first chunk seen event, result dict, thread)."""
    first = threading.Event()
    result = {"text": "", "finish": None, "done": False, "error": None, "error_event": None}

    def run():
        try:
            with httpx.stream("POST", url + "/v1/completions", json=REQUEST, timeout=60) as resp:
                for line in resp.iter_lines():
                    if line == "data: [DONE]":
                        result["done"] = True
                    elif line.startswith("data: "):
                        chunk = json.loads(line[6:])
                        if "error" in chunk:  # the server's word that the stream ends early
                            result["error_event"] = chunk["error"]
                            continue
                        choice = chunk["choices"][0]
                        result["text"] += choice["text"]
                        result["finish"] = choice["finish_reason"] or result["finish"]
                        first.set()
        except httpx.HTTPError as e:
            result["error"] = e
        finally:
            first.set()

    thread = threading.Thread(target=run)
    thread.start()
    return first, result, thread


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_graceful_shutdown_finishes_in_flight_requests(tiny_chat_model, tmp_path, sig):
    server = start_server(tiny_chat_model, tmp_path)
    engine_pid = server.engine_pid()
    first, result, thread = stream_in_thread(server.url)
    assert first.wait(60)
    assert server.stop(sig) == 0
    thread.join(60)
    # the whole stream came through the engine process: it stopped only after the drain
    assert result["error"] is None and result["error_event"] is None
    assert result["done"] and result["finish"] == "length"
    assert not process_alive(engine_pid)
    with pytest.raises(httpx.ConnectError):  # no longer accepting
        httpx.get(server.url + "/health", timeout=5)
    assert "hotpath serve: stopped" in server.log.read_text()


def test_shutdown_timeout_aborts_in_flight_requests(tiny_chat_model, tmp_path):
    server = start_server(tiny_chat_model, tmp_path, "--shutdown-timeout", "0")
    first, result, thread = stream_in_thread(server.url)
    assert first.wait(60)
    assert server.stop(signal.SIGTERM) == 0
    thread.join(60)
    assert result["finish"] is None  # cut off before the 300 tokens
    # and told so, in the stream's own terms
    assert result["error_event"]["type"] == "server_error" and "stopped" in result["error_event"]["message"]
    assert result["done"] and result["error"] is None
