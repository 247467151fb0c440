// Routed mixture-of-experts feed-forward block on the CPU (Shazeer et al.
// 2017, "Outrageously Large Neural Networks"; top-k softmax routing as in
// Mixtral, Jiang et al. 2024, and Qwen3-MoE): each token goes to its top_k
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
//
// Arithmetic: router logits in float32; softmax over the E logits, the top_k
// largest probabilities (ties: the lower expert first), renormalized to sum to
// 1 if norm_topk_prob; each expert's gate/up projection rounded to dtype,
// silu_and_mul rounded to dtype (as a dense MLP), its down projection kept in
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

class MoeExperts {
 public:
  // Checks sizes, pointers and formats (std::invalid_argument naming the
  // field): the parts of router, gate_up and down must hold E, E 2I and E H
  // rows; dense parts must be in `dtype`. The weights must outlive the object.
  MoeExperts(int64_t hidden_size, int64_t intermediate_size, int64_t num_experts,
             int64_t top_k, bool norm_topk_prob, DType dtype, std::vector<WeightPart> router,
             std::vector<WeightPart> gate_up, std::vector<WeightPart> down);

  // out [T, H] = the block on x [T, H] (see the header comment); out and x
  // must not overlap. Safe to call from several threads at once (scratch is
  // per call).
  void forward(void* out, const void* x, int64_t num_tokens, bool batch_invariant) const;

  int64_t hidden_size() const { return hidden_; }
  DType dtype() const { return dtype_; }

 private:
  int64_t hidden_, inter_, num_experts_, top_k_;
  bool norm_topk_prob_;
  DType dtype_;
  std::vector<WeightPart> router_;
  // Per expert, the parts holding its gate/up rows [2I, H] and down rows [H, I].
  std::vector<std::vector<WeightPart>> gate_up_, down_;
};

}  // namespace paternoster
