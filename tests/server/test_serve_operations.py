"""What an operator sees of `hotpath serve`: GET /version, the access log, and what the server says
while it stops (a first SIGTERM drains, a second stops at once)."""

import json
import re
import signal
import threading
import time

import httpx

from hotpath import __version__
from server_utils import process_alive, start_server


def test_version_needs_no_api_key(server):
    r = httpx.get(server.url + "/version", timeout=10)  # the fixture's server requires a key on /v1
    assert r.status_code == 200 and r.json() == {"version": __version__}
    # --disable-uvicorn-access-log, which the fixture passes: uvicorn logs a line as the response
    # starts, so it would be in the log by now
    assert '"GET /version HTTP/1.1"' not in server.log.read_text()


def wait_for_log(server, pattern: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while not re.search(pattern, text := server.log.read_text()):
        assert time.monotonic() < deadline, f"no {pattern!r} in the log:\n{text[-3000:]}"
        time.sleep(0.02)
    return text


def test_access_log_and_a_second_signal_stops_at_once(tiny_chat_model, tmp_path):
    """The access log is on by default, at uvicorn's INFO, although --uvicorn-log-level stays at
    warning; SIGTERM says it drains the request in flight, and a second SIGTERM cuts it off at once
    instead of waiting out --shutdown-timeout."""
    server = start_server(tiny_chat_model, tmp_path, "--shutdown-timeout", "120")
    engine_pid = server.engine_pid()
    assert httpx.get(server.url + "/version", timeout=10).json() == {"version": __version__}
    wait_for_log(server, r'INFO: +127\.0\.0\.1:\d+ - "GET /version HTTP/1\.1" 200')

    first = threading.Event()
    result = {"chunks": 0, "finish": None, "error": None}

    def stream() -> None:  # longer than the test: 480 tokens
        body = {"prompt": "Hello", "max_tokens": 480, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: {"):
                        result["chunks"] += 1
                        result["finish"] = json.loads(line[6:])["choices"][0]["finish_reason"]
                        first.set()
        except httpx.HTTPError as e:
            result["error"] = e
        finally:
            first.set()

    thread = threading.Thread(target=stream)
    thread.start()
    assert first.wait(60) and result["error"] is None
    wait_for_log(server, r'"POST /v1/completions HTTP/1\.1" 200')

    server.proc.send_signal(signal.SIGTERM)
    wait_for_log(server, r"hotpath serve: draining 1 request in flight \(up to 120 s; Ctrl-C again to stop now\)")
    start = time.monotonic()
    assert server.stop(signal.SIGTERM) == 0
    assert time.monotonic() - start < 60  # not the 120 s drain
    thread.join(60)
    assert result["finish"] is None  # cut off before its 480 tokens
    assert not process_alive(engine_pid)
    log = server.log.read_text()
    assert "hotpath serve: stopping now, cutting off 1 request" in log
    assert log.rstrip().endswith("hotpath serve: stopped") and "Traceback" not in log, log[-3000:]
