"""Media loading under a MediaPolicy: what is allowed loads, every refusal is a MediaError naming
the problem. The http cases run against a real server on loopback."""

from __future__ import annotations

import base64
import io
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from PIL import Image

from hotpath.multimodal.media import (
    MediaError,
    MediaPolicy,
    fetch_bytes,
    load_bytes,
    load_image,
)


def _png(height: int = 20, width: int = 30) -> bytes:
    pixels = np.random.default_rng(height * width).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


PNG = _png()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        port = self.server.server_address[1]
        routes = {
            "/image.png": lambda: self._send(PNG),
            "/not-an-image": lambda: self._send(b"<html>hello</html>"),
            "/big-declared": lambda: self._send(b"x" * 5000),
            "/big-undeclared": lambda: self._send(b"x" * 5000, declare_length=False),
            "/same-host-redirect": lambda: self._redirect("/image.png"),
            "/other-host-redirect": lambda: self._redirect(f"http://localhost:{port}/image.png"),
            "/other-port-redirect": lambda: self._redirect("http://127.0.0.1:1/image.png"),
            "/redirect-loop": lambda: self._redirect("/redirect-loop"),
            "/slow-headers": lambda: (time.sleep(2), self._send(PNG)),
            "/slow-drip": self._drip,
        }
        route = routes.get(self.path)
        if route is None:
            self.send_error(404)
        else:
            route()

    def _send(self, body: bytes, declare_length: bool = True):
        self.send_response(200)
        if declare_length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str):
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _drip(self):  # each byte within the per-read timeout, the whole body far past timeout_s
        self.send_response(200)
        self.end_headers()
        for _ in range(20):
            self.wfile.write(b"x")
            self.wfile.flush()
            time.sleep(0.1)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


LOOPBACK = MediaPolicy(allowed_media_domains=["127.0.0.1", "localhost"], timeout_s=5.0)


def test_media_error_is_a_value_error():
    assert issubclass(MediaError, ValueError)


def test_data_url():
    image = load_image("data:image/png;base64," + base64.b64encode(PNG).decode(), MediaPolicy())
    assert image.size == (30, 20)
    assert np.array_equal(np.asarray(image), np.asarray(Image.open(io.BytesIO(PNG))))
    assert load_bytes("data:text/plain,a%20b", MediaPolicy()) == b"a b"


def test_path_and_file_url_inside_the_allowed_dir(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "photo.png"
    path.write_bytes(PNG)
    policy = MediaPolicy(allowed_local_media_path=str(tmp_path))
    assert load_image(str(path), policy).size == (30, 20)
    assert load_image(path.as_uri(), policy).size == (30, 20)
    assert load_bytes(f"{tmp_path}/sub/../sub/photo.png", policy) == PNG


def test_local_media_refused_without_an_allowed_dir(tmp_path):
    path = tmp_path / "photo.png"
    path.write_bytes(PNG)
    for source in (str(path), path.as_uri()):
        with pytest.raises(MediaError, match="allowed_local_media_path is not set"):
            load_image(source, MediaPolicy())


def test_paths_outside_the_allowed_dir_refused(tmp_path):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    secret = tmp_path / "secret.png"
    secret.write_bytes(PNG)
    (allowed / "link.png").symlink_to(secret)
    (allowed / "dirlink").symlink_to(tmp_path)
    (tmp_path / "allowed-sibling").mkdir()  # shares the allowed dir's name as a prefix
    (tmp_path / "allowed-sibling" / "x.png").write_bytes(PNG)
    policy = MediaPolicy(allowed_local_media_path=str(allowed))
    for source in (str(secret), secret.as_uri(), f"{allowed}/../secret.png", str(allowed / "link.png"),
                   str(allowed / "dirlink" / "secret.png"), str(tmp_path / "allowed-sibling" / "x.png"),
                   "/etc/passwd", "file:///etc/passwd"):
        with pytest.raises(MediaError, match="outside allowed_local_media_path"):
            load_bytes(source, policy)


def test_local_files_that_are_not_regular_files_refused(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    policy = MediaPolicy(allowed_local_media_path=str(tmp_path))
    with pytest.raises(MediaError, match="not a regular file"):
        load_bytes(str(tmp_path / "fifo"), policy)
    with pytest.raises(MediaError, match="cannot read"):
        load_bytes(str(tmp_path / "missing.png"), policy)
    with pytest.raises(MediaError, match="must name a local file"):
        load_bytes("file://otherhost/etc/passwd", policy)


@pytest.mark.parametrize("url", ["ftp://example.com/a.png", "gopher://example.com/", "javascript:alert(1)",
                                 "smb://server/share/a.png", "jar:file:///a.zip!/a.png"])
def test_unsupported_schemes_refused(url):
    with pytest.raises(MediaError, match="unsupported URL scheme"):
        load_bytes(url, MediaPolicy(allowed_local_media_path="/"))


def test_byte_limit(tmp_path, server):
    policy = MediaPolicy(max_bytes=1000, allowed_local_media_path=str(tmp_path),
                         allowed_media_domains=["127.0.0.1"])
    with pytest.raises(MediaError, match="over 1000 bytes \\(max_bytes\\)"):
        load_bytes("data:image/png;base64," + base64.b64encode(b"x" * 2000).decode(), policy)
    with pytest.raises(MediaError, match="max_bytes"):
        load_bytes("data:text/plain," + "x" * 2000, policy)
    (tmp_path / "big.png").write_bytes(b"x" * 2000)
    with pytest.raises(MediaError, match="2000 bytes, over the limit of 1000"):
        load_bytes(str(tmp_path / "big.png"), policy)
    with pytest.raises(MediaError, match="5000 bytes, over the limit of 1000"):
        fetch_bytes(f"{server}/big-declared", policy)
    with pytest.raises(MediaError, match="over the limit of 1000 bytes"):  # caught while streaming
        fetch_bytes(f"{server}/big-undeclared", policy)


def test_undecodable_bytes_refused(server, tmp_path):
    with pytest.raises(MediaError, match="cannot decode the image"):
        load_image(b"\x89PNG\r\n\x1a\n but then nothing", MediaPolicy())
    with pytest.raises(MediaError, match="cannot decode the image"):
        load_image(f"{server}/not-an-image", LOOPBACK)
    with pytest.raises(MediaError, match="not valid base64"):
        load_image("data:image/png;base64,@@@@", MediaPolicy())
    with pytest.raises(MediaError, match="needs a ','"):
        load_image("data:image/png;base64", MediaPolicy())


def test_decompression_bomb_refused():
    out = io.BytesIO()
    Image.new("L", (4000, 3000)).save(out, format="PNG")  # 12 M pixels in a few kB
    assert len(out.getvalue()) < 100_000
    with pytest.raises(MediaError, match="4000x3000 = 12000000 pixels, over the limit of 1000000"):
        load_image(out.getvalue(), MediaPolicy(max_pixels=1_000_000))


def test_http_fetch_and_same_host_redirect(server):
    assert fetch_bytes(f"{server}/image.png", LOOPBACK) == PNG
    assert load_image(f"{server}/same-host-redirect", LOOPBACK).size == (30, 20)


def test_redirect_to_another_host_refused(server):
    # localhost is allowed too, and is the same machine: only the same host name may be redirected to
    with pytest.raises(MediaError, match="redirect .* to another host \\(localhost:"):
        fetch_bytes(f"{server}/other-host-redirect", LOOPBACK)
    with pytest.raises(MediaError, match="to another host \\(127.0.0.1:1\\)"):
        fetch_bytes(f"{server}/other-port-redirect", LOOPBACK)
    with pytest.raises(MediaError, match="more than 5 redirects"):
        fetch_bytes(f"{server}/redirect-loop", LOOPBACK)


def test_hosts_outside_the_allowlist_refused(server):
    with pytest.raises(MediaError, match="host '127.0.0.1' is not in allowed_media_domains"):
        fetch_bytes(f"{server}/image.png", MediaPolicy(allowed_media_domains=["example.com"]))


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "10.1.2.3", "169.254.169.254", "[::ffff:7f00:1]"])
def test_non_public_hosts_refused_without_an_allowlist(host):
    with pytest.raises(MediaError, match="resolves to a non-public address"):
        fetch_bytes(f"http://{host}:9/image.png", MediaPolicy())


def test_http_errors_are_media_errors(server):
    with pytest.raises(MediaError, match="HTTP 404"):
        fetch_bytes(f"{server}/missing", LOOPBACK)


def test_timeout(server):
    policy = MediaPolicy(allowed_media_domains=["127.0.0.1"], timeout_s=0.5)
    for path in ("/slow-headers", "/slow-drip"):
        start = time.monotonic()
        with pytest.raises(MediaError, match="0.5s \\(timeout_s\\)"):
            fetch_bytes(f"{server}{path}", policy)
        assert time.monotonic() - start < 1.5


def test_policy_validates_its_limits():
    with pytest.raises(ValueError, match="max_bytes"):
        MediaPolicy(max_bytes=0)
    with pytest.raises(ValueError, match="timeout_s"):
        MediaPolicy(timeout_s=0)
