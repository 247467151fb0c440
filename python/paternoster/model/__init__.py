"""The model side: our Llama/Qwen2/Qwen3(-MoE)/SmolLM3/Gemma 3/gpt-oss/OLMo/EXAONE/Ministral
modules over a paged KV cache, weight loading, the ModelRunner, the Sampler and the embedded
default model.

Modules (import them directly; this package imports nothing heavy):
    default_model  SmolLM2-135M-Instruct, converted once from the bundled GGUF
    loader         architecture registry, dtype resolution, safetensors loading
    llama          LlamaForCausalLM (Llama 2/3, SmolLM2, Mistral) and Qwen2ForCausalLM
    qwen3          Qwen3ForCausalLM (per-head q/k RMSNorm)
    qwen3_moe      Qwen3MoeForCausalLM (Qwen3 attention, routed experts)
    moe            SparseMoeBlock: top-k routed SwiGLU experts, grouped per expert
    mixtral        MixtralForCausalLM (Mistral attention, routed experts)
    smollm3        SmolLM3ForCausalLM (no RoPE in every fourth layer)
    phi3           Phi3ForCausalLM (fused projections in the checkpoint, LongRoPE, partial rotation)
    gemma3         Gemma3ForCausalLM (four norms per layer, GeGLU, local and global RoPE)
    layer_types    sliding/full layer types and the per-type-RoPE model base (Gemma 3, OLMo 3,
                   EXAONE 4)
    olmo2          Olmo2ForCausalLM, Olmo3ForCausalLM (post-norm blocks, whole-projection q/k
                   norms); PostNormDecoderLayer
    exaone4        Exaone4ForCausalLM (post-norm blocks, per-head q/k norms, NoPE full layers)
    ministral3     Ministral3ForCausalLM (YaRN, Llama 4's query temperature)
    gpt_oss        GptOssForCausalLM (attention sinks, biased experts with a clamped SwiGLU)
    mxfp4          MXFP4 (OCP MX) dequantization of gpt-oss's expert weights
    rope           rotary embedding tables (default, linear, llama3, yarn, longrope scaling;
                   partial rotation)
    longrope       LongRoPE's short/long rescale factors and attention factor
    attention      AttentionMetadata and the per-layer paged-attention step
    runner         ModelRunner: model + KV cache, one forward per engine step
    cuda_graphs    DecodeGraphs: captured decode forwards for padded batch sizes (CUDA)
    sampler        Sampler: greedy, temperature, top-k, top-p, min-p, per-request seeds
"""
