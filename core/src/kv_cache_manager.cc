#include "paternoster/kv_cache_manager.h"

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
}  // namespace

KVCacheManager::KVCacheManager(int64_t num_blocks, int64_t block_size)
    : pool_(num_blocks), block_size_(checked_block_size(block_size)) {}

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
  pool_.free(it->second);
  tables_.erase(it);
}

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
