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
#include <stdexcept>
#include <vector>

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
  // not fit in int32).
  explicit BlockPool(int64_t num_blocks);

  // Takes n free blocks (ref count 1 each), all or nothing. n < 0 throws
  // std::invalid_argument; n > num_free_blocks() throws OutOfBlocks.
  std::vector<int32_t> allocate(int64_t n);
  // Appends the n taken blocks to *out instead of returning a new vector.
  void allocate_into(int64_t n, std::vector<int32_t>* out);
  bool can_allocate(int64_t n) const { return n >= 0 && n <= num_free_; }

  // Drops one reference to each listed block (a block may be listed several
  // times, once per reference); blocks reaching zero go to the back of the free
  // list. Throws std::invalid_argument for an id out of range or a block with
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

  // Reference count of one block (0 = free). Throws std::invalid_argument if
  // out of range.
  int32_t ref_count(int64_t id) const;

  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_free_blocks() const { return num_free_; }
  // Fraction of blocks in use, in [0, 1] (0 for an empty pool).
  double usage() const;

 private:
  void check_id(int64_t id) const;
  void push_back_free(int32_t id);
  void unlink(int32_t id);

  int64_t num_blocks_;
  int64_t num_free_;
  std::vector<int32_t> ref_;
  // Intrusive circular list over indices [0, num_blocks]; index num_blocks is
  // the sentinel. A block in use has prev_ = next_ = -1.
  std::vector<int32_t> prev_;
  std::vector<int32_t> next_;
};

}  // namespace paternoster
