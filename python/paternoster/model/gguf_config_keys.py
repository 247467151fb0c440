"""Transformers configs built from the metadata keys llama.cpp's converter
writes, for the architectures transformers' GGUF support does not map:
``olmo2`` (OLMo 2 and OLMo 3), ``exaone4``, ``mistral3`` (Ministral 3),
``lfm2`` and ``lfm2moe``, ``granitehybrid``, ``nemotron_h`` and ``nemotron_h_moe``.
The keys are those of llama.cpp's ``TextModel.set_gguf_parameters`` and each
converter's additions (conversion/olmo.py, exaone.py, mistral3.py, lfm2.py,
granite.py, nemotron.py).
"""

from __future__ import annotations

from pathlib import Path

from paternoster.model.gguf_file import float_field, int_field


class Keys:
    """Typed reads of one architecture's ``{arch}.*`` keys.

    Args:
        reader: the parsed file. path: its path (for errors). arch: the
            ``general.architecture`` value.
    """

    def __init__(self, reader, path: str | Path, arch: str) -> None:
        self.reader, self.path, self.arch = reader, path, arch

    def need(self, key: str) -> int:
        """``{arch}.{key}`` as an int.

        Raises:
            ValueError: the key is missing (naming the file and key).
        """
        value = int_field(self.reader, f"{self.arch}.{key}")
        if value is None:
            raise ValueError(f"{self.path}: no {self.arch}.{key} in the GGUF metadata")
        return value

    def get_int(self, key: str) -> int | None:
        """``{arch}.{key}`` as an int, None when absent."""
        return int_field(self.reader, f"{self.arch}.{key}")

    def get_float(self, key: str) -> float | None:
        """``{arch}.{key}`` as a float, None when absent."""
        return float_field(self.reader, f"{self.arch}.{key}")

    def get_str(self, key: str) -> str | None:
        """``{arch}.{key}`` as a string, None when absent."""
        field = self.reader.fields.get(f"{self.arch}.{key}")
        return None if field is None else bytes(field.parts[field.data[0]]).decode()

    def get_bools(self, key: str) -> list[bool] | None:
        """``{arch}.{key}``, an array, as bools; None when absent."""
        field = self.reader.fields.get(f"{self.arch}.{key}")
        return None if field is None else [bool(field.parts[i][0]) for i in field.data]

    def get_ints(self, key: str) -> list[int] | None:
        """``{arch}.{key}`` as a list of ints (one value for a scalar key);
        None when absent."""
        field = self.reader.fields.get(f"{self.arch}.{key}")
        return None if field is None else [int(field.parts[i][0]) for i in field.data]

    def common(self, vocab_size: int, untied: bool, special: dict) -> dict:
        """The sizes every decoder has, as transformers config arguments
        (``head_dim`` from ``attention.key_length`` when written)."""
        args = dict(
            hidden_size=self.need("embedding_length"),
            intermediate_size=self.need("feed_forward_length"),
            num_hidden_layers=self.need("block_count"),
            num_attention_heads=self.need("attention.head_count"),
            num_key_value_heads=self.need("attention.head_count_kv"),
            max_position_embeddings=self.need("context_length"),
            rms_norm_eps=self.get_float("attention.layer_norm_rms_epsilon") or 1e-6,
            vocab_size=vocab_size, tie_word_embeddings=not untied, **special)
        head_dim = self.get_int("attention.key_length")
        if head_dim is not None:
            args["head_dim"] = head_dim
        return args

    def rope(self) -> dict:
        """The full-attention layers' RoPE: ``rope.freq_base`` and, where
        written, linear or YaRN scaling (``rope.scaling.*``)."""
        rope: dict = {"rope_type": "default",
                      "rope_theta": self.get_float("rope.freq_base") or 10000.0}
        kind = self.get_str("rope.scaling.type")
        if kind == "linear":
            rope.update(rope_type="linear", factor=self.get_float("rope.scaling.factor") or 1.0)
        elif kind == "yarn":
            rope.update(rope_type="yarn", factor=self.get_float("rope.scaling.factor") or 1.0,
                        original_max_position_embeddings=self.need(
                            "rope.scaling.original_context_length"),
                        beta_fast=self.get_float("rope.scaling.yarn_beta_fast") or 32.0,
                        beta_slow=self.get_float("rope.scaling.yarn_beta_slow") or 1.0)
            attn_factor = self.get_float("rope.scaling.yarn_attn_factor")
            if attn_factor is not None:
                rope["attention_factor"] = attn_factor
        return rope

    def layer_types(self, layers: int) -> tuple[int | None, list[str]]:
        """``(sliding_window, layer_types)``: the window and, from
        ``attention.sliding_window_pattern`` (True: sliding), each layer's
        kind; without a window every layer is full."""
        window = self.get_int("attention.sliding_window")
        flags = self.get_bools("attention.sliding_window_pattern")
        if not window:
            return None, ["full_attention"] * layers
        if flags is None or len(flags) != layers:
            flags = [True] * layers
        return window, ["sliding_attention" if f else "full_attention" for f in flags]


def olmo2_config(keys: Keys, args: dict):
    """OLMo 2, or OLMo 3 where the file has sliding-window layers (the
    sliding layers' RoPE base from ``rope.freq_base_swa``, unscaled)."""
    from transformers import Olmo2Config, Olmo3Config

    window, types = keys.layer_types(args["num_hidden_layers"])
    rope = keys.rope()
    if window is None:
        return Olmo2Config(**args, rope_parameters=rope)
    local = {"rope_type": "default",
             "rope_theta": keys.get_float("rope.freq_base_swa") or rope["rope_theta"]}
    return Olmo3Config(**args, sliding_window=window, layer_types=types,
                       rope_parameters={"full_attention": rope, "sliding_attention": local})


def exaone4_config(keys: Keys, args: dict):
    """EXAONE 4.0 (Llama 3's rope scaling arrives as the ``rope_freqs``
    tensor, read for every architecture)."""
    from transformers import Exaone4Config

    window, types = keys.layer_types(args["num_hidden_layers"])
    return Exaone4Config(**args, sliding_window=window, layer_types=types,
                         rope_parameters=keys.rope())


def mistral3_config(keys: Keys, args: dict):
    """Ministral 3: YaRN with ``rope.scaling.yarn_log_multiplier`` as
    ``mscale_all_dim`` (and ``mscale`` 1, as the released configs) and the
    query temperature ``attention.temperature_scale`` (llama.cpp's floor
    length is the original context, as HF's)."""
    from transformers import Ministral3Config

    rope = keys.rope()
    if rope["rope_type"] == "yarn":
        log_mul = keys.get_float("rope.scaling.yarn_log_multiplier")
        if log_mul:
            rope.update(mscale=1.0, mscale_all_dim=log_mul)
        beta = keys.get_float("attention.temperature_scale")
        if beta:
            rope["llama_4_scaling_beta"] = beta
    window = keys.get_int("attention.sliding_window")
    return Ministral3Config(**args, rope_parameters=rope, sliding_window=window or None)


def lfm2_config(keys: Keys, args: dict):
    """LFM2 / LFM2-MoE: the conv layers are those with 0 KV heads in the
    per-layer ``attention.head_count_kv``; ``feed_forward_length`` is the
    MLP's final size (the converter applies LFM2's adjustment); LFM2-MoE's
    experts are chosen by sigmoid scores plus ``exp_probs_b``, renormalized
    (llama.cpp's lfm2moe graph), scaled by ``expert_weights_scale`` where
    written."""
    from transformers import Lfm2Config, Lfm2MoeConfig

    kv = keys.get_ints("attention.head_count_kv") or []
    layers = args["num_hidden_layers"]
    if len(kv) == 1:
        kv = kv * layers
    if len(kv) != layers or not any(kv):
        raise ValueError(f"{keys.path}: {keys.arch}.attention.head_count_kv must give each "
                         f"of the {layers} layers its KV heads (0 for a conv layer), got {kv}")
    args.update(num_key_value_heads=max(kv), norm_eps=args.pop("rms_norm_eps"),
                layer_types=["full_attention" if n else "conv" for n in kv],
                conv_L_cache=keys.need("shortconv.l_cache"), rope_parameters=keys.rope())
    if keys.arch == "lfm2":
        return Lfm2Config(**args, block_auto_adjust_ff_dim=False)
    return Lfm2MoeConfig(**args, num_experts=keys.need("expert_count"),
                         num_experts_per_tok=keys.need("expert_used_count"),
                         moe_intermediate_size=keys.need("expert_feed_forward_length"),
                         num_dense_layers=keys.need("leading_dense_block_count"),
                         use_expert_bias=True, norm_topk_prob=True,
                         routed_scaling_factor=keys.get_float("expert_weights_scale") or 1.0)


def _kv_per_layer(keys: Keys, layers: int) -> list[int]:
    """``attention.head_count_kv`` per layer (0: no attention), a scalar
    key repeated.

    Raises:
        ValueError: neither one value nor one per layer, or no attention layer.
    """
    kv = keys.get_ints("attention.head_count_kv") or []
    if len(kv) == 1:
        kv = kv * layers
    if len(kv) != layers or not any(kv):
        raise ValueError(f"{keys.path}: {keys.arch}.attention.head_count_kv must give each of "
                         f"the {layers} layers its KV heads (0 without attention), got {kv}")
    return kv


def _mamba2_sizes(keys: Keys) -> tuple[int, int, int, int, int]:
    """(heads, head size, state size, groups, conv width) from the
    ``ssm.*`` keys (``time_step_rank`` is the head count, ``inner_size``
    heads times head size: llama.cpp's Mamba2 reading)."""
    heads = keys.need("ssm.time_step_rank")
    return (heads, keys.need("ssm.inner_size") // heads, keys.need("ssm.state_size"),
            keys.need("ssm.group_count"), keys.need("ssm.conv_kernel"))


def granitehybrid_config(keys: Keys, args: dict):
    """Granite 4.0-H: Mamba2 layers where ``attention.head_count_kv`` is 0;
    experts where ``expert_count`` > 0, the shared MLP's width
    ``expert_shared_feed_forward_length``; the multipliers from
    ``embedding_scale``, ``residual_scale``, ``attention.scale`` and
    ``logit_scale``; RoPE only where ``rope.scaling.finetuned`` (the
    converter's flag for it)."""
    from transformers import GraniteMoeHybridConfig

    layers = args["num_hidden_layers"]
    kv = _kv_per_layer(keys, layers)
    heads, head_dim, state, groups, conv = _mamba2_sizes(keys)
    experts = keys.get_int("expert_count") or 0
    args.pop("head_dim", None)  # Granite's is hidden / heads
    args.update(num_key_value_heads=max(kv),
                layer_types=["full_attention" if n else "linear_attention" for n in kv])
    finetuned = keys.reader.fields.get(f"{keys.arch}.rope.scaling.finetuned")
    rope = finetuned is not None and bool(finetuned.parts[finetuned.data[0]][0])
    shared = keys.get_int("expert_shared_feed_forward_length") or args["intermediate_size"]
    return GraniteMoeHybridConfig(
        **args, num_local_experts=experts,
        num_experts_per_tok=(keys.get_int("expert_used_count") or 1) if experts else 1,
        shared_intermediate_size=shared, mamba_n_heads=heads, mamba_d_head=head_dim,
        mamba_d_state=state, mamba_n_groups=groups, mamba_d_conv=conv,
        mamba_expand=heads * head_dim // args["hidden_size"],
        embedding_multiplier=keys.get_float("embedding_scale") or 1.0,
        residual_multiplier=keys.get_float("residual_scale") or 1.0,
        attention_multiplier=keys.get_float("attention.scale") or 1.0,
        logits_scaling=keys.get_float("logit_scale") or 1.0,
        position_embedding_type="rope" if rope else None, rope_parameters=keys.rope())


def nemotron_h_config(keys: Keys, args: dict):
    """Nemotron-H (``nemotron_h``) and Nemotron 3 (``nemotron_h_moe``): each
    layer's kind from the tensors it has (attention, Mamba2, experts or an
    MLP; the converter's per-layer ``feed_forward_length`` is all zeros for
    a dense model read through transformers 5, which it then labels
    ``nemotron_h_moe``), the MLP's width from its tensor; the experts' group
    limit, renormalization and scaling from the ``expert_*`` keys.

    Raises:
        ValueError: a layer with none of the four kinds' tensors, or the
            latent projection's tensors (not read yet).
    """
    from transformers import NemotronHConfig

    from paternoster.model.gguf_file import gguf_reader, gguf_shards

    layers = args["num_hidden_layers"]
    kv = _kv_per_layer(keys, layers)
    tensors = {t.name: t for shard in gguf_shards(keys.path) for t in gguf_reader(shard).tensors}
    if any("latent" in name for name in tensors):
        raise ValueError(f"{keys.path}: Nemotron 3's latent-projection experts are not read "
                         f"from GGUF files yet; serve the HF checkpoint")
    kinds = (("attn_q.weight", "full_attention"), ("ssm_in.weight", "linear_attention"),
             ("ffn_up_exps.weight", "moe"), ("ffn_up.weight", "mlp"))
    types = []
    for i in range(layers):
        kind = next((k for t, k in kinds if f"blk.{i}.{t}" in tensors), None)
        if kind is None:
            raise ValueError(f"{keys.path}: layer {i} has no attention, Mamba2, expert or MLP "
                             f"tensors")
        types.append(kind)
    mlp = next((tensors[f"blk.{i}.ffn_up.weight"] for i, k in enumerate(types) if k == "mlp"),
               None)
    heads, head_dim, state, groups, conv = _mamba2_sizes(keys)
    eps = keys.get_float("attention.layer_norm_epsilon") or args["rms_norm_eps"]
    for k in ("num_hidden_layers", "intermediate_size", "rms_norm_eps", "num_key_value_heads"):
        args.pop(k)
    extra: dict = {}
    if "moe" in types:
        extra = dict(n_routed_experts=keys.need("expert_count"),
                     num_experts_per_tok=keys.need("expert_used_count"),
                     moe_intermediate_size=keys.need("expert_feed_forward_length"),
                     moe_shared_expert_intermediate_size=keys.need(
                         "expert_shared_feed_forward_length"),
                     n_group=keys.get_int("expert_group_count") or 1,
                     topk_group=keys.get_int("expert_group_used_count") or 1,
                     norm_topk_prob=bool(keys.get_int("expert_weights_norm") or 0),
                     routed_scaling_factor=keys.get_float("expert_weights_scale") or 1.0)
    return NemotronHConfig(
        **args, layers_block_type=types, num_key_value_heads=max(kv),
        intermediate_size=int(mlp.shape[1]) if mlp is not None else 1,
        layer_norm_epsilon=eps, mamba_num_heads=heads, mamba_head_dim=head_dim,
        ssm_state_size=state, n_groups=groups, conv_kernel=conv, **extra)
