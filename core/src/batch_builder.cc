#include "paternoster/batch_builder.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace paternoster {

namespace {
[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }
}  // namespace

BatchBuilder::BatchBuilder(const KVCacheManager& kv_cache_manager) : kv_(kv_cache_manager) {}

void BatchBuilder::add_request(int64_t req_id, const int64_t* token_ids, int64_t n) {
  if (n < 0) fail("negative token count");
  auto [it, inserted] = tokens_.try_emplace(req_id);
  if (!inserted) fail("request id " + std::to_string(req_id) + " is already registered");
  it->second.assign(token_ids, token_ids + n);
}

template <typename T>
void BatchBuilder::append_impl(const int64_t* req_ids, const T* token_ids, int64_t n) {
  targets_.clear();
  for (int64_t i = 0; i < n; ++i) {
    auto it = tokens_.find(req_ids[i]);
    if (it == tokens_.end()) fail("unknown request id " + std::to_string(req_ids[i]));
    targets_.push_back(&it->second);
  }
  for (int64_t i = 0; i < n; ++i) targets_[i]->push_back(static_cast<int64_t>(token_ids[i]));
}

void BatchBuilder::append_tokens(const int64_t* req_ids, const int64_t* token_ids, int64_t n) {
  append_impl(req_ids, token_ids, n);
}

void BatchBuilder::append_tokens(const int64_t* req_ids, const int32_t* token_ids, int64_t n) {
  append_impl(req_ids, token_ids, n);
}

void BatchBuilder::remove_request(int64_t req_id) { tokens_.erase(req_id); }

const std::vector<int64_t>* BatchBuilder::find_tokens(int64_t req_id) const {
  auto it = tokens_.find(req_id);
  return it == tokens_.end() ? nullptr : &it->second;
}

int64_t BatchBuilder::num_tokens(int64_t req_id) const {
  const auto* t = find_tokens(req_id);
  if (!t) fail("unknown request id " + std::to_string(req_id));
  return static_cast<int64_t>(t->size());
}

void BatchBuilder::build_into(const int64_t* req_ids, const int32_t* num_computed,
                              const int32_t* num_scheduled, int64_t n,
                              const std::function<BatchBuffers(const BatchShape&)>& alloc) const {
  if (n < 0) fail("negative batch size");
  const int64_t bs = kv_.block_size();
  sorted_.assign(req_ids, req_ids + n);
  std::sort(sorted_.begin(), sorted_.end());
  auto dup = std::adjacent_find(sorted_.begin(), sorted_.end());
  if (dup != sorted_.end()) fail("request id " + std::to_string(*dup) + " listed twice");

  BatchShape shape;
  shape.num_seqs = n;
  entries_.resize(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; ++b) {
    const int64_t id = req_ids[b];
    const auto* tokens = find_tokens(id);
    if (!tokens) fail("unknown request id " + std::to_string(id) + " (not in BatchBuilder)");
    const auto* table = kv_.find_block_table(id);
    if (!table) fail("request id " + std::to_string(id) + " has no KV cache blocks");
    if (num_computed[b] < 0) {
      fail("num_computed_tokens must be >= 0 (request " + std::to_string(id) + ")");
    }
    if (num_scheduled[b] < 1) {
      fail("num_scheduled_tokens must be >= 1 (request " + std::to_string(id) + ")");
    }
    const int64_t seq_len = int64_t{num_computed[b]} + num_scheduled[b];
    if (seq_len > static_cast<int64_t>(tokens->size())) {
      fail("request " + std::to_string(id) + " has " + std::to_string(tokens->size()) +
           " tokens; the schedule needs " + std::to_string(seq_len));
    }
    const int64_t blocks = (seq_len + bs - 1) / bs;
    if (blocks > static_cast<int64_t>(table->size())) {
      fail("request " + std::to_string(id) + " lacks KV slots: needs " + std::to_string(blocks) +
           " blocks, has " + std::to_string(table->size()));
    }
    entries_[b] = {tokens, table};
    shape.num_tokens += num_scheduled[b];
    shape.max_blocks = std::max(shape.max_blocks, blocks);
  }
  if (shape.num_tokens > INT32_MAX) fail("batch has more than 2^31 - 1 tokens");

  const BatchBuffers out = alloc(shape);
  const int64_t m = shape.max_blocks;
  int64_t t = 0;
  out.query_start_loc[0] = 0;
  for (int64_t b = 0; b < n; ++b) {
    const Entry& e = entries_[b];
    const int64_t start = num_computed[b];
    const int64_t q_len = num_scheduled[b];
    const int64_t seq_len = start + q_len;
    std::memcpy(out.input_ids + t, e.tokens->data() + start, sizeof(int64_t) * q_len);
    const int32_t* table = e.table->data();
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t pos = start + i;
      out.positions[t + i] = pos;
      out.slot_mapping[t + i] = int64_t{table[pos / bs]} * bs + pos % bs;
    }
    const int64_t blocks = (seq_len + bs - 1) / bs;
    int32_t* row = out.block_tables + b * m;
    std::memcpy(row, table, sizeof(int32_t) * blocks);
    std::fill(row + blocks, row + m, 0);
    t += q_len;
    out.seq_lens[b] = static_cast<int32_t>(seq_len);
    out.query_start_loc[b + 1] = static_cast<int32_t>(t);
    out.logits_indices[b] = t - 1;
  }
}

Batch BatchBuilder::build(const std::vector<int64_t>& req_ids,
                          const std::vector<int32_t>& num_computed,
                          const std::vector<int32_t>& num_scheduled) const {
  if (num_computed.size() != req_ids.size() || num_scheduled.size() != req_ids.size()) {
    fail("req_ids, num_computed_tokens and num_scheduled_tokens must have the same length");
  }
  Batch batch;
  build_into(req_ids.data(), num_computed.data(), num_scheduled.data(),
             static_cast<int64_t>(req_ids.size()),
             [&batch](const BatchShape& s) { return batch.resize(s); });
  return batch;
}

BatchBuffers Batch::resize(const BatchShape& s) {
  const auto b = static_cast<size_t>(s.num_seqs);
  const auto t = static_cast<size_t>(s.num_tokens);
  shape = s;
  input_ids.resize(t);
  positions.resize(t);
  slot_mapping.resize(t);
  block_tables.resize(b * static_cast<size_t>(s.max_blocks));
  seq_lens.resize(b);
  query_start_loc.resize(b + 1);
  logits_indices.resize(b);
  return BatchBuffers{input_ids.data(),    positions.data(),       slot_mapping.data(),
                      block_tables.data(), seq_lens.data(),        query_start_loc.data(),
                      logits_indices.data()};
}

}  // namespace paternoster
