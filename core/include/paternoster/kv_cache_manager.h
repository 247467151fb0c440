// KVCacheManager: per-request block tables over a BlockPool (PagedAttention,
// Kwon et al., SOSP'23).
//
// A request's block table lists the KV blocks holding its tokens in order:
// token at position p lives in block table[p / block_size], slot
// p % block_size. Tables only grow (allocate_slots) until the request is freed.
// Request ids are int64 chosen by the caller. Not thread safe.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "paternoster/block_pool.h"

namespace paternoster {

class KVCacheManager {
 public:
  // num_blocks >= 0 and block_size >= 1, else std::invalid_argument.
  KVCacheManager(int64_t num_blocks, int64_t block_size);

  // Blocks to add so that request `req_id` has KV slots for its first
  // `num_tokens` tokens: max(0, ceil(num_tokens / block_size) - table size).
  // An unknown request has an empty table. num_tokens < 0 throws
  // std::invalid_argument.
  int64_t num_required_blocks(int64_t req_id, int64_t num_tokens) const;
  bool can_allocate(int64_t req_id, int64_t num_tokens) const;

  // Grows the request's table to cover its first `num_tokens` tokens, all or
  // nothing: returns false (and changes nothing) when too few blocks are free.
  // Creates the table if the request is new (also when no block is needed).
  bool allocate_slots(int64_t req_id, int64_t num_tokens);

  // Returns all the request's blocks to the pool and forgets it; no-op for an
  // unknown request.
  void free(int64_t req_id);

  // The request's block table (a copy); std::invalid_argument if unknown.
  std::vector<int32_t> block_table(int64_t req_id) const;
  // The request's block table, or nullptr if unknown. Valid until the next
  // call that modifies this request.
  const std::vector<int32_t>* find_block_table(int64_t req_id) const;

  bool has_request(int64_t req_id) const { return tables_.count(req_id) != 0; }
  int64_t num_requests() const { return static_cast<int64_t>(tables_.size()); }
  int64_t num_free_blocks() const { return pool_.num_free_blocks(); }
  int64_t num_blocks() const { return pool_.num_blocks(); }
  int64_t block_size() const { return block_size_; }
  // Fraction of blocks in use, in [0, 1].
  double usage() const { return pool_.usage(); }

  const BlockPool& pool() const { return pool_; }

 private:
  int64_t blocks_for(int64_t num_tokens) const;

  BlockPool pool_;
  int64_t block_size_;
  std::unordered_map<int64_t, std::vector<int32_t>> tables_;
};

}  // namespace paternoster
