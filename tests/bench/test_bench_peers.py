"""bench/peers.py's pure parts: llama-batched-bench output and the result tables
(no llama.cpp build, no model)."""

from __future__ import annotations

import pytest

from paternoster.bench.llamacpp import BatchedBenchRow, parse_batched_bench
from paternoster.bench.peer_servers import describe_probes
from paternoster.bench.peers import capacity_table, combine_rounds, decode_table

# The end of a real run on the 2-core AMD EPYC VM (llama.cpp of llama-cpp-python 0.3.36,
# 2026-12-02), log lines and all: llama-batched-bench -m SmolLM2-135M-Instruct.BF16.gguf
# -c 1088 -b 2048 -ub 512 -npp 128 -ntg 6 -npl 1,8 -t 1 -tb 1
CAPTURED = """\
0.00.205.923 W llama_context: n_ctx is not divisible by n_seq_max - rounding down to 2048

llama_batched_bench: n_kv_max = 2048, n_batch = 2048, n_ubatch = 512, flash_attn = -1, is_pp_shared = 0, is_tg_separate = 0, n_gpu_layers = -1, n_threads = 1, n_threads_batch = 1

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|   128 |      6 |    1 |    134 |    0.169 |   755.72 |    0.079 |    76.10 |    0.248 |   539.84 |
|   128 |      6 |    8 |   1072 |    1.261 |   811.99 |    0.274 |   175.41 |    1.535 |   698.48 |
"""  # noqa: E501


def test_parse_captured_output():
    rows = parse_batched_bench(CAPTURED)
    assert rows == [
        BatchedBenchRow(128, 6, 1, 134, 0.169, 755.72, 0.079, 76.10, 0.248, 539.84),
        BatchedBenchRow(128, 6, 8, 1072, 1.261, 811.99, 0.274, 175.41, 1.535, 698.48),
    ]


def test_parse_fields_in_order():
    text = (
        "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |"
        "      T s |    S t/s |\n"
        "|-------|--------|------|--------|----------|----------|----------|----------|"
        "----------|----------|\n"
        "|   128 |     18 |   32 |   4672 |    4.096 |  1000.00 |    1.152 |   500.00 |"
        "    5.248 |   890.24 |\n"
    )
    (row,) = parse_batched_bench(text)
    assert row == BatchedBenchRow(128, 18, 32, 4672, 4.096, 1000.0, 1.152, 500.0, 5.248, 890.24)


def test_parse_errors():
    with pytest.raises(ValueError, match="no llama-batched-bench table"):
        parse_batched_bench("main: error: unable to load model\n")
    with pytest.raises(ValueError, match="columns"):
        parse_batched_bench("|   128 |   18 |   32 |\n")


def _row(b: int, s_pp: float, s_tg: float) -> BatchedBenchRow:
    return BatchedBenchRow(128, 18, b, b * 146, 1.0, s_pp, 1.0, s_tg, 2.0, 1.0)


def test_decode_table_ratios_and_notes():
    table = decode_table({
        "bf16": {
            "llama": {1: _row(1, 400.0, 20.0)},
            "ours": {1: {"batch": 1, "tokens_per_s": 30.0, "prefill_tokens_per_s": 200.0}},
        },
        "q8_0": {"llama": {1: _row(1, 500.0, 40.0)}, "ours_note": "n/a (not supported yet)"},
    })  # fmt: skip
    lines = table.splitlines()
    assert lines[2] == "| BF16 | 1 | 20.0 | 30.0 | 1.50× | 400.0 | 200.0 | 0.50× |"
    assert lines[3] == (
        "| Q8_0 | 1 | 40.0 | n/a (not supported yet) | - | 500.0 | n/a (not supported yet) | - |"
    )


def _round(tg: float, pp: float, ours_tg: float, ours_pp: float) -> dict:
    return {
        "bf16": {
            "llama": {1: _row(1, pp, tg)},
            "ours": {1: {"batch": 1, "tokens_per_s": ours_tg, "prefill_tokens_per_s": ours_pp}},
        },
        "q8_0": {"llama": {1: _row(1, 2 * pp, 2 * tg)}, "ours_note": "not run (--ours-quantized)"},
    }


def test_combine_rounds_pairs_each_round():
    # The VM halves its speed in round 2: both engines slow alike, so each
    # round's own ratio is 1.5 while the medians' ratio would not be.
    rounds = [_round(100.0, 400.0, 150.0, 200.0), _round(50.0, 200.0, 75.0, 100.0),
              _round(80.0, 300.0, 100.0, 330.0)]  # fmt: skip
    combined = combine_rounds(rounds)
    bf16 = combined["bf16"]
    assert bf16["llama"][1].s_tg == 80.0 and bf16["llama"][1].s_pp == 300.0
    assert bf16["ours"][1]["tokens_per_s"] == 100.0
    assert bf16["ratios"][1]["decode"] == pytest.approx([1.5, 1.5, 1.25])
    assert bf16["ratios"][1]["prefill"] == pytest.approx([0.5, 0.5, 1.1])
    assert combined["q8_0"] == {"llama": {1: _row(1, 600.0, 160.0)},
                                "ours_note": "not run (--ours-quantized)"}  # fmt: skip
    lines = decode_table(combined).splitlines()
    assert lines[2] == (
        "| BF16 | 1 | 80.0 | 100.0 | 1.50× (1.25–1.50) | 300.0 | 200.0 | 0.50× (0.50–1.10) |"
    )
    assert lines[3].startswith("| Q8_0 | 1 | 160.0 | not run (--ours-quantized) | - |")


def test_combine_rounds_errors():
    with pytest.raises(ValueError, match="rounds must not be empty"):
        combine_rounds([])
    other = _round(1.0, 1.0, 1.0, 1.0)
    other["bf16"]["llama"] = {8: _row(8, 1.0, 1.0)}
    with pytest.raises(ValueError, match="differ"):
        combine_rounds([_round(1.0, 1.0, 1.0, 1.0), other])


def test_capacity_table():
    def probe(load, ok, ttft, itl):
        return {"load": load, "ok": ok, "summary": {"ttft": {"p95": ttft}, "itl": {"p95": itl}}}

    searches = {
        "llama.cpp": {"capacity": 1.0, "elapsed": 300.0,
                      "probes": [probe(1.0, True, 0.5, 0.05), probe(2.0, False, 3.1, 0.3)]},
        "Paternoster": {"capacity": 0.5, "elapsed": 200.0, "probes": [probe(0.5, True, 1, 0.1)]},
    }  # fmt: skip
    assert describe_probes(searches["llama.cpp"]) == "1: 0.50 s, 50 ms ✓; 2: 3.10 s, 300 ms ✗"
    table = capacity_table(searches)
    assert "| llama.cpp | 1 | 1: 0.50 s, 50 ms ✓; 2: 3.10 s, 300 ms ✗ | 300 |" in table
    assert table.endswith("ratio (Paternoster / llama.cpp): 0.50×")
    searches["Paternoster"]["capacity"] = None
    assert "| Paternoster | none |" in capacity_table(searches)
    assert capacity_table(searches).endswith("-")


@pytest.mark.parametrize("argv, message", [
    (["--rounds", "0"], "must be >= 1, got 0"),
    (["--rounds", "abc"], "must be an integer >= 1, got 'abc'"),
    (["--batches", "1,0"], "must be >= 1, got 0"),
    (["--batches", ""], "needs at least one integer"),
    (["--weights", ""], "needs at least one format"),
    (["--weights", "fp8"], "unknown weights fp8"),
    (["--threads", "0"], "must be >= 1"),
])  # fmt: skip
def test_decode_arguments_are_checked_when_parsed(argv, message, capsys):
    from paternoster.bench.peers import parse_args

    with pytest.raises(SystemExit):
        parse_args(["decode", *argv])
    assert message in capsys.readouterr().err
