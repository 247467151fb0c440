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
  shape.num_groups = kv_.num_groups();
  const int64_t G = shape.num_groups;
  entries_.resize(static_cast<size_t>(n));
  tables_.resize(static_cast<size_t>(n * G));
  for (int64_t b = 0; b < n; ++b) {
    const int64_t id = req_ids[b];
    const auto* tokens = find_tokens(id);
    if (!tokens) fail("unknown request id " + std::to_string(id) + " (not in BatchBuilder)");
    if (!kv_.find_block_table(id)) fail("request id " + std::to_string(id) + " has no KV cache blocks");
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
    for (int64_t g = 0; g < G; ++g) {
      const auto* table = kv_.find_block_table(id, g);
      const std::string where = G > 1 ? " in KV cache group " + std::to_string(g) : "";
      if (kv_.group(g).recurrent) {  // one state slot, however long the request
        if (table->size() != 1) {
          fail("request " + std::to_string(id) + " has no state slot" + where);
        }
        tables_[static_cast<size_t>(b * G + g)] = table;
        continue;
      }
      if (blocks > static_cast<int64_t>(table->size())) {
        fail("request " + std::to_string(id) + " lacks KV slots" + where + ": needs " +
             std::to_string(blocks) + " blocks, has " + std::to_string(table->size()));
      }
      if ((*table)[static_cast<size_t>(num_computed[b] / bs)] == kNoBlock) {
        fail("request " + std::to_string(id) + " has no block" + where + " for position " +
             std::to_string(num_computed[b]) + " (released out of the sliding window)");
      }
      tables_[static_cast<size_t>(b * G + g)] = table;
    }
    entries_[b] = {tokens};
    shape.num_tokens += num_scheduled[b];
    shape.max_blocks = std::max(shape.max_blocks, blocks);
  }
  if (shape.num_tokens > INT32_MAX) fail("batch has more than 2^31 - 1 tokens");

  const BatchBuffers out = alloc(shape);
  const int64_t m = shape.max_blocks, T = shape.num_tokens;
  int64_t t = 0;
  out.query_start_loc[0] = 0;
  for (int64_t b = 0; b < n; ++b) {
    const Entry& e = entries_[b];
    const int64_t start = num_computed[b];
    const int64_t q_len = num_scheduled[b];
    const int64_t seq_len = start + q_len;
    const int64_t blocks = (seq_len + bs - 1) / bs;
    std::memcpy(out.input_ids + t, e.tokens->data() + start, sizeof(int64_t) * q_len);
    for (int64_t i = 0; i < q_len; ++i) out.positions[t + i] = start + i;
    for (int64_t g = 0; g < G; ++g) {
      int64_t* slots = g == 0 ? out.slot_mapping : out.group_slot_mapping + (g - 1) * T;
      int32_t* rows = g == 0 ? out.block_tables : out.group_block_tables + (g - 1) * n * m;
      const int32_t* tab = table(b, g).data();
      int32_t* row = rows + b * m;
      if (kv_.group(g).recurrent) {  // the state slot in every token's entry and column 0
        std::fill(slots + t, slots + t + q_len, int64_t{tab[0]});
        row[0] = tab[0];
        std::fill(row + 1, row + m, 0);
        continue;
      }
      for (int64_t i = 0; i < q_len; ++i) {
        const int64_t pos = start + i;
        slots[t + i] = int64_t{tab[pos / bs]} * bs + pos % bs;
      }
      std::memcpy(row, tab, sizeof(int32_t) * blocks);
      std::fill(row + blocks, row + m, 0);
    }
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
  const auto extra = static_cast<size_t>(s.num_groups - 1);
  group_slot_mapping.resize(extra * t);
  group_block_tables.resize(extra * b * static_cast<size_t>(s.max_blocks));
  return BatchBuffers{input_ids.data(),
                      positions.data(),
                      slot_mapping.data(),
                      block_tables.data(),
                      seq_lens.data(),
                      query_start_loc.data(),
                      logits_indices.data(),
                      extra ? group_slot_mapping.data() : nullptr,
                      extra ? group_block_tables.data() : nullptr};
}

}  // namespace paternoster
