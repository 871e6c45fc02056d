"""The Gated DeltaNet reference against HF transformers' torch fallback (the definition it
follows), the chunked form against the recurrent one, a sequence split anywhere with its state
carried equal to the whole, and the causal conv1d against HF's."""

import pytest
import torch

from hotpath.ops.gated_delta import reference

qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def inputs(T, num_k_heads, num_v_heads, dk, dv, seed=0):
    """Random q, k, v, and gates from random projections through the layer's formulas."""
    g_ = torch.Generator().manual_seed(seed)
    q = torch.randn(T, num_k_heads, dk, generator=g_)
    k = torch.randn(T, num_k_heads, dk, generator=g_)
    v = torch.randn(T, num_v_heads, dv, generator=g_)
    a, b = torch.randn(T, num_v_heads, generator=g_), torch.randn(T, num_v_heads, generator=g_)
    A_log = torch.rand(num_v_heads, generator=g_) * 2 - 1
    dt_bias = torch.randn(num_v_heads, generator=g_)
    g, beta = reference.gates(a, b, A_log, dt_bias)
    state = torch.randn(num_v_heads, dk, dv, generator=g_) * 0.5
    return q, k, v, g, beta, state


def hf(fn, q, k, v, g, beta, state, **kw):
    # HF's layer repeats the key heads to the value heads before the rule (older releases' rule
    # functions take equal head counts only)
    ratio = v.shape[1] // k.shape[1]
    q, k = q.repeat_interleave(ratio, dim=1), k.repeat_interleave(ratio, dim=1)
    out, final = fn(q[None], k[None], v[None], g[None], beta[None], initial_state=state[None],
                    output_final_state=True, use_qk_l2norm_in_kernel=True, **kw)
    return out[0], final[0]


HEADS = [(2, 2, 16, 16), (2, 4, 16, 8), (1, 3, 8, 32)]  # (k heads, v heads, Dk, Dv): GVA 1, 2, 3


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("T", [1, 5, 64, 150])
def test_matches_hf(T, heads):
    q, k, v, g, beta, state = inputs(T, *heads, seed=T)
    want_o, want_s = hf(qwen3_next.torch_recurrent_gated_delta_rule, q, k, v, g, beta, state)
    o, s = reference.recurrent(q, k, v, g, beta, state)
    torch.testing.assert_close(o, want_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, want_s, rtol=1e-5, atol=1e-5)
    want_o, want_s = hf(qwen3_next.torch_chunk_gated_delta_rule, q, k, v, g, beta, state, chunk_size=16)
    o, s = reference.chunked(q, k, v, g, beta, state, chunk_size=16)
    torch.testing.assert_close(o, want_o, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s, want_s, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("chunk_size", [1, 16, 64])
def test_chunked_equals_recurrent(chunk_size):
    q, k, v, g, beta, state = inputs(150, 2, 4, 32, 16, seed=3)
    o, s = reference.chunked(q, k, v, g, beta, state, chunk_size)
    want_o, want_s = reference.recurrent(q, k, v, g, beta, state)
    torch.testing.assert_close(o, want_o, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s, want_s, rtol=1e-4, atol=1e-4)


def test_split_sequence_resumes_from_its_state():
    """Prefill in pieces that do not fall on chunk boundaries, then decode a token at a time:
    the outputs and the final state equal one pass over the whole sequence."""
    q, k, v, g, beta, state = inputs(140, 2, 2, 16, 16, seed=4)
    whole_o, whole_s = reference.chunked(q, k, v, g, beta, state)
    pieces, s = [], state
    for a, b in [(0, 37), (37, 101), (101, 137), (137, 138), (138, 139), (139, 140)]:
        fn = reference.recurrent if b - a == 1 else reference.chunked
        o, s = fn(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], s)
        pieces.append(o)
    torch.testing.assert_close(torch.cat(pieces), whole_o, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s, whole_s, rtol=1e-4, atol=1e-4)


def test_varlen_uses_and_updates_each_slot():
    lengths, slots = [5, 70, 1], [3, 0, 2]
    q, k, v, g, beta, _ = inputs(sum(lengths), 2, 4, 16, 8, seed=5)
    states = torch.randn(4, 4, 16, 8, generator=torch.Generator().manual_seed(6))
    before = states.clone()
    cu = [0, 5, 75, 76]
    out = reference.gated_delta_rule(q, k, v, g, beta, cu, states, slots)
    for i, slot in enumerate(slots):
        sl = slice(cu[i], cu[i + 1])
        want_o, want_s = reference.recurrent(q[sl], k[sl], v[sl], g[sl], beta[sl], before[slot])
        torch.testing.assert_close(out[sl], want_o, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(states[slot], want_s, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(states[1], before[1], rtol=0, atol=0)  # no sequence's slot


def test_gates_match_the_layer_formula():
    a, b = torch.randn(7, 4), torch.randn(7, 4)
    A_log, dt_bias = torch.randn(4), torch.randn(4)
    g, beta = reference.gates(a, b, A_log, dt_bias)
    torch.testing.assert_close(g, -A_log.exp() * torch.nn.functional.softplus(a + dt_bias))
    torch.testing.assert_close(beta, torch.sigmoid(b))
    assert (g <= 0).all()


def test_causal_conv1d_matches_hf_and_resumes():
    """The prefill form (zeros before the sequence) equals HF's causal_conv1d_fn; continuing from
    the state in pieces, and a token at a time, equals the whole."""
    C, K, T = 12, 4, 20
    gen = torch.Generator().manual_seed(7)
    x, weight, bias = torch.randn(T, C, generator=gen), torch.randn(C, K, generator=gen), torch.randn(C, generator=gen)
    want = qwen3_next.causal_conv1d_fn(x.T[None], weight, bias, activation="silu")[0].T
    y, state = reference.causal_conv1d(x, weight, bias, torch.zeros(C, K - 1))
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state, x[-(K - 1):].T)
    pieces, s = [], torch.zeros(C, K - 1)
    for a, b in [(0, 2), (2, 9), (9, 10), (10, 20)]:
        out, s = reference.causal_conv1d(x[a:b], weight, bias, s)
        pieces.append(out)
    torch.testing.assert_close(torch.cat(pieces), want, rtol=1e-5, atol=1e-6)
    # HF's decode-step form on the same state
    hf_state = torch.zeros(1, C, K - 1)
    steps = [qwen3_next.causal_conv1d_update(x[t:t + 1].T[None], hf_state, weight, bias, "silu")[0].T
             for t in range(T)]
    torch.testing.assert_close(torch.cat(steps), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("heads", [(2, 4, 16, 8), (1, 1, 8, 16), (2, 2, 16, 80)])
def test_interpreter_decode_step(heads, interpreter, poisoned):
    """The decode step's two kernels against the reference (conv then recurrence) for 3 sequences
    in scattered slots, one of them at its first token (its slot's stale states ignored), twice in
    a row (the second step reads what the first wrote); other slots untouched. The inputs are
    column slices of one projection, as the layer passes them."""
    from hotpath.ops.gated_delta import triton_decode

    hk, hv, dk, dv = heads
    C, K, N, num_slots = 2 * hk * dk + hv * dv, 4, 3, 6
    gen = torch.Generator().manual_seed(11)
    weight = torch.randn(C, K, generator=gen) * 0.5
    A_log, dt_bias = torch.rand(hv, generator=gen) - 0.5, torch.randn(hv, generator=gen)
    conv_states = torch.randn(num_slots, C, K - 1, generator=gen)
    states = torch.randn(num_slots, hv, dk, dv, generator=gen) * 0.5
    slots = torch.tensor([4, 0, 2])
    context_lens = torch.tensor([7, 1, 30], dtype=torch.int32)  # the second: its first token
    want_conv, want_states = conv_states.clone(), states.clone()
    want_conv[0].zero_()
    want_states[0].zero_()
    got_conv, got_states = conv_states.clone(), states.clone()
    for step in range(2):
        mixed, b, a = torch.randn(N, C + 2 * hv + 3, generator=gen).split([C, hv, hv + 3], dim=-1)
        a = a[:, :hv]
        out = triton_decode.decode_step(mixed, weight, got_conv, a, b, A_log, dt_bias, got_states,
                                        slots, context_lens + step, hk)
        g, beta = reference.gates(a, b, A_log, dt_bias)
        for i, slot in enumerate(slots.tolist()):
            y, want_conv[slot] = reference.causal_conv1d(mixed[i:i + 1], weight, None, want_conv[slot])
            q, k, v = y[0].split([hk * dk, hk * dk, hv * dv])
            o, want_states[slot] = reference.recurrent(
                q.reshape(1, hk, dk), k.reshape(1, hk, dk), v.reshape(1, hv, dv), g[i:i + 1],
                beta[i:i + 1], want_states[slot])
            torch.testing.assert_close(out[i], o[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_conv, want_conv, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_states, want_states, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_decode_step_real_shape(dtype, gpu_triton, poisoned):
    """The decode kernels at Qwen3-Next-80B's shape (16 key heads, 32 value heads, 128 x 128
    states) on the GPU against the reference run in fp32 on the same inputs: 64 sequences in
    scattered slots, some at their first token, three steps in a row."""
    from hotpath.ops.gated_delta import triton_decode

    hk, hv, dk, dv, K, N, num_slots = 16, 32, 128, 128, 4, 64, 200
    C = 2 * hk * dk + hv * dv
    gen = torch.Generator("cuda").manual_seed(3)
    weight = (torch.randn(C, K, generator=gen, device="cuda") * 0.5).to(dtype)
    A_log = torch.rand(hv, generator=gen, device="cuda") - 0.5
    dt_bias = torch.randn(hv, generator=gen, device="cuda")
    conv_states = torch.randn(num_slots, C, K - 1, generator=gen, device="cuda").to(dtype)
    states = torch.randn(num_slots, hv, dk, dv, generator=gen, device="cuda") * 0.5
    slots = torch.randperm(num_slots, generator=gen, device="cuda")[:N]
    context_lens = torch.randint(2, 5000, (N,), generator=gen, device="cuda", dtype=torch.int32)
    context_lens[::7] = 1
    want_conv, want_states = conv_states.float(), states.clone()
    got_conv, got_states = conv_states.clone(), states.clone()
    for step in range(3):
        mixed = torch.randn(N, C, generator=gen, device="cuda").to(dtype)
        a = torch.randn(N, hv, generator=gen, device="cuda").to(dtype)
        b = torch.randn(N, hv, generator=gen, device="cuda").to(dtype)
        out = triton_decode.decode_step(mixed, weight, got_conv, a, b, A_log, dt_bias, got_states,
                                        slots, context_lens + step, hk)
        want = reference.decode_step(mixed.float(), weight.float(), want_conv, a.float(), b.float(), A_log,
                                     dt_bias, want_states, slots, context_lens + step, hk)
        assert out.dtype == dtype
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        err = (out.float() - want).norm() / want.norm()
        assert err < tol, (step, err)
    assert ((got_states - want_states).norm() / want_states.norm()) < (1e-4 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("lens", [[5, 0, 130, 2, 64], [1], [200]])
def test_interpreter_prefill_conv(lens, interpreter, poisoned):
    """The prefill conv's two kernels against the reference a sequence at a time: sequences
    empty, shorter than the conv's window, across chunks; each from a scattered slot's state (its
    old inputs), the slots' new states; other slots untouched; the inputs a strided view."""
    from hotpath.ops.gated_delta import causal_conv1d_varlen, triton_chunked

    C, K, num_slots = 40, 4, 7
    gen = torch.Generator().manual_seed(len(lens))
    T = sum(lens)
    x = torch.randn(T, C + 9, generator=gen)[:, 3 : 3 + C]
    weight = torch.randn(C, K, generator=gen) * 0.5
    conv_states = torch.randn(num_slots, C, K - 1, generator=gen)
    slots = torch.tensor([6, 1, 3, 0, 4][: len(lens)])
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    want_states = conv_states.clone()
    want = torch.empty(T, C)
    for i, slot in enumerate(slots.tolist()):
        want[cu[i]:cu[i + 1]], want_states[slot] = reference.causal_conv1d(x[cu[i]:cu[i + 1]], weight, None,
                                                                            want_states[slot])
    got_states = conv_states.clone()
    got = causal_conv1d_varlen(x, weight, got_states, cu, slots, triton_chunked.chunk_table(cu, T))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_states, want_states, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_prefill_conv_real_shape(dtype, gpu_triton, poisoned):
    """The prefill conv at Qwen3.5-35B-A3B's linear-attention width (8,192 channels) on the GPU
    against the reference in fp32 on the same inputs: sequences of 1 to 3,000 tokens (one empty)
    in scattered slots, the inputs a strided view of a projection, as the layer passes them."""
    from hotpath.ops.gated_delta import causal_conv1d_varlen

    C, K, num_slots = 8192, 4, 40
    lens = [3000, 1, 0, 700, 2, 65]
    gen = torch.Generator("cuda").manual_seed(5)
    T = sum(lens)
    x = torch.randn(T, C + 4096, generator=gen, device="cuda").to(dtype)[:, :C]
    weight = (torch.randn(C, K, generator=gen, device="cuda") * 0.5).to(dtype)
    conv_states = torch.randn(num_slots, C, K - 1, generator=gen, device="cuda").to(dtype)
    slots = torch.randperm(num_slots, generator=gen, device="cuda")[: len(lens)]
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    want_states = conv_states.float().clone()  # (.float() of fp32 states is the same tensor)
    want = torch.empty(T, C, device="cuda")
    for i, slot in enumerate(slots.tolist()):
        want[cu[i]:cu[i + 1]], want_states[slot] = reference.causal_conv1d(
            x[cu[i]:cu[i + 1]].float(), weight.float(), None, want_states[slot])
    got_states = conv_states.clone()
    got = causal_conv1d_varlen(x, weight, got_states, cu, slots)
    assert got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert (got.float() - want).norm() / want.norm() < tol
    assert torch.equal(got_states.float(), want_states)  # the states are inputs, copied
