// DecoderStack's argument checks (its numerics are checked from Python
// against the layer-by-layer model: tests/model/test_fused_stack.py).
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "paternoster/decoder.h"

namespace paternoster {
namespace {

DecoderConfig small_config(const float* table) {
  DecoderConfig c;
  c.hidden_size = 8;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_size = 4;
  c.intermediate_size = 8;
  c.cos_sin_cache = table;
  c.max_positions = 4;
  c.num_blocks = 2;
  c.block_size = 4;
  return c;
}

// A layer whose every array is `buf` (the checks read no values).
DecoderLayer layer_on(float* buf) {
  DecoderLayer layer;
  layer.input_norm = layer.post_attention_norm = buf;
  layer.qkv.data = layer.o.data = layer.gate_up.data = layer.down.data = buf;
  layer.key_cache = layer.value_cache = buf;
  return layer;
}

TEST(DecoderStack, RejectsBadConfigs) {
  std::vector<float> buf(1024);
  const DecoderLayer layer = layer_on(buf.data());
  EXPECT_NO_THROW(DecoderStack(small_config(buf.data()), {layer}, buf.data()));

  EXPECT_THROW(DecoderStack(small_config(buf.data()), {}, buf.data()), std::invalid_argument);
  EXPECT_THROW(DecoderStack(small_config(buf.data()), {layer}, nullptr), std::invalid_argument);
  DecoderConfig c = small_config(buf.data());
  c.num_kv_heads = 3;
  EXPECT_THROW(DecoderStack(c, {layer}, buf.data()), std::invalid_argument);
  c = small_config(nullptr);
  EXPECT_THROW(DecoderStack(c, {layer}, buf.data()), std::invalid_argument);
  DecoderLayer no_cache = layer;
  no_cache.value_cache = nullptr;
  EXPECT_THROW(DecoderStack(small_config(buf.data()), {no_cache}, buf.data()),
               std::invalid_argument);
  DecoderLayer bf16_weight = layer;  // a bfloat16 weight in a float32 model
  bf16_weight.o.format = WeightFormat::kBFloat16;
  EXPECT_THROW(DecoderStack(small_config(buf.data()), {bf16_weight}, buf.data()),
               std::invalid_argument);
  DecoderLayer q_norm_only = layer;  // per-head norms come in pairs
  q_norm_only.q_norm = buf.data();
  EXPECT_THROW(DecoderStack(small_config(buf.data()), {q_norm_only}, buf.data()),
               std::invalid_argument);
  DecoderLayer windowed = layer;
  windowed.sliding_window = 4;
  EXPECT_NO_THROW(DecoderStack(small_config(buf.data()), {layer, windowed}, buf.data()));
  windowed.sliding_window = -1;
  EXPECT_THROW(DecoderStack(small_config(buf.data()), {layer, windowed}, buf.data()),
               std::invalid_argument);
}

TEST(DecoderStack, EmptyStepIsANoOp) {
  std::vector<float> buf(1024);
  DecoderStack stack(small_config(buf.data()), {layer_on(buf.data())}, buf.data());
  EXPECT_NO_THROW(stack.forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0,
                                0, 0));
  EXPECT_THROW(stack.forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1,
                             1),
               std::invalid_argument);
}

}  // namespace
}  // namespace paternoster
