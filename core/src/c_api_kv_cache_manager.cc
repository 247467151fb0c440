// C API: the KV cache manager (pn_kv_cache_manager_*).
#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "c_api_internal.h"

using paternoster::KVCacheManager;
using paternoster::c_api::check_array;
using paternoster::c_api::check_out;
using paternoster::c_api::deref;
using paternoster::c_api::guarded;
using paternoster::c_api::raise;

namespace {
KVCacheManager& manager_of(pn_kv_cache_manager_t* m) { return *deref(m, "manager").kv; }
const KVCacheManager& manager_of(const pn_kv_cache_manager_t* m) {
  return *deref(m, "manager").kv;
}
[[noreturn]] void not_found(int64_t req_id) {
  raise(PN_ERR_NOT_FOUND, "request " + std::to_string(req_id) + " has no KV blocks");
}
void require_request(const KVCacheManager& kv, int64_t req_id) {
  if (!kv.has_request(req_id)) not_found(req_id);
}
pn_kv_cache_manager* new_manager(int64_t num_blocks, int64_t block_size, int enable_caching,
                                 std::vector<paternoster::KVCacheGroupSpec> groups,
                                 int64_t num_state_slots = 0) {
  return new pn_kv_cache_manager{std::make_shared<KVCacheManager>(
      num_blocks, block_size, enable_caching != 0, std::move(groups), num_state_slots)};
}
// allocate_slots, all or nothing: PN_ERR_OUT_OF_BLOCKS saying how many are short.
void allocate(KVCacheManager& kv, int64_t req_id, int64_t num_tokens, int64_t num_computed) {
  if (!kv.allocate_slots(req_id, num_tokens, num_computed)) {
    if (kv.num_required_state_slots(req_id) > kv.num_free_state_slots()) {
      raise(PN_ERR_OUT_OF_BLOCKS, "request " + std::to_string(req_id) +
                                      " needs a recurrent state slot, none is free");
    }
    raise(PN_ERR_OUT_OF_BLOCKS,
          "request " + std::to_string(req_id) + " needs " +
              std::to_string(kv.num_required_blocks(req_id, num_tokens, num_computed)) +
              " more blocks, " + std::to_string(kv.num_free_blocks()) + " free");
  }
}
// Copies the request's table in `group` into out_ids[0 .. capacity) and its
// length to *out_len (PN_ERR_BUFFER_TOO_SMALL when it does not fit).
void copy_table(const KVCacheManager& kv, int64_t req_id, int64_t group, int32_t* out_ids,
                int64_t capacity, int64_t* out_len) {
  check_array(out_ids, capacity, "out_ids");
  check_out(out_len, "out_len");
  const std::vector<int32_t>* table = kv.find_block_table(req_id, group);
  if (table == nullptr) not_found(req_id);
  const auto len = static_cast<int64_t>(table->size());
  *out_len = len;
  if (len > capacity) {
    raise(PN_ERR_BUFFER_TOO_SMALL, "the table has " + std::to_string(len) +
                                       " blocks, capacity is " + std::to_string(capacity));
  }
  std::copy(table->begin(), table->end(), out_ids);
}
}  // namespace

extern "C" {

pn_status_t pn_kv_cache_manager_create(int64_t num_blocks, int64_t block_size,
                                       int enable_caching,
                                       pn_kv_cache_manager_t** out) noexcept {
  return guarded(__func__, [&] {
    check_out(out, "out");
    *out = new_manager(num_blocks, block_size, enable_caching, {paternoster::KVCacheGroupSpec{}});
  });
}

pn_status_t pn_kv_cache_manager_create_grouped(int64_t num_blocks, int64_t block_size,
                                               int enable_caching,
                                               const int64_t* sliding_windows,
                                               int64_t num_groups,
                                               pn_kv_cache_manager_t** out) noexcept {
  return guarded(__func__, [&] {
    check_out(out, "out");
    if (num_groups < 1) raise(PN_ERR_INVALID_ARGUMENT, "num_groups must be >= 1");
    check_array(sliding_windows, num_groups, "sliding_windows");
    std::vector<paternoster::KVCacheGroupSpec> groups(static_cast<size_t>(num_groups));
    for (int64_t g = 0; g < num_groups; ++g) groups[g].sliding_window = sliding_windows[g];
    *out = new_manager(num_blocks, block_size, enable_caching, std::move(groups));
  });
}

pn_status_t pn_kv_cache_manager_create_hybrid(int64_t num_blocks, int64_t block_size,
                                              int enable_caching,
                                              const int64_t* sliding_windows,
                                              const int* recurrent, int64_t num_groups,
                                              int64_t num_state_slots,
                                              pn_kv_cache_manager_t** out) noexcept {
  return guarded(__func__, [&] {
    check_out(out, "out");
    if (num_groups < 1) raise(PN_ERR_INVALID_ARGUMENT, "num_groups must be >= 1");
    check_array(sliding_windows, num_groups, "sliding_windows");
    check_array(recurrent, num_groups, "recurrent");
    std::vector<paternoster::KVCacheGroupSpec> groups(static_cast<size_t>(num_groups));
    for (int64_t g = 0; g < num_groups; ++g) {
      groups[g].sliding_window = sliding_windows[g];
      groups[g].recurrent = recurrent[g] != 0;
    }
    *out = new_manager(num_blocks, block_size, enable_caching, std::move(groups),
                       num_state_slots);
  });
}

pn_status_t pn_kv_cache_manager_num_free_state_slots(const pn_kv_cache_manager_t* manager,
                                                     int64_t* out) noexcept {
  return guarded(__func__, [&] {
    const auto& kv = manager_of(manager);
    check_out(out, "out");
    *out = kv.num_free_state_slots();
  });
}

pn_status_t pn_kv_cache_manager_num_groups(const pn_kv_cache_manager_t* manager,
                                           int64_t* out) noexcept {
  return guarded(__func__, [&] {
    const auto& kv = manager_of(manager);
    check_out(out, "out");
    *out = kv.num_groups();
  });
}

pn_status_t pn_kv_cache_manager_num_required_blocks_after(const pn_kv_cache_manager_t* manager,
                                                          int64_t req_id, int64_t num_tokens,
                                                          int64_t num_computed_tokens,
                                                          int64_t* out_blocks) noexcept {
  return guarded(__func__, [&] {
    const auto& kv = manager_of(manager);
    check_out(out_blocks, "out_blocks");
    *out_blocks = kv.num_required_blocks(req_id, num_tokens, num_computed_tokens);
  });
}

pn_status_t pn_kv_cache_manager_can_allocate_after(const pn_kv_cache_manager_t* manager,
                                                   int64_t req_id, int64_t num_tokens,
                                                   int64_t num_computed_tokens,
                                                   int* out) noexcept {
  return guarded(__func__, [&] {
    const auto& kv = manager_of(manager);
    check_out(out, "out");
    *out = kv.can_allocate(req_id, num_tokens, num_computed_tokens) ? 1 : 0;
  });
}

pn_status_t pn_kv_cache_manager_allocate_slots_after(pn_kv_cache_manager_t* manager,
                                                     int64_t req_id, int64_t num_tokens,
                                                     int64_t num_computed_tokens) noexcept {
  return guarded(__func__, [&] {
    allocate(manager_of(manager), req_id, num_tokens, num_computed_tokens);
  });
}

pn_status_t pn_kv_cache_manager_group_block_table(const pn_kv_cache_manager_t* manager,
                                                  int64_t req_id, int64_t group,
                                                  int32_t* out_ids, int64_t capacity,
                                                  int64_t* out_len) noexcept {
  return guarded(__func__, [&] {
    copy_table(manager_of(manager), req_id, group, out_ids, capacity, out_len);
  });
}

pn_status_t pn_kv_cache_manager_destroy(pn_kv_cache_manager_t* manager) noexcept {
  delete manager;
  paternoster::c_api::clear_error();
  return PN_OK;
}

pn_status_t pn_kv_cache_manager_num_required_blocks(const pn_kv_cache_manager_t* manager,
                                                    int64_t req_id, int64_t num_tokens,
                                                    int64_t* out_blocks) noexcept {
  return guarded(__func__, [&] {
    const auto& kv = manager_of(manager);
    check_out(out_blocks, "out_blocks");
    *out_blocks = kv.num_required_blocks(req_id, num_tokens);
  });
}

pn_status_t pn_kv_cache_manager_can_allocate(const pn_kv_cache_manager_t* manager,
                                             int64_t req_id, int64_t num_tokens,
                                             int* out) noexcept {
  return guarded(__func__, [&] {
    const auto& kv = manager_of(manager);
    check_out(out, "out");
    *out = kv.can_allocate(req_id, num_tokens) ? 1 : 0;
  });
}

pn_status_t pn_kv_cache_manager_allocate_slots(pn_kv_cache_manager_t* manager, int64_t req_id,
                                               int64_t num_tokens) noexcept {
  return guarded(__func__, [&] { allocate(manager_of(manager), req_id, num_tokens, 0); });
}

pn_status_t pn_kv_cache_manager_free(pn_kv_cache_manager_t* manager, int64_t req_id) noexcept {
  return guarded(__func__, [&] {
    auto& kv = manager_of(manager);
    require_request(kv, req_id);
    kv.free(req_id);
  });
}

pn_status_t pn_kv_cache_manager_has_request(const pn_kv_cache_manager_t* manager,
                                            int64_t req_id, int* out) noexcept {
  return guarded(__func__, [&] {
    const auto& kv = manager_of(manager);
    check_out(out, "out");
    *out = kv.has_request(req_id) ? 1 : 0;
  });
}

pn_status_t pn_kv_cache_manager_block_table(const pn_kv_cache_manager_t* manager,
                                            int64_t req_id, int32_t* out_ids,
                                            int64_t capacity, int64_t* out_len) noexcept {
  return guarded(__func__, [&] {
    copy_table(manager_of(manager), req_id, 0, out_ids, capacity, out_len);
  });
}

pn_status_t pn_kv_cache_manager_num_blocks(const pn_kv_cache_manager_t* manager,
                                           int64_t* out) noexcept {
  return guarded(__func__, [&] {
    const auto& kv = manager_of(manager);
    check_out(out, "out");
    *out = kv.num_blocks();
  });
}

pn_status_t pn_kv_cache_manager_block_size(const pn_kv_cache_manager_t* manager,
                                           int64_t* out) noexcept {
  return guarded(__func__, [&] {
    const auto& kv = manager_of(manager);
    check_out(out, "out");
    *out = kv.block_size();
  });
}

pn_status_t pn_kv_cache_manager_num_free_blocks(const pn_kv_cache_manager_t* manager,
                                                int64_t* out) noexcept {
  return guarded(__func__, [&] {
    const auto& kv = manager_of(manager);
    check_out(out, "out");
    *out = kv.num_free_blocks();
  });
}

pn_status_t pn_kv_cache_manager_num_requests(const pn_kv_cache_manager_t* manager,
                                             int64_t* out) noexcept {
  return guarded(__func__, [&] {
    const auto& kv = manager_of(manager);
    check_out(out, "out");
    *out = kv.num_requests();
  });
}

pn_status_t pn_kv_cache_manager_usage(const pn_kv_cache_manager_t* manager,
                                      double* out) noexcept {
  return guarded(__func__, [&] {
    const auto& kv = manager_of(manager);
    check_out(out, "out");
    *out = kv.usage();
  });
}

// ---------------------------------------------------------------- prefix caching

pn_status_t pn_kv_cache_manager_get_computed_blocks(pn_kv_cache_manager_t* manager,
                                                    int64_t req_id, const int64_t* tokens,
                                                    int64_t n, const char* cache_salt,
                                                    int64_t salt_len,
                                                    int64_t* out_num_computed_tokens) noexcept {
  return guarded(__func__, [&] {
    auto& kv = manager_of(manager);
    check_array(tokens, n, "tokens");
    check_array(cache_salt, salt_len, "cache_salt");
    check_out(out_num_computed_tokens, "out_num_computed_tokens");
    if (kv.has_request(req_id)) {
      raise(PN_ERR_ALREADY_EXISTS,
            "request " + std::to_string(req_id) + " already has KV blocks (free it first)");
    }
    const std::string_view salt(cache_salt, static_cast<size_t>(salt_len));
    *out_num_computed_tokens = kv.get_computed_blocks(req_id, tokens, n, salt);
  });
}

pn_status_t pn_kv_cache_manager_cache_blocks(pn_kv_cache_manager_t* manager, int64_t req_id,
                                             const int64_t* tokens,
                                             int64_t num_tokens) noexcept {
  return guarded(__func__, [&] {
    auto& kv = manager_of(manager);
    check_array(tokens, num_tokens, "tokens");
    require_request(kv, req_id);
    kv.cache_blocks(req_id, tokens, num_tokens);
  });
}

pn_status_t pn_kv_cache_manager_reset_prefix_cache(pn_kv_cache_manager_t* manager,
                                                   int64_t* out_num_uncached) noexcept {
  return guarded(__func__, [&] {
    auto& kv = manager_of(manager);
    const int64_t n = kv.reset_prefix_cache();
    if (out_num_uncached != nullptr) *out_num_uncached = n;
  });
}

pn_status_t pn_kv_cache_manager_prefix_cache_stats(const pn_kv_cache_manager_t* manager,
                                                   int64_t* out_queried_tokens,
                                                   int64_t* out_hit_tokens,
                                                   int64_t* out_cached_blocks) noexcept {
  return guarded(__func__, [&] {
    const auto& kv = manager_of(manager);
    if (out_queried_tokens != nullptr) *out_queried_tokens = kv.prefix_cache_queries();
    if (out_hit_tokens != nullptr) *out_hit_tokens = kv.prefix_cache_hits();
    if (out_cached_blocks != nullptr) *out_cached_blocks = kv.num_cached_blocks();
  });
}

}  // extern "C"
