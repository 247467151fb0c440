"""Logit adjustments before sampling: ``allowed_token_ids``, ``bad_words``,
``logit_bias``, ``min_tokens`` and the presence, frequency and repetition
penalties.

Order and semantics follow vLLM: the allowed-token and bad-word masks first,
then the bias and the ``min_tokens`` mask, then the penalties:

- repetition (HF ``RepetitionPenaltyLogitsProcessor``, Keskar et al. 2019):
  for every token in the prompt or the output, a positive logit is divided by
  the penalty, a negative one multiplied;
- frequency and presence (OpenAI): ``logit -= frequency * count + presence *
  (count > 0)``, counting generated tokens only.

Only the rows whose :attr:`SamplingParams.needs_logits_processing` is set are
touched, and the common batch (no such row) costs one attribute read per row.
Everything is sparse and vectorised: token histories become flat ``(row,
token)`` index arrays and each adjustment is one indexed read/write on the
logits in place, so a step costs O(history tokens), never O(rows x vocabulary)
and never a Python loop over tokens. The frequency penalty is one accumulating
``index_put_`` (a token seen ``c`` times is hit ``c`` times); the presence and
repetition penalties are indexed assignments whose duplicate indices all write
the same value.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from paternoster.request import Request


def apply_logits_processors(logits: torch.Tensor, requests: Sequence[Request]) -> None:
    """Apply each request's bias, ``min_tokens`` mask and penalties, in place.

    Args:
        logits: float32 [N, V], row ``i`` belongs to ``requests[i]``; modified
            in place (rows that need nothing are left untouched).
        requests: N requests; their ``sampling_params``, ``prompt_token_ids``,
            ``output_token_ids`` (the tokens generated so far, not yet
            including this step's) and ``eos_token_id`` are read.
    Raises:
        ValueError: ``logits`` is not [len(requests), V].
    """
    if logits.dim() != 2 or logits.shape[0] != len(requests):
        raise ValueError(
            f"logits must be [{len(requests)}, V], got shape {tuple(logits.shape)}"
        )
    rows = [i for i, r in enumerate(requests) if r.sampling_params.needs_logits_processing]
    if not rows:
        return
    masked = [i for i in rows if _masks(requests[i].sampling_params)]
    before = logits[masked].clone() if masked else None
    _keep_allowed_tokens(logits, rows, requests)
    _ban_bad_words(logits, rows, requests)
    _add_bias(logits, rows, requests)
    _mask_stops_before_min_tokens(logits, rows, requests)
    if masked:
        _never_mask_everything(logits, masked, before, requests)
    _repetition_penalty(logits, rows, requests)
    _frequency_presence_penalties(logits, rows, requests)


def _flat(rows: list[int], histories: list[list[int]], values: list[float], vocab: int,
          device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flat ``(row, token id, value)`` over all histories: int64 [T], int64 [T] and
    float32 [T], ``values[k]`` repeated for each token of ``histories[k]``; ids
    outside ``[0, vocab)`` are dropped."""
    lengths = np.fromiter((len(h) for h in histories), np.int64, len(histories))
    if not lengths.sum():
        tokens = np.empty(0, np.int64)
    else:
        tokens = np.concatenate([np.asarray(h, dtype=np.int64) for h in histories if h])
    row = np.repeat(np.asarray(rows, dtype=np.int64), lengths)
    value = np.repeat(np.asarray(values, dtype=np.float32), lengths)
    ok = (tokens >= 0) & (tokens < vocab)
    return tuple(torch.from_numpy(a[ok]).to(device) for a in (row, tokens, value))


def _masks(p) -> bool:
    """True when the request's settings can set logits to -inf."""
    return bool(p.allowed_token_ids or p.bad_words_token_ids or p.min_tokens)


def _never_mask_everything(logits: torch.Tensor, masked: list[int], before: torch.Tensor,
                           reqs: Sequence[Request]) -> None:
    """A row whose masks together left no token (``allowed_token_ids`` all
    banned by ``bad_words`` or held back by ``min_tokens``) would sample out
    of the vocabulary: ``allowed_token_ids`` wins, so those tokens get their
    unmasked logits back (or, without it, the whole row does)."""
    dead = torch.isneginf(logits[masked]).all(dim=1).nonzero().flatten().tolist()
    for k in dead:
        i = masked[k]
        allowed = reqs[i].sampling_params.allowed_token_ids
        if allowed:
            ids = torch.tensor([t for t in allowed if t < logits.shape[1]], device=logits.device)
            logits[i, ids] = before[k, ids]
        else:
            logits[i] = before[k]


def _keep_allowed_tokens(logits: torch.Tensor, rows: list[int],
                         reqs: Sequence[Request]) -> None:
    """Every logit but those of ``allowed_token_ids`` becomes -inf (vLLM)."""
    sel = [i for i in rows if reqs[i].sampling_params.allowed_token_ids]
    if not sel:
        return
    row, tok, _ = _flat(sel, [reqs[i].sampling_params.allowed_token_ids for i in sel],
                        [0.0] * len(sel), logits.shape[1], logits.device)  # fmt: skip
    kept = logits[row, tok]
    logits[torch.tensor(sel, device=logits.device)] = float("-inf")
    logits[row, tok] = kept


def _ban_bad_words(logits: torch.Tensor, rows: list[int], reqs: Sequence[Request]) -> None:
    """Mask a bad word's last token wherever the output ends with the tokens
    before it (a one-token word is always masked), as vLLM does."""
    sel, banned = [], []
    for i in rows:
        words = reqs[i].sampling_params.bad_words_token_ids
        if not words:
            continue
        out = reqs[i].output_token_ids
        ids = [w[-1] for w in words
               if len(w) == 1 or (len(out) >= len(w) - 1 and out[len(out) - len(w) + 1:] == w[:-1])]
        if ids:
            sel.append(i)
            banned.append(ids)
    if sel:
        row, tok, _ = _flat(sel, banned, [0.0] * len(sel), logits.shape[1], logits.device)
        logits[row, tok] = float("-inf")


def _add_bias(logits: torch.Tensor, rows: list[int], reqs: Sequence[Request]) -> None:
    vocab = logits.shape[1]
    entries = [(i, t, b) for i in rows
               for t, b in (reqs[i].sampling_params.logit_bias or {}).items() if t < vocab]
    if not entries:
        return
    row, tok, bias = zip(*entries)
    dev = logits.device
    logits.index_put_(
        (torch.tensor(row, device=dev), torch.tensor(tok, device=dev)),
        torch.tensor(bias, dtype=logits.dtype, device=dev),
        accumulate=True,
    )


def _mask_stops_before_min_tokens(logits: torch.Tensor, rows: list[int],
                                  reqs: Sequence[Request]) -> None:
    """Set EOS (unless ``ignore_eos``) and ``stop_token_ids`` to -inf for rows
    that have generated fewer than ``min_tokens`` tokens."""
    sel, stops = [], []
    for i in rows:
        r = reqs[i]
        p = r.sampling_params
        if len(r.output_token_ids) >= p.min_tokens:
            continue
        ids = list(p.stop_token_ids)
        if r.eos_token_id is not None and not p.ignore_eos:
            ids.append(r.eos_token_id)
        sel.append(i)
        stops.append(ids)
    if sel:
        row, tok, _ = _flat(sel, stops, [0.0] * len(sel), logits.shape[1], logits.device)
        logits[row, tok] = float("-inf")


def _repetition_penalty(logits: torch.Tensor, rows: list[int], reqs: Sequence[Request]) -> None:
    sel = [i for i in rows if reqs[i].sampling_params.repetition_penalty != 1.0]
    if not sel:
        return
    row, tok, penalty = _flat(
        sel, [reqs[i].prompt_token_ids + reqs[i].output_token_ids for i in sel],
        [reqs[i].sampling_params.repetition_penalty for i in sel],
        logits.shape[1], logits.device,
    )  # fmt: skip
    seen = logits[row, tok]
    logits[row, tok] = torch.where(seen > 0, seen / penalty, seen * penalty)


def _frequency_presence_penalties(logits: torch.Tensor, rows: list[int],
                                  reqs: Sequence[Request]) -> None:
    sel = [
        i for i in rows
        if (reqs[i].sampling_params.frequency_penalty or reqs[i].sampling_params.presence_penalty)
        and reqs[i].output_token_ids
    ]
    if not sel:
        return
    outputs = [reqs[i].output_token_ids for i in sel]
    vocab, dev = logits.shape[1], logits.device
    row, tok, freq = _flat(sel, outputs, [reqs[i].sampling_params.frequency_penalty for i in sel],
                           vocab, dev)
    if any(reqs[i].sampling_params.frequency_penalty for i in sel):
        logits.index_put_((row, tok), -freq, accumulate=True)  # once per occurrence
    if any(reqs[i].sampling_params.presence_penalty for i in sel):
        _, _, presence = _flat(sel, outputs,
                               [reqs[i].sampling_params.presence_penalty for i in sel], vocab, dev)
        logits[row, tok] = logits[row, tok] - presence  # once per distinct token
