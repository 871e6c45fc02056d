"""Loading media that a client names by URL or path, under a MediaPolicy.

A request must not make the server read its files or reach its network: local files are read
only under `allowed_local_media_path`; http(s) fetches go only to public hosts, or to the hosts
in `allowed_media_domains` when it is set, follow redirects only on the same host, and stop at
`max_bytes` and `timeout_s`. Every refusal is a MediaError (a ValueError: HTTP 400 in the server)
naming the limit, scheme or host. Hosts are checked by the addresses they resolve to just before
the fetch; a DNS answer that changes between that check and the connection is not caught, so
deployments that must never reach internal hosts set `allowed_media_domains`.
"""

from __future__ import annotations

import base64
import binascii
import io
import ipaddress
import os
import socket
import stat
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import SplitResult, unquote, unquote_to_bytes, urljoin, urlsplit

import httpx
from PIL import Image

_MAX_REDIRECTS = 5
_DEFAULT_PORTS = {"http": 80, "https": 443}
# formats a client may send; the rest of PIL's decoders are rarely needed and widen the attack surface
IMAGE_FORMATS = ("PNG", "JPEG", "MPO", "WEBP", "GIF", "BMP", "TIFF")


class MediaError(ValueError):
    """Media that the policy refuses or that cannot be read or decoded."""


@dataclass(frozen=True)
class MediaPolicy:
    # None: local paths and file: URLs are refused
    allowed_local_media_path: str | None = None
    # None: any host whose addresses are all public; a list: exactly these host names, whatever
    # they resolve to (the operator vouches for them)
    allowed_media_domains: list[str] | None = None
    max_bytes: int = 20 << 20
    timeout_s: float = 10.0
    max_pixels: int = 10**8  # per image or video frame: a decompression-bomb guard

    def __post_init__(self) -> None:
        if self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {self.max_bytes}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.max_pixels <= 0:
            raise ValueError(f"max_pixels must be positive, got {self.max_pixels}")


def _registered(formats: tuple[str, ...]) -> list[str]:
    """The formats this Pillow can open (one that no longer registers a format, as Pillow 13 with
    MPO, would otherwise fail every format after it)."""
    Image.init()
    return [f for f in formats if f in Image.OPEN]


def load_bytes(source: str, policy: MediaPolicy) -> bytes:
    """The bytes behind an http(s) URL, a data: URL, a file: URL or a local path."""
    parts = urlsplit(source)
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        return fetch_bytes(source, policy)
    if scheme == "data":
        return _data_url_bytes(source, policy)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise MediaError(f"file: URLs must name a local file, got host {parts.netloc!r}")
        return _read_local_file(unquote(parts.path), policy)
    if scheme == "":
        return _read_local_file(source, policy)
    raise MediaError(f"unsupported URL scheme {scheme!r}: use http, https, data or file")


def load_image(source: str | bytes, policy: MediaPolicy) -> Image.Image:
    """A decoded image from a URL, a path (see load_bytes) or the encoded bytes themselves."""
    data = source if isinstance(source, bytes) else load_bytes(source, policy)
    return decode_image(data, policy)


def decode_image(data: bytes, policy: MediaPolicy) -> Image.Image:
    """PIL image from encoded bytes, its size checked against max_pixels before the pixels are decoded."""
    try:
        with warnings.catch_warnings():
            # our max_pixels is the bomb guard; PIL's own warning threshold would only add noise
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=_registered(IMAGE_FORMATS))
            width, height = image.size
            if width * height > policy.max_pixels:
                raise MediaError(f"image is {width}x{height} = {width * height} pixels, over the "
                                 f"limit of {policy.max_pixels} (max_pixels)")
            image.load()
    except MediaError:
        raise
    except Exception as e:  # untrusted bytes: PIL's decoders raise many kinds of error
        raise MediaError(f"cannot decode the image (supported formats: {', '.join(IMAGE_FORMATS)}): {e}") from e
    return image


def fetch_bytes(url: str, policy: MediaPolicy) -> bytes:
    """GET an http(s) URL, following redirects only on the same host, streaming at most max_bytes."""
    parts = urlsplit(url)
    _check_fetch_target(parts, policy)
    deadline = time.monotonic() + policy.timeout_s
    host = parts.hostname
    try:
        with httpx.Client(timeout=policy.timeout_s, follow_redirects=False, trust_env=False,
                          headers={"Accept-Encoding": "identity"}) as client:
            for _ in range(_MAX_REDIRECTS + 1):
                with client.stream("GET", url) as response:
                    if response.is_redirect:
                        target = urljoin(url, response.headers["location"])
                        _check_redirect(urlsplit(url), urlsplit(target), policy)
                        url = target
                        continue
                    if response.status_code != 200:
                        raise MediaError(f"fetching media from {host} failed: HTTP {response.status_code}")
                    return _read_body(response, host, deadline, policy)
    except httpx.TimeoutException as e:
        raise MediaError(f"fetching media from {host} timed out after {policy.timeout_s}s (timeout_s)") from e
    except httpx.HTTPError as e:
        raise MediaError(f"fetching media from {host} failed: {e}") from e
    raise MediaError(f"fetching media from {host}: more than {_MAX_REDIRECTS} redirects")


def _read_body(response: httpx.Response, host: str | None, deadline: float, policy: MediaPolicy) -> bytes:
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > policy.max_bytes:
        raise MediaError(f"media from {host} is {declared} bytes, over the limit of {policy.max_bytes} (max_bytes)")
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > policy.max_bytes:
            raise MediaError(f"media from {host} is over the limit of {policy.max_bytes} bytes (max_bytes)")
        # httpx's timeout bounds each read; this bounds the whole body against a slow drip
        if time.monotonic() > deadline:
            raise MediaError(f"fetching media from {host} took over {policy.timeout_s}s (timeout_s)")
    return bytes(body)


def _check_fetch_target(parts: SplitResult, policy: MediaPolicy) -> None:
    if parts.scheme.lower() not in ("http", "https"):
        raise MediaError(f"unsupported URL scheme {parts.scheme!r}: use http or https")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise MediaError("the media URL has no host")
    if policy.allowed_media_domains is not None:
        allowed = {d.lower().rstrip(".") for d in policy.allowed_media_domains}
        if host not in allowed:
            raise MediaError(f"host {host!r} is not in allowed_media_domains")
        return
    for address in _resolve(host, _port(parts)):
        if not _is_public(address):
            raise MediaError(f"host {host!r} resolves to a non-public address ({address}); "
                             "list it in allowed_media_domains to allow it")


def _resolve(host: str, port: int) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return {ipaddress.ip_address(host)}
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as e:
        raise MediaError(f"cannot resolve host {host!r}: {e}") from e
    # the scope id of a link-local IPv6 address (fe80::1%eth0) is not part of the address
    return {ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}


def _is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    # ::ffff:127.0.0.1 reaches 127.0.0.1; Python 3.10's is_global does not look inside
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global


def _port(parts: SplitResult) -> int:
    try:
        port = parts.port
    except ValueError as e:
        raise MediaError(f"bad port in the media URL: {e}") from e
    return port if port is not None else _DEFAULT_PORTS[parts.scheme.lower()]


def _check_redirect(origin: SplitResult, target: SplitResult, policy: MediaPolicy) -> None:
    """Same host only; the port may change only for an http -> https upgrade on the default ports."""
    if target.scheme.lower() not in ("http", "https"):
        raise MediaError(f"refused a redirect to the unsupported scheme {target.scheme!r}")
    same_host = (target.hostname or "").rstrip(".") == (origin.hostname or "").rstrip(".")
    origin_port, target_port = _port(origin), _port(target)
    upgrade = (origin.scheme.lower(), origin_port, target.scheme.lower(), target_port) == ("http", 80, "https", 443)
    if not same_host or (origin_port != target_port and not upgrade):
        raise MediaError(f"refused a redirect from {origin.hostname}:{origin_port} to another host "
                         f"({target.hostname}:{target_port})")
    _check_fetch_target(target, policy)


def _data_url_bytes(url: str, policy: MediaPolicy) -> bytes:
    header, comma, payload = url[len("data:"):].partition(",")
    if not comma:
        raise MediaError("a data: URL needs a ',' before its data")
    if header.lower().endswith(";base64"):
        if any(c in payload for c in " \t\r\n"):  # some clients wrap long base64 lines
            payload = "".join(payload.split())
        if len(payload) // 4 * 3 > policy.max_bytes:
            raise MediaError(f"the data: URL holds over {policy.max_bytes} bytes (max_bytes)")
        try:
            return base64.b64decode(payload, validate=True)
        except binascii.Error as e:
            raise MediaError(f"the data: URL is not valid base64: {e}") from e
    data = unquote_to_bytes(payload)
    if len(data) > policy.max_bytes:
        raise MediaError(f"the data: URL holds over {policy.max_bytes} bytes (max_bytes)")
    return data


def _read_local_file(path: str, policy: MediaPolicy) -> bytes:
    if policy.allowed_local_media_path is None:
        raise MediaError("local media paths and file: URLs are not allowed (allowed_local_media_path is not set)")
    try:
        root = Path(policy.allowed_local_media_path).resolve(strict=True)
        # symlinks and '..' resolved before the containment check, so neither can lead outside
        resolved = Path(path).resolve()
    except (OSError, RuntimeError, ValueError) as e:
        raise MediaError(f"cannot resolve the local media path {path!r}: {e}") from e
    if not resolved.is_relative_to(root):
        raise MediaError(f"local media path {path!r} is outside allowed_local_media_path")
    try:
        # O_NONBLOCK: opening a FIFO must not hang the request; regular files read as usual
        with open(os.open(resolved, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise MediaError(f"local media path {path!r} is not a regular file")
            if info.st_size > policy.max_bytes:
                raise MediaError(f"local media file {path!r} is {info.st_size} bytes, over the limit of "
                                 f"{policy.max_bytes} (max_bytes)")
            data = f.read(policy.max_bytes + 1)
    except OSError as e:
        raise MediaError(f"cannot read local media file {path!r}: {e.strerror}") from e
    if len(data) > policy.max_bytes:  # the file grew after fstat
        raise MediaError(f"local media file {path!r} is over the limit of {policy.max_bytes} bytes (max_bytes)")
    return data
