"""Image-text models against HF transformers on tiny random checkpoints (CPU, fp32): greedy tokens
are HF's argmax at every step (near ties only), with two images and text between, through a
chunked prefill that cuts an image, an encoder-cache hit, a prefix-cache hit with the same image
and a miss with another image of the same size."""

import json

import numpy as np
import pytest
import torch

from hotpath import LLM, SamplingParams
from hotpath.multimodal.inputs import ProcessedPrompt

VL_MODELS = ["qwen3vl", "qwen3vl-moe", "qwen3_5-vl", "qwen3_5moe-vl"]
IMG, VID, START, END = 500, 501, 502, 503  # the tiny models' placeholder ids (tests/tiny_models.py)
NUM_TOKENS = 8
TIE = 1e-5
# small images: 4 to 64 visual tokens each
PREPROCESSOR = {"size": {"shortest_edge": 4 * 1024, "longest_edge": 64 * 1024}, "patch_size": 16,
                "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5]}


@pytest.fixture(scope="module")
def vl_model(tiny_model_factory):
    def get(name):
        path, hf = tiny_model_factory(name)
        (path / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
        return path, hf
    return get


def random_image(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def two_image_prompt(seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    text = lambda n: torch.randint(3, 490, (n,), generator=g).tolist()  # noqa: E731
    return text(5) + [START, IMG, END] + text(7) + [START, IMG, END] + text(3)


def hf_check(hf, processed: ProcessedPrompt, out_ids: list[int]) -> None:
    """out_ids are HF's greedy argmax at every step but near ties."""
    ids = torch.tensor([processed.prompt_token_ids + out_ids])
    types = torch.zeros_like(ids)
    for item in processed.mm_items:
        for off, n in item.spans:
            types[0, off:off + n] = 1 if item.modality == "image" else 2
    kwargs = {}
    for modality, key in (("image", ""), ("video", "_videos")):
        items = [i for i in processed.mm_items if i.modality == modality]
        if items:
            kwargs[f"pixel_values{key}"] = torch.cat([i.pixel_values for i in items])
            kwargs[f"{modality}_grid_thw"] = torch.tensor([i.grid_thw for i in items])
    with torch.no_grad():
        logits = hf(input_ids=ids, mm_token_type_ids=types, **kwargs).logits[0].float()
    n = len(processed.prompt_token_ids)
    for step, token in enumerate(out_ids):
        top2 = torch.topk(logits[n + step - 1], 2)
        best = int(top2.indices[0])
        assert token == best or float(top2.values[0] - top2.values[1]) < TIE, \
            f"step {step}: hotpath {token}, HF argmax {best}"
        if token != best:
            return


def generate(llm, prompt: dict) -> list[int]:
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
    return llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids


@pytest.mark.parametrize("name", VL_MODELS)
def test_images_match_hf(name, vl_model):
    path, hf = vl_model(name)
    llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=1024)
    images = [random_image(37, 91, 1), random_image(300, 200, 2)]
    prompt = {"prompt_token_ids": two_image_prompt(), "multi_modal_data": {"image": images}}
    processed = llm.engine.process_prompt(prompt)
    assert [i.modality for i in processed.mm_items] == ["image", "image"]
    out = generate(llm, prompt)
    hf_check(hf, processed, out)

    # the same image again: the encoder cache and the prefix cache serve it, the same tokens come
    cache = llm.engine.executor.runner.encoder_cache
    hits = cache.hits
    assert generate(llm, prompt) == out
    assert llm.engine.kv_cache.prefix_hit_tokens > 0
    # a different image of the same size: the same placeholder tokens, but no prefix hit past them
    other = {"prompt_token_ids": prompt["prompt_token_ids"],
             "multi_modal_data": {"image": [random_image(37, 91, 3), images[1]]}}
    processed_other = llm.engine.process_prompt(other)
    assert processed_other.prompt_token_ids == processed.prompt_token_ids
    out_other = generate(llm, other)
    hf_check(hf, processed_other, out_other)
    assert cache.hits > hits  # the second image was cached by the first request


@pytest.mark.parametrize("name", ["qwen3vl", "qwen3_5-vl"])
def test_chunked_prefill_cuts_images(name, vl_model):
    """Chunks of 16 tokens cut through both images: the tower runs once an image, its output
    sliced, and the tokens are HF's."""
    path, hf = vl_model(name)
    llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=1024,
              max_num_batched_tokens=16, max_num_seqs=16, enable_prefix_caching=False)
    images = [random_image(180, 240, 4), random_image(250, 100, 5)]
    prompt = {"prompt_token_ids": two_image_prompt(1), "multi_modal_data": {"image": images}}
    processed = llm.engine.process_prompt(prompt)
    assert max(i.num_tokens for i in processed.mm_items) > 16
    cache = llm.engine.executor.runner.encoder_cache
    out = generate(llm, prompt)
    assert cache.misses == 2  # one tower run per image, however many chunks
    hf_check(hf, processed, out)


def test_text_only_model_refuses_images(tiny_model_factory):
    path, _ = tiny_model_factory("qwen3-gqa8-untied-hd")
    llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=256)
    with pytest.raises(ValueError, match="takes no images"):
        llm.generate([{"prompt_token_ids": [5, IMG, 6], "multi_modal_data": {"image": random_image(8, 8, 0)}}],
                     use_tqdm=False)


def test_language_model_only(vl_model):
    path, hf = vl_model("qwen3vl")
    llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=256,
              language_model_only=True)
    assert llm.engine.executor.runner.model.visual is None
    with pytest.raises(ValueError, match="language_model_only"):
        llm.generate([{"prompt_token_ids": [5, START, IMG, END], "multi_modal_data": {"image": random_image(40, 40, 0)}}],
                     use_tqdm=False)
    prompt = [5, 6, 7, 8]
    out = generate(llm, {"prompt_token_ids": prompt})
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=NUM_TOKENS, do_sample=False)[0, len(prompt):].tolist()
    assert out == ref


def test_image_limit(vl_model):
    path, _ = vl_model("qwen3vl")
    llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=256,
              limit_mm_per_prompt={"image": 1})
    with pytest.raises(ValueError, match="at most 1"):
        llm.engine.process_prompt({"prompt_token_ids": two_image_prompt(),
                                   "multi_modal_data": {"image": [random_image(40, 40, 0)] * 2}})


@pytest.mark.parametrize("name", ["qwen3vl", "qwen3_5-vl"])
def test_decode_graphs_and_speculation_with_images(name, vl_model):
    """Decode steps past images rotate at index + rope_delta: the decode graphs (the CPU stand-in),
    batched with a text-only sequence, and n-gram speculation (verify steps, in graphs too) give
    the plain eager path's tokens."""
    from eager_graphs import capture_eager_graphs

    path, _ = vl_model(name)
    prompts = [{"prompt_token_ids": two_image_prompt(2),
                "multi_modal_data": {"image": [random_image(90, 150, 6), random_image(40, 70, 7)]}},
               {"prompt_token_ids": two_image_prompt(3) + two_image_prompt(3)[:4],
                "multi_modal_data": {"image": [random_image(200, 60, 8), random_image(33, 33, 9)]}},
               {"prompt_token_ids": [7, 8, 9, 10, 11]}]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

    def run(**kwargs):
        llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=1024,
                  **kwargs)
        capture_eager_graphs(llm)
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    eager = [o.outputs[0].token_ids for o in LLM(
        str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=1024,
    ).generate(prompts, params, use_tqdm=False)]
    assert run() == eager
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    assert run(speculative_config=ngram) == eager


def test_preemption_and_tensor_parallel_workers(vl_model):
    """Image prompts under a cache tight enough to preempt (the images sent to the workers again)
    and on two tensor-parallel worker processes (the images over the signed channel; the tower on
    each rank): the one-rank engine's tokens."""
    path, _ = vl_model("qwen3vl")
    prompts = [{"prompt_token_ids": two_image_prompt(seed),
                "multi_modal_data": {"image": [random_image(64 + 9 * seed, 80, seed), random_image(50, 120, 10 + seed)]}}
               for seed in range(4)]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)

    def run(**kwargs) -> tuple[list[list[int]], int]:
        llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=96, **kwargs)
        try:
            outs = llm.generate(prompts, params, use_tqdm=False)
            return [o.outputs[0].token_ids for o in outs], llm.engine.scheduler.num_preemptions
        finally:
            llm.engine.shutdown()

    want, _ = run()
    got, preemptions = run(num_gpu_blocks_override=16, block_size=8, max_num_batched_tokens=48)
    assert preemptions > 0 and got == want
    assert run(tensor_parallel_size=2)[0] == want


def test_video_and_image_chat_match_hf(tmp_path_factory):
    """A 3-frame video (Qwen3-VL's timestamp text between its frames) and an image in one chat,
    through LLM.chat with a real tokenizer: HF's argmax at every step."""
    import transformers
    from tiny_vl_chat_model import make_tiny_vl_chat_model

    path = make_tiny_vl_chat_model(tmp_path_factory.mktemp("vl-chat"))
    hf = transformers.Qwen3VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(str(path), device="cpu", dtype="float32", max_model_len=1024)
    frames = [random_image(70, 100, 20 + i) for i in range(3)]
    messages = [{"role": "user", "content": [
        {"type": "video", "video": frames}, {"type": "text", "text": "Describe the video."},
        {"type": "image", "image": random_image(90, 60, 30)}]}]
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
    out = llm.chat(messages, params, use_tqdm=False)[0].outputs[0].token_ids
    from hotpath.multimodal.chat import extract_media

    conversation, media = extract_media(messages)
    processed = llm.engine.process_prompt({"prompt_token_ids": llm.apply_chat_template(conversation),
                                           "multi_modal_data": media})
    video = next(i for i in processed.mm_items if i.modality == "video")
    assert video.grid_thw[0] >= 2 and len(video.spans) == video.grid_thw[0]  # a span per frame pair
    hf_check(hf, processed, out)


def test_mtp_speculation_with_images(tmp_path):
    """Qwen3.5's own MTP head drafting on image prompts (its rows at plain positions): the
    verified output is the plain engine's, token for token."""
    from tiny_models import make_tiny_model

    make_tiny_model("qwen3_5-vl", tmp_path, mtp_layers=1)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    prompts = [{"prompt_token_ids": two_image_prompt(s),
                "multi_modal_data": {"image": [random_image(90, 60 + s, s), random_image(40, 70, 9 + s)]}}
               for s in range(3)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

    def run(**kwargs) -> tuple[list[list[int]], LLM]:
        llm = LLM(str(tmp_path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=512,
                  **kwargs)
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)], llm

    plain, _ = run()
    drafted, llm = run(speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    assert llm.engine.spec_stats.num_draft_tokens > 0 and drafted == plain
