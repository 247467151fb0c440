// BlockPool: a fixed set of KV cache blocks with reference counts.
//
// Free blocks form an intrusive doubly linked list threaded through two index
// arrays (prev/next), so taking a block, returning it and unlinking a given
// free block are all O(1). Blocks are taken from the front of the free list and
// returned to the back, so the list is in least-recently-freed order (the order
// a prefix cache would evict in).
//
// Block ids are int32 in [0, num_blocks). Not thread safe: one owner (the
// engine's scheduler thread) drives it.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <stdexcept>
#include <vector>

#include "paternoster/block_hash.h"

namespace paternoster {

// Thrown by BlockPool::allocate when fewer blocks are free than requested.
// Nothing is allocated in that case. The Python binding raises
// paternoster._core.OutOfBlocksError (a RuntimeError subclass).
class OutOfBlocks : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class BlockPool {
 public:
  // num_blocks >= 0; throws std::invalid_argument otherwise (or when it does
  // not fit in int32). enable_caching = false keeps no hashes at all: every
  // freed block goes to the back of the free list, and the cache methods
  // below throw std::logic_error.
  explicit BlockPool(int64_t num_blocks, bool enable_caching = false);

  // Takes n free blocks (ref count 1 each) from the front of the free list,
  // all or nothing, evicting cached ones (their hash leaves the map). n < 0
  // throws std::invalid_argument; n > num_free_blocks() throws OutOfBlocks.
  std::vector<int32_t> allocate(int64_t n);
  // Appends the n taken blocks to *out instead of returning a new vector.
  void allocate_into(int64_t n, std::vector<int32_t>* out);
  bool can_allocate(int64_t n) const { return n >= 0 && n <= num_free_; }

  // Drops one reference to each listed block (a block may be listed several
  // times, once per reference); blocks reaching zero go to the back of the free
  // list (with caching on: cached blocks to the back, uncached to the front). Throws std::invalid_argument for an id out of range or a block with
  // no reference left (double free); then no ref count changes.
  void free(const int32_t* ids, int64_t n);
  void free(const std::vector<int32_t>& ids) { free(ids.data(), static_cast<int64_t>(ids.size())); }

  // Adds one reference to each listed block (for sharing a block between
  // requests). Every block must be in use; otherwise std::invalid_argument and
  // no change.
  void incr_ref(const int32_t* ids, int64_t n);
  void incr_ref(const std::vector<int32_t>& ids) {
    incr_ref(ids.data(), static_cast<int64_t>(ids.size()));
  }

  // Adds one reference to each listed block, reviving free ones (a cache hit:
  // the block leaves the free list, keeping its hash). Works with caching off
  // too. Out-of-range id: std::invalid_argument and no change.
  void touch(const int32_t* ids, int64_t n);
  void touch(const std::vector<int32_t>& ids) { touch(ids.data(), static_cast<int64_t>(ids.size())); }

  // ---- prefix cache (enable_caching only; std::logic_error otherwise)

  // Registers in-use block `id` as holding the content hashed `hash`. Returns
  // false (and changes nothing) when another block already holds that hash.
  // std::invalid_argument: id out of range, block free, or already cached.
  bool cache_block(int32_t id, BlockHash hash);
  // The block registered under `hash`, if any (in use or free).
  std::optional<int32_t> cached_block(BlockHash hash) const;
  // Drops every block's hash (in use or free) and empties the map; cached free
  // blocks move to the front of the free list. Returns the blocks uncached.
  int64_t reset_cache();

  // The block's hash, if cached. std::invalid_argument if out of range.
  std::optional<BlockHash> block_hash(int64_t id) const;
  // How many times the block was handed out by allocate(); with the id it
  // names one content of the block. std::invalid_argument if out of range.
  uint64_t generation(int64_t id) const;
  // Blocks with a hash (free or in use); 0 with caching off.
  int64_t num_cached_blocks() const { return static_cast<int64_t>(map_.size()); }
  // Cached blocks evicted by allocate() so far.
  int64_t num_evictions() const { return num_evictions_; }
  bool enable_caching() const { return enable_caching_; }
  // The free blocks in the order allocate() would take them (O(free); for
  // tests and debugging).
  std::vector<int32_t> free_block_ids() const;

  // Reference count of one block (0 = free). Throws std::invalid_argument if
  // out of range.
  int32_t ref_count(int64_t id) const;

  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_free_blocks() const { return num_free_; }
  // Fraction of blocks in use, in [0, 1] (0 for an empty pool).
  double usage() const;

 private:
  void check_id(int64_t id) const;
  void require_caching(const char* what) const;
  void push_back_free(int32_t id);
  void push_front_free(int32_t id);
  void release(int32_t id);  // ref count reached 0: back or front of the list
  void unlink(int32_t id);

  bool enable_caching_;
  int64_t num_blocks_;
  int64_t num_evictions_ = 0;
  int64_t num_free_;
  std::vector<int32_t> ref_;
  // Intrusive circular list over indices [0, num_blocks]; index num_blocks is
  // the sentinel. A block in use has prev_ = next_ = -1.
  std::vector<int32_t> prev_;
  std::vector<int32_t> next_;
  std::vector<uint64_t> generation_;
  // Prefix cache: per-block hash (valid where has_hash_) and hash -> block.
  std::vector<BlockHash> hash_;
  std::vector<uint8_t> has_hash_;
  std::unordered_map<BlockHash, int32_t> map_;
};

}  // namespace paternoster
