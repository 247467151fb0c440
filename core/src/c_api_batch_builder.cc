// C API: the batch builder and the batches it fills (pn_batch_builder_*,
// pn_batch_*).
#include <string>
#include <vector>

#include "c_api_internal.h"

using paternoster::Batch;
using paternoster::BatchBuffers;
using paternoster::BatchBuilder;
using paternoster::BatchShape;
using paternoster::c_api::check_array;
using paternoster::c_api::check_out;
using paternoster::c_api::deref;
using paternoster::c_api::guarded;
using paternoster::c_api::raise;

void pn_batch::clear() {
  batch.shape = BatchShape{};
  batch.input_ids.clear();
  batch.positions.clear();
  batch.slot_mapping.clear();
  batch.logits_indices.clear();
  batch.block_tables.clear();
  batch.seq_lens.clear();
  batch.query_start_loc.assign(1, 0);
  batch.group_slot_mapping.clear();
  batch.group_block_tables.clear();
}

namespace {

[[noreturn]] void unknown_request(int64_t req_id) {
  raise(PN_ERR_NOT_FOUND, "unknown request id " + std::to_string(req_id));
}

template <typename T>
void view(const std::vector<T>& v, const T** out_data, int64_t* out_len) {
  check_out(out_data, "out_data");
  check_out(out_len, "out_len");
  *out_data = v.empty() ? nullptr : v.data();
  *out_len = static_cast<int64_t>(v.size());
}

// Group `group`'s part of one of the batch's per-group arrays: group 0 in
// `first`, the others back to back in `rest`.
template <typename T>
void group_view(const pn_batch_t* batch, int64_t group, const std::vector<T>& first,
                const std::vector<T>& rest, const T** out_data, int64_t* out_len) {
  const paternoster::Batch& b = deref(batch, "batch").batch;
  if (group < 0 || group >= b.shape.num_groups) {
    raise(PN_ERR_INVALID_ARGUMENT, "group " + std::to_string(group) + " out of range [0, " +
                                       std::to_string(b.shape.num_groups) + ")");
  }
  check_out(out_data, "out_data");
  check_out(out_len, "out_len");
  if (group == 0) {
    view(first, out_data, out_len);
    return;
  }
  const auto n = static_cast<int64_t>(first.size());
  *out_len = n;
  *out_data = n == 0 ? nullptr : rest.data() + (group - 1) * n;
}
}  // namespace

extern "C" {

pn_status_t pn_batch_builder_create(pn_kv_cache_manager_t* manager,
                                    pn_batch_builder_t** out) noexcept {
  return guarded(__func__, [&] {
    const auto& m = deref(manager, "manager");
    check_out(out, "out");
    *out = new pn_batch_builder(m.kv);
  });
}

pn_status_t pn_batch_builder_destroy(pn_batch_builder_t* builder) noexcept {
  delete builder;
  paternoster::c_api::clear_error();
  return PN_OK;
}

pn_status_t pn_batch_builder_add_request(pn_batch_builder_t* builder, int64_t req_id,
                                         const int64_t* token_ids, int64_t n) noexcept {
  return guarded(__func__, [&] {
    BatchBuilder& bb = deref(builder, "builder").builder;
    check_array(token_ids, n, "token_ids");
    if (bb.has_request(req_id)) {
      raise(PN_ERR_ALREADY_EXISTS, "request id " + std::to_string(req_id) +
                                       " is already registered");
    }
    bb.add_request(req_id, token_ids, n);
  });
}

pn_status_t pn_batch_builder_append_tokens(pn_batch_builder_t* builder, const int64_t* req_ids,
                                           const int64_t* token_ids, int64_t n) noexcept {
  return guarded(__func__, [&] {
    BatchBuilder& bb = deref(builder, "builder").builder;
    check_array(req_ids, n, "req_ids");
    check_array(token_ids, n, "token_ids");
    for (int64_t i = 0; i < n; ++i) {
      if (!bb.has_request(req_ids[i])) unknown_request(req_ids[i]);
    }
    bb.append_tokens(req_ids, token_ids, n);
  });
}

pn_status_t pn_batch_builder_remove_request(pn_batch_builder_t* builder,
                                            int64_t req_id) noexcept {
  return guarded(__func__, [&] {
    BatchBuilder& bb = deref(builder, "builder").builder;
    if (!bb.has_request(req_id)) unknown_request(req_id);
    bb.remove_request(req_id);
  });
}

pn_status_t pn_batch_builder_has_request(const pn_batch_builder_t* builder, int64_t req_id,
                                         int* out) noexcept {
  return guarded(__func__, [&] {
    const BatchBuilder& bb = deref(builder, "builder").builder;
    check_out(out, "out");
    *out = bb.has_request(req_id) ? 1 : 0;
  });
}

pn_status_t pn_batch_builder_num_tokens(const pn_batch_builder_t* builder, int64_t req_id,
                                        int64_t* out) noexcept {
  return guarded(__func__, [&] {
    const BatchBuilder& bb = deref(builder, "builder").builder;
    check_out(out, "out");
    const auto* tokens = bb.find_tokens(req_id);
    if (tokens == nullptr) unknown_request(req_id);
    *out = static_cast<int64_t>(tokens->size());
  });
}

pn_status_t pn_batch_builder_num_requests(const pn_batch_builder_t* builder,
                                          int64_t* out) noexcept {
  return guarded(__func__, [&] {
    const BatchBuilder& bb = deref(builder, "builder").builder;
    check_out(out, "out");
    *out = bb.num_requests();
  });
}

pn_status_t pn_batch_builder_build(pn_batch_builder_t* builder, const int64_t* req_ids,
                                   const int32_t* num_computed, const int32_t* num_scheduled,
                                   int64_t n, pn_batch_t* batch) noexcept {
  const pn_status_t status = guarded(__func__, [&] {
    const pn_batch_builder& b = deref(builder, "builder");
    Batch& out = deref(batch, "batch").batch;
    check_array(req_ids, n, "req_ids");
    check_array(num_computed, n, "num_computed");
    check_array(num_scheduled, n, "num_scheduled");
    for (int64_t i = 0; i < n; ++i) {
      if (!b.builder.has_request(req_ids[i])) unknown_request(req_ids[i]);
      if (!b.kv->has_request(req_ids[i])) {
        raise(PN_ERR_NOT_FOUND,
              "request " + std::to_string(req_ids[i]) + " has no KV blocks in the manager");
      }
    }
    b.builder.build_into(req_ids, num_computed, num_scheduled, n,
                         [&out](const BatchShape& s) { return out.resize(s); });
  });
  if (status != PN_OK && batch != nullptr) {
    try {
      batch->clear();  // within capacity: does not allocate
    } catch (...) {
    }
  }
  return status;
}

pn_status_t pn_batch_create(pn_batch_t** out) noexcept {
  return guarded(__func__, [&] {
    check_out(out, "out");
    *out = new pn_batch();
  });
}

pn_status_t pn_batch_destroy(pn_batch_t* batch) noexcept {
  delete batch;
  paternoster::c_api::clear_error();
  return PN_OK;
}

pn_status_t pn_batch_shape(const pn_batch_t* batch, int64_t* out_num_seqs,
                           int64_t* out_num_tokens, int64_t* out_max_blocks) noexcept {
  return guarded(__func__, [&] {
    const BatchShape& s = deref(batch, "batch").batch.shape;
    if (out_num_seqs != nullptr) *out_num_seqs = s.num_seqs;
    if (out_num_tokens != nullptr) *out_num_tokens = s.num_tokens;
    if (out_max_blocks != nullptr) *out_max_blocks = s.max_blocks;
  });
}

pn_status_t pn_batch_input_ids(const pn_batch_t* batch, const int64_t** out_data,
                               int64_t* out_len) noexcept {
  return guarded(__func__, [&] { view(deref(batch, "batch").batch.input_ids, out_data, out_len); });
}

pn_status_t pn_batch_positions(const pn_batch_t* batch, const int64_t** out_data,
                               int64_t* out_len) noexcept {
  return guarded(__func__, [&] { view(deref(batch, "batch").batch.positions, out_data, out_len); });
}

pn_status_t pn_batch_slot_mapping(const pn_batch_t* batch, const int64_t** out_data,
                                  int64_t* out_len) noexcept {
  return guarded(__func__,
                 [&] { view(deref(batch, "batch").batch.slot_mapping, out_data, out_len); });
}

pn_status_t pn_batch_logits_indices(const pn_batch_t* batch, const int64_t** out_data,
                                    int64_t* out_len) noexcept {
  return guarded(__func__,
                 [&] { view(deref(batch, "batch").batch.logits_indices, out_data, out_len); });
}

pn_status_t pn_batch_block_tables(const pn_batch_t* batch, const int32_t** out_data,
                                  int64_t* out_len) noexcept {
  return guarded(__func__,
                 [&] { view(deref(batch, "batch").batch.block_tables, out_data, out_len); });
}

pn_status_t pn_batch_seq_lens(const pn_batch_t* batch, const int32_t** out_data,
                              int64_t* out_len) noexcept {
  return guarded(__func__, [&] { view(deref(batch, "batch").batch.seq_lens, out_data, out_len); });
}

pn_status_t pn_batch_query_start_loc(const pn_batch_t* batch, const int32_t** out_data,
                                     int64_t* out_len) noexcept {
  return guarded(__func__,
                 [&] { view(deref(batch, "batch").batch.query_start_loc, out_data, out_len); });
}

pn_status_t pn_batch_num_groups(const pn_batch_t* batch, int64_t* out) noexcept {
  return guarded(__func__, [&] {
    check_out(out, "out");
    *out = deref(batch, "batch").batch.shape.num_groups;
  });
}


pn_status_t pn_batch_group_slot_mapping(const pn_batch_t* batch, int64_t group,
                                        const int64_t** out_data, int64_t* out_len) noexcept {
  return guarded(__func__, [&] {
    const paternoster::Batch& b = deref(batch, "batch").batch;
    group_view(batch, group, b.slot_mapping, b.group_slot_mapping, out_data, out_len);
  });
}

pn_status_t pn_batch_group_block_tables(const pn_batch_t* batch, int64_t group,
                                        const int32_t** out_data, int64_t* out_len) noexcept {
  return guarded(__func__, [&] {
    const paternoster::Batch& b = deref(batch, "batch").batch;
    group_view(batch, group, b.block_tables, b.group_block_tables, out_data, out_len);
  });
}

}  // extern "C"
