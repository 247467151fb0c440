#include "paternoster/block_pool.h"

#include <limits>
#include <string>

namespace paternoster {

BlockPool::BlockPool(int64_t num_blocks) : num_blocks_(num_blocks), num_free_(num_blocks) {
  if (num_blocks < 0 || num_blocks >= std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("num_blocks must be in [0, 2^31 - 1), got " +
                                std::to_string(num_blocks));
  }
  const auto n = static_cast<size_t>(num_blocks);
  ref_.assign(n, 0);
  prev_.resize(n + 1);
  next_.resize(n + 1);
  // Sentinel at index n; blocks 0..n-1 in order.
  for (size_t i = 0; i <= n; ++i) {
    prev_[i] = static_cast<int32_t>(i == 0 ? n : i - 1);
    next_[i] = static_cast<int32_t>(i == n ? 0 : i + 1);
  }
}

void BlockPool::check_id(int64_t id) const {
  if (id < 0 || id >= num_blocks_) {
    throw std::invalid_argument("block id " + std::to_string(id) + " out of range [0, " +
                                std::to_string(num_blocks_) + ")");
  }
}

void BlockPool::push_back_free(int32_t id) {
  const auto s = static_cast<int32_t>(num_blocks_);
  const int32_t last = prev_[s];
  prev_[id] = last;
  next_[id] = s;
  next_[last] = id;
  prev_[s] = id;
  ++num_free_;
}

void BlockPool::unlink(int32_t id) {
  next_[prev_[id]] = next_[id];
  prev_[next_[id]] = prev_[id];
  prev_[id] = next_[id] = -1;
  --num_free_;
}

void BlockPool::allocate_into(int64_t n, std::vector<int32_t>* out) {
  if (n < 0) throw std::invalid_argument("cannot allocate a negative number of blocks");
  if (n > num_free_) {
    throw OutOfBlocks("out of KV cache blocks: requested " + std::to_string(n) + ", " +
                      std::to_string(num_free_) + " free of " + std::to_string(num_blocks_));
  }
  out->reserve(out->size() + static_cast<size_t>(n));
  const auto s = static_cast<int32_t>(num_blocks_);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = next_[s];
    unlink(id);
    ref_[id] = 1;
    out->push_back(id);
  }
}

std::vector<int32_t> BlockPool::allocate(int64_t n) {
  std::vector<int32_t> out;
  allocate_into(n, &out);
  return out;
}

void BlockPool::free(const int32_t* ids, int64_t n) {
  // Apply in order; on an error undo what was applied (in reverse, so the free
  // list is restored exactly) and rethrow.
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= num_blocks_ || ref_[id] == 0) {
      for (int64_t j = i - 1; j >= 0; --j) {
        const int32_t u = ids[j];
        if (ref_[u] == 0) unlink(u);
        ++ref_[u];
      }
      if (id < 0 || id >= num_blocks_) check_id(id);
      throw std::invalid_argument("double free of block " + std::to_string(id));
    }
    if (--ref_[id] == 0) push_back_free(id);
  }
}

void BlockPool::incr_ref(const int32_t* ids, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    check_id(ids[i]);
    if (ref_[ids[i]] == 0) {
      throw std::invalid_argument("incr_ref on free block " + std::to_string(ids[i]));
    }
  }
  for (int64_t i = 0; i < n; ++i) ++ref_[ids[i]];
}

int32_t BlockPool::ref_count(int64_t id) const {
  check_id(id);
  return ref_[static_cast<size_t>(id)];
}

double BlockPool::usage() const {
  if (num_blocks_ == 0) return 0.0;
  return static_cast<double>(num_blocks_ - num_free_) / static_cast<double>(num_blocks_);
}

}  // namespace paternoster
