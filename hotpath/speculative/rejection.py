"""Verification of speculative-decoding drafts: which drafted tokens a step keeps, losslessly.

A drafter proposes k tokens d_1..d_k for a sequence; the target model runs once over
[last_token, d_1..d_k] and yields k + 1 rows of logits, row i being the target's next-token logits
after d_1..d_i. Each row is first processed as the Sampler would process it had d_1..d_i already
been sampled: penalties count those drafts and min_tokens suppression counts len(output) + i
(`sampler.process_logits`). Then:

- Greedy rows: t_i = argmax of processed row i. d_{i+1} is accepted while d_{i+1} == t_i; the step
  emits the accepted drafts, then t_j at the first mismatch j (or t_k, the bonus token, when all k
  were accepted). That is exactly the chain greedy decoding would produce one token at a time.
- Sampled rows (the speculative sampling rule of Leviathan et al. 2023 and Chen et al. 2023):
  p_i = `sampler.probabilities` of processed row i, q_i the distribution d_{i+1} was drawn from
  (a one-hot at d_{i+1} for point-mass drafts such as n-gram lookups). d_{i+1} is accepted with
  probability min(1, p_i(d) / q_i(d)); at the first rejection the step emits a token drawn from
  the residual normalise(max(0, p_i - q_i)) and stops; when all k are accepted it draws the bonus
  token from p_k.

Why it is lossless: at a row where the draft x was drawn from q, the emitted token is x with
probability q(x) min(1, p(x)/q(x)) = min(p(x), q(x)) through acceptance, plus, through rejection,
P(reject) * residual(x) = (1 - sum_y min(p(y), q(y))) * max(0, p(x) - q(x)) / sum_y max(0, p(y) -
q(y)). The two sums are equal (sum min(p, q) = 1 - sum max(0, p - q)), so the second term is
max(0, p(x) - q(x)) and the total is min(p, q) + max(0, p - q) = p(x). Given an accepted draft the
next row faces the same situation with the next row's p and a fresh draft, and the bonus row draws
from p_k directly, so the whole emitted sequence has exactly the distribution of sampling token by
token from p. A point-mass q is the case q = one-hot(d): d stays with probability p(d), otherwise
the token is drawn from p with d removed, which again gives p for any d.

Randomness: a sequence with a generator draws only from it (k uniforms for the acceptance tests,
then one exponential per vocab entry for the final draw, in that order), so a seeded request's
output does not depend on the batch; the other sequences use the global RNG of the logits'
device. The final draw is the Sampler's exponential race: with k = 0 a seeded sampled sequence gets
exactly the Sampler's token.

Host syncs: none until the end. Every per-row setting comes from the Python-side params and drafts
(built into host lists and copied to the device through pinned memory), all rows of the batch are
decided in a few tensor ops, and the results (accepted counts, per-row emitted ids, their logprobs
and the top logprobs) travel back in one packed float64 tensor: a single `.tolist()`, the
function's one synchronisation.
"""

from dataclasses import dataclass

import torch

from hotpath.runner.sampler import _to_device, probabilities, process_logits
from hotpath.sampling_params import SamplingParams


@dataclass
class VerifyOutput:
    # Per sequence: the accepted drafts, then one more token (the correction at the first
    # rejection, or the bonus token when all k were accepted): 1..k+1 tokens.
    token_ids: list[list[int]]
    # The raw target log-softmax (before penalties and temperature) of each emitted token, at its
    # row.
    logprobs: list[list[float]]
    # Per emitted token the top-n raw (token_id, logprob), best first, n = params.logprobs (empty
    # for a sequence that did not ask); None when no sequence asked.
    top_logprobs: list[list[list[tuple[int, float]]]] | None
    num_accepted: list[int]  # accepted drafts per sequence, 0..k


def verify_drafts(
    logits: torch.Tensor,
    draft_token_ids: list[list[int]],
    draft_probs: list[torch.Tensor | None],
    params: list[SamplingParams],
    prompt_token_ids: list[list[int]],
    output_token_ids: list[list[int]],
    generators: list[torch.Generator | None],
    suppressed_token_ids: list[list[int]] | None = None,
) -> VerifyOutput:
    """Decide which drafts each sequence keeps and the token that follows them.

    `logits`: [sum(k_i + 1), vocab] float32, the target's rows, sequence after sequence (row i of a
    sequence follows its drafts d_1..d_i). `draft_token_ids[s]`: its k_s drafts (k_s may be 0: one
    token is then sampled normally). `draft_probs[s]`: [k_s, vocab] float32 on the logits' device,
    the distribution each draft was drawn from (already transformed by the same params), or None
    for point-mass drafts. `output_token_ids[s]`: the tokens generated before this step, drafts not
    included. `generators[s]` (on the logits' device) is the only randomness sequence s uses when
    given. `suppressed_token_ids[s]`: ids held back while the sequence (drafts counted) has fewer
    than min_tokens outputs, as in `Sampler.__call__`.
    """
    num_seqs = len(draft_token_ids)
    num_rows = logits.shape[0]
    device = logits.device
    ks = [len(drafts) for drafts in draft_token_ids]
    if num_rows != sum(ks) + num_seqs:
        raise ValueError(f"{num_rows} logits rows for drafts of lengths {ks} (need sum(k + 1))")
    if not num_seqs:
        return VerifyOutput([], [], None, [])
    starts = [0] * num_seqs  # first row of each sequence
    for s in range(1, num_seqs):
        starts[s] = starts[s - 1] + ks[s - 1] + 1

    # Per-row host tables. A row's draft is the one it verifies, d_{i+1}; the bonus row (i = k)
    # has none (0 stands in, masked by has_draft).
    row_draft = [d for drafts in draft_token_ids for d in [*drafts, 0]]
    row_has_draft = [int(i < k) for k in ks for i in range(k + 1)]

    raw_logprobs = torch.log_softmax(logits, dim=-1)  # [num_rows, vocab]
    processed = _process_rows(
        logits, draft_token_ids, params, prompt_token_ids, output_token_ids,
        suppressed_token_ids,
    )  # [num_rows, vocab]

    greedy_seqs = [s for s in range(num_seqs) if params[s].greedy]
    sampled_seqs = [s for s in range(num_seqs) if not params[s].greedy]
    mixed = bool(greedy_seqs and sampled_seqs)
    max_k = max(ks, default=0)
    # Row of each (sequence, draft position); padding points at an extra never-accepted slot.
    grid = [starts[s] + i if i < ks[s] else num_rows for s in range(num_seqs) for i in range(max_k)]
    # One host-to-device copy for the integer tables: [num_rows] drafts, [num_rows] has-draft
    # flags, [num_seqs] first rows, [num_seqs * max_k] grid, the greedy sequences in a mixed batch.
    tables = [row_draft, row_has_draft, starts, grid, greedy_seqs if mixed else []]
    table = _to_device([x for t in tables for x in t], torch.long, device)
    next_draft, has_draft, first_row, grid_rows, greedy_index = table.split(
        [len(t) for t in tables]
    )
    has_draft = has_draft.bool()

    accepted = torch.zeros(num_rows + 1, dtype=torch.bool, device=device)  # [num_rows + 1]
    target = None  # [num_rows] greedy rows' argmax (sampled rows hold garbage)
    if greedy_seqs:
        target = processed.argmax(dim=-1)  # cheaper than gathering the greedy rows first
        accepted[:num_rows] = (target == next_draft) & has_draft
    sampled = None
    if sampled_seqs:
        sampled = _SampledRows.build(
            processed, draft_token_ids, draft_probs, params, generators, sampled_seqs, starts,
            row_draft, next_draft,
        )
        sampled_accepted = sampled.accept()  # [num_sampled_rows]
        if mixed:
            accepted[sampled.rows] = sampled_accepted & has_draft[sampled.rows]
        else:
            accepted[:num_rows] = sampled_accepted & has_draft

    # Accepted drafts per sequence: the length of its leading run of accepted rows.
    run = accepted[grid_rows].view(num_seqs, max_k).long().cumprod(dim=1)  # [num_seqs, max_k]
    num_accepted = run.sum(dim=1)  # [num_seqs]
    final_row = first_row + num_accepted  # [num_seqs] the row that emits the last token

    if not sampled_seqs:
        final_token = target[final_row]  # [num_seqs]
    elif not greedy_seqs:
        final_token = sampled.final_draw(final_row)  # [num_seqs]
    else:
        final_token = torch.empty(num_seqs, dtype=torch.long, device=device)  # [num_seqs]
        final_token[greedy_index] = target[final_row[greedy_index]]
        final_token[sampled.seqs] = sampled.final_draw(final_row)  # [num_sampled_seqs]

    # Each row's emitted token: its draft up to the final row, which emits final_token; rows past
    # it hold garbage the host never reads.
    emitted = next_draft.clone()  # [num_rows]
    emitted[final_row] = final_token
    emitted_logprobs = raw_logprobs.gather(1, emitted[:, None]).squeeze(1)  # [num_rows]
    packed = [num_accepted, emitted, emitted_logprobs]
    requested = [p.logprobs for p in params if p.logprobs is not None]
    top_n = max(requested, default=0)
    if requested:
        top_values, top_ids = raw_logprobs.topk(top_n, dim=-1)  # [num_rows, top_n] each
        packed += [top_ids.flatten(), top_values.flatten()]
    # The one synchronisation: ids (< 2**53) and float32 logprobs are exact in float64.
    host = torch.cat([t.to(torch.float64) for t in packed]).tolist()

    return _unpack(host, params, starts, num_seqs, num_rows, top_n, bool(requested))


def _process_rows(
    logits: torch.Tensor,
    draft_token_ids: list[list[int]],
    params: list[SamplingParams],
    prompt_token_ids: list[list[int]],
    output_token_ids: list[list[int]],
    suppressed_token_ids: list[list[int]] | None,
) -> torch.Tensor:
    """Penalties and min_tokens suppression of every row at once ([num_rows, vocab]), row i of a
    sequence with the history output + drafts[:i]. Returns `logits` itself when nothing applies.

    The expanded histories cost host work of rows x history length, built only when some sequence
    has a penalty or a min_tokens suppression that can be in force this step."""
    penalized = any(
        p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
        for p in params
    )
    suppressing = suppressed_token_ids is not None and any(
        ids and len(output) < p.min_tokens
        for p, output, ids in zip(params, output_token_ids, suppressed_token_ids)
    )
    if not (penalized or suppressing):
        return logits
    row_seq = [s for s, drafts in enumerate(draft_token_ids) for _ in range(len(drafts) + 1)]
    row_outputs = [
        output_token_ids[s] + drafts[:i]
        for s, drafts in enumerate(draft_token_ids)
        for i in range(len(drafts) + 1)
    ]
    return process_logits(
        logits,
        [params[s] for s in row_seq],
        [prompt_token_ids[s] for s in row_seq],
        row_outputs,
        [suppressed_token_ids[s] for s in row_seq] if suppressing else None,
    )


@dataclass
class _SampledRows:
    """The rows of the sampled (non-greedy) sequences, gathered in sequence order ("local" rows);
    the index tensors are None when every sequence samples (local rows are then batch rows)."""

    seqs: torch.Tensor | None  # [num_sampled_seqs] int64, indices of the sampled sequences
    rows: torch.Tensor | None  # [num_local_rows] int64, their rows in the batch
    local_row: torch.Tensor | None  # [num_rows] int64, batch row -> local row
    p: torch.Tensor  # [num_local_rows, vocab] float32, target distributions
    q: torch.Tensor  # [num_local_rows, vocab] float32, draft distributions (0 on bonus rows)
    draft: torch.Tensor  # [num_local_rows] int64, the draft each row verifies (0 on bonus rows)
    first_rows: list[int]  # per sampled sequence: its first local row
    ks: list[int]  # per sampled sequence: its number of drafts
    generators: list[torch.Generator | None]  # per sampled sequence

    @classmethod
    def build(
        cls,
        processed: torch.Tensor,
        draft_token_ids: list[list[int]],
        draft_probs: list[torch.Tensor | None],
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        sampled_seqs: list[int],
        starts: list[int],
        row_draft: list[int],
        next_draft: torch.Tensor,
    ) -> "_SampledRows":
        """p and q of the sampled sequences' rows; `next_draft` is `row_draft` on the device."""
        num_rows, vocab_size = processed.shape
        device = processed.device
        ks = [len(draft_token_ids[s]) for s in sampled_seqs]
        first_rows = [0] * len(ks)  # first local row of each sampled sequence
        for j in range(1, len(ks)):
            first_rows[j] = first_rows[j - 1] + ks[j - 1] + 1
        dense = [j for j, s in enumerate(sampled_seqs) if draft_probs[s] is not None and ks[j]]
        point = [j for j, s in enumerate(sampled_seqs) if draft_probs[s] is None and ks[j]]
        for j in dense:
            shape = tuple(draft_probs[sampled_seqs[j]].shape)
            if shape != (ks[j], vocab_size):
                raise ValueError(f"draft_probs[{sampled_seqs[j]}] has shape {shape}, "
                                 f"expected {(ks[j], vocab_size)}")
        # Host tables, then one host-to-device copy.
        dense_rows = [first_rows[j] + i for j in dense for i in range(ks[j])]
        point_rows = [first_rows[j] + i for j in point for i in range(ks[j])]
        point_ids = [d for j in point for d in draft_token_ids[sampled_seqs[j]]]
        tables = [dense_rows, point_rows, point_ids]
        all_sampled = len(sampled_seqs) == len(draft_token_ids)
        if not all_sampled:
            rows = [starts[s] + i for s, k in zip(sampled_seqs, ks) for i in range(k + 1)]
            local_row = [0] * num_rows
            for j, row in enumerate(rows):
                local_row[row] = j
            tables += [sampled_seqs, rows, local_row]
        table = _to_device([x for t in tables for x in t], torch.long, device)
        dense_t, point_rows_t, point_ids_t, *index = table.split([len(t) for t in tables])
        seqs_t, rows_t, local_t = index if index else (None, None, None)

        row_params = [params[s] for s, k in zip(sampled_seqs, ks) for _ in range(k + 1)]
        p = probabilities(processed if all_sampled else processed[rows_t], row_params)
        q = torch.zeros_like(p)  # [num_local_rows, vocab]
        if dense:
            # [num_dense_rows, vocab]
            q[dense_t] = torch.cat([draft_probs[sampled_seqs[j]] for j in dense]).to(q.dtype)
        if point:
            q[point_rows_t, point_ids_t] = 1.0  # one-hot at the draft
        draft = next_draft if all_sampled else next_draft[rows_t]  # [num_local_rows]
        return cls(seqs_t, rows_t, local_t, p, q, draft, first_rows, ks,
                   [generators[s] for s in sampled_seqs])

    def accept(self) -> torch.Tensor:
        """[num_sampled_rows] bool: u < p(d) / q(d) with u ~ U[0, 1), i.e. probability
        min(1, p(d) / q(d)); written u * q(d) < p(d) so that p(d) = 0 never accepts (bonus rows
        come out arbitrary and are masked by the caller)."""
        u = torch.empty(self.p.shape[0], device=self.p.device)  # [num_sampled_rows]
        if any(g is None for g in self.generators):
            u.uniform_()
        for first, k, generator in zip(self.first_rows, self.ks, self.generators):
            if generator is not None and k:
                u[first : first + k].uniform_(generator=generator)
        p_draft = self.p.gather(1, self.draft[:, None]).squeeze(1)  # [num_sampled_rows]
        q_draft = self.q.gather(1, self.draft[:, None]).squeeze(1)  # [num_sampled_rows]
        return _accept(u, p_draft, q_draft)

    def final_draw(self, final_row: torch.Tensor) -> torch.Tensor:
        """One token per sampled sequence ([num_sampled_seqs] int64) at its final row: from the
        residual after a rejection, from p on the bonus row (where q is 0, so the residual is p)."""
        # [num_sampled_seqs] local final rows
        local = final_row if self.seqs is None else self.local_row[final_row[self.seqs]]
        p = self.p[local]  # [num_sampled_seqs, vocab]
        weights = _residual(p, self.q[local])  # [num_sampled_seqs, vocab], unnormalized
        # Exponential race, as in sampler.sample: argmax(w / e), e ~ Exp(1), picks a token with
        # probability w / sum(w), with no normalization needed.
        e = torch.empty_like(weights)  # [num_sampled_seqs, vocab]
        if any(g is None for g in self.generators):
            e.exponential_()
        for index, generator in enumerate(self.generators):
            if generator is not None:
                e[index].exponential_(generator=generator)
        e.clamp_min_(torch.finfo(e.dtype).tiny)  # exponential_ can return exactly 0
        return (weights / e).argmax(dim=-1)


def _accept(u: torch.Tensor, p_draft: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
    """The acceptance test, elementwise: u < p(d) / q(d)."""
    return u * q_draft < p_draft


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """max(0, p - q) per row (unnormalized); p itself where that is all zero, which only rounding
    can cause (p and q both sum to 1, so p - q has positive mass wherever p != q)."""
    residual = (p - q).clamp_min_(0.0)  # [rows, vocab]
    empty = residual.sum(dim=-1, keepdim=True) <= 0.0  # [rows, 1]
    return torch.where(empty, p, residual)


def _unpack(
    host: list[float],
    params: list[SamplingParams],
    starts: list[int],
    num_seqs: int,
    num_rows: int,
    top_n: int,
    any_top: bool,
) -> VerifyOutput:
    """The packed host list -> per-sequence lists (layout: num_accepted [num_seqs], emitted
    [num_rows], logprobs [num_rows], then top ids and top logprobs [num_rows * top_n] each)."""
    num_accepted = [int(x) for x in host[:num_seqs]]
    emitted = host[num_seqs : num_seqs + num_rows]
    logprobs = host[num_seqs + num_rows : num_seqs + 2 * num_rows]
    top_ids_at = num_seqs + 2 * num_rows
    top_values_at = top_ids_at + num_rows * top_n
    token_ids, token_logprobs, top = [], [], [] if any_top else None
    for s in range(num_seqs):
        rows = range(starts[s], starts[s] + num_accepted[s] + 1)
        token_ids.append([int(emitted[r]) for r in rows])
        token_logprobs.append([logprobs[r] for r in rows])
        if top is not None:
            n = params[s].logprobs or 0
            top.append([
                [(int(host[top_ids_at + r * top_n + j]), host[top_values_at + r * top_n + j])
                 for j in range(n)]
                for r in rows
            ])
    return VerifyOutput(token_ids, token_logprobs, top, num_accepted)
