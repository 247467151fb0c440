// The decoder stack in one call (see paternoster/decoder.h): the Python
// model's layer loop (python/paternoster/model/llama.py) over the same
// kernels, in the same order, with the same intermediate buffers' contents.
#include "paternoster/decoder.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "paternoster/fused_ops.h"

namespace paternoster {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

void require_positive(int64_t v, const char* name) {
  if (v <= 0) fail(std::string("DecoderConfig.") + name + " must be > 0, got " + std::to_string(v));
}

void* grow(std::vector<uint8_t>& buf, int64_t bytes) {
  if (static_cast<int64_t>(buf.size()) < bytes) buf.resize(static_cast<size_t>(bytes));
  return buf.data();
}

// Rows [T, width] at `src` with `stride` elements between rows -> contiguous `dst`.
void gather_rows(void* dst, const void* src, int64_t rows, int64_t width, int64_t stride,
                 int64_t elem) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for (int64_t t = 0; t < rows; ++t) {
    std::memcpy(d + t * width * elem, s + t * stride * elem, static_cast<size_t>(width * elem));
  }
}

// out = x W^T (+ bias) for a projection of `rows` output features.
void project(const DecoderWeight& w, void* out, const void* x, DType dt, int64_t T, int64_t rows,
             int64_t in_features, bool batch_invariant) {
  if (w.parts.empty()) {
    linear(out, dt, x, dt, w.data, w.format, w.bias, T, rows, in_features, batch_invariant);
  } else {
    linear_parts(out, dt, x, dt, w.parts.data(), static_cast<int64_t>(w.parts.size()), w.bias, T,
                 in_features, batch_invariant);
  }
}

}  // namespace

DecoderStack::DecoderStack(const DecoderConfig& config, std::vector<DecoderLayer> layers,
                           const void* final_norm)
    : c_(config), layers_(std::move(layers)), final_norm_(final_norm) {
  dtype_size(c_.dtype);
  require_positive(c_.hidden_size, "hidden_size");
  require_positive(c_.num_heads, "num_heads");
  require_positive(c_.num_kv_heads, "num_kv_heads");
  require_positive(c_.head_size, "head_size");
  require_positive(c_.intermediate_size, "intermediate_size");
  require_positive(c_.max_positions, "max_positions");
  require_positive(c_.num_blocks, "num_blocks");
  require_positive(c_.block_size, "block_size");
  if (c_.num_heads % c_.num_kv_heads) fail("num_heads must be a multiple of num_kv_heads");
  if (!c_.cos_sin_cache) fail("DecoderConfig.cos_sin_cache must not be null");
  if (!final_norm_) fail("final_norm must not be null");
  if (layers_.empty()) fail("a DecoderStack needs at least one layer");
  for (size_t i = 0; i < layers_.size(); ++i) {
    const DecoderLayer& l = layers_[i];
    const std::string at = "layer " + std::to_string(i) + ": ";
    if (!l.input_norm || !l.post_attention_norm) fail(at + "norm weights must not be null");
    const int64_t q_size = c_.num_heads * c_.head_size, kv_size = c_.num_kv_heads * c_.head_size;
    std::vector<std::pair<const DecoderWeight*, int64_t>> projections = {
        {&l.qkv, q_size + 2 * kv_size}, {&l.o, c_.hidden_size}};
    if (l.moe) {
      if (l.moe->hidden_size() != c_.hidden_size || l.moe->dtype() != c_.dtype) {
        fail(at + "the routed experts' hidden size and dtype must be the model's");
      }
    } else {
      projections.push_back({&l.gate_up, 2 * c_.intermediate_size});
      projections.push_back({&l.down, c_.hidden_size});
    }
    for (const auto& [w, rows] : projections) {
      if (w->parts.empty()) {
        if (!w->data) fail(at + "projection weights must not be null");
        continue;
      }
      int64_t total = 0;
      for (const WeightPart& p : w->parts) {
        if (!p.data) fail(at + "projection weights must not be null");
        total += p.rows;
      }
      if (total != rows) {
        fail(at + "weight parts hold " + std::to_string(total) + " rows, the projection has " +
             std::to_string(rows));
      }
    }
    if (!l.key_cache || !l.value_cache) fail(at + "KV caches must not be null");
    if (!l.q_norm != !l.k_norm) fail(at + "q_norm and k_norm must both be set or both be null");
    if (l.sliding_window < 0) {
      fail(at + "sliding_window must be >= 0, got " + std::to_string(l.sliding_window));
    }
    for (const auto& [w, rows] : projections) {
      std::vector<WeightFormat> formats;
      for (const WeightPart& p : w->parts) formats.push_back(p.format);
      if (w->parts.empty()) formats.push_back(w->format);
      for (WeightFormat f : formats) {
        const bool is_dense = f == WeightFormat::kFloat32 || f == WeightFormat::kBFloat16;
        const bool matches = (f == WeightFormat::kFloat32) == (c_.dtype == DType::kFloat32);
        if (is_dense && !matches) fail(at + "dense weights must be in the model dtype");
      }
    }
  }
}

void DecoderStack::forward(void* out, void* x, const int64_t* positions,
                           const int64_t* slot_mapping, const int32_t* block_tables,
                           const int32_t* seq_lens, const int32_t* query_start_loc,
                           int64_t num_tokens, int64_t num_seqs, int64_t max_blocks_per_seq) {
  const int64_t T = num_tokens, H = c_.hidden_size, D = c_.head_size;
  if (T < 0) fail("num_tokens must be >= 0");
  if (T == 0) return;
  if (!out || !x) fail("out and x must not be null");
  const int64_t elem = dtype_size(c_.dtype);
  const int64_t q_size = c_.num_heads * D, kv_size = c_.num_kv_heads * D;
  const int64_t qkv_width = q_size + 2 * kv_size, I = c_.intermediate_size;
  void* h = grow(h_, T * H * elem);
  void* qkv = grow(qkv_, T * qkv_width * elem);
  void* q = grow(q_, T * q_size * elem);
  void* k = grow(k_, T * kv_size * elem);
  void* v = grow(v_, T * kv_size * elem);
  void* attn = grow(attn_, T * q_size * elem);
  void* proj = grow(proj_, T * H * elem);
  void* gate_up = grow(gate_up_, T * 2 * I * elem);
  void* act = grow(act_, T * I * elem);
  void* mlp = grow(mlp_, T * H * elem);  // each layer's MLP output (the next one's x)
  const float scale = static_cast<float>(std::pow(static_cast<double>(D), -0.5));
  const DType dt = c_.dtype;
  auto bytes = [](void* p) { return static_cast<uint8_t*>(p); };

  // The residual stream is the embeddings' buffer, updated in place (as the
  // Python model carries it); layer 0 normalizes it into h, later layers add
  // the previous MLP output first (fused_add_rms_norm leaves the norm in mlp).
  void* residual = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const DecoderLayer& l = layers_[i];
    void* normed = h;
    if (i == 0) {
      rms_norm(h, x, l.input_norm, T, H, c_.rms_norm_eps, dt);
    } else {
      fused_add_rms_norm(mlp, residual, l.input_norm, T, H, c_.rms_norm_eps, dt);
      normed = mlp;
    }
    project(l.qkv, qkv, normed, dt, T, qkv_width, H, c_.batch_invariant);
    gather_rows(q, qkv, T, q_size, qkv_width, elem);
    gather_rows(k, bytes(qkv) + q_size * elem, T, kv_size, qkv_width, elem);
    gather_rows(v, bytes(qkv) + (q_size + kv_size) * elem, T, kv_size, qkv_width, elem);
    if (l.q_norm) {  // every head a row of D
      rms_norm(q, q, l.q_norm, T * c_.num_heads, D, c_.rms_norm_eps, dt);
      rms_norm(k, k, l.k_norm, T * c_.num_kv_heads, D, c_.rms_norm_eps, dt);
    }
    if (l.use_rope) {
      rotary_embedding(positions, q, k, c_.cos_sin_cache, T, c_.num_heads, c_.num_kv_heads, D,
                       q_size, kv_size, c_.max_positions, c_.is_neox, dt);
    }
    reshape_and_cache(k, v, l.key_cache, l.value_cache, slot_mapping, T, c_.num_kv_heads, D,
                      c_.num_blocks * c_.block_size, dt);
    paged_attention(attn, q, l.key_cache, l.value_cache, block_tables, seq_lens,
                    query_start_loc, T, num_seqs, c_.num_heads, c_.num_kv_heads, D,
                    c_.num_blocks, c_.block_size, max_blocks_per_seq, scale, dt,
                    c_.batch_invariant, l.sliding_window);
    project(l.o, proj, attn, dt, T, H, q_size, c_.batch_invariant);
    fused_add_rms_norm(proj, residual, l.post_attention_norm, T, H, c_.rms_norm_eps, dt);
    if (l.moe) {
      l.moe->forward(mlp, proj, T, c_.batch_invariant);
      continue;
    }
    project(l.gate_up, gate_up, proj, dt, T, 2 * I, H, c_.batch_invariant);
    silu_and_mul(act, gate_up, T, I, dt);
    project(l.down, mlp, act, dt, T, H, I, c_.batch_invariant);
  }
  std::memcpy(out, mlp, static_cast<size_t>(T * H * elem));
  fused_add_rms_norm(out, residual, final_norm_, T, H, c_.rms_norm_eps, dt);
}

}  // namespace paternoster
