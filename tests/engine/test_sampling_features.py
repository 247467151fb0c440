"""EngineCore's per-request sampling features on a tiny random Llama, against
HF transformers' own forward: logprobs and prompt logprobs (also across
chunked prefill and preemption), logit_bias, min_tokens, penalties changing
the tokens but not the (raw) logprobs, and seeded reproducibility."""

from __future__ import annotations

import msgspec
import pytest
import torch

from paternoster.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from paternoster.engine.codec import MessageCodec
from paternoster.engine.core import EngineCore
from paternoster.engine.messages import EngineCoreOutput, EngineCoreRequest, FromEngine, Outputs
from paternoster.sampling_params import SamplingParams

from .conftest import make_request

VOCAB = 160
EOS = 2
ATOL = 1e-4


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        eos_token_id=EOS, bos_token_id=1, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():  # sharper distributions than the default init
        model.lm_head.weight.mul_(40)
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


def hf_log_probs(hf_model, tokens: list[int]) -> torch.Tensor:
    """log_softmax of HF's forward over ``tokens``: float32 [len(tokens), V]."""
    with torch.inference_mode():
        return torch.log_softmax(hf_model(torch.tensor([tokens])).logits[0].float(), dim=-1)


def make_engine(path, scheduler: str = "fcfs", budget: int = 256, num_kv_blocks: int = 64,
                max_num_seqs: int = 8) -> EngineCore:
    return EngineCore(
        EngineConfig(
            model=ModelConfig(model=str(path), dtype="float32", max_model_len=256),
            cache=CacheConfig(block_size=8, num_kv_blocks=num_kv_blocks),
            scheduler=SchedulerConfig(
                scheduler=scheduler, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget
            ),
        )
    )


def run(engine: EngineCore, requests: list[EngineCoreRequest]) -> dict[str, list[EngineCoreOutput]]:
    """Add every request, step until done; the outputs per request id."""
    for r in requests:
        engine.add_request(r)
    outs: dict[str, list[EngineCoreOutput]] = {r.request_id: [] for r in requests}
    for _ in range(10_000):
        for o in engine.step():
            outs[o.request_id].append(o)
        if not engine.has_unfinished_requests():
            break
    stats = engine.stats()
    assert stats["num_free_blocks"] == stats["num_kv_blocks"]
    return outs


def tokens_of(outs: list[EngineCoreOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n,), generator=g).tolist()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize(
    ("scheduler", "budget", "blocks"),
    [("fcfs", 256, 64), ("chunked_prefill", 7, 64), ("fcfs", 256, 10)],
    ids=["whole-prefill", "chunked-7", "preempting"],
)
def test_logprobs_and_prompt_logprobs_match_hf_forward(
    tiny_dir, hf_model, temperature, scheduler, budget, blocks
):
    engine = make_engine(tiny_dir, scheduler, budget, num_kv_blocks=blocks)
    prompts = [prompt(n, seed=n) for n in (1, 2, 19, 33)]
    params = SamplingParams(temperature=temperature, max_tokens=12, ignore_eos=True, seed=5,
                            logprobs=3, prompt_logprobs=4)
    outs = run(engine, [make_request(f"r{i}", p, params) for i, p in enumerate(prompts)])
    if blocks == 10:
        assert engine.stats()["num_preemptions_total"] > 0
    for i, p in enumerate(prompts):
        out = outs[f"r{i}"]
        gen = tokens_of(out)
        assert len(gen) == 12
        ref = hf_log_probs(hf_model, p + gen[:-1])
        # Prompt logprobs: on the first output with a token, for tokens 1..P-1.
        firsts = [o for o in out if o.prompt_logprobs is not None]
        if len(p) == 1:
            assert firsts == []
        else:
            assert len(firsts) == 1 and firsts[0] is out[0]
            plp = firsts[0].prompt_logprobs
            assert len(plp) == len(p) - 1
            want = ref[torch.arange(len(p) - 1), torch.tensor(p[1:])]
            torch.testing.assert_close(torch.tensor(plp.token_logprobs), want, atol=ATOL, rtol=0)
            top = ref[: len(p) - 1].topk(4, dim=-1)
            assert plp.top_token_ids == top.indices.tolist()
            torch.testing.assert_close(torch.tensor(plp.top_logprobs), top.values, atol=ATOL,
                                       rtol=0)
        # Sampled-token logprobs: one position per generated token.
        assert all(len(o.logprobs) == len(o.new_token_ids) for o in out)
        lps = [v for o in out for v in o.logprobs.token_logprobs]
        rows = torch.arange(len(p) - 1, len(p) - 1 + len(gen))
        torch.testing.assert_close(torch.tensor(lps), ref[rows, torch.tensor(gen)], atol=ATOL,
                                   rtol=0)
        tops = [ids for o in out for ids in o.logprobs.top_token_ids]
        assert tops == ref[rows].topk(3, dim=-1).indices.tolist()
        if temperature == 0.0:
            assert [t[0] for t in tops] == gen  # greedy picks the most likely token


def _over_the_link(outputs: list[EngineCoreOutput]) -> tuple[list[EngineCoreOutput], list[dict]]:
    """``outputs`` encoded in one :class:`Outputs` frame and decoded: the typed
    outputs and the raw maps."""
    codec = MessageCodec(FromEngine)
    frame = codec.encode(Outputs(outputs=outputs))
    return codec.decode(frame).outputs, msgspec.msgpack.decode(frame)["outputs"]


def test_requests_without_logprobs_carry_none_on_the_wire(tiny_dir):
    engine = make_engine(tiny_dir)
    outs = run(engine, [make_request("a", prompt(5, 1), SamplingParams(max_tokens=3))])
    for o in outs["a"]:
        assert o.logprobs is None and o.prompt_logprobs is None
    _, wire = _over_the_link(outs["a"])
    assert all("logprobs" not in w and "prompt_logprobs" not in w for w in wire)


def test_logprobs_travel_over_the_wire(tiny_dir):
    engine = make_engine(tiny_dir)
    params = SamplingParams(max_tokens=2, logprobs=2, prompt_logprobs=1)
    outs = run(engine, [make_request("a", prompt(5, 1), params)])
    assert outs["a"][0].prompt_logprobs is not None
    back, _ = _over_the_link(outs["a"])
    for o, b in zip(outs["a"], back, strict=True):
        assert b.logprobs == o.logprobs and b.prompt_logprobs == o.prompt_logprobs


def test_logprobs_are_raw_while_penalties_and_bias_change_the_tokens(tiny_dir, hf_model):
    engine = make_engine(tiny_dir)
    p = prompt(10, 7)
    plain = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=0)
    greedy = tokens_of(run(engine, [make_request("g", p, plain)])["g"])
    banned = greedy[0]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=0,
                            repetition_penalty=1.8, frequency_penalty=1.0,
                            logit_bias={banned: -100.0})
    out = run(engine, [make_request("p", p, params)])["p"]
    gen = tokens_of(out)
    assert banned not in gen and gen != greedy
    ref = hf_log_probs(hf_model, p + gen[:-1])
    rows = torch.arange(len(p) - 1, len(p) - 1 + len(gen))
    lps = torch.tensor([v for o in out for v in o.logprobs.token_logprobs])
    torch.testing.assert_close(lps, ref[rows, torch.tensor(gen)], atol=ATOL, rtol=0)


def test_logit_bias_forces_a_token(tiny_dir):
    engine = make_engine(tiny_dir)
    params = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True,
                            logit_bias={77: 100.0})
    assert tokens_of(run(engine, [make_request("b", prompt(8, 2), params)])["b"]) == [77] * 6


@pytest.mark.parametrize("stop", ["eos", "stop_token_id"])
def test_min_tokens_holds_back_eos_and_stop_tokens(tiny_dir, stop):
    engine = make_engine(tiny_dir)
    token = EOS if stop == "eos" else 50
    stop_ids = [] if stop == "eos" else [50]
    # The bias makes the stop token the most likely at every step.
    params = SamplingParams(temperature=0.0, max_tokens=20, min_tokens=5,
                            logit_bias={token: 100.0}, stop_token_ids=stop_ids)
    out = run(engine, [make_request("m", prompt(8, 3), params)])["m"]
    gen = tokens_of(out)
    assert len(gen) == 6 and token not in gen[:5] and gen[5] == token
    assert out[-1].finish_reason == "stop"
    ignoring = SamplingParams(temperature=0.0, max_tokens=3, min_tokens=2, ignore_eos=True,
                              logit_bias={EOS: 100.0})
    assert tokens_of(run(engine, [make_request("i", prompt(8, 3), ignoring)])["i"]) == \
        [EOS] * 3  # ignore_eos: EOS is an ordinary token, min_tokens does not mask it


def test_seeded_request_is_reproducible_across_batch_compositions(tiny_dir):
    p = prompt(12, 11)
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, ignore_eos=True, seed=42,
                            presence_penalty=0.5, logprobs=2)
    alone = tokens_of(run(make_engine(tiny_dir), [make_request("s", p, seeded)])["s"])
    others = [
        make_request(f"o{i}", prompt(5 + 7 * i, i), SamplingParams(
            temperature=0.7, max_tokens=4 + 5 * i, ignore_eos=True,
            repetition_penalty=1.3 if i % 2 else 1.0, logprobs=i if i % 3 else None))
        for i in range(5)
    ]  # fmt: skip
    for scheduler, budget in (("fcfs", 256), ("chunked_prefill", 5)):
        engine = make_engine(tiny_dir, scheduler, budget)
        mixed = run(engine, [others[0], others[1], make_request("s", p, seeded), *others[2:]])
        assert tokens_of(mixed["s"]) == alone, scheduler


def test_seeded_requests_differ_by_seed_and_repeat(tiny_dir):
    """Four requests on one prompt with seeds 9..12 (what the frontend's fan-out
    of ``n=4, seed=9`` sends) sample four sequences, the same ones in a new
    engine; four unseeded requests differ too (the shared generator advances)."""
    p = prompt(6, 4)

    def requests(seed: int | None) -> list:
        return [make_request(f"x{i}", p, SamplingParams(
            temperature=1.0, max_tokens=12, ignore_eos=True,
            seed=None if seed is None else seed + i)) for i in range(4)]  # fmt: skip

    first = run(make_engine(tiny_dir), requests(9))
    seqs = [tuple(tokens_of(o)) for o in first.values()]
    assert len(set(seqs)) == 4
    again = run(make_engine(tiny_dir), requests(9))
    assert [tuple(tokens_of(o)) for o in again.values()] == seqs
    outs = run(make_engine(tiny_dir), requests(None))
    assert len({tuple(tokens_of(o)) for o in outs.values()}) == 4


def test_logit_bias_outside_the_vocabulary_is_refused(tiny_dir):
    engine = make_engine(tiny_dir)
    with pytest.raises(ValueError, match="logit_bias"):
        engine.add_request(
            make_request("x", [5, 6], SamplingParams(logit_bias={VOCAB: 1.0}))
        )
