// A Llama-family decoder stack run in one call: every layer's RMSNorms,
// projections, RoPE, KV-cache write, paged attention and SwiGLU MLP, through
// the core's kernels (paternoster/fused_ops.h, linear.h, attention.h) in the
// order the Python model calls them, so its results are the same bits. It
// exists for small decode steps, where a host's per-kernel call overhead
// (tens of microseconds in Python, ~10 calls a layer) costs more than the
// arithmetic.
//
// Layouts as in those headers: activations [T, hidden] in `dtype`; the fused
// q/k/v weight [(Hq + 2 Hkv) D, hidden] (q rows, then k, then v), gate/up
// [2 I, hidden] (gate rows first), o [hidden, Hq D], down [hidden, I]; biases
// optional (null), in `dtype`; weights dense in `dtype` or quantized
// (WeightFormat). Caches [num_blocks, block_size, Hkv, D] in `dtype`.
// Optional per-head query/key RMSNorm weights [D] (Qwen3) normalize every
// head of q and k after the projection, before RoPE. A layer's feed-forward
// block is the SwiGLU MLP, or routed experts (paternoster/moe.h).
#pragma once

#include <cstdint>
#include <vector>

#include "paternoster/attention.h"
#include "paternoster/linear.h"
#include "paternoster/moe.h"

namespace paternoster {

// A projection's weight: one matrix (data, format), or, when `parts` is not
// empty, its row blocks stored apart (linear_parts; data and format unused).
struct DecoderWeight {
  const void* data = nullptr;
  WeightFormat format = WeightFormat::kFloat32;
  const void* bias = nullptr;
  std::vector<WeightPart> parts;
};

struct DecoderLayer {
  const void* input_norm = nullptr;          // [hidden]
  const void* post_attention_norm = nullptr;  // [hidden]
  DecoderWeight qkv, o, gate_up, down;  // gate_up and down unused with `moe`
  const MoeExperts* moe = nullptr;  // routed experts as the feed-forward block, or null
  const void* q_norm = nullptr;  // [head_size] or null (Qwen3's per-head norms)
  const void* k_norm = nullptr;  // both or neither
  bool use_rope = true;          // false: no RoPE in this layer (SmolLM3's NoPE layers)
  int64_t sliding_window = 0;    // passed to paged_attention: W > 0, or 0 (full causal)
  void* key_cache = nullptr;
  void* value_cache = nullptr;
};

struct DecoderConfig {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_size = 0;
  int64_t intermediate_size = 0;
  double rms_norm_eps = 1e-6;
  DType dtype = DType::kFloat32;
  const void* cos_sin_cache = nullptr;  // [max_positions, head_size]
  int64_t max_positions = 0;
  bool is_neox = true;
  int64_t num_blocks = 0;  // per layer cache
  int64_t block_size = 0;
  bool batch_invariant = false;  // passed to paged_attention
};

class DecoderStack {
 public:
  // Checks sizes and pointers (std::invalid_argument naming the field); the
  // arrays must outlive the stack.
  DecoderStack(const DecoderConfig& config, std::vector<DecoderLayer> layers,
               const void* final_norm);

  // One step over T tokens of B sequences (the attention metadata of
  // paternoster/attention.h). x [T, hidden] holds the embeddings and is used
  // as scratch; out [T, hidden] gets the final hidden states (after the final
  // RMSNorm). Throws std::invalid_argument (from the kernels' checks) for bad
  // positions, slots or block tables; nothing is written to `out` then, but
  // earlier layers' caches may already hold this step's K/V.
  void forward(void* out, void* x, const int64_t* positions, const int64_t* slot_mapping,
               const int32_t* block_tables, const int32_t* seq_lens,
               const int32_t* query_start_loc, int64_t num_tokens, int64_t num_seqs,
               int64_t max_blocks_per_seq);

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

 private:
  DecoderConfig c_;
  std::vector<DecoderLayer> layers_;
  const void* final_norm_;
  // Scratch (bytes): the first norm, q/k/v, contiguous q, k, v, attention
  // out, its projection, gate/up, activation, MLP out.
  std::vector<uint8_t> h_, qkv_, q_, k_, v_, attn_, proj_, gate_up_, act_, mlp_;
};

}  // namespace paternoster
