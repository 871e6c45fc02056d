"""`hotpath bench serve` against the running server, and the prompt-set loaders on local files."""

import gzip
import json

import pytest

from server_utils import API_KEY
from hotpath.bench.datasets import load_requests
from hotpath.bench.serve import _percentiles
from hotpath.cli import main


def test_bench_serve_sweep_writes_table_json_and_plot(server, tmp_path, capsys):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    rc = main(["bench", "serve", "--base-url", server.url, "--api-key", API_KEY, "--dataset", "random",
               "--num-prompts", "8", "--input-len", "16", "--output-len", "8", "--token-range", "10", "400",
               "--max-concurrency", "1,4", "--sweep", "--output-json", str(out_json),
               "--output-plot", str(out_png), "--no-progress"])
    assert rc == 0
    table = capsys.readouterr().out
    assert "| concurrency |" in table and "\n| 1 |" in table and "\n| 4 |" in table
    data = json.loads(out_json.read_text())
    assert data["model"] == "tiny" and data["dataset"] == "random"
    assert [r["max_concurrency"] for r in data["results"]] == [1, 4]
    for r in data["results"]:
        assert r["completed"] == 8 and r["failed"] == 0
        assert r["input_tokens"] == 8 * 16 and r["output_tokens"] == 8 * 8
        assert 0 < r["ttft_ms"]["p50"] <= r["ttft_ms"]["p99"] <= r["e2e_ms"]["p99"]
        assert r["tpot_ms"]["p50"] > 0 and r["output_throughput"] > 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_needs_sweep_for_several_levels(server):
    assert main(["bench", "serve", "--base-url", server.url, "--max-concurrency", "1,2"]) == 2


def test_percentiles():
    stats = _percentiles([float(x) for x in range(1, 101)])
    assert stats["mean"] == 50.5 and stats["p50"] == 50.5 and stats["p99"] == pytest.approx(99.01)


def test_dataset_loaders_read_the_shipped_formats(tmp_path):
    root = tmp_path / "datasets"
    (root / "sharegpt").mkdir(parents=True)
    conversations = [{"id": str(i), "conversations": [{"from": "human", "value": f"question {i}"},
                                                      {"from": "gpt", "value": "answer"}]} for i in range(3)]
    text = json.dumps(conversations, indent=2)
    # the shipped file is cut off inside its last conversation
    (root / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.json").write_text(text[:text.rindex("question 2") + 4])
    (root / "humaneval").mkdir()
    with gzip.open(root / "humaneval" / "HumanEval.jsonl.gz", "wt") as f:
        f.write(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n"}) + "\n")
    (root / "mtbench").mkdir()
    (root / "mtbench" / "question.jsonl").write_text(json.dumps({"turns": ["first?", "second?"]}) + "\n")

    share = load_requests("sharegpt", 4, 16, cache_dir=tmp_path)
    assert sorted({r.messages[0]["content"] for r in share}) == ["question 0", "question 1"]
    assert all(r.is_chat and r.output_len == 16 for r in share) and len(share) == 4
    (code,) = load_requests("humaneval", 1, 8, cache_dir=tmp_path)
    assert code.prompt == "def f():\n" and not code.is_chat
    (mt,) = load_requests("mtbench", 1, 8, cache_dir=tmp_path)
    assert mt.messages == [{"role": "user", "content": "first?"}]
    rand = load_requests("random", 3, 8, input_len=5, token_range=(10, 20))
    assert all(len(r.prompt) == 5 and all(10 <= t < 20 for t in r.prompt) for r in rand)
    with pytest.raises(ValueError, match="unknown dataset"):
        load_requests("nope", 1, 8)
