// Routed mixture-of-experts feed-forward block on the CPU (Shazeer et al.
// 2017, "Outrageously Large Neural Networks"; top-k softmax routing as in
// Mixtral, Jiang et al. 2024, and Qwen3-MoE, or sigmoid routing as in
// DeepSeek-V3, MoeRouting): each token goes to its top_k
// highest-scoring experts, each a SwiGLU MLP, and their outputs are summed
// with the routing weights. One call runs the router, the routing and every
// expert through the core's kernels (linear.h, fused_ops.h), so a host pays
// one call a layer instead of a few per expert.
//
// Layouts (row-major; weights as linear.h's, each stacked weight given as the
// parts its rows are stored in, one part for one matrix):
//   router   [E, H]        logits = x router^T, in float32
//   gate_up  [E * 2I, H]   expert e's gate rows, then its up rows, at [e 2I, (e + 1) 2I)
//   down     [E * H, I]    expert e's rows at [e H, (e + 1) H)
//   x, out   [T, H] in `dtype` (float32 or bfloat16); dense weights in `dtype`.
//   biases   optional (null), in `dtype`: router [E], gate_up [E * 2I], down [E * H]
//            (gpt-oss), stacked as the weights' rows.
//
// Arithmetic: router logits in float32; softmax over the E logits, the top_k
// largest probabilities (ties: the lower expert first), renormalized to sum to
// 1 if norm_topk_prob (which is also the softmax over the top_k logits alone,
// gpt-oss's routing); each expert's gate/up projection rounded to dtype, its
// activation rounded to dtype (SwiGLU as silu_and_mul, as a dense MLP; or
// gpt-oss's clamped SwiGLU in float32), its down projection kept in
// float32, times the routing weight and summed over the token's experts in
// ascending expert order in float32, rounded to dtype once. A token's result
// depends on its own row alone (not on the batch) whenever the linear kernel's
// do (linear.h: dense weights, or batch_invariant).
#pragma once

#include <cstdint>
#include <vector>

#include "paternoster/attention.h"  // DType
#include "paternoster/linear.h"

namespace paternoster {

// Softmax top-k routing of one step's tokens.
//   logits [T, E] float32 -> weights [T, top_k] float32 and experts [T, top_k],
// each token's slots in descending probability (ties: the lower expert first);
// weights are the softmax probabilities over all E experts, renormalized over
// the chosen top_k when `renormalize` (HF Qwen3-MoE's norm_topk_prob,
// Mixtral's always). Throws std::invalid_argument for top_k outside [1, E]
// or a null pointer with T > 0.
void moe_route(float* weights, int32_t* experts, const float* logits, int64_t num_tokens,
               int64_t num_experts, int64_t top_k, bool renormalize);

// Sigmoid routing (DeepSeek-V3, arXiv:2412.19437; LFM2-MoE; Nemotron-H):
// scores = sigmoid(logits); the top_k experts by score + selection_bias[e]
// (bias null: none), only among the experts of the topk_groups best of
// `groups` equal groups when groups > 1 (a group's score: its two best biased
// scores summed; DeepSeek-V3's node-limited routing); weights = the chosen
// experts' scores, divided by (their sum + norm_eps) when renormalize, times
// scaling. Slots in descending biased score (ties: the lower expert first).
struct MoeRouting {
  bool sigmoid = false;  // false: moe_route's softmax (the other fields unused)
  const float* selection_bias = nullptr;  // [E] float32, or null
  float norm_eps = 0.0f;
  float scaling = 1.0f;
  int64_t groups = 1;
  int64_t topk_groups = 1;
};

// The routing above for one step's tokens: logits [T, E] float32 -> weights
// [T, top_k] float32 and experts [T, top_k]. Throws std::invalid_argument for
// top_k outside [1, E], groups not dividing E (or < 1), topk_groups outside
// [1, groups], fewer than top_k experts in topk_groups groups, a group of
// fewer than 2 experts when groups > 1, or a null pointer with T > 0.
void moe_route_sigmoid(float* weights, int32_t* experts, const float* logits, int64_t num_tokens,
                       int64_t num_experts, int64_t top_k, bool renormalize,
                       const MoeRouting& routing);

// An expert's activation of its first projection:
//   kSwiGLU:        silu(gate) * up                         (Shazeer 2020)
//   kClampedSwiGLU: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g),
//                   g = min(gate, limit)          (gpt-oss's reference code)
// on [n, 2I] (gate columns, then up); or, for non-gated experts whose first
// projection is the up rows alone ([n, I]; gate_up then holds [E * I, H]):
//   kReluSquared:   relu(up)^2                    (Nemotron-H; So et al. 2021)
enum class MoeActivation : int32_t { kSwiGLU = 0, kClampedSwiGLU = 1, kReluSquared = 2 };

struct MoeBiases {
  const void* router = nullptr;
  const void* gate_up = nullptr;
  const void* down = nullptr;
};

class MoeExperts {
 public:
  // Checks sizes, pointers and formats (std::invalid_argument naming the
  // field): the parts of router, gate_up and down must hold E, E 2I and E H
  // rows; dense parts must be in `dtype`; kClampedSwiGLU needs limit > 0. The
  // weights and biases must outlive the object.
  MoeExperts(int64_t hidden_size, int64_t intermediate_size, int64_t num_experts,
             int64_t top_k, bool norm_topk_prob, DType dtype, std::vector<WeightPart> router,
             std::vector<WeightPart> gate_up, std::vector<WeightPart> down,
             MoeBiases biases = {}, MoeActivation activation = MoeActivation::kSwiGLU,
             float alpha = 0.0f, float limit = 0.0f, MoeRouting routing = {});

  // out [T, H] = the block on x [T, H] (see the header comment); out and x
  // must not overlap. Safe to call from several threads at once (scratch is
  // per call).
  void forward(void* out, const void* x, int64_t num_tokens, bool batch_invariant) const;

  int64_t hidden_size() const { return hidden_; }
  DType dtype() const { return dtype_; }

 private:
  // act [rows, I] = the activation of gate_up [rows, up_rows_].
  void activate(void* act, const void* gate_up, int64_t rows) const;

  int64_t hidden_, inter_, num_experts_, top_k_;
  int64_t up_rows_;  // rows of an expert's first projection: 2I (gated) or I
  MoeRouting routing_;
  bool norm_topk_prob_;
  DType dtype_;
  MoeBiases biases_;
  MoeActivation activation_;
  float alpha_, limit_;
  std::vector<WeightPart> router_;
  // Per expert, the parts holding its gate/up rows [2I, H] and down rows [H, I].
  std::vector<std::vector<WeightPart>> gate_up_, down_;
};

}  // namespace paternoster
