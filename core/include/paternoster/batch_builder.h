// BatchBuilder: turns one step's schedule into the flat arrays a forward pass
// over a paged KV cache needs (input ids, positions, slot mapping, block
// tables, sequence lengths, query start offsets, logits indices).
//
// It keeps every live request's token ids (prompt + generated) so that the
// step needs no per-token work in Python. Block tables come from the
// KVCacheManager it was built with, which must outlive it. Not thread safe.
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "paternoster/kv_cache_manager.h"

namespace paternoster {

// Sizes of one batch: B sequences, T tokens, M = max blocks of any row, and
// G = the KV cache manager's groups.
struct BatchShape {
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;
  int64_t max_blocks = 0;
  int64_t num_groups = 1;
};

// Caller-owned output buffers, sized from a BatchShape (B, T, M, G):
// input_ids/positions/slot_mapping [T], block_tables [B, M] row-major,
// seq_lens [B], query_start_loc [B + 1], logits_indices [B]; slot_mapping and
// block_tables are group 0's, group_slot_mapping [G - 1, T] and
// group_block_tables [G - 1, B, M] the other groups' (null when G == 1). A
// recurrent-state group's row holds the request's state slot in column 0 (the
// rest 0) and its slot_mapping the same slot for each of the request's tokens.
struct BatchBuffers {
  int64_t* input_ids = nullptr;
  int64_t* positions = nullptr;
  int64_t* slot_mapping = nullptr;
  int32_t* block_tables = nullptr;
  int32_t* seq_lens = nullptr;
  int32_t* query_start_loc = nullptr;
  int64_t* logits_indices = nullptr;
  int64_t* group_slot_mapping = nullptr;
  int32_t* group_block_tables = nullptr;
};

// The same arrays in owning vectors (BatchBuilder::build).
struct Batch {
  BatchShape shape;
  std::vector<int64_t> input_ids, positions, slot_mapping, logits_indices, group_slot_mapping;
  std::vector<int32_t> block_tables, seq_lens, query_start_loc, group_block_tables;

  // Sizes every vector for `shape` (num_tokens entries for the per-token
  // arrays, num_seqs x max_blocks for block_tables, num_seqs + 1 for
  // query_start_loc; capacity is reused) and returns views of them, the
  // allocator BatchBuilder::build_into expects. std::bad_alloc on failure.
  BatchBuffers resize(const BatchShape& shape);
};

class BatchBuilder {
 public:
  explicit BatchBuilder(const KVCacheManager& kv_cache_manager);

  // Registers a request with its prompt tokens. std::invalid_argument if the
  // id is already registered.
  void add_request(int64_t req_id, const int64_t* token_ids, int64_t n);
  void add_request(int64_t req_id, const std::vector<int64_t>& token_ids) {
    add_request(req_id, token_ids.data(), static_cast<int64_t>(token_ids.size()));
  }
  // Appends token_ids[i] to request req_ids[i], for i < n. All ids are checked
  // first: an unknown id throws std::invalid_argument and nothing is appended.
  void append_tokens(const int64_t* req_ids, const int64_t* token_ids, int64_t n);
  void append_tokens(const int64_t* req_ids, const int32_t* token_ids, int64_t n);
  // Forgets a request; no-op if unknown.
  void remove_request(int64_t req_id);

  bool has_request(int64_t req_id) const { return tokens_.count(req_id) != 0; }
  int64_t num_requests() const { return static_cast<int64_t>(tokens_.size()); }
  // Number of tokens held for the request; std::invalid_argument if unknown.
  int64_t num_tokens(int64_t req_id) const;
  // The request's tokens, or nullptr if unknown (valid until it changes).
  const std::vector<int64_t>* find_tokens(int64_t req_id) const;

  // Builds the batch for B = n requests where request req_ids[b] computes its
  // tokens num_computed[b] .. num_computed[b] + num_scheduled[b] - 1:
  //   input_ids[t], positions[t]  token id and position of flat token t
  //   slot_mapping[t]             block_table[pos / bs] * bs + pos % bs
  //   seq_lens[b]                 num_computed[b] + num_scheduled[b]
  //   query_start_loc[b]          offset of request b's first token (B + 1)
  //   block_tables[b, :]          first ceil(seq_lens[b] / bs) blocks, 0-padded
  //                               (kNoBlock where a sliding-window group
  //                               released the block)
  //   logits_indices[b]           query_start_loc[b + 1] - 1
  // and slot_mapping / block_tables of every further KV cache group.
  // `alloc` receives the shape once everything is validated and returns the
  // buffers to fill. Throws std::invalid_argument (before calling alloc) when a
  // request is unknown or listed twice, num_computed < 0, num_scheduled < 1,
  // the request holds fewer than seq_lens[b] tokens, or a group's block table
  // covers fewer than seq_lens[b] slots or lacks a block for a scheduled token.
  void build_into(const int64_t* req_ids, const int32_t* num_computed,
                  const int32_t* num_scheduled, int64_t n,
                  const std::function<BatchBuffers(const BatchShape&)>& alloc) const;
  Batch build(const std::vector<int64_t>& req_ids, const std::vector<int32_t>& num_computed,
              const std::vector<int32_t>& num_scheduled) const;

 private:
  struct Entry {
    const std::vector<int64_t>* tokens;
  };
  // Request b's block table in group g (validated by build_into).
  const std::vector<int32_t>& table(int64_t b, int64_t g) const {
    return *tables_[static_cast<size_t>(b * kv_.num_groups() + g)];
  }
  template <typename T>
  void append_impl(const int64_t* req_ids, const T* token_ids, int64_t n);

  const KVCacheManager& kv_;
  std::unordered_map<int64_t, std::vector<int64_t>> tokens_;
  mutable std::vector<Entry> entries_;     // scratch for build_into
  mutable std::vector<const std::vector<int32_t>*> tables_;  // [B, G], scratch
  mutable std::vector<int64_t> sorted_;    // scratch for the duplicate check
  mutable std::vector<std::vector<int64_t>*> targets_;  // scratch for append
};

}  // namespace paternoster
