"""Serving a GGUF file directly (``paternoster.model.gguf``): a tiny random
Llama written as llama.cpp's converter writes it (q/k rows permuted, matrices
quantized by gguf-py), loaded with Q8_0/Q4_0/Q4_1 weights kept quantized; its
logits against HF transformers' forward on gguf-py's dequantization of the
same blocks, and its greedy ids against HF ``generate``."""

from __future__ import annotations

import pytest
import torch

from paternoster import kernels
from paternoster.config import CacheConfig, ModelConfig
from paternoster.kernels import QuantizedWeight, WeightParts
from paternoster.model.gguf import hf_name
from paternoster.model.gguf_config import load_gguf_config
from paternoster.model.runner import ModelRunner

from .conftest import BatchMaker, Chunk, greedy_matches_hf_generate, hf_logits
from .gguf_writer import write_llama_gguf

BLOCK_SIZE = 8
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def _hf_llama(seed: int, tied: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(**TINY, tie_word_embeddings=tied, rope_theta=10000.0)
    return LlamaForCausalLM(cfg).float().eval()


def _reference(hf, weights: dict[str, torch.Tensor]):
    """``hf`` with the file's (dequantized) weights."""
    hf.load_state_dict(weights, strict=False)
    return hf


def _runner(path, dtype="float32") -> ModelRunner:
    """A runner in batch-invariant mode: quantized matrices multiply float
    activations at every call size, so logits meet HF's on the dequantized
    weights to float32 summation error (the default mode's 8-bit activations
    for calls of at most 4 rows are checked against HF by greedy decoding and
    in tests/core/test_linear.py)."""
    return ModelRunner(ModelConfig(model=str(path), dtype=dtype, batch_invariant=True),
                       CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=128))


@pytest.mark.parametrize("fmt,tied", [("q8_0", True), ("q4_0", False), ("q4_1", True)])
def test_quantized_gguf_logits_match_hf_on_dequantized_weights(tmp_path, fmt, tied):
    hf = _hf_llama(0, tied)
    path = tmp_path / f"tiny-{fmt}.gguf"
    weights = write_llama_gguf(hf, path, fmt)
    runner = _runner(path)
    qkv = runner.model.layers[0].self_attn.qkv_weight
    # kept quantized, as the file's three tensors (v's bytes where they lie in the file)
    assert isinstance(qkv, WeightParts) and qkv.format == "+".join([fmt] * 3)
    assert qkv.parts[2].mapped and not qkv.parts[0].mapped  # q's rows un-permuted: a copy
    assert isinstance(runner.model.lm_head, QuantizedWeight)
    hf = _reference(hf, weights)
    tokens = torch.randint(3, 128, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    maker = BatchMaker(128, BLOCK_SIZE)
    # Two chunks of one prompt: the second reads the first's cached K/V.
    first = runner.compute_logits(maker.batch([Chunk("a", tokens, 0, 17)]))
    second = runner.compute_logits(maker.batch([Chunk("a", tokens, 17, 23)]))
    ours = torch.cat([first, second])
    ref = hf_logits(hf, tokens)
    assert (ours - ref).abs().max() < 1e-4


def test_greedy_ids_match_hf_generate(tmp_path):
    from paternoster import LLM, SamplingParams

    hf = _hf_llama(2, True)
    path = tmp_path / "tiny-q4_1.gguf"
    hf = _reference(hf, write_llama_gguf(hf, path, "q4_1"))
    llm = LLM(str(path), dtype="float32", num_threads=1, max_model_len=256)
    prompt = [5, 17, 99, 3, 42, 8, 61]
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    with torch.inference_mode():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    assert list(out[0].outputs[0].token_ids) == ref[0, len(prompt):].tolist()


def test_mixed_formats_in_a_fused_matrix_stay_quantized(tmp_path):
    """q and k in Q4_1, v in Q8_0 (llama.cpp's mixes do this): the fused qkv
    matrix keeps each part in its own format, logits still match, through the
    Python layers and the core's decoder stack alike."""
    hf = _hf_llama(3, True)
    path = tmp_path / "mixed.gguf"
    weights = write_llama_gguf(hf, path, "q4_1", layer_types={"self_attn.v_proj": "q8_0"})
    runner = _runner(path)
    layer = runner.model.layers[0]
    assert layer.self_attn.qkv_weight.format == "q4_1+q4_1+q8_0"
    assert isinstance(layer.mlp.down_weight, QuantizedWeight)
    hf = _reference(hf, weights)
    tokens = list(range(3, 30))
    ours = runner.compute_logits(BatchMaker(128, BLOCK_SIZE).batch([Chunk("a", tokens, 0, 27)]))
    assert (ours - hf_logits(hf, tokens)).abs().max() < 1e-4
    ids, ref = greedy_matches_hf_generate(path, hf, kernels, [5, 9, 33, 2, 17], 8)
    assert ids == ref


#: A Llama at shapes the 256-value K-quant blocks fit (hidden and MLP widths).
K_QUANT_SHAPES = dict(TINY, hidden_size=256, intermediate_size=512)


@pytest.mark.parametrize("mix", [
    # Q4_K_M as llama-quantize writes it: Q4_K, with v and down in Q6_K
    dict(matrix="q4_k", embed="q6_k", overrides={"self_attn.v_proj": "q6_k",
                                                 "mlp.down_proj": "q6_k"}),
    # the other kept types, and Q3_K (dequantized at load) in one file
    dict(matrix="q5_k", embed="iq4_xs", overrides={"self_attn.q_proj": "iq4_nl",
                                                   "self_attn.k_proj": "q5_0",
                                                   "self_attn.v_proj": "q5_1",
                                                   "mlp.down_proj": "q3_k"}),
], ids=["q4_k_m", "others"])
def test_k_quant_mixes_match_hf_on_dequantized_weights(tmp_path, mix, caplog):
    """A file in llama.cpp's K-quant mixes (the blocks gguf-py's reference
    dequantizes): logits against HF's forward on the file's values (batch-
    invariant: the float path); in the default mode, decode steps (the 8-bit
    activation path) teacher-forced on HF's greedy ids, within llama.cpp's
    activation rounding of HF's logits and with HF's greedy choice wherever
    its top-2 margin is clear of that rounding (a random model's logits hold
    near-ties that 8-bit activations may flip, as they would in llama.cpp)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(12)
    hf = LlamaForCausalLM(LlamaConfig(**K_QUANT_SHAPES, tie_word_embeddings=True,
                                      rope_theta=10000.0)).float().eval()
    path = tmp_path / "tiny-mix.gguf"
    weights = write_llama_gguf(hf, path, mix["matrix"], embed_type=mix["embed"],
                               layer_types=mix["overrides"])
    with caplog.at_level("INFO", logger="paternoster.model.gguf"):
        runner = _runner(path)
    layer = runner.model.layers[1]
    q, k, v = (mix["overrides"].get(f"self_attn.{p}_proj", mix["matrix"]) for p in "qkv")
    assert layer.self_attn.qkv_weight.format == f"{q}+{k}+{v}"
    assert runner.model.embed_tokens.format == mix["embed"]
    if mix["overrides"].get("mlp.down_proj") == "q3_k":
        assert isinstance(layer.mlp.down_weight, torch.Tensor)  # dequantized at load
        assert "Q3_K" in caplog.text and "to bfloat16 at load" in caplog.text
    hf = _reference(hf, weights)
    tokens = torch.randint(3, 128, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    ours = runner.compute_logits(BatchMaker(128, BLOCK_SIZE).batch([Chunk("a", tokens, 0, 40)]))
    ref = hf_logits(hf, tokens)
    # Q3_K went through bfloat16 at load (the reference holds its float32 values)
    tol = 3e-2 if "q3_k" in mix["overrides"].values() else 1e-4
    assert (ours - ref).abs().max() < tol * max(1.0, float(ref.abs().max()))
    _decode_steps_match_hf(path, hf, [5, 9, 33, 2, 17], 12)


def _decode_steps_match_hf(path, hf, prompt: list[int], n: int) -> None:
    """Default-mode decode steps of one sequence, fed HF's greedy ids, against
    HF's logits of the same sequence: median NMSE <= 3e-4 over the steps
    (llama.cpp's activation rounding, ~5e-5 a step on a well-conditioned
    step), every step <= 3e-2 (a random model amplifies any perturbation at
    some positions: there even the float path's error rises 100-fold), and
    the same argmax where HF's top-2 margin exceeds 5 % of the logits' spread."""
    from paternoster.config import CacheConfig, ModelConfig
    from paternoster.model.runner import ModelRunner

    with torch.inference_mode():
        seq = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                          eos_token_id=None, pad_token_id=0)[0].tolist()
        ref = hf(torch.tensor([seq])).logits[0]
    runner = ModelRunner(ModelConfig(model=str(path), dtype="float32"),
                         CacheConfig(block_size=8, num_kv_blocks=32))
    maker = BatchMaker(runner.num_kv_blocks, 8, seed=1)
    runner.execute_model(maker.batch([Chunk("a", seq, 0, len(prompt))]))
    clear, nmse = 0, []
    for pos in range(len(prompt), len(seq)):
        ours = runner.execute_model(maker.batch([Chunk("a", seq, pos, 1)]))[-1].double()
        want = ref[pos].double()
        nmse.append(float(((ours - want) ** 2).sum() / (want**2).sum()))
        assert nmse[-1] <= 3e-2, (pos, nmse)
        top = want.topk(2).values
        if top[0] - top[1] > 0.05 * want.std():
            assert int(ours.argmax()) == int(want.argmax()), pos
            clear += 1
    assert sorted(nmse)[len(nmse) // 2] <= 3e-4, nmse
    assert clear >= n // 2  # the argmax check ran on most steps


def _random_norms(model, seed: int) -> None:
    """Norm weights away from their initial ones (so a missed norm shift shows)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


@pytest.mark.parametrize("case", ["gemma3", "smollm3", "phi3", "olmo2", "olmo3", "exaone4",
                                  "ministral3"])
def test_table_named_architectures_match_hf(tmp_path, case):
    """Gemma 3 (norms stored as 1 + w, sliding and global layers with their
    RoPE bases from the keys, the query scale llama.cpp uses), SmolLM3 (its
    config built from the keys: NoPE every 4th layer; q/k rows permuted),
    OLMo 2/3 and EXAONE 4 (configs from the keys: window pattern, per-type
    RoPE with YaRN on OLMo 3's full layers) and Ministral 3 (YaRN, the query
    temperature, permuted q/k) as llama.cpp's converter writes them: logits
    over 40 tokens (past the window and the temperature's first step) against
    HF's forward on the file's values, relative error 1e-5 (a mis-ordered RoPE
    pair or a norm off by one shows far above it)."""
    import transformers

    torch.manual_seed(20)
    arch = {"olmo3": "olmo2", "ministral3": "mistral3"}.get(case, case)
    window = {"sliding_window": 8, "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}
    yarn = {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
            "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0}
    if case == "olmo2":
        cfg = transformers.Olmo2Config(**TINY, pad_token_id=0, rope_theta=5000.0)
    elif case == "olmo3":
        cfg = transformers.Olmo3Config(**dict(TINY, num_hidden_layers=4), pad_token_id=0,
                                       **window, rope_parameters={
                                           "full_attention": yarn, "sliding_attention": {
                                               "rope_type": "default", "rope_theta": 500.0}})
    elif case == "exaone4":
        cfg = transformers.Exaone4Config(**dict(TINY, num_hidden_layers=4), head_dim=16,
                                         pad_token_id=0, **window)
    elif case == "ministral3":
        cfg = transformers.Ministral3Config(**TINY, head_dim=16, pad_token_id=0, rope_parameters={
            **yarn, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1})
    if case in ("olmo2", "olmo3", "exaone4", "ministral3"):
        cfg.architectures = [type(cfg).__name__.replace("Config", "ForCausalLM")]
    elif arch == "gemma3":
        cfg = transformers.Gemma3TextConfig(**dict(TINY, num_hidden_layers=6), head_dim=16,
                                            sliding_window=8, query_pre_attn_scalar=16,
                                            rope_theta=1e6, pad_token_id=0)
        cfg.architectures = ["Gemma3ForCausalLM"]
    elif arch == "phi3":  # q/k/v and gate/up fused in the checkpoint and the file
        cfg = transformers.Phi3Config(**TINY, pad_token_id=0, rope_theta=10000.0)
        cfg.architectures = ["Phi3ForCausalLM"]
    else:
        cfg = transformers.SmolLM3Config(**dict(TINY, num_hidden_layers=4), pad_token_id=0,
                                         rope_theta=2e6)
        cfg.architectures = ["SmolLM3ForCausalLM"]
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    _random_norms(hf, 21)
    path = tmp_path / f"tiny-{arch}.gguf"
    hf = _reference(hf, write_llama_gguf(hf, path, "q8_0", arch=arch))
    runner = _runner(path)
    assert type(runner.model).__name__ == cfg.architectures[0]
    tokens = torch.randint(3, 128, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    maker = BatchMaker(runner.num_kv_blocks, BLOCK_SIZE, num_groups=runner.kv_layout.num_groups)
    ours = runner.compute_logits(maker.batch([Chunk("a", tokens, 0, 40)]))
    ref = hf_logits(hf, tokens)
    assert (ours - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_llama3_rope_scaling_from_the_rope_freqs_tensor(tmp_path):
    """Llama 3.1/3.2 files carry their rope scaling as llama.cpp's
    ``rope_freqs`` tensor (no config key): logits against HF's Llama with the
    llama3 rope type (scaling that reaches most frequencies at this size)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(7)
    scaling = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    hf = LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=True,
                                      rope_parameters=scaling)).float().eval()
    path = tmp_path / "tiny-llama3.gguf"
    hf = _reference(hf, write_llama_gguf(hf, path, "q8_0"))
    runner = _runner(path)
    tokens = torch.randint(3, 128, (60,), generator=torch.Generator().manual_seed(3)).tolist()
    ours = runner.compute_logits(BatchMaker(128, BLOCK_SIZE).batch([Chunk("a", tokens, 0, 60)]))
    ref = hf_logits(hf, tokens)
    assert (ours - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_split_files_load_as_one_model(tmp_path):
    """A model split over three files (gguf-split's naming; metadata in the
    first) serves from its first file, logits as the one-file model's
    reference; another file of the split, or a missing one, is a clear error."""
    hf = _hf_llama(6, True)
    weights = write_llama_gguf(hf, tmp_path / "tiny.gguf", "q8_0", split_max_tensors=8)
    files = sorted(tmp_path.glob("tiny-*-of-*.gguf"))
    assert len(files) > 2 and files[0].name == f"tiny-00001-of-{len(files):05d}.gguf"
    runner = _runner(files[0])
    hf = _reference(hf, weights)
    tokens = list(range(3, 30))
    ours = runner.compute_logits(BatchMaker(128, BLOCK_SIZE).batch([Chunk("a", tokens, 0, 27)]))
    assert (ours - hf_logits(hf, tokens)).abs().max() < 1e-4
    from paternoster.engine.assembly import served_model_name

    assert served_model_name(ModelConfig(model=str(files[0]))) == "tiny"  # llama-server's id
    with pytest.raises(ValueError, match="serve its first file"):
        _runner(files[1])
    files[-1].unlink()
    with pytest.raises(ValueError, match=f"{files[-1].name}, file of this split model, is missing"):
        _runner(files[0])


def test_a_file_named_relative_to_the_working_directory_loads(tmp_path, monkeypatch):
    """``serve name.gguf`` and ``serve ./name.gguf`` from the file's directory
    (found by a fresh user's trial: the config failed with a TypeError)."""
    write_llama_gguf(_hf_llama(8, True), tmp_path / "rel.gguf", "q8_0")
    monkeypatch.chdir(tmp_path)
    for spelling in ("rel.gguf", "./rel.gguf"):
        assert load_gguf_config(spelling).architectures == ["LlamaForCausalLM"], spelling
        assert _runner(spelling).model is not None


def test_unsupported_types_and_architectures_are_refused(tmp_path):
    from gguf import GGUFWriter

    hf = _hf_llama(4, True)
    path = tmp_path / "f16.gguf"
    write_llama_gguf(hf, path, "f16")  # dense F16 is supported: loads
    assert _runner(path).model is not None
    other = tmp_path / "mamba.gguf"
    w = GGUFWriter(str(other), "mamba")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="not supported; supported: llama, qwen2, qwen3, qwen3moe, "
                                         "gemma3, phi3, smollm3"):
        load_gguf_config(other)


def test_tensor_names():
    assert hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("rope_freqs.weight") is None


def test_bad_files_get_clear_errors(tmp_path):
    from paternoster.model.gguf_file import is_gguf
    from paternoster.model.loader import load_tokenizer

    hf = _hf_llama(5, True)
    good = tmp_path / "good.gguf"
    write_llama_gguf(hf, good, "q8_0")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_gguf_config(cut)
    text = tmp_path / "text.gguf"
    text.write_text("not a model")
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_gguf_config(text)
    with pytest.raises(ValueError, match="no such GGUF file"):
        load_gguf_config(tmp_path / "missing.gguf")
    # Cut inside the tensor data (header and metadata whole): the same error
    # from the tokenizer, which transformers reads from the file first.
    tail = tmp_path / "tail.gguf"
    tail.write_bytes(good.read_bytes()[:-100])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_gguf_config(tail)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_tokenizer(tail)
    (tmp_path / "dir.gguf").mkdir()
    assert not is_gguf(tmp_path / "dir.gguf") and is_gguf(good)


def test_a_mis_shaped_tensor_or_no_tokenizer_names_the_file(tmp_path):
    """A tensor whose shape disagrees with the file's metadata, and a file
    without a tokenizer: one ValueError from LLM(...) naming the file and
    what is wrong (the server's start logs the same line and exits 1)."""
    from paternoster import LLM

    hf = _hf_llama(5, True)
    hf.config.intermediate_size += 32  # the metadata says 128 rows; the tensors have 96
    bad = tmp_path / "bad.gguf"
    write_llama_gguf(hf, bad, "q8_0")
    with pytest.raises(ValueError, match=r"bad\.gguf: weight model\.layers\.0\.mlp\.gate_proj"
                                         r"\.weight has shape \(96, 64\), expected \(128, 64\)"):
        LLM(str(bad))
    hf.config.intermediate_size -= 32
    bare = tmp_path / "bare.gguf"
    write_llama_gguf(hf, bare, "q8_0", tokenizer=False)
    with pytest.raises(ValueError, match=r"bare\.gguf: no tokenizer in the GGUF metadata"):
        LLM(str(bare))


def test_served_name_is_the_file_name_without_suffix(tmp_path):
    from paternoster import LLM

    hf = _hf_llama(6, True)
    path = tmp_path / "tiny.Q4_0.gguf"
    write_llama_gguf(hf, path, "q4_0")
    llm = LLM(str(path), num_threads=1, max_model_len=128)
    assert llm.engine.info["model"] == "tiny.Q4_0"
    assert llm.engine.info["batch_invariant"] is False


def test_qwen3_gguf_logits_match_hf(tmp_path):
    """A qwen3 GGUF (head size from the key length, per-head q/k norms, no
    row permutation), Q8_0 matrices kept quantized: logits match HF's Qwen3
    on the file's dequantized weights."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(9)
    hf = Qwen3ForCausalLM(Qwen3Config(**TINY, head_dim=48, tie_word_embeddings=True,
                                      rope_theta=10000.0)).float().eval()
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    path = tmp_path / "tiny-qwen3-q8_0.gguf"
    hf = _reference(hf, write_llama_gguf(hf, path, "q8_0", arch="qwen3"))
    runner = _runner(path)
    assert type(runner.model).__name__ == "Qwen3ForCausalLM"
    assert runner.model.layers[0].self_attn.head_dim == 48
    assert isinstance(runner.model.layers[0].mlp.down_weight, QuantizedWeight)
    tokens = list(range(3, 40))
    ours = runner.compute_logits(BatchMaker(128, BLOCK_SIZE).batch([Chunk("a", tokens, 0, 37)]))
    assert (ours - hf_logits(hf, tokens)).abs().max() < 1e-4


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1"])
def test_qwen3_moe_gguf_logits_match_hf(tmp_path, fmt):
    """A qwen3moe GGUF (experts stacked per layer, router in F32, expert width
    and counts from the metadata, top-k renormalized as llama.cpp's qwen3moe),
    expert matrices kept quantized: logits and greedy ids match HF's
    Qwen3-MoE on the file's dequantized weights."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(10)
    cfg = Qwen3MoeConfig(**TINY, head_dim=32, moe_intermediate_size=64, num_experts=6,
                         num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=False,
                         rope_theta=10000.0)
    hf = Qwen3MoeForCausalLM(cfg).float().eval()
    path = tmp_path / f"tiny-qwen3moe-{fmt}.gguf"
    hf = _reference(hf, write_llama_gguf(hf, path, fmt, arch="qwen3moe"))
    runner = _runner(path)
    assert type(runner.model).__name__ == "Qwen3MoeForCausalLM"
    moe = runner.model.layers[0].mlp
    assert (moe.num_experts, moe.top_k, moe.inter) == (6, 2, 64)
    # every expert's matrices where they lie in the file's stacked tensors
    assert isinstance(moe.gate_up_weight, WeightParts) and len(moe.gate_up_weight.parts) == 12
    assert all(p.mapped for p in moe.down_weight.parts)
    tokens = list(range(3, 40))
    ours = runner.compute_logits(BatchMaker(128, BLOCK_SIZE).batch([Chunk("a", tokens, 0, 37)]))
    assert (ours - hf_logits(hf, tokens)).abs().max() < 1e-4
    ids, ref = greedy_matches_hf_generate(path, hf, kernels, [5, 9, 33, 2, 17], 8)
    assert ids == ref


@pytest.mark.parametrize("experts", ["mxfp4", "q8_0"])
def test_gpt_oss_gguf_logits_match_hf(tmp_path, experts):
    """A gpt-oss GGUF as llama.cpp's converter writes it (sinks, biases,
    fused experts split into gate/up/down stacks, YaRN and the window from
    the keys), expert matrices kept quantized where they lie in the file:
    float32 logits over a chunked prefill past the window and then one-token
    decode steps through the paged cache match HF's GptOssForCausalLM on the
    file's dequantized weights (with llama.cpp's whole-dimension YaRN
    correction range, HF's ``truncate``). The default mode's 8-bit
    activations for the MXFP4 experts are checked in
    tests/core/test_linear_gguf_types.py; on a model this small they flip
    routing choices, so greedy ids are no test of them here."""
    from .gguf_writer import write_gpt_oss_gguf
    from .test_gpt_oss import WINDOW, _config, _hf_model

    # The file has no key for the SwiGLU limit: llama.cpp fixes gpt-oss's 7.
    cfg = _config(max_position_embeddings=256, swiglu_limit=7.0)
    path = tmp_path / f"tiny-gpt-oss-{experts}.gguf"
    weights = write_gpt_oss_gguf(_hf_model(cfg, 43), path, "q8_0", experts)
    cfg.rope_parameters["truncate"] = True
    hf = _hf_model(cfg, 43)
    hf.load_state_dict(weights)
    runner = _runner(path)
    assert type(runner.model).__name__ == "GptOssForCausalLM"
    moe = runner.model.layers[0].mlp
    assert isinstance(moe.gate_up_weight, WeightParts)
    assert moe.gate_up_weight.format.split("+")[0] == experts
    assert all(p.mapped for p in moe.down_weight.parts)
    tokens = torch.randint(3, 128, (37,), generator=torch.Generator().manual_seed(2)).tolist()
    maker = BatchMaker(128, BLOCK_SIZE, num_groups=runner.kv_layout.num_groups)
    split = 3 * WINDOW // 2
    outs = [runner.compute_logits(maker.batch([Chunk("a", tokens, 0, split)])),
            runner.compute_logits(maker.batch([Chunk("a", tokens, split, 30 - split)]))]
    outs += [runner.compute_logits(maker.batch([Chunk("a", tokens, p, 1)]))
             for p in range(30, 37)]
    ours = torch.cat(outs)
    ref = hf_logits(hf, tokens)
    assert (ours - ref).abs().max() < 1e-4 * ref.abs().max()


@pytest.mark.parametrize("arch,mtp", [("qwen3next", 0), ("qwen35", 1), ("qwen35moe", 0)])
def test_hybrid_gguf_logits_match_hf(tmp_path, arch, mtp):
    """Qwen3-Next and Qwen3.5 (dense, MoE) GGUF files as llama.cpp's converter
    writes them (``1 + w`` norms, ``-exp(A_log)``, q/k/v and z apart, Qwen3.5's
    value heads tiled over the key heads; tests/model/gguf_writer_hybrid.py),
    matrices kept quantized where they lie: float32 logits over a chunked
    prefill and one-token decode steps match HF's model on the file's
    dequantized weights. A file with a multi-token-prediction layer after
    the model's (as the converter appends one) serves the model's layers."""
    import transformers as tf

    from .gguf_writer_hybrid import write_hybrid_gguf
    from .hybrid_checks import file_logits_match_hf
    from .test_qwen3_next import MOE, TEXT, _randomize_norms

    torch.manual_seed(70)
    if arch == "qwen3next":  # every layer routed, as the released models and llama.cpp
        hf = tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(**TEXT, **MOE, decoder_sparse_step=1))
    elif arch == "qwen35":
        hf = tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**TEXT))
    else:
        hf = tf.Qwen3_5MoeForCausalLM(tf.Qwen3_5MoeTextConfig(**TEXT, **MOE))
    hf = hf.float().eval()
    _randomize_norms(hf)
    path = tmp_path / f"tiny-{arch}.gguf"
    hf.load_state_dict(write_hybrid_gguf(hf, path, arch, mtp_layers=mtp))
    runner = _runner(path)
    assert type(runner.model).__name__ == type(hf).__name__
    assert len(runner.model.layers) == hf.config.num_hidden_layers
    net = runner.model.layers[0].linear_attn
    # q/k/v, z and b/a stay the file's quantized tensors (b, a: F32 rows, dense)
    assert isinstance(net.out_weight, QuantizedWeight) and net.out_weight.mapped
    assert net.tiled == (arch != "qwen3next")
    file_logits_match_hf(runner, hf)
