// C API: the standalone block pool (pn_block_pool_*).
#include <algorithm>
#include <string>
#include <vector>

#include "c_api_internal.h"

using paternoster::c_api::check_array;
using paternoster::c_api::check_out;
using paternoster::c_api::deref;
using paternoster::c_api::guarded;

extern "C" {

pn_status_t pn_block_pool_create(int64_t num_blocks, pn_block_pool_t** out) noexcept {
  return guarded(__func__, [&] {
    check_out(out, "out");
    *out = new pn_block_pool(num_blocks);
  });
}

pn_status_t pn_block_pool_destroy(pn_block_pool_t* pool) noexcept {
  delete pool;
  paternoster::c_api::clear_error();
  return PN_OK;
}

pn_status_t pn_block_pool_allocate(pn_block_pool_t* pool, int64_t n, int32_t* out_ids) noexcept {
  return guarded(__func__, [&] {
    auto& p = deref(pool, "pool").pool;
    check_array(out_ids, n, "out_ids");
    if (!p.can_allocate(n)) {
      throw paternoster::OutOfBlocks("need " + std::to_string(n) + " blocks, " +
                                     std::to_string(p.num_free_blocks()) + " free");
    }
    const std::vector<int32_t> ids = p.allocate(n);
    std::copy(ids.begin(), ids.end(), out_ids);
  });
}

pn_status_t pn_block_pool_free(pn_block_pool_t* pool, const int32_t* ids, int64_t n) noexcept {
  return guarded(__func__, [&] {
    auto& p = deref(pool, "pool").pool;
    check_array(ids, n, "ids");
    p.free(ids, n);
  });
}

pn_status_t pn_block_pool_incr_ref(pn_block_pool_t* pool, const int32_t* ids,
                                   int64_t n) noexcept {
  return guarded(__func__, [&] {
    auto& p = deref(pool, "pool").pool;
    check_array(ids, n, "ids");
    p.incr_ref(ids, n);
  });
}

pn_status_t pn_block_pool_ref_count(const pn_block_pool_t* pool, int32_t id,
                                    int32_t* out) noexcept {
  return guarded(__func__, [&] {
    const auto& p = deref(pool, "pool").pool;
    check_out(out, "out");
    *out = p.ref_count(id);
  });
}

pn_status_t pn_block_pool_num_blocks(const pn_block_pool_t* pool, int64_t* out) noexcept {
  return guarded(__func__, [&] {
    const auto& p = deref(pool, "pool").pool;
    check_out(out, "out");
    *out = p.num_blocks();
  });
}

pn_status_t pn_block_pool_num_free_blocks(const pn_block_pool_t* pool, int64_t* out) noexcept {
  return guarded(__func__, [&] {
    const auto& p = deref(pool, "pool").pool;
    check_out(out, "out");
    *out = p.num_free_blocks();
  });
}

}  // extern "C"
