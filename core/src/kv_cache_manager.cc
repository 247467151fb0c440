#include "paternoster/kv_cache_manager.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace paternoster {

namespace {
int64_t checked_block_size(int64_t block_size) {
  if (block_size < 1) {
    throw std::invalid_argument("block_size must be >= 1, got " + std::to_string(block_size));
  }
  return block_size;
}

bool fits_int32(const int64_t* tokens, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    if (tokens[j] < std::numeric_limits<int32_t>::min() ||
        tokens[j] > std::numeric_limits<int32_t>::max()) {
      return false;
    }
  }
  return true;
}
}  // namespace

KVCacheManager::KVCacheManager(int64_t num_blocks, int64_t block_size, bool enable_caching)
    : pool_(num_blocks, enable_caching), block_size_(checked_block_size(block_size)) {
  if (enable_caching) {
    const auto n = static_cast<size_t>(num_blocks);
    parent_.resize(n);
    root_salt_.resize(n);
    block_tokens_.resize(n * static_cast<size_t>(block_size));
  }
}

int64_t KVCacheManager::blocks_for(int64_t num_tokens) const {
  if (num_tokens < 0) {
    throw std::invalid_argument("num_tokens must be >= 0, got " + std::to_string(num_tokens));
  }
  return (num_tokens + block_size_ - 1) / block_size_;
}

int64_t KVCacheManager::num_required_blocks(int64_t req_id, int64_t num_tokens) const {
  const int64_t needed = blocks_for(num_tokens);
  const auto* table = find_block_table(req_id);
  const int64_t have = table ? static_cast<int64_t>(table->size()) : 0;
  return needed > have ? needed - have : 0;
}

bool KVCacheManager::can_allocate(int64_t req_id, int64_t num_tokens) const {
  return num_required_blocks(req_id, num_tokens) <= pool_.num_free_blocks();
}

bool KVCacheManager::allocate_slots(int64_t req_id, int64_t num_tokens) {
  const int64_t extra = num_required_blocks(req_id, num_tokens);
  if (extra > pool_.num_free_blocks()) return false;
  pool_.allocate_into(extra, &tables_[req_id]);
  return true;
}

void KVCacheManager::free(int64_t req_id) {
  auto it = tables_.find(req_id);
  if (it == tables_.end()) return;
  auto& table = it->second;
  if (enable_caching()) {
    // Tail first: the request's last blocks reach the LRU end first.
    std::reverse(table.begin(), table.end());
    req_cache_.erase(req_id);
  }
  pool_.free(table);
  tables_.erase(it);
}

// ------------------------------------------------------------ prefix caching

BlockHash KVCacheManager::block_hash_at(RequestCache& st, int64_t i, const int64_t* tokens) {
  if (i < static_cast<int64_t>(st.hashes.size())) return st.hashes[static_cast<size_t>(i)];
  const BlockHash parent = i == 0 ? root_block_hash(st.salt) : st.hashes.back();
  const int64_t* block = tokens + i * block_size_;
  const BlockHash h = (hash_fn_ ? hash_fn_(parent, block, block_size_)
                                : hash_block_tokens(parent, block, block_size_)) &
                      hash_mask_;
  st.hashes.push_back(h);
  return h;
}

std::optional<int32_t> KVCacheManager::match(BlockHash hash, BlockRef parent,
                                             const int64_t* tokens,
                                             std::string_view salt) const {
  const auto found = pool_.cached_block(hash);
  if (!found) return std::nullopt;
  const auto id = static_cast<size_t>(*found);
  const BlockRef& p = parent_[id];
  if (p.id != parent.id || p.gen != parent.gen) return std::nullopt;
  if (parent.id < 0 && root_salt_[id] != salt) return std::nullopt;
  const int32_t* stored = block_tokens_.data() + id * static_cast<size_t>(block_size_);
  for (int64_t j = 0; j < block_size_; ++j) {
    if (tokens[j] != int64_t{stored[j]}) return std::nullopt;
  }
  return found;
}

void KVCacheManager::record(int32_t id, BlockRef parent, const int64_t* tokens,
                            std::string_view salt) {
  const auto i = static_cast<size_t>(id);
  parent_[i] = parent;
  root_salt_[i] = parent.id < 0 ? std::string(salt) : std::string();
  int32_t* out = block_tokens_.data() + i * static_cast<size_t>(block_size_);
  for (int64_t j = 0; j < block_size_; ++j) out[j] = static_cast<int32_t>(tokens[j]);
}

int64_t KVCacheManager::get_computed_blocks(int64_t req_id, const int64_t* tokens, int64_t n,
                                            std::string_view cache_salt) {
  if (n < 0) throw std::invalid_argument("negative token count " + std::to_string(n));
  if (!enable_caching()) return 0;
  if (tables_.count(req_id) != 0) {
    throw std::invalid_argument("get_computed_blocks: request " + std::to_string(req_id) +
                                " already has KV blocks (free it first)");
  }
  RequestCache& st = req_cache_[req_id];
  st = RequestCache{};
  st.salt.assign(cache_salt.data(), cache_salt.size());
  std::vector<int32_t>& table = tables_[req_id];
  const int64_t max_blocks = n > 0 ? (n - 1) / block_size_ : 0;  // keep the last token
  for (int64_t i = 0; i < max_blocks; ++i) {
    const BlockHash h = block_hash_at(st, i, tokens);
    const auto hit = match(h, st.last, tokens + i * block_size_, st.salt);
    if (!hit) break;
    table.push_back(*hit);
    st.last = BlockRef{*hit, pool_.generation(*hit)};
  }
  pool_.touch(table);
  st.num_linked = static_cast<int64_t>(table.size());
  const int64_t computed = st.num_linked * block_size_;
  queries_ += n;
  hits_ += computed;
  return computed;
}

bool KVCacheManager::has_blocks_to_cache(int64_t req_id, int64_t num_tokens) const {
  if (!enable_caching()) return false;
  auto it = req_cache_.find(req_id);
  if (it == req_cache_.end()) return num_tokens >= block_size_;
  return !it->second.stopped && num_tokens / block_size_ > it->second.num_linked;
}

void KVCacheManager::cache_blocks(int64_t req_id, const int64_t* tokens, int64_t num_tokens) {
  if (!enable_caching()) return;
  if (num_tokens < 0) {
    throw std::invalid_argument("num_tokens must be >= 0, got " + std::to_string(num_tokens));
  }
  auto tit = tables_.find(req_id);
  if (tit == tables_.end()) {
    throw std::invalid_argument("cache_blocks: unknown request id " + std::to_string(req_id));
  }
  const std::vector<int32_t>& table = tit->second;
  const int64_t full = num_tokens / block_size_;
  if (full > static_cast<int64_t>(table.size())) {
    throw std::invalid_argument("cache_blocks: request " + std::to_string(req_id) + " has " +
                                std::to_string(table.size()) + " blocks, fewer than the " +
                                std::to_string(full) + " full blocks of " +
                                std::to_string(num_tokens) + " tokens");
  }
  RequestCache& st = req_cache_[req_id];
  for (int64_t i = st.num_linked; i < full && !st.stopped; ++i) {
    if (i > 0) {
      // The parent may be another request's copy that was evicted meanwhile.
      const auto parent_hash = pool_.block_hash(st.last.id);
      if (pool_.generation(st.last.id) != st.last.gen || !parent_hash ||
          *parent_hash != st.hashes[static_cast<size_t>(i - 1)]) {
        st.stopped = true;
        break;
      }
    }
    const BlockHash h = block_hash_at(st, i, tokens);
    const int64_t* block_tokens = tokens + i * block_size_;
    auto canonical = match(h, st.last, block_tokens, st.salt);
    if (!canonical) {
      if (!fits_int32(block_tokens, block_size_)) {  // cannot be stored for the check
        st.stopped = true;
        break;
      }
      const int32_t own = table[static_cast<size_t>(i)];
      if (!pool_.cache_block(own, h)) {  // hash taken by other content
        st.stopped = true;
        break;
      }
      record(own, st.last, block_tokens, st.salt);
      canonical = own;
    }
    st.last = BlockRef{*canonical, pool_.generation(*canonical)};
    st.num_linked = i + 1;
  }
}

int64_t KVCacheManager::reset_prefix_cache() {
  if (!enable_caching()) return 0;
  for (auto& [id, st] : req_cache_) st.stopped = true;
  return pool_.reset_cache();
}

// ------------------------------------------------------------ tables

const std::vector<int32_t>* KVCacheManager::find_block_table(int64_t req_id) const {
  auto it = tables_.find(req_id);
  return it == tables_.end() ? nullptr : &it->second;
}

std::vector<int32_t> KVCacheManager::block_table(int64_t req_id) const {
  const auto* table = find_block_table(req_id);
  if (!table) throw std::invalid_argument("unknown request id " + std::to_string(req_id));
  return *table;
}

}  // namespace paternoster
