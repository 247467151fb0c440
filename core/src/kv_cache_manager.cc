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

namespace {
// Blocks a table holds: released entries (kNoBlock) are always a prefix, as
// a window only moves forward, so a binary search finds where they end.
int64_t live_blocks(const std::vector<int32_t>& table) {
  const auto live = std::partition_point(table.begin(), table.end(),
                                         [](int32_t id) { return id == kNoBlock; });
  return static_cast<int64_t>(table.end() - live);
}

std::vector<KVCacheGroupSpec> checked_groups(std::vector<KVCacheGroupSpec> groups) {
  if (groups.empty()) throw std::invalid_argument("a KVCacheManager needs at least one group");
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].sliding_window < 0) {
      throw std::invalid_argument("group " + std::to_string(g) + ": sliding_window must be >= 0, got " +
                                  std::to_string(groups[g].sliding_window));
    }
    if (groups[g].recurrent && groups[g].sliding_window != 0) {
      throw std::invalid_argument("group " + std::to_string(g) +
                                  ": a recurrent-state group has no sliding_window");
    }
  }
  return groups;
}

int64_t count_recurrent(const std::vector<KVCacheGroupSpec>& groups) {
  return std::count_if(groups.begin(), groups.end(),
                       [](const KVCacheGroupSpec& g) { return g.recurrent; });
}
}  // namespace

KVCacheManager::KVCacheManager(int64_t num_blocks, int64_t block_size, bool enable_caching,
                               std::vector<KVCacheGroupSpec> groups, int64_t num_state_slots)
    : pool_(num_blocks, enable_caching),
      block_size_(checked_block_size(block_size)),
      groups_(checked_groups(std::move(groups))),
      num_state_slots_(num_state_slots),
      num_recurrent_groups_(count_recurrent(groups_)) {
  if (num_state_slots < 0 || num_state_slots > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("num_state_slots must be in [0, 2^31 - 1], got " +
                                std::to_string(num_state_slots));
  }
  if (num_recurrent_groups_ > 0 && num_state_slots < 1) {
    throw std::invalid_argument("recurrent-state groups need num_state_slots >= 1");
  }
  if (num_recurrent_groups_ > 0 && enable_caching) {
    throw std::invalid_argument(
        "prefix caching is not supported with recurrent-state groups (their states are not "
        "saved at block boundaries): create the manager with enable_caching = false");
  }
  free_state_slots_.reserve(static_cast<size_t>(num_state_slots));
  for (int64_t s = num_state_slots - 1; s >= 0; --s) {
    free_state_slots_.push_back(static_cast<int32_t>(s));
  }
  if (enable_caching) {
    const auto n = static_cast<size_t>(num_blocks);
    parent_.resize(n);
    root_salt_.resize(n);
    block_group_.resize(n);
    block_tokens_.resize(n * static_cast<size_t>(block_size));
  }
}

void KVCacheManager::check_group(int64_t g) const {
  if (g < 0 || g >= num_groups()) {
    throw std::invalid_argument("KV cache group " + std::to_string(g) + " out of range [0, " +
                                std::to_string(num_groups()) + ")");
  }
}

const KVCacheGroupSpec& KVCacheManager::group(int64_t g) const {
  check_group(g);
  return groups_[static_cast<size_t>(g)];
}

int64_t KVCacheManager::blocks_for(int64_t num_tokens) const {
  if (num_tokens < 0) {
    throw std::invalid_argument("num_tokens must be >= 0, got " + std::to_string(num_tokens));
  }
  return (num_tokens + block_size_ - 1) / block_size_;
}

int64_t KVCacheManager::first_needed_block(int64_t g, int64_t num_computed) const {
  const int64_t w = groups_[static_cast<size_t>(g)].sliding_window;
  if (w == 0) return 0;
  // The next query (position num_computed) sees positions >= num_computed - W + 1.
  return std::max<int64_t>(0, num_computed - w + 1) / block_size_;
}

int64_t KVCacheManager::num_required_blocks(int64_t req_id, int64_t num_tokens,
                                            int64_t num_computed_tokens) const {
  const int64_t needed = blocks_for(num_tokens);
  if (num_computed_tokens < 0) {
    throw std::invalid_argument("num_computed_tokens must be >= 0, got " +
                                std::to_string(num_computed_tokens));
  }
  const auto it = tables_.find(req_id);
  int64_t growth = 0;
  for (int64_t g = 0; g < num_groups(); ++g) {
    if (groups_[static_cast<size_t>(g)].recurrent) continue;  // a state slot, no blocks
    const std::vector<int32_t>* table =
        it == tables_.end() ? nullptr : &it->second[static_cast<size_t>(g)];
    const int64_t size = table ? static_cast<int64_t>(table->size()) : 0;
    const int64_t first = first_needed_block(g, num_computed_tokens);
    // Held after: entries [first, max(size, needed)); held now: live entries.
    const int64_t after = std::max<int64_t>(0, std::max(size, needed) - first);
    growth += after - (table ? live_blocks(*table) : 0);
  }
  return std::max<int64_t>(0, growth);
}

int64_t KVCacheManager::num_required_state_slots(int64_t req_id) const {
  if (num_recurrent_groups_ == 0) return 0;
  const auto it = tables_.find(req_id);
  if (it == tables_.end()) return num_recurrent_groups_;
  int64_t n = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g].recurrent && it->second[g].empty()) ++n;
  }
  return n;
}

bool KVCacheManager::can_allocate(int64_t req_id, int64_t num_tokens,
                                  int64_t num_computed_tokens) const {
  return num_required_blocks(req_id, num_tokens, num_computed_tokens) <= pool_.num_free_blocks() &&
         num_required_state_slots(req_id) <= num_free_state_slots();
}

bool KVCacheManager::allocate_slots(int64_t req_id, int64_t num_tokens,
                                    int64_t num_computed_tokens) {
  if (!can_allocate(req_id, num_tokens, num_computed_tokens)) return false;
  const int64_t needed = blocks_for(num_tokens);
  auto [it, created] = tables_.try_emplace(req_id);
  Tables& tables = it->second;
  if (created) tables.resize(groups_.size());
  for (int64_t g = 0; g < num_groups(); ++g) {
    std::vector<int32_t>& table = tables[static_cast<size_t>(g)];
    if (groups_[static_cast<size_t>(g)].recurrent) {
      if (table.empty()) {  // the request's state slot, for its whole life
        table.push_back(free_state_slots_.back());
        free_state_slots_.pop_back();
      }
      continue;
    }
    const int64_t first = first_needed_block(g, num_computed_tokens);
    // Release what fell out of the window (tail first, as free() does).
    for (int64_t i = std::min<int64_t>(first, static_cast<int64_t>(table.size())) - 1; i >= 0;
         --i) {
      int32_t& id = table[static_cast<size_t>(i)];
      if (id == kNoBlock) break;  // everything below was released earlier
      pool_.free(&id, 1);
      id = kNoBlock;
    }
    // Entries never needed (a request starting past the window) stay empty.
    if (static_cast<int64_t>(table.size()) < std::min(first, needed)) {
      table.resize(static_cast<size_t>(std::min(first, needed)), kNoBlock);
    }
    const int64_t extra = needed - static_cast<int64_t>(table.size());
    if (extra > 0) pool_.allocate_into(extra, &table);
  }
  return true;
}

void KVCacheManager::free(int64_t req_id) {
  auto it = tables_.find(req_id);
  if (it == tables_.end()) return;
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::vector<int32_t>& table = it->second[g];
    if (groups_[g].recurrent) {
      free_state_slots_.insert(free_state_slots_.end(), table.begin(), table.end());
      continue;
    }
    table.erase(std::remove(table.begin(), table.end(), kNoBlock), table.end());
    // Tail first: the request's last blocks reach the LRU end first.
    if (enable_caching()) std::reverse(table.begin(), table.end());
    pool_.free(table);
  }
  req_cache_.erase(req_id);
  tables_.erase(it);
}

int64_t KVCacheManager::num_request_blocks(int64_t req_id) const {
  const auto it = tables_.find(req_id);
  if (it == tables_.end()) return 0;
  int64_t n = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!groups_[g].recurrent) n += live_blocks(it->second[g]);
  }
  return n;
}

// ------------------------------------------------------------ prefix caching

BlockHash KVCacheManager::chain_root(std::string_view salt, int64_t g) const {
  // Group 0 keeps the single-group root; others mix their index in, so no
  // group's chain is another's.
  BlockHash root = root_block_hash(salt);
  if (g > 0) root = hash_block_tokens(root, &g, 1);
  return root;
}

BlockHash KVCacheManager::chain_hash(BlockHash parent, const int64_t* block) const {
  return (hash_fn_ ? hash_fn_(parent, block, block_size_)
                   : hash_block_tokens(parent, block, block_size_)) &
         hash_mask_;
}

BlockHash KVCacheManager::block_hash_at(RequestCache& st, int64_t g, int64_t i,
                                        const int64_t* tokens) {
  if (i < static_cast<int64_t>(st.hashes.size())) return st.hashes[static_cast<size_t>(i)];
  const BlockHash parent = i > 0 ? st.hashes.back() : chain_root(st.salt, g);
  const BlockHash h = chain_hash(parent, tokens + i * block_size_);
  st.hashes.push_back(h);
  return h;
}

std::optional<int32_t> KVCacheManager::match(int64_t g, BlockHash hash, BlockRef parent,
                                             const int64_t* tokens,
                                             std::string_view salt) const {
  const auto found = pool_.cached_block(hash);
  if (!found) return std::nullopt;
  const auto id = static_cast<size_t>(*found);
  if (block_group_[id] != g) return std::nullopt;
  const BlockRef& p = parent_[id];
  if (p.id != parent.id || p.gen != parent.gen) return std::nullopt;
  if (parent.id < 0 && root_salt_[id] != salt) return std::nullopt;
  const int32_t* stored = block_tokens_.data() + id * static_cast<size_t>(block_size_);
  for (int64_t j = 0; j < block_size_; ++j) {
    if (tokens[j] != int64_t{stored[j]}) return std::nullopt;
  }
  return found;
}

void KVCacheManager::record(int64_t g, int32_t id, BlockRef parent, const int64_t* tokens,
                            std::string_view salt) {
  const auto i = static_cast<size_t>(id);
  parent_[i] = parent;
  block_group_[i] = static_cast<int32_t>(g);
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
  PrefixWalk walk;
  const int64_t hit = cached_prefix_blocks(tokens, n, cache_salt, &walk);
  const auto G = groups_.size();
  std::vector<RequestCache>& states = req_cache_[req_id];
  states.assign(G, RequestCache{});
  Tables& tables = tables_[req_id];
  tables.assign(G, {});
  for (size_t g = 0; g < G; ++g) {
    RequestCache& st = states[g];
    st.salt.assign(cache_salt.data(), cache_salt.size());
    st.hashes = std::move(walk.hashes[g]);  // cache_blocks() goes on from them
    std::vector<int32_t>& table = tables[g];
    table = std::move(walk.found[g]);
    table.resize(static_cast<size_t>(hit));
    pool_.touch(table);
    st.num_linked = hit;
    if (hit > 0) {
      const int32_t id = table.back();
      st.last = BlockRef{id, pool_.generation(id)};
    }
  }
  const int64_t computed = hit * block_size_;
  queries_ += n;
  hits_ += computed;
  return computed;
}

int64_t KVCacheManager::cached_prefix_blocks(const int64_t* tokens, int64_t n,
                                             std::string_view salt, PrefixWalk* out) const {
  const auto G = static_cast<int64_t>(groups_.size());
  if (out) {
    out->found.assign(static_cast<size_t>(G), {});
    out->hashes.assign(static_cast<size_t>(G), {});
  }
  // Each group's longest cached chain; the request takes the shortest.
  int64_t hit = n > 0 ? (n - 1) / block_size_ : 0;  // keep the last token
  for (int64_t g = 0; g < G && hit > 0; ++g) {
    BlockHash h = chain_root(salt, g);
    BlockRef last;
    int64_t i = 0;
    for (; i < hit; ++i) {
      const int64_t* block = tokens + i * block_size_;
      h = chain_hash(h, block);
      if (out) out->hashes[static_cast<size_t>(g)].push_back(h);
      const auto found = match(g, h, last, block, salt);
      if (!found) break;
      if (out) out->found[static_cast<size_t>(g)].push_back(*found);
      last = BlockRef{*found, pool_.generation(*found)};
    }
    hit = i;
  }
  return hit;
}

int64_t KVCacheManager::num_cached_prefix_tokens(const int64_t* tokens, int64_t n,
                                                 std::string_view cache_salt) const {
  if (n < 0) throw std::invalid_argument("negative token count " + std::to_string(n));
  if (!enable_caching()) return 0;
  return cached_prefix_blocks(tokens, n, cache_salt, nullptr) * block_size_;
}

bool KVCacheManager::has_blocks_to_cache(int64_t req_id, int64_t num_tokens) const {
  if (!enable_caching()) return false;
  auto it = req_cache_.find(req_id);
  if (it == req_cache_.end()) return num_tokens >= block_size_;
  for (const RequestCache& st : it->second) {
    if (!st.stopped && num_tokens / block_size_ > st.num_linked) return true;
  }
  return false;
}

void KVCacheManager::cache_group(RequestCache& st, int64_t g, const std::vector<int32_t>& table,
                                 const int64_t* tokens, int64_t full) {
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
    const int32_t own = table[static_cast<size_t>(i)];
    if (own == kNoBlock) {  // released out of the window before it was cached
      st.stopped = true;
      break;
    }
    const BlockHash h = block_hash_at(st, g, i, tokens);
    const int64_t* block_tokens = tokens + i * block_size_;
    auto canonical = match(g, h, st.last, block_tokens, st.salt);
    if (!canonical) {
      if (!fits_int32(block_tokens, block_size_)) {  // cannot be stored for the check
        st.stopped = true;
        break;
      }
      if (!pool_.cache_block(own, h)) {  // hash taken by other content
        st.stopped = true;
        break;
      }
      record(g, own, st.last, block_tokens, st.salt);
      canonical = own;
    }
    st.last = BlockRef{*canonical, pool_.generation(*canonical)};
    st.num_linked = i + 1;
  }
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
  const Tables& tables = tit->second;
  const int64_t full = num_tokens / block_size_;
  if (full > static_cast<int64_t>(tables[0].size())) {
    throw std::invalid_argument("cache_blocks: request " + std::to_string(req_id) + " has " +
                                std::to_string(tables[0].size()) + " blocks, fewer than the " +
                                std::to_string(full) + " full blocks of " +
                                std::to_string(num_tokens) + " tokens");
  }
  std::vector<RequestCache>& states = req_cache_[req_id];
  if (states.empty()) states.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    cache_group(states[g], static_cast<int64_t>(g), tables[g], tokens, full);
  }
}

int64_t KVCacheManager::reset_prefix_cache() {
  if (!enable_caching()) return 0;
  for (auto& [id, states] : req_cache_) {
    for (RequestCache& st : states) st.stopped = true;
  }
  return pool_.reset_cache();
}

// ------------------------------------------------------------ tables

const std::vector<int32_t>* KVCacheManager::find_block_table(int64_t req_id, int64_t group) const {
  check_group(group);
  auto it = tables_.find(req_id);
  return it == tables_.end() ? nullptr : &it->second[static_cast<size_t>(group)];
}

std::vector<int32_t> KVCacheManager::block_table(int64_t req_id, int64_t group) const {
  const auto* table = find_block_table(req_id, group);
  if (!table) throw std::invalid_argument("unknown request id " + std::to_string(req_id));
  return *table;
}

}  // namespace paternoster
