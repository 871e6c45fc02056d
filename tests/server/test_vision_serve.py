"""Image chat over HTTP: `hotpath serve` with a tiny Qwen3-VL checkpoint, driven by the official
openai client over loopback. Images come as data: URLs, from a loopback HTTP server and from an
allowed local directory; the replies equal LLM.chat's offline (greedy, the same tokens). Bad media
get a 400 naming the problem, and the server keeps serving.

Three servers: the image-text model with a media policy open to the loopback host and one local
directory; the same model with the default policy (no local files, public hosts only) as two
data-parallel replicas; and conftest's text-only server."""

from __future__ import annotations

import base64
import importlib.util
import io
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import openai
import pytest
from PIL import Image
from server_utils import API_KEY, start_server

from hotpath import LLM, SamplingParams
from hotpath.multimodal.chat import extract_media

MAX_TOKENS = 8
IMAGE_LIMIT = 2


def png_bytes(height: int, width: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims width x height pixels in a few bytes (a decompression bomb's header)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def conversation(*parts: dict) -> list[dict]:
    return [{"role": "system", "content": "You describe pictures."},
            {"role": "user", "content": [{"type": "text", "text": "What is in the picture?"}, *parts]}]


class MediaHost:
    """A loopback HTTP server with a few files; /huge.png announces more bytes than a server takes."""

    def __init__(self, files: dict[str, bytes]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/huge.png":
                    self.send_response(200)
                    self.send_header("Content-Length", str(64 << 20))
                    self.end_headers()
                    return
                body = files.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


@pytest.fixture(scope="module")
def vl_model(tmp_path_factory):
    from tiny_vl_chat_model import make_tiny_vl_chat_model

    return make_tiny_vl_chat_model(tmp_path_factory.mktemp("tiny-vl-chat"))


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("media")
    (out / "photo.png").write_bytes(png_bytes(90, 120, 3))
    return out


@pytest.fixture(scope="module")
def media_host():
    host = MediaHost({"/photo.png": png_bytes(100, 150, 2)})
    yield host
    host.httpd.shutdown()


@pytest.fixture(scope="module")
def servers(vl_model, media_dir, tmp_path_factory):
    """(open, default): the open one allows the loopback host and media_dir; the default one,
    two data-parallel replicas, allows neither. Started side by side."""
    tmp = tmp_path_factory.mktemp("vl-servers")
    common = ("--max-model-len", "1024", "--served-model-name", "tiny-vl",
              "--limit-mm-per-prompt", f'{{"image": {IMAGE_LIMIT}}}')
    with ThreadPoolExecutor(2) as pool:
        started = [pool.submit(start_server, vl_model, tmp, *common, "--allowed-media-domains", "127.0.0.1",
                               "--allowed-local-media-path", str(media_dir)),
                   pool.submit(start_server, vl_model, tmp, *common, "--data-parallel-size", "2")]
        procs = [s.result() for s in started]
    yield procs
    for proc in procs:
        assert proc.stop() == 0, proc.log.read_text()[-3000:]


@pytest.fixture(scope="module")
def open_client(servers):
    return openai.OpenAI(base_url=servers[0].url + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def default_client(servers):
    return openai.OpenAI(base_url=servers[1].url + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def offline(vl_model, media_dir):
    return LLM(str(vl_model), device="cpu", max_model_len=1024, allowed_media_domains=["127.0.0.1"],
               allowed_local_media_path=str(media_dir))


def offline_reply(llm: LLM, messages: list[dict]):
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return llm.chat(messages, params, use_tqdm=False)[0]


def chat(client: openai.OpenAI, messages: list[dict], **kwargs):
    return client.chat.completions.create(model="tiny-vl", messages=messages, max_tokens=MAX_TOKENS,
                                          temperature=0, extra_body={"ignore_eos": True, **kwargs})


def test_image_chat_equals_offline(servers, open_client, offline, media_host):
    messages = conversation(image_part(data_url(png_bytes(60, 80, 1))), image_part(media_host.url("/photo.png")))
    expected = offline_reply(offline, messages)
    reply = chat(open_client, messages)
    assert reply.choices[0].message.content == expected.outputs[0].text
    assert reply.usage.completion_tokens == MAX_TOKENS
    # the placeholders count expanded: one token per merged patch of each image, not one per image
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert reply.usage.prompt_tokens > len(offline.apply_chat_template(extract_media(messages)[0])) + 2
    tokenized = httpx.post(servers[0].url + "/tokenize", json={"messages": messages}, timeout=60).json()
    assert tokenized["count"] == reply.usage.prompt_tokens


def test_streamed_image_chat_equals_offline(open_client, offline, media_dir):
    messages = conversation(image_part((media_dir / "photo.png").as_uri()),
                            {"type": "text", "text": " and "}, image_part(data_url(png_bytes(70, 50, 4))))
    expected = offline_reply(offline, messages)
    stream = open_client.chat.completions.create(
        model="tiny-vl", messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.outputs[0].text
    assert chunks[-1].usage.prompt_tokens == len(expected.prompt_token_ids)


def test_mm_processor_kwargs_per_request(servers, open_client):
    """min_pixels raised for one request: a small image becomes more visual tokens."""
    messages = conversation(image_part(data_url(png_bytes(60, 80, 1))))
    kwargs = {"min_pixels": 16 * 1024}
    plain = chat(open_client, messages).usage.prompt_tokens
    larger = chat(open_client, messages, mm_processor_kwargs=kwargs).usage.prompt_tokens
    assert larger > plain
    tokenized = httpx.post(servers[0].url + "/tokenize", json={"messages": messages, "mm_processor_kwargs": kwargs},
                           timeout=60).json()
    assert tokenized["count"] == larger


def test_data_parallel_replicas_take_images(servers, default_client, offline):
    """Both replicas serve images (each prompt crosses its replica's pipe preprocessed), and a prompt
    whose text before its image repeats an earlier prompt's is routed after it."""
    def routed(name: str) -> list[float]:
        metrics = servers[1].metrics()
        return [metrics[f'hotpath:{name}{{model_name="tiny-vl",replica="{i}"}}'] for i in range(2)]

    image = image_part(data_url(png_bytes(60, 80, 5)))
    long_text_first = [{"role": "system", "content": "You describe pictures in a few words. " * 4},
                       {"role": "user", "content": [image]}]
    image_first = [{"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}]
    before, prefix_before = routed("dp_requests_routed_total"), routed("dp_requests_prefix_routed_total")
    for messages in (long_text_first, long_text_first, image_first):
        expected = offline_reply(offline, messages).outputs[0].text
        assert chat(default_client, messages).choices[0].message.content == expected
    after, prefix_after = routed("dp_requests_routed_total"), routed("dp_requests_prefix_routed_total")
    assert sorted(a - b for a, b in zip(after, before)) == [1, 2]
    assert sum(prefix_after) - sum(prefix_before) == 1


def test_tiny_checkpoint_takes_video_offline(offline):
    """The builder's tokenizer writes Qwen3-VL's frame timestamps ("<0.5 seconds>") as text, so
    its checkpoint serves video parity tests too (the frames given as an array: no PyAV needed)."""
    frames = np.random.default_rng(6).integers(0, 256, (8, 64, 96, 3), dtype=np.uint8)
    messages = conversation({"type": "video", "video": frames})
    out = offline_reply(offline, messages)
    template_ids = offline.apply_chat_template(extract_media(messages)[0])
    (item,) = offline.engine.process_prompt({"prompt_token_ids": template_ids,
                                             "multi_modal_data": {"video": [frames]}}).mm_items
    assert item.modality == "video" and len(item.spans) == item.grid_thw[0] == 2
    assert "<0.0 seconds><|vision_start|><|video_pad|>" in offline.get_tokenizer().decode(out.prompt_token_ids)
    assert len(out.outputs[0].token_ids) == MAX_TOKENS


# (which server, the content parts, words the message must contain)
BAD_MEDIA = {
    "undecodable image": ("open", lambda host, d: [image_part(data_url(b"not an image at all"))],
                          ["cannot decode the image"]),
    "more images than --limit-mm-per-prompt": (
        "open", lambda host, d: [image_part(data_url(png_bytes(8, 8, i))) for i in range(IMAGE_LIMIT + 1)],
        [f"{IMAGE_LIMIT + 1} images", f"at most {IMAGE_LIMIT}", "--limit-mm-per-prompt"]),
    "image over the pixel limit": ("open", lambda host, d: [image_part(data_url(png_header_only(12000, 10000)))],
                                   ["12000x10000", "max_pixels"]),
    "image over the byte limit": ("open", lambda host, d: [image_part(host.url("/huge.png"))],
                                  [str(64 << 20), "max_bytes"]),
    "missing image on the media host": ("open", lambda host, d: [image_part(host.url("/gone.png"))], ["HTTP 404"]),
    "unsupported URL scheme": ("open", lambda host, d: [image_part("ftp://127.0.0.1/photo.png")], ["'ftp'"]),
    "local path outside the allowed directory": (
        "open", lambda host, d: [image_part(str(d.parent / "elsewhere.png"))], ["outside allowed_local_media_path"]),
    "file: URL escaping the allowed directory": (
        "open", lambda host, d: [image_part((d / ".." / "x.png").as_uri())], ["outside allowed_local_media_path"]),
    "host not in --allowed-media-domains": ("open", lambda host, d: [image_part(host.url("/photo.png", "localhost"))],
                                            ["'localhost'", "allowed_media_domains"]),
    "file: URL without --allowed-local-media-path": (
        "default", lambda host, d: [image_part((d / "photo.png").as_uri())], ["allowed_local_media_path is not set"]),
    "local path without --allowed-local-media-path": (
        "default", lambda host, d: [image_part(str(d / "photo.png"))], ["allowed_local_media_path is not set"]),
    "loopback host under the default policy": (
        "default", lambda host, d: [image_part(host.url("/photo.png"))], ["non-public address"]),
    "content part of an unknown type": ("open", lambda host, d: [{"type": "input_audio", "input_audio": {}}],
                                        ["input_audio", "image_url"]),
}


@pytest.mark.parametrize("case", list(BAD_MEDIA))
def test_bad_media_is_400(case, open_client, default_client, media_host, media_dir):
    which, parts, words = BAD_MEDIA[case]
    client = open_client if which == "open" else default_client
    with pytest.raises(openai.BadRequestError) as raised:
        chat(client, conversation(*parts(media_host, media_dir)))
    message = raised.value.body["message"]
    for word in words:
        assert word in message, message


def test_processor_kwargs_over_the_model_limit_is_400(open_client):
    with pytest.raises(openai.BadRequestError, match="over the model's limit"):
        chat(open_client, conversation(image_part(data_url(png_bytes(8, 8, 0)))),
             mm_processor_kwargs={"max_pixels": 10**9})


@pytest.mark.skipif(importlib.util.find_spec("av") is not None, reason="PyAV is installed: videos decode")
def test_video_without_pyav_is_400(open_client):
    part = {"type": "video_url", "video_url": {"url": data_url(b"\0\0\0\x18ftypmp42", "video/mp4")}}
    with pytest.raises(openai.BadRequestError, match="PyAV"):
        chat(open_client, conversation(part))


def test_still_serving_after_bad_media(servers, open_client, default_client):
    for client in (open_client, default_client):
        reply = chat(client, conversation(image_part(data_url(png_bytes(40, 40, 9)))))
        assert reply.usage.completion_tokens == MAX_TOKENS
    for proc in servers:
        assert httpx.get(proc.url + "/health", timeout=10).status_code == 200


def test_text_only_model_refuses_images(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError, match="takes no images or videos") as raised:
        client.chat.completions.create(model="tiny", messages=conversation(image_part(data_url(png_bytes(8, 8, 0)))),
                                       max_tokens=2)
    assert raised.value.body["param"] == "messages"
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.usage.completion_tokens >= 1
