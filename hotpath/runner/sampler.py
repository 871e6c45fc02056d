"""Turns logits into one next token per sequence: the reference sampler (runs on CPU and GPU).

Order, as in vLLM: penalties on the raw logits, then min_tokens suppression; greedy rows take the
argmax; the other rows go through temperature, top-k, top-p, min-p and an exponential race.
Returned logprobs are always those of the raw logits, so penalties and temperature never change
what a client sees as the model's probabilities.

`process_logits` (penalties and suppression) and `probabilities` (the distribution a sampled row
draws from) are the two halves of that pipeline; speculative verification (speculative/rejection.py)
reuses them so that it accepts drafts against exactly the distribution this sampler draws from.

Every per-row setting is decided from the Python-side params, never by reading a device tensor
back, so the sampler adds no host sync beyond the caller copying the tokens out.
"""

from dataclasses import dataclass

import torch

from hotpath.sampling_params import SamplingParams


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [num_seqs] int64, sampled tokens
    logprobs: torch.Tensor  # [num_seqs] float32, raw log-softmax at token_ids
    top_logprob_ids: torch.Tensor | None  # [num_seqs, k] int64, k = max requested logprobs
    top_logprobs: torch.Tensor | None  # [num_seqs, k] float32, raw log-softmax, descending


class Sampler:
    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        prompt_token_ids: list[list[int]],
        output_token_ids: list[list[int]],
        generators: list[torch.Generator | None],
        suppressed_token_ids: list[list[int]] | None = None,
    ) -> SamplerOutput:
        """Sample one token per row of `logits` ([num_seqs, vocab], float32, any device).

        `generators[i]` (on the logits' device) is the only randomness row i uses when given, so a
        seeded request gets the same tokens whatever else is in the batch. `suppressed_token_ids[i]`
        are masked out while row i has fewer than `params[i].min_tokens` output tokens (the caller
        knows the EOS and stop ids).
        """
        num_seqs = logits.shape[0]
        raw_logprobs = torch.log_softmax(logits, dim=-1)  # [num_seqs, vocab]

        logits = process_logits(
            logits, params, prompt_token_ids, output_token_ids, suppressed_token_ids
        )

        greedy_rows = [i for i, p in enumerate(params) if p.greedy]
        sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
        if not sampled_rows:
            token_ids = logits.argmax(dim=-1)
        elif not greedy_rows:
            token_ids = sample(logits, params, generators)
        else:
            token_ids = torch.empty(num_seqs, dtype=torch.long, device=logits.device)
            greedy_index = _to_device(greedy_rows, torch.long, logits.device)  # [num_greedy]
            sampled_index = _to_device(sampled_rows, torch.long, logits.device)  # [num_sampled]
            token_ids[greedy_index] = logits[greedy_index].argmax(dim=-1)
            token_ids[sampled_index] = sample(
                logits[sampled_index],
                [params[i] for i in sampled_rows],
                [generators[i] for i in sampled_rows],
            )

        logprobs = raw_logprobs.gather(1, token_ids[:, None]).squeeze(1)  # [num_seqs]
        requested = [p.logprobs for p in params if p.logprobs is not None]
        if not requested:
            return SamplerOutput(token_ids, logprobs, None, None)
        top_logprobs, top_logprob_ids = raw_logprobs.topk(max(requested), dim=-1)  # [num_seqs, k]
        return SamplerOutput(token_ids, logprobs, top_logprob_ids, top_logprobs)


def process_logits(
    logits: torch.Tensor,
    params: list[SamplingParams],
    prompt_token_ids: list[list[int]],
    output_token_ids: list[list[int]],
    suppressed_token_ids: list[list[int]] | None = None,
) -> torch.Tensor:
    """What the Sampler does to each row before choosing: penalties, then min_tokens suppression.

    `logits` is [num_rows, vocab]; every list holds one entry per row (a row's history is its
    prompt and the output it follows). Returns `logits` itself when nothing applies, else a new
    tensor. Speculative verification (speculative/rejection.py) runs it over rows whose output
    histories include the drafts before them.
    """
    logits = apply_penalties(logits, params, prompt_token_ids, output_token_ids)
    if suppressed_token_ids is not None:
        logits = suppress_below_min_tokens(logits, params, output_token_ids, suppressed_token_ids)
    return logits


def apply_penalties(
    logits: torch.Tensor,
    params: list[SamplingParams],
    prompt_token_ids: list[list[int]],
    output_token_ids: list[list[int]],
) -> torch.Tensor:
    """Repetition penalty over prompt+output tokens (CTRL/HF style), then frequency and presence
    penalties over output tokens only (OpenAI style). Returns a new tensor."""
    use_repetition = any(p.repetition_penalty != 1.0 for p in params)
    use_output = any(p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params)
    if not (use_repetition or use_output):
        return logits
    vocab_size = logits.shape[1]
    output_counts = _token_counts(output_token_ids, vocab_size, logits)  # [num_seqs, vocab]

    if use_repetition:
        prompt_counts = _token_counts(prompt_token_ids, vocab_size, logits)  # [num_seqs, vocab]
        seen = (prompt_counts + output_counts) > 0
        penalty = _column([p.repetition_penalty for p in params], logits)  # [num_seqs, 1]
        # Dividing a negative logit would raise it, so negative logits are multiplied instead.
        penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(seen, penalized, logits)

    if use_output:
        frequency = _column([p.frequency_penalty for p in params], logits)  # [num_seqs, 1]
        presence = _column([p.presence_penalty for p in params], logits)  # [num_seqs, 1]
        logits = logits - frequency * output_counts - presence * (output_counts > 0)
    return logits


def suppress_below_min_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    output_token_ids: list[list[int]],
    suppressed_token_ids: list[list[int]],
) -> torch.Tensor:
    """Mask `suppressed_token_ids[i]` to -inf in rows that have not yet produced min_tokens."""
    rows = [
        ids if len(output) < p.min_tokens else []
        for p, output, ids in zip(params, output_token_ids, suppressed_token_ids)
    ]
    if not any(rows):
        return logits
    suppressed = _token_counts(rows, logits.shape[1], logits) > 0  # [num_seqs, vocab]
    return logits.masked_fill(suppressed, float("-inf"))


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """Draw one token per row ([num_rows, vocab] -> [num_rows] int64) from the tempered, truncated
    distribution. No row may be greedy."""
    probs = _truncated_probs(logits, params)  # [num_rows, vocab], min-p rows not renormalized

    # Exponential race: argmax(p_i / q_i) with q_i ~ Exp(1) picks token i with probability
    # p_i / sum(p); no renormalization needed and each row's randomness is its own q row.
    q = torch.empty_like(probs)  # [num_rows, vocab]
    if any(g is None for g in generators):
        q.exponential_()
    for row, generator in enumerate(generators):
        if generator is not None:
            q[row].exponential_(generator=generator)
    # exponential_ can return exactly 0; 0/0 would be NaN, which argmax would pick.
    q.clamp_min_(torch.finfo(q.dtype).tiny)
    return (probs / q).argmax(dim=-1)


def probabilities(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The distribution `sample` draws each row from: temperature, top-k, top-p, min-p.

    [num_rows, vocab] logits (already through `process_logits`) -> [num_rows, vocab] float32
    probabilities, each row summing to 1 (tokens cut by top-k / top-p / min-p are exactly 0).
    No row may be greedy (temperature 0 would divide by zero).
    """
    probs = _truncated_probs(logits, params)
    if any(p.min_p > 0.0 for p in params):
        # min-p zeroes tokens after the softmax; the exponential race needs no renormalization,
        # a caller reading probabilities does.
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _truncated_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, top-k, top-p, softmax, then min-p's cut left unnormalized: [num_rows, vocab]."""
    logits = logits / _column([p.temperature for p in params], logits)
    logits = apply_top_k_top_p(logits, params)
    probs = logits.softmax(dim=-1)  # [num_rows, vocab]

    if any(p.min_p > 0.0 for p in params):
        min_p = _column([p.min_p for p in params], probs)  # [num_rows, 1]
        threshold = min_p * probs.max(dim=-1, keepdim=True).values  # [num_rows, 1]
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs


def apply_top_k_top_p(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Set to -inf every token outside the row's top-k, then outside the smallest set of the
    remaining tokens whose probability mass reaches top_p (the most likely token always stays)."""
    use_top_k = any(p.top_k > 0 for p in params)
    use_top_p = any(p.top_p < 1.0 for p in params)
    if not (use_top_k or use_top_p):
        return logits
    vocab_size = logits.shape[1]
    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True)  # [num_rows, vocab]

    if use_top_k:
        top_k = _column([p.top_k if p.top_k > 0 else vocab_size for p in params], logits)
        rank = torch.arange(vocab_size, device=logits.device)  # [vocab]
        sorted_logits = sorted_logits.masked_fill(rank >= top_k, float("-inf"))

    if use_top_p:
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of all better-ranked tokens
        # top_p == 1 becomes inf so rounding in the cumsum can never drop a tail token.
        top_p = _column([p.top_p if p.top_p < 1.0 else float("inf") for p in params], logits)
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))

    return torch.full_like(logits, float("-inf")).scatter(1, sorted_ids, sorted_logits)


def _token_counts(token_ids: list[list[int]], vocab_size: int, like: torch.Tensor) -> torch.Tensor:
    """How often each vocab id occurs per row: [num_rows, vocab], dtype and device of `like`."""
    max_len = max((len(ids) for ids in token_ids), default=0)
    # Padding uses the extra id `vocab_size`, whose column is dropped, so it counts nowhere.
    padded = [ids + [vocab_size] * (max_len - len(ids)) for ids in token_ids]
    # [num_rows, max_len]
    index = _to_device(padded, torch.long, like.device).view(len(token_ids), max_len)
    counts = torch.zeros(len(token_ids), vocab_size + 1, dtype=like.dtype, device=like.device)
    counts.scatter_add_(1, index, torch.ones_like(index, dtype=like.dtype))
    return counts[:, :vocab_size]


def _column(values: list[float], like: torch.Tensor) -> torch.Tensor:
    """One value per row as a [num_rows, 1] tensor with the dtype and device of `like`."""
    return _to_device(values, like.dtype, like.device)[:, None]


def _to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host list -> tensor on `device`; through pinned memory on CUDA so the host need not wait."""
    tensor = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
