#include "paternoster/block_pool.h"

#include <limits>
#include <string>

namespace paternoster {

BlockPool::BlockPool(int64_t num_blocks, bool enable_caching)
    : enable_caching_(enable_caching), num_blocks_(num_blocks), num_free_(num_blocks) {
  if (num_blocks < 0 || num_blocks >= std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("num_blocks must be in [0, 2^31 - 1), got " +
                                std::to_string(num_blocks));
  }
  const auto n = static_cast<size_t>(num_blocks);
  ref_.assign(n, 0);
  generation_.assign(n, 0);
  if (enable_caching_) {
    hash_.assign(n, 0);
    has_hash_.assign(n, 0);
  }
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

void BlockPool::push_front_free(int32_t id) {
  const auto s = static_cast<int32_t>(num_blocks_);
  const int32_t first = next_[s];
  next_[id] = first;
  prev_[id] = s;
  prev_[first] = id;
  next_[s] = id;
  ++num_free_;
}

void BlockPool::release(int32_t id) {
  if (enable_caching_ && !has_hash_[id]) {
    push_front_free(id);  // nothing to keep: reuse it first
  } else {
    push_back_free(id);
  }
}

void BlockPool::require_caching(const char* what) const {
  if (!enable_caching_) {
    throw std::logic_error(std::string(what) + ": prefix caching is disabled in this BlockPool");
  }
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
    ++generation_[id];
    if (enable_caching_ && has_hash_[id]) {  // evict
      map_.erase(hash_[id]);
      has_hash_[id] = 0;
      ++num_evictions_;
    }
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
    if (--ref_[id] == 0) release(id);
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

void BlockPool::touch(const int32_t* ids, int64_t n) {
  for (int64_t i = 0; i < n; ++i) check_id(ids[i]);
  for (int64_t i = 0; i < n; ++i) {
    if (ref_[ids[i]] == 0) unlink(ids[i]);
    ++ref_[ids[i]];
  }
}

bool BlockPool::cache_block(int32_t id, BlockHash hash) {
  require_caching("cache_block");
  check_id(id);
  if (ref_[id] == 0) throw std::invalid_argument("cache_block on free block " + std::to_string(id));
  if (has_hash_[id]) throw std::invalid_argument("block " + std::to_string(id) + " is already cached");
  if (!map_.emplace(hash, id).second) return false;
  hash_[id] = hash;
  has_hash_[id] = 1;
  return true;
}

std::optional<int32_t> BlockPool::cached_block(BlockHash hash) const {
  require_caching("cached_block");
  auto it = map_.find(hash);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

int64_t BlockPool::reset_cache() {
  require_caching("reset_cache");
  const auto n = static_cast<int64_t>(map_.size());
  for (const auto& [h, id] : map_) {
    has_hash_[id] = 0;
    if (ref_[id] == 0) {  // now an uncached free block: reuse it first
      unlink(id);
      push_front_free(id);
    }
  }
  map_.clear();
  return n;
}

std::optional<BlockHash> BlockPool::block_hash(int64_t id) const {
  check_id(id);
  if (!enable_caching_ || !has_hash_[id]) return std::nullopt;
  return hash_[id];
}

uint64_t BlockPool::generation(int64_t id) const {
  check_id(id);
  return generation_[static_cast<size_t>(id)];
}

std::vector<int32_t> BlockPool::free_block_ids() const {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(num_free_));
  const auto s = static_cast<int32_t>(num_blocks_);
  for (int32_t id = next_[s]; id != s; id = next_[id]) out.push_back(id);
  return out;
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
