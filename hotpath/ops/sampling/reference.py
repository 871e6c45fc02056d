"""Greedy sampling in torch: the readable definition the Triton kernel is tested against."""

from __future__ import annotations

import torch


def greedy_sample(
    logits: torch.Tensor,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    host_out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of `logits` ([rows, vocab], any float dtype): the argmax (the lowest index among
    equal maxima, as torch.argmax) and its raw logprob, logit - logsumexp(row), in fp32.

    Returns ([rows] int64, [rows] float32), written into `out` when given. With `host_out` =
    (slot [1] int32, token ids [slots, rows], logprobs [slots, rows], both in host memory), also
    writes them into row `slot` of the two."""
    token_ids = logits.argmax(dim=-1)  # [rows]
    logprobs = torch.log_softmax(logits.float(), dim=-1).gather(1, token_ids[:, None]).squeeze(1)
    if host_out is not None:
        slot, host_ids, host_logprobs = host_out
        host_ids[int(slot)] = token_ids.cpu()
        host_logprobs[int(slot)] = logprobs.cpu()
    if out is None:
        return token_ids, logprobs
    out[0].copy_(token_ids)
    out[1].copy_(logprobs)
    return out
