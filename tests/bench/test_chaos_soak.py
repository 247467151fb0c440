"""bench/chaos_soak.py: each request's fate, read off real HTTP exchanges
(httpx's mock transport, no server), and the report's arithmetic."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from paternoster.bench.chaos_soak import (
    SoakLog,
    clear_error,
    fate,
    parse_args,
    report,
    touches,
    window_share,
)
from paternoster.bench.client import RequestRecord, stream_request


def _sse(*events: dict | str) -> bytes:
    return b"".join(
        f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events
    )


def _chunk(text: str, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}


def _fate_of(status: int, body: bytes) -> tuple[str, RequestRecord]:
    """Run bench's real SSE reader against one canned reply; classify it."""

    async def go() -> RequestRecord:
        transport = httpx.MockTransport(lambda request: httpx.Response(status, content=body))
        rec = RequestRecord(0, None, 4, 4, 0.0)
        async with httpx.AsyncClient(transport=transport) as client:
            await stream_request(client, "http://x/v1/completions", {}, "completions", rec)
        return rec

    rec = asyncio.run(go())
    return fate(rec, timed_out=False), rec


def test_a_stream_that_ends_with_done_is_completed():
    assert _fate_of(200, _sse(_chunk("a"), _chunk("b", "length"), "[DONE]"))[0] == "completed"


def test_an_error_event_after_tokens_is_a_clear_failure():
    body = _sse(_chunk("a"), {"error": {"message": "engine is not running", "code": 503}})
    result, rec = _fate_of(200, body)
    assert result == "failed" and rec.num_chunks == 1


def test_an_http_error_with_a_message_is_a_clear_failure():
    body = json.dumps({"error": {"message": "server overloaded", "type": "x"}}).encode()
    assert _fate_of(503, body)[0] == "failed"


def test_a_stream_cut_before_its_end_is_lost():
    assert _fate_of(200, _sse(_chunk("a"), _chunk("b")))[0] == "lost"


def test_an_http_error_without_a_body_is_lost():
    assert _fate_of(502, b"")[0] == "lost"


def test_a_timed_out_request_is_hung_whatever_it_received():
    rec = RequestRecord(0, None, 4, 4, 0.0, success=True)
    assert fate(rec, timed_out=True) == "hung"


@pytest.mark.parametrize(("status", "body", "clear"), [
    (400, b'{"error": {"message": "max_tokens must be >= 1", "param": "max_tokens"}}', True),
    (413, b'{"error": {"message": "too large"}}', True),
    (400, b'{"error": {"message": ""}}', False),  # no message
    (400, b'{"detail": "bad"}', False),  # not the OpenAI shape
    (500, b'{"error": {"message": "boom"}}', False),  # a 5xx is the server's fault
    (200, b'{"choices": []}', False),
    (400, b"<html>", False),
])
def test_clear_error_is_a_4xx_with_an_openai_error_message(status, body, clear):
    assert clear_error(status, body) is clear


def test_touches_counts_overlap_at_either_edge():
    windows = [(10.0, 40.0)]
    assert touches(0.0, 10.0, windows) and touches(40.0, 50.0, windows)
    assert touches(15.0, 20.0, windows) and touches(0.0, 100.0, windows)
    assert not touches(0.0, 9.9, windows) and not touches(40.1, 60.0, windows)


def test_report_counts_each_fate_and_splits_p95s_by_kill_window():
    args = parse_args(["--rate", "1", "--kill-window", "30"])
    log = SoakLog(kills=[{"time": 100.0, "engine": 1, "pid": 7}],
                  malformed={"clear": 9, "unclear": 1}, unclear=["empty body: HTTP 500"],
                  rss_mib=[(0.0, 400.0, 3000.0), (200.0, 410.0, 3100.0)])  # fmt: skip
    quiet = RequestRecord(0, None, 4, 4, 0.0, sent=10.0, success=True, ttft=0.5,
                          itl=[0.1], e2e=1.0)  # fmt: skip
    noisy = RequestRecord(1, None, 4, 4, 0.0, sent=95.0, success=True, ttft=3.0,
                          itl=[0.4], e2e=10.0)  # fmt: skip
    failed = RequestRecord(2, None, 4, 4, 0.0, sent=99.0, error="error in stream: died",
                           num_chunks=2)  # fmt: skip
    log.records = [(quiet, "completed"), (noisy, "completed"), (failed, "failed")]
    table = report(log, args)
    rows = dict(line.strip("|").split("|")[:2] for line in table.splitlines()
                if line.startswith("| ") and line.count("|") == 3)  # fmt: skip
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    assert rows["requests sent"] == "3" and rows["completed"] == "2"
    assert rows["failed"] == "1" and rows["hung"] == rows["lost"] == "0"
    assert rows["engine kills"] == "1" and rows["answered otherwise"] == "1"
    assert rows["p95 TTFT / ITL, outside kill windows"] == "0.50 s / 100 ms (1 requests)"
    assert rows["p95 TTFT / ITL, touching a kill window"] == "3.00 s / 400 ms (1 requests)"
    assert "1 × error in stream: died (after its first token)" in table
    assert "empty body: HTTP 500" in table


@pytest.mark.parametrize(("argv", "message"), [
    (["--rate", "0"], "--rate must be > 0"),
    (["--rate", "1", "--kill-every", "90-60"], "--kill-every needs 0 < LO <= HI"),
    (["--rate", "1", "--kill-every", "often"], "--kill-every must be LO-HI seconds"),
    (["--rate", "1", "--mix", "nonsense"], "--mix"),
])
def test_bad_options_are_usage_errors_naming_them(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err



def test_a_timed_out_request_still_receiving_tokens_is_slow_not_hung():
    """Timed out at 180 s: tokens up to 170 s is a server over capacity; a
    last token at 100 s (80 s of silence) or none at all is hung."""
    streaming = RequestRecord(0, None, 4, 4, 0.0, ttft=10.0, itl=[80.0, 80.0])
    stalled = RequestRecord(0, None, 4, 4, 0.0, ttft=10.0, itl=[90.0])
    queued = RequestRecord(0, None, 4, 4, 0.0)
    assert fate(streaming, True, timeout=180.0, stall=30.0) == "slow"
    assert fate(stalled, True, timeout=180.0, stall=30.0) == "hung"
    assert fate(queued, True, timeout=180.0, stall=30.0) == "hung"


def test_window_share_is_the_union_of_overlapping_windows():
    assert window_share([(10.0, 40.0), (30.0, 50.0), (90.0, 200.0)], 100.0) == 0.5
    assert window_share([], 100.0) == 0.0


def test_report_warns_when_kill_windows_cover_most_of_the_run():
    args = parse_args(["--rate", "1", "--duration", "100", "--kill-window", "30"])
    log = SoakLog(kills=[{"time": t, "engine": 0, "pid": 1} for t in (0.0, 30.0, 60.0)])
    assert "Kill windows cover 90% of the run" in report(log, args)
    log.kills = log.kills[:1]
    assert "Kill windows cover" not in report(log, args)
