"""Bad input gets a clear error naming the problem, and the engine keeps serving."""

import json
import shutil

import pytest

from hotpath import LLM, SamplingParams

MODEL = "llama-gqa4-tied-hd"
GOOD = {"prompt_token_ids": [5, 6, 7, 8]}
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_model_factory):
    path, _ = tiny_model_factory(MODEL)
    return LLM(str(path), skip_tokenizer_init=True, device="cpu", max_model_len=64)


@pytest.fixture(scope="module")
def reference_output(llm):
    return llm.generate(GOOD, GREEDY, use_tqdm=False)[0].outputs[0].token_ids


@pytest.mark.parametrize("prompt, params, message", [
    ({"prompt_token_ids": list(range(3, 70))}, GREEDY, "prompt is 67 tokens, but max_model_len is 64"),
    ({"prompt_token_ids": []}, GREEDY, "prompt is empty"),
    ({"prompt_token_ids": [1, 99999]}, GREEDY, "token ids must be integers in [0, 512)"),
    ("some text", GREEDY, "need a tokenizer"),
])
def test_bad_prompt(llm, reference_output, prompt, params, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        llm.generate([GOOD, prompt], params, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()  # nothing half-queued
    assert llm.generate(GOOD, GREEDY, use_tqdm=False)[0].outputs[0].token_ids == reference_output


@pytest.mark.parametrize("kwargs, name", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(temperature=-1.0), "temperature"),
])
def test_bad_sampling_params(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_error_mid_run_keeps_other_requests(llm, reference_output):
    engine = llm.engine
    engine.add_request("ok", GOOD, GREEDY)
    engine.step()
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request("bad", {"prompt_token_ids": [3] * 100}, GREEDY)
    finished = []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in finished] == ["ok"]
    assert finished[0].outputs[0].token_ids == reference_output


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_unknown_architecture(tiny_model_factory, tmp_path):
    path = _copy(tiny_model_factory(MODEL)[0], tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["MysteryForCausalLM"]
    cfg["model_type"] = "mystery"
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported model architecture 'MysteryForCausalLM'"):
        LLM(str(path), skip_tokenizer_init=True, device="cpu")


def test_missing_weights_file(tiny_model_factory, tmp_path):
    path = _copy(tiny_model_factory(MODEL)[0], tmp_path / "m")
    (path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors weights"):
        LLM(str(path), skip_tokenizer_init=True, device="cpu")


def test_corrupt_weights_file(tiny_model_factory, tmp_path):
    path = _copy(tiny_model_factory(MODEL)[0], tmp_path / "m")
    f = path / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ValueError, match="model.safetensors"):
        LLM(str(path), skip_tokenizer_init=True, device="cpu")


def test_missing_model_path():
    with pytest.raises((FileNotFoundError, ValueError), match="no-such-model"):
        LLM("/nonexistent/no-such-model", skip_tokenizer_init=True, device="cpu")


def test_max_model_len_over_cache(tiny_model_factory):
    path, _ = tiny_model_factory(MODEL)
    with pytest.raises(ValueError, match="larger than the KV cache capacity"):
        LLM(str(path), skip_tokenizer_init=True, device="cpu", max_model_len=512, num_gpu_blocks_override=4)


def test_max_model_len_over_model_positions(tiny_model_factory):
    path, _ = tiny_model_factory(MODEL)  # max_position_embeddings 1024
    with pytest.raises(ValueError, match="max_model_len 4096 is larger than the model's max_position_embeddings"):
        LLM(str(path), skip_tokenizer_init=True, device="cpu", max_model_len=4096)


def test_snapshot_stride_must_be_whole_blocks():
    from hotpath.config import EngineConfig

    with pytest.raises(ValueError, match=r"state_snapshot_stride \(100\) must be a multiple of block_size \(16\)"):
        EngineConfig(max_model_len=256, state_snapshot_stride=100)
