"""bench/saturation.py: the steady window's token rates and the mix's mean
lengths, worked out by hand (no server)."""

from __future__ import annotations

import pytest

from paternoster.bench.saturation import mean_lengths, parse_args, steady_rates


def record(sent: float, ttft: float, itl: list[float], prompt: int, ok: bool = True) -> dict:
    return {"sent": sent, "ttft": ttft, "itl": itl, "prompt_tokens": prompt, "success": ok}


RUN = [
    record(0, 1, [1, 1, 1], 100),  # tokens at 1, 2, 3, 4; done at 4
    record(2, 1, [2, 2], 50),  # tokens at 3, 5, 7; done at 7
    record(5, 3, [1], 10),  # tokens at 8, 9; done at 9
    record(0, 0.5, [0.5], 999, ok=False),  # failed: not counted
]


def test_steady_window_counts_tokens_between_the_skip_and_three_quarters_done():
    """Done at 4, 7, 9: the window ends at the second (index int(0.75 * 2)),
    7 s, and starts at 2 s. Inside [2, 7): r1's tokens at 2, 3, 4 and r2's
    at 3, 5 (5 tokens in 5 s); r2's prompt (first token at 3 s) only."""
    assert steady_rates(RUN, skip_s=2) == (2, 7, 10.0, 1.0)


def test_an_empty_window_or_no_success_is_an_error():
    with pytest.raises(ValueError, match="steady window is empty"):
        steady_rates(RUN, skip_s=8)
    with pytest.raises(ValueError, match="no successful request"):
        steady_rates([record(0, 1, [], 5, ok=False)], skip_s=0)


def test_mean_lengths_weight_each_class_by_its_share():
    """(3 x 15 + 1 x 100) / 4 prompt tokens, (3 x 2 + 1 x 5) / 4 output tokens."""
    assert mean_lengths("a=3:10-20:1-3,b=1:100-100:5-5") == (36.25, 2.75)


def test_policies_are_parsed_into_serve_flags():
    args = parse_args(["--policies", "fcfs,chunked_prefill:256"])
    assert args.serve == [("fcfs", ["--scheduler", "fcfs"]),
                          ("chunked_prefill:256", ["--scheduler", "chunked_prefill",
                                                   "--max-num-batched-tokens", "256"])]  # fmt: skip
    with pytest.raises(SystemExit):
        parse_args(["--policies", "chunked_prefill:big"])


def test_an_unknown_policy_is_refused_before_any_server_starts(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--policies", "fcfs,sol"])
    assert "unknown scheduler 'sol'" in capsys.readouterr().err
