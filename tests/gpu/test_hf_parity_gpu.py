"""End to end on the GPU (Triton kernels, CUDA graphs): greedy output of random-weight models matches
HF transformers on the same GPU; a bf16 run stays within bf16 tolerance of the fp32 reference."""

import pytest
import torch

from hotpath import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

NUM_TOKENS = 24
LENGTHS = [1, 15, 16, 17, 100, 300]  # + NUM_TOKENS within every model's 512 positions


def run(path, prompts, dtype):
    llm = LLM(str(path), skip_tokenizer_init=True, device="cuda", dtype=dtype, max_model_len=512,
              num_gpu_blocks_override=512)
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=1)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [(o.outputs[0].token_ids, [e[t].logprob for t, e in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)])
            for o in outs]


# decode steps of six rows (tensor cores or cuBLAS), and of two (the GEMV's one-row design and the
# fused layer forward, on these small weights)
@pytest.mark.parametrize("lengths", [LENGTHS, [17, 300]])
@pytest.mark.parametrize("name", ["qwen2-gqa4-tied", "qwen3-gqa8-untied-hd", "llama-mha-untied-llama3rope"])
def test_gpu_greedy_matches_hf(name, lengths, tiny_model_factory):
    path, hf_cpu = tiny_model_factory(name)
    hf = hf_cpu.to("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist() for n in lengths]
    fp32 = run(path, prompts, "float32")
    bf16 = run(path, prompts, "bfloat16")
    for prompt, (ids, lps), (ids16, lps16) in zip(prompts, fp32, bf16):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + ids], device="cuda")).logits[0].float()
        ref = torch.log_softmax(logits, -1)
        for step, tok in enumerate(ids):
            row = logits[len(prompt) + step - 1]
            top2 = torch.topk(row, 2)
            # fp32 on the GPU: Triton's dots may round through TF32, so a near tie is a gap < 1e-3
            assert tok == int(top2.indices[0]) or float(top2.values[0] - top2.values[1]) < 1e-3
            assert abs(lps[step] - float(ref[len(prompt) + step - 1, tok])) < 2e-3
            if tok != int(top2.indices[0]):
                break
        # bf16: the logprob of each token it picks, against the fp32 reference's, until the paths part
        with torch.no_grad():
            ref16 = torch.log_softmax(hf(torch.tensor([prompt + ids16], device="cuda")).logits[0].float(), -1)
        diffs = [abs(lps16[s] - float(ref16[len(prompt) + s - 1, t])) for s, t in enumerate(ids16)]
        assert max(diffs) < 0.15, diffs
        assert sum(diffs) / len(diffs) < 0.05, diffs
