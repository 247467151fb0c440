// Routed experts in one call (see paternoster/moe.h): the router's linear,
// softmax top-k routing, the (token, expert) pairs grouped by expert, each
// expert's SwiGLU MLP on its tokens through linear_parts and silu_and_mul,
// and the weighted sum in float32.
#include "paternoster/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "paternoster/fused_ops.h"
#include "scalar_dtype.h"

namespace paternoster {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

using detail::load_elem;
using detail::store_elem;

// The parts holding rows [start, start + rows) of a weight stored as `parts`.
std::vector<WeightPart> slice(const std::vector<WeightPart>& parts, int64_t start, int64_t rows,
                              int64_t in_features) {
  std::vector<WeightPart> out;
  int64_t at = 0;  // first row of the current part
  for (const WeightPart& p : parts) {
    const int64_t lo = std::max(start, at), hi = std::min(start + rows, at + p.rows);
    if (lo < hi) {
      const auto* data = static_cast<const uint8_t*>(p.data) +
                         (lo - at) * weight_row_bytes(p.format, in_features);
      out.push_back(WeightPart{data, p.format, hi - lo});
    }
    at += p.rows;
  }
  return out;
}

void check_parts(const std::vector<WeightPart>& parts, const char* name, int64_t rows,
                 int64_t in_features, DType dtype) {
  int64_t total = 0;
  for (const WeightPart& p : parts) {
    if (!p.data) fail(std::string("MoeExperts: ") + name + " parts must not be null");
    if (p.rows <= 0) fail(std::string("MoeExperts: ") + name + " parts need rows > 0");
    const bool dense = p.format == WeightFormat::kFloat32 || p.format == WeightFormat::kBFloat16;
    if (dense && (p.format == WeightFormat::kFloat32) != (dtype == DType::kFloat32)) {
      fail(std::string("MoeExperts: dense ") + name + " weights must be in the model dtype");
    }
    weight_row_bytes(p.format, in_features);  // throws for a bad in_features
    total += p.rows;
  }
  if (total != rows) {
    fail(std::string("MoeExperts: ") + name + " parts hold " + std::to_string(total) +
         " rows, expected " + std::to_string(rows));
  }
}

}  // namespace

void moe_route(float* weights, int32_t* experts, const float* logits, int64_t num_tokens,
               int64_t num_experts, int64_t top_k, bool renormalize) {
  if (top_k < 1 || top_k > num_experts) {
    fail("top_k must be in [1, " + std::to_string(num_experts) + "], got " +
         std::to_string(top_k));
  }
  if (num_tokens < 0) fail("num_tokens must be >= 0");
  if (num_tokens > 0 && (!weights || !experts || !logits)) fail("moe_route: null pointer");
  std::vector<int32_t> order(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* l = logits + t * num_experts;
    const float top = *std::max_element(l, l + num_experts);
    float sum = 0.0f;
    for (int64_t e = 0; e < num_experts; ++e) sum += std::exp(l[e] - top);
    for (int64_t e = 0; e < num_experts; ++e) order[e] = static_cast<int32_t>(e);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [l](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    float chosen = 0.0f;
    for (int64_t s = 0; s < top_k; ++s) {
      const float p = std::exp(l[order[s]] - top) / sum;
      weights[t * top_k + s] = p;
      experts[t * top_k + s] = order[s];
      chosen += p;
    }
    if (renormalize) {
      for (int64_t s = 0; s < top_k; ++s) weights[t * top_k + s] /= chosen;
    }
  }
}

void moe_route_sigmoid(float* weights, int32_t* experts, const float* logits, int64_t num_tokens,
                       int64_t num_experts, int64_t top_k, bool renormalize,
                       const MoeRouting& r) {
  const int64_t E = num_experts;
  if (top_k < 1 || top_k > E) {
    fail("top_k must be in [1, " + std::to_string(E) + "], got " + std::to_string(top_k));
  }
  if (r.groups < 1 || E % r.groups || r.topk_groups < 1 || r.topk_groups > r.groups) {
    fail("moe routing: n_group must divide the " + std::to_string(E) +
         " experts and topk_group be in [1, n_group], got n_group " + std::to_string(r.groups) +
         ", topk_group " + std::to_string(r.topk_groups));
  }
  const int64_t per_group = E / r.groups;
  if (r.groups > 1 && (per_group < 2 || r.topk_groups * per_group < top_k)) {
    fail("moe routing: groups of " + std::to_string(per_group) + " experts, " +
         std::to_string(r.topk_groups) + " of them, cannot give top_k " + std::to_string(top_k));
  }
  if (num_tokens < 0) fail("num_tokens must be >= 0");
  if (num_tokens > 0 && (!weights || !experts || !logits)) fail("moe_route: null pointer");
  std::vector<float> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E)), gorder(static_cast<size_t>(r.groups));
  std::vector<float> gscore(static_cast<size_t>(r.groups));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* l = logits + t * E;
    for (int64_t e = 0; e < E; ++e) {
      score[e] = 1.0f / (1.0f + std::exp(-l[e]));
      choice[e] = score[e] + (r.selection_bias ? r.selection_bias[e] : 0.0f);
    }
    if (r.groups > 1) {
      for (int64_t g = 0; g < r.groups; ++g) {
        float a = neg_inf, b = neg_inf;  // the group's two best
        for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
          if (choice[e] > a) {
            b = a;
            a = choice[e];
          } else if (choice[e] > b) {
            b = choice[e];
          }
        }
        gscore[g] = a + b;
        gorder[g] = static_cast<int32_t>(g);
      }
      std::partial_sort(gorder.begin(), gorder.begin() + r.topk_groups, gorder.end(),
                        [&](int32_t a, int32_t b) {
                          return gscore[a] > gscore[b] || (gscore[a] == gscore[b] && a < b);
                        });
      std::vector<bool> keep(static_cast<size_t>(r.groups), false);
      for (int64_t i = 0; i < r.topk_groups; ++i) keep[gorder[i]] = true;
      for (int64_t e = 0; e < E; ++e) {
        if (!keep[e / per_group]) choice[e] = neg_inf;
      }
    }
    for (int64_t e = 0; e < E; ++e) order[e] = static_cast<int32_t>(e);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [&](int32_t a, int32_t b) {
                        return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
                      });
    float sum = 0.0f;
    for (int64_t s = 0; s < top_k; ++s) {
      weights[t * top_k + s] = score[order[s]];
      experts[t * top_k + s] = order[s];
      sum += score[order[s]];
    }
    const float div = renormalize ? sum + r.norm_eps : 1.0f;
    for (int64_t s = 0; s < top_k; ++s) {
      weights[t * top_k + s] = weights[t * top_k + s] / div * r.scaling;
    }
  }
}

MoeExperts::MoeExperts(int64_t hidden_size, int64_t intermediate_size, int64_t num_experts,
                       int64_t top_k, bool norm_topk_prob, DType dtype,
                       std::vector<WeightPart> router, std::vector<WeightPart> gate_up,
                       std::vector<WeightPart> down, MoeBiases biases,
                       MoeActivation activation, float alpha, float limit, MoeRouting routing)
    : hidden_(hidden_size), inter_(intermediate_size), num_experts_(num_experts),
      top_k_(top_k),
      up_rows_(activation == MoeActivation::kReluSquared ? intermediate_size
                                                         : 2 * intermediate_size),
      routing_(routing), norm_topk_prob_(norm_topk_prob), dtype_(dtype), biases_(biases),
      activation_(activation), alpha_(alpha), limit_(limit), router_(std::move(router)) {
  dtype_size(dtype);
  if (activation_ != MoeActivation::kSwiGLU && activation_ != MoeActivation::kClampedSwiGLU &&
      activation_ != MoeActivation::kReluSquared) {
    fail("MoeExperts: unknown activation " + std::to_string(static_cast<int>(activation_)));
  }
  if (activation_ == MoeActivation::kClampedSwiGLU && !(limit_ > 0.0f)) {
    fail("MoeExperts: the clamped SwiGLU needs limit > 0, got " + std::to_string(limit_));
  }
  if (hidden_ <= 0 || inter_ <= 0 || num_experts_ <= 0) {
    fail("MoeExperts: hidden_size, intermediate_size and num_experts must be > 0");
  }
  if (top_k_ < 1 || top_k_ > num_experts_) {
    fail("MoeExperts: top_k must be in [1, " + std::to_string(num_experts_) + "], got " +
         std::to_string(top_k_));
  }
  check_parts(router_, "router", num_experts_, hidden_, dtype_);
  check_parts(gate_up, "gate_up", num_experts_ * up_rows_, hidden_, dtype_);
  check_parts(down, "down", num_experts_ * hidden_, inter_, dtype_);
  if (routing_.sigmoid) {  // the routing's own checks, before any call
    std::vector<float> w(static_cast<size_t>(top_k_));
    std::vector<int32_t> ids(static_cast<size_t>(top_k_));
    std::vector<float> zeros(static_cast<size_t>(num_experts_), 0.0f);
    moe_route_sigmoid(w.data(), ids.data(), zeros.data(), 1, num_experts_, top_k_, false,
                      routing_);
  }
  for (int64_t e = 0; e < num_experts_; ++e) {
    gate_up_.push_back(slice(gate_up, e * up_rows_, up_rows_, hidden_));
    down_.push_back(slice(down, e * hidden_, hidden_, inter_));
  }
}

void MoeExperts::activate(void* act, const void* gate_up, int64_t rows) const {
  if (activation_ == MoeActivation::kSwiGLU) {
    silu_and_mul(act, gate_up, rows, inter_, dtype_);
    return;
  }
  if (activation_ == MoeActivation::kReluSquared) {
    for (int64_t i = 0; i < rows * inter_; ++i) {
      const float u = std::max(load_elem(gate_up, i, dtype_), 0.0f);
      store_elem(act, i, u * u, dtype_);
    }
    return;
  }
  const int64_t I = inter_;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < I; ++i) {
      const float g = std::min(load_elem(gate_up, r * 2 * I + i, dtype_), limit_);
      const float u = std::clamp(load_elem(gate_up, r * 2 * I + I + i, dtype_), -limit_, limit_);
      store_elem(act, r * I + i, (u + 1.0f) * g / (1.0f + std::exp(-alpha_ * g)), dtype_);
    }
  }
}

void MoeExperts::forward(void* out, const void* x, int64_t num_tokens,
                         bool batch_invariant) const {
  const int64_t T = num_tokens, H = hidden_, I = inter_, E = num_experts_, k = top_k_;
  if (T < 0) fail("num_tokens must be >= 0");
  if (T == 0) return;
  if (!out || !x) fail("MoeExperts: out and x must not be null");
  const DType dt = dtype_;
  const int64_t elem = dtype_size(dt);
  std::vector<float> logits(static_cast<size_t>(T * E)), weights(static_cast<size_t>(T * k));
  std::vector<int32_t> experts(static_cast<size_t>(T * k));
  linear_parts(logits.data(), DType::kFloat32, x, dt, router_.data(),
               static_cast<int64_t>(router_.size()), biases_.router, T, H, batch_invariant);
  auto at = [elem](const void* base, int64_t index) -> const void* {
    return base ? static_cast<const uint8_t*>(base) + index * elem : nullptr;
  };
  if (routing_.sigmoid) {
    moe_route_sigmoid(weights.data(), experts.data(), logits.data(), T, E, k, norm_topk_prob_,
                      routing_);
  } else {
    moe_route(weights.data(), experts.data(), logits.data(), T, E, k, norm_topk_prob_);
  }
  const int64_t U = up_rows_;

  std::vector<float> acc(static_cast<size_t>(T * H), 0.0f);
  auto add = [&](int64_t t, const float* y, float w) {
    float* a = acc.data() + t * H;
    for (int64_t h = 0; h < H; ++h) a[h] += w * y[h];
  };
  std::vector<float> y;
  std::vector<uint8_t> gu, act;
  if (T == 1) {
    // One token: every chosen expert reads the same x, so their gate/up rows
    // run as one linear_parts call; the down projections take one call each.
    std::vector<int32_t> slots(static_cast<size_t>(k));
    for (int64_t s = 0; s < k; ++s) slots[s] = static_cast<int32_t>(s);
    std::sort(slots.begin(), slots.end(),
              [&](int32_t a, int32_t b) { return experts[a] < experts[b]; });
    std::vector<WeightPart> parts;
    std::vector<uint8_t> bias;  // the chosen experts' gate/up biases, in their order
    for (int32_t s : slots) {
      const auto& p = gate_up_[experts[s]];
      parts.insert(parts.end(), p.begin(), p.end());
      if (biases_.gate_up) {
        const auto* b = static_cast<const uint8_t*>(at(biases_.gate_up, experts[s] * U));
        bias.insert(bias.end(), b, b + U * elem);
      }
    }
    gu.resize(static_cast<size_t>(k * U * elem));
    act.resize(static_cast<size_t>(k * I * elem));
    y.resize(static_cast<size_t>(H));
    linear_parts(gu.data(), dt, x, dt, parts.data(), static_cast<int64_t>(parts.size()),
                 bias.empty() ? nullptr : bias.data(), 1, H, batch_invariant);
    activate(act.data(), gu.data(), k);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t s = slots[j];
      const auto& d = down_[experts[s]];
      linear_parts(y.data(), DType::kFloat32, act.data() + j * I * elem, dt, d.data(),
                   static_cast<int64_t>(d.size()), at(biases_.down, experts[s] * H), 1, I,
                   batch_invariant);
      add(0, y.data(), weights[s]);
    }
  } else {
    // Pairs p = t k + s grouped by expert (counting sort, tokens ascending).
    std::vector<int64_t> start(static_cast<size_t>(E + 1), 0), pairs(static_cast<size_t>(T * k));
    for (int64_t p = 0; p < T * k; ++p) ++start[experts[p] + 1];
    for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t p = 0; p < T * k; ++p) pairs[fill[experts[p]]++] = p;
    std::vector<uint8_t> xe;
    // Summing over experts in ascending order gives each token its experts'
    // outputs in ascending expert order, whatever the batch.
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = start[e + 1] - start[e];
      if (n == 0) continue;
      xe.resize(static_cast<size_t>(n * H * elem));
      gu.resize(static_cast<size_t>(n * U * elem));
      act.resize(static_cast<size_t>(n * I * elem));
      y.resize(static_cast<size_t>(n * H));
      const int64_t* ps = pairs.data() + start[e];
      for (int64_t j = 0; j < n; ++j) {
        std::memcpy(xe.data() + j * H * elem, static_cast<const uint8_t*>(x) + ps[j] / k * H * elem,
                    static_cast<size_t>(H * elem));
      }
      const auto& g = gate_up_[e];
      const auto& d = down_[e];
      linear_parts(gu.data(), dt, xe.data(), dt, g.data(), static_cast<int64_t>(g.size()),
                   at(biases_.gate_up, e * U), n, H, batch_invariant);
      activate(act.data(), gu.data(), n);
      linear_parts(y.data(), DType::kFloat32, act.data(), dt, d.data(),
                   static_cast<int64_t>(d.size()), at(biases_.down, e * H), n, I, batch_invariant);
      for (int64_t j = 0; j < n; ++j) add(ps[j] / k, y.data() + j * H, weights[ps[j]]);
    }
  }
  for (int64_t i = 0; i < T * H; ++i) store_elem(out, i, acc[i], dt);
}

}  // namespace paternoster
