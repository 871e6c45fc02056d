"""Image-text models end to end on the GPU (the tower's Triton attention, the decode kernel rotating
at mRoPE positions, CUDA graphs): greedy tokens are HF transformers' argmax on the same GPU, for
image prompts decoded together with a text-only one."""

import json

import numpy as np
import pytest
import torch

from hotpath import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

IMG, START, END = 500, 502, 503
PREPROCESSOR = {"size": {"shortest_edge": 4 * 1024, "longest_edge": 256 * 1024}, "patch_size": 16,
                "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5]}


def image(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize("name", ["qwen3vl", "qwen3vl-moe", "qwen3_5-vl"])
def test_gpu_images_match_hf(name, tiny_model_factory):
    path, hf_cpu = tiny_model_factory(name)
    (path / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    hf = hf_cpu.to("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator().manual_seed(3)
    text = lambda n: torch.randint(3, 490, (n,), generator=g).tolist()  # noqa: E731
    prompts = [{"prompt_token_ids": text(4) + [START, IMG, END] + text(9) + [START, IMG, END] + text(2),
                "multi_modal_data": {"image": [image(300, 500, 1), image(37, 91, 2)]}},
               {"prompt_token_ids": [START, IMG, END] + text(20), "multi_modal_data": {"image": image(640, 480, 3)}},
               {"prompt_token_ids": text(30)}]
    llm = LLM(str(path), skip_tokenizer_init=True, device="cuda", dtype="float32", max_model_len=1024,
              num_gpu_blocks_override=512)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        processed = llm.engine.process_prompt(prompt)
        ids = torch.tensor([processed.prompt_token_ids + out.outputs[0].token_ids], device="cuda")
        types = torch.zeros_like(ids)
        kwargs = {}
        if processed.mm_items:
            for item in processed.mm_items:
                for off, n in item.spans:
                    types[0, off:off + n] = 1
            kwargs = dict(pixel_values=torch.cat([i.pixel_values for i in processed.mm_items]).cuda(),
                          image_grid_thw=torch.tensor([i.grid_thw for i in processed.mm_items], device="cuda"))
        with torch.no_grad():
            logits = hf(input_ids=ids, mm_token_type_ids=types, **kwargs).logits[0].float()
        n = len(processed.prompt_token_ids)
        for step, tok in enumerate(out.outputs[0].token_ids):
            top2 = torch.topk(logits[n + step - 1], 2)
            # fp32 on the GPU: Triton's dots may round through TF32, so a near tie is a gap < 1e-3
            assert tok == int(top2.indices[0]) or float(top2.values[0] - top2.values[1]) < 1e-3, (name, step)
            if tok != int(top2.indices[0]):
                break
