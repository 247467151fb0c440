// pybind11 module paternoster._core: the only Python-aware C++ in the project.
// Signatures and full docs: python/paternoster/_core.pyi.
//
// Error mapping: std::invalid_argument -> ValueError, OutOfBlocks ->
// paternoster._core.OutOfBlocksError (a RuntimeError).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "paternoster/attention.h"
#include "paternoster/batch_builder.h"
#include "paternoster/block_hash.h"
#include "paternoster/block_pool.h"
#include "paternoster/decoder.h"
#include "paternoster/fused_ops.h"
#include "paternoster/kv_cache_manager.h"
#include "paternoster/linear.h"
#include "paternoster/moe.h"
#include "paternoster/ssm.h"
#include "paternoster/thread_pool.h"

namespace py = pybind11;
using namespace paternoster;

namespace {

template <typename T>
using Arr = py::array_t<T, py::array::c_style | py::array::forcecast>;

// A 1-D array of T from any array-like (list, numpy array of another integer
// dtype); ValueError naming `name` otherwise.
template <typename T>
Arr<T> as_1d(const py::handle& obj, const char* name) {
  Arr<T> a;
  try {
    a = Arr<T>::ensure(obj);
  } catch (py::error_already_set&) {
    throw std::invalid_argument(std::string(name) + " must be a 1-D integer array");
  }
  if (!a || a.ndim() != 1) {
    throw std::invalid_argument(std::string(name) + " must be a 1-D integer array");
  }
  return a;
}

std::vector<int32_t> block_ids(const py::handle& obj) {
  auto a = as_1d<int64_t>(obj, "block_ids");
  std::vector<int32_t> ids(static_cast<size_t>(a.shape(0)));
  const int64_t* p = a.data();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (p[i] < std::numeric_limits<int32_t>::min() || p[i] > std::numeric_limits<int32_t>::max()) {
      throw std::invalid_argument("block id " + std::to_string(p[i]) + " out of range");
    }
    ids[i] = static_cast<int32_t>(p[i]);
  }
  return ids;
}

template <typename T>
py::array_t<T> to_numpy(const std::vector<T>& v) {
  py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(T));
  return a;
}

py::dict build_batch(const BatchBuilder& bb, const py::handle& req_ids_obj,
                     const py::handle& computed_obj, const py::handle& scheduled_obj) {
  auto req_ids = as_1d<int64_t>(req_ids_obj, "req_ids");
  auto computed = as_1d<int32_t>(computed_obj, "num_computed_tokens");
  auto scheduled = as_1d<int32_t>(scheduled_obj, "num_scheduled_tokens");
  const py::ssize_t n = req_ids.shape(0);
  if (computed.shape(0) != n || scheduled.shape(0) != n) {
    throw std::invalid_argument(
        "req_ids, num_computed_tokens and num_scheduled_tokens must have the same length");
  }
  py::dict result;
  bb.build_into(req_ids.data(), computed.data(), scheduled.data(), n,
                [&result](const BatchShape& s) {
                  py::array_t<int64_t> input_ids(s.num_tokens), positions(s.num_tokens),
                      slot_mapping(s.num_tokens), logits_indices(s.num_seqs);
                  py::array_t<int32_t> block_tables({s.num_seqs, s.max_blocks}),
                      seq_lens(s.num_seqs), query_start_loc(s.num_seqs + 1);
                  const py::ssize_t extra = s.num_groups - 1;
                  py::array_t<int64_t> group_slot_mapping({extra, s.num_tokens});
                  py::array_t<int32_t> group_block_tables({extra, s.num_seqs, s.max_blocks});
                  BatchBuffers buf{input_ids.mutable_data(),
                                   positions.mutable_data(),
                                   slot_mapping.mutable_data(),
                                   block_tables.mutable_data(),
                                   seq_lens.mutable_data(),
                                   query_start_loc.mutable_data(),
                                   logits_indices.mutable_data(),
                                   extra ? group_slot_mapping.mutable_data() : nullptr,
                                   extra ? group_block_tables.mutable_data() : nullptr};
                  result["input_ids"] = input_ids;
                  result["positions"] = positions;
                  result["slot_mapping"] = slot_mapping;
                  result["block_tables"] = block_tables;
                  result["seq_lens"] = seq_lens;
                  result["query_start_loc"] = query_start_loc;
                  result["logits_indices"] = logits_indices;
                  if (extra) {
                    result["group_slot_mapping"] = group_slot_mapping;
                    result["group_block_tables"] = group_block_tables;
                  }
                  return buf;
                });
  return result;
}

void append_tokens(BatchBuilder& bb, const py::handle& req_ids_obj, const py::handle& tokens_obj) {
  auto req_ids = as_1d<int64_t>(req_ids_obj, "req_ids");
  const py::ssize_t n = req_ids.shape(0);
  auto check_len = [n](py::ssize_t m) {
    if (m != n) throw std::invalid_argument("req_ids and token_ids must have the same length");
  };
  if (py::isinstance<py::array_t<int32_t>>(tokens_obj)) {
    auto tokens = as_1d<int32_t>(tokens_obj, "token_ids");
    check_len(tokens.shape(0));
    bb.append_tokens(req_ids.data(), tokens.data(), n);
  } else {
    auto tokens = as_1d<int64_t>(tokens_obj, "token_ids");
    check_len(tokens.shape(0));
    bb.append_tokens(req_ids.data(), tokens.data(), n);
  }
}

// KVCacheManager.cache_computed_blocks: one call per step for every request,
// reading each request's tokens from the BatchBuilder.
void cache_computed_blocks(KVCacheManager& kv, const BatchBuilder& bb,
                           const py::handle& req_ids_obj, const py::handle& computed_obj) {
  auto req_ids = as_1d<int64_t>(req_ids_obj, "req_ids");
  auto computed = as_1d<int64_t>(computed_obj, "num_computed_tokens");
  const py::ssize_t n = req_ids.shape(0);
  if (computed.shape(0) != n) {
    throw std::invalid_argument("req_ids and num_computed_tokens must have the same length");
  }
  for (py::ssize_t i = 0; i < n; ++i) {
    const int64_t id = req_ids.data()[i];
    if (!kv.has_blocks_to_cache(id, computed.data()[i])) continue;  // the common decode step
    const auto* tokens = bb.find_tokens(id);
    if (!tokens) throw std::invalid_argument("unknown request id " + std::to_string(id));
    const int64_t c = computed.data()[i];
    if (c > static_cast<int64_t>(tokens->size())) {
      throw std::invalid_argument("num_computed_tokens (" + std::to_string(c) + ") of request " +
                                  std::to_string(id) + " exceeds its " +
                                  std::to_string(tokens->size()) + " tokens");
    }
    kv.cache_blocks(id, tokens->data(), c);
  }
}

template <typename T>
T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

// (data, format, rows) tuples from Python -> WeightPart (linear_parts, MoeExperts).
using PartTuples = std::vector<std::tuple<uintptr_t, WeightFormat, int64_t>>;

std::vector<WeightPart> weight_parts(const PartTuples& parts) {
  std::vector<WeightPart> ps;
  for (const auto& [data, format, rows] : parts) {
    ps.push_back(WeightPart{ptr<const void>(data), format, rows});
  }
  return ps;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() =
      "Paternoster C++ core: KV block pool, KV cache manager, batch builder and CPU paged "
      "attention kernels. See paternoster/_core.pyi.";

  py::register_exception<OutOfBlocks>(m, "OutOfBlocksError", PyExc_RuntimeError);

  py::enum_<DType>(m, "DType", "Element type of attention tensors.")
      .value("float32", DType::kFloat32)
      .value("bfloat16", DType::kBFloat16);
  py::enum_<WeightFormat>(m, "WeightFormat",
                          "Storage format of a linear layer's weight (see paternoster/linear.h).")
      .value("float32", WeightFormat::kFloat32)
      .value("bfloat16", WeightFormat::kBFloat16)
      .value("q8_0", WeightFormat::kQ8_0)
      .value("q4_0", WeightFormat::kQ4_0)
      .value("q4_1", WeightFormat::kQ4_1)
      .value("q5_0", WeightFormat::kQ5_0)
      .value("q5_1", WeightFormat::kQ5_1)
      .value("iq4_nl", WeightFormat::kIQ4_NL)
      .value("mxfp4", WeightFormat::kMXFP4)
      .value("q4_k", WeightFormat::kQ4_K)
      .value("q5_k", WeightFormat::kQ5_K)
      .value("q6_k", WeightFormat::kQ6_K)
      .value("iq4_xs", WeightFormat::kIQ4_XS);

  py::class_<BlockPool>(m, "BlockPool",
                        "Fixed pool of reference-counted KV blocks, with an optional prefix cache.")
      .def(py::init<int64_t, bool>(), py::arg("num_blocks"), py::arg("enable_caching") = false)
      .def("allocate", &BlockPool::allocate, py::arg("n"),
           "Take n free blocks (ref count 1), all or nothing; OutOfBlocksError if too few.")
      .def("can_allocate", &BlockPool::can_allocate, py::arg("n"))
      .def("free", [](BlockPool& p, const py::handle& ids) { p.free(block_ids(ids)); },
           py::arg("block_ids"), "Drop one reference per listed block.")
      .def("incr_ref", [](BlockPool& p, const py::handle& ids) { p.incr_ref(block_ids(ids)); },
           py::arg("block_ids"), "Add one reference per listed (in-use) block.")
      .def("touch", [](BlockPool& p, const py::handle& ids) { p.touch(block_ids(ids)); },
           py::arg("block_ids"), "Add one reference per listed block, reviving free ones.")
      .def("cache_block", &BlockPool::cache_block, py::arg("block_id"), py::arg("block_hash"))
      .def("cached_block", &BlockPool::cached_block, py::arg("block_hash"))
      .def("reset_cache", &BlockPool::reset_cache)
      .def("block_hash", &BlockPool::block_hash, py::arg("block_id"))
      .def("generation", &BlockPool::generation, py::arg("block_id"))
      .def("num_cached_blocks", &BlockPool::num_cached_blocks)
      .def("num_evictions", &BlockPool::num_evictions)
      .def("enable_caching", &BlockPool::enable_caching)
      .def("free_block_ids", &BlockPool::free_block_ids)
      .def("ref_count", &BlockPool::ref_count, py::arg("block_id"))
      .def("num_blocks", &BlockPool::num_blocks)
      .def("num_free_blocks", &BlockPool::num_free_blocks)
      .def("usage", &BlockPool::usage);

  py::class_<KVCacheManager>(m, "KVCacheManager",
                             "Per-request block tables over a BlockPool, one per KV cache "
                             "group (full or sliding-window attention), with optional "
                             "automatic prefix caching.")
      .def(py::init([](int64_t num_blocks, int64_t block_size, bool enable_caching,
                       const std::optional<std::vector<int64_t>>& sliding_windows,
                       const std::optional<std::vector<bool>>& recurrent,
                       int64_t num_state_slots) {
             std::vector<KVCacheGroupSpec> groups;
             for (int64_t w : sliding_windows.value_or(std::vector<int64_t>{0})) {
               groups.push_back(KVCacheGroupSpec{w});
             }
             if (recurrent) {
               if (recurrent->size() != groups.size()) {
                 throw std::invalid_argument(
                     "recurrent has " + std::to_string(recurrent->size()) +
                     " entries, sliding_windows " + std::to_string(groups.size()));
               }
               for (size_t g = 0; g < groups.size(); ++g) groups[g].recurrent = (*recurrent)[g];
             }
             return std::make_unique<KVCacheManager>(num_blocks, block_size, enable_caching,
                                                     std::move(groups), num_state_slots);
           }),
           py::arg("num_blocks"), py::arg("block_size"), py::arg("enable_caching") = false,
           py::arg("sliding_windows") = py::none(), py::arg("recurrent") = py::none(),
           py::arg("num_state_slots") = 0)
      .def(
          "recurrent",
          [](const KVCacheManager& kv, int64_t group) { return kv.group(group).recurrent; },
          py::arg("group"))
      .def("num_required_state_slots", &KVCacheManager::num_required_state_slots,
           py::arg("req_id"))
      .def("num_state_slots", &KVCacheManager::num_state_slots)
      .def("num_free_state_slots", &KVCacheManager::num_free_state_slots)
      .def("state_usage", &KVCacheManager::state_usage)
      .def("num_groups", &KVCacheManager::num_groups)
      .def(
          "sliding_window",
          [](const KVCacheManager& kv, int64_t group) { return kv.group(group).sliding_window; },
          py::arg("group"))
      .def("num_required_blocks", &KVCacheManager::num_required_blocks, py::arg("req_id"),
           py::arg("num_tokens"), py::arg("num_computed_tokens") = 0)
      .def("can_allocate", &KVCacheManager::can_allocate, py::arg("req_id"), py::arg("num_tokens"),
           py::arg("num_computed_tokens") = 0)
      .def("allocate_slots", &KVCacheManager::allocate_slots, py::arg("req_id"),
           py::arg("num_tokens"), py::arg("num_computed_tokens") = 0)
      .def("num_request_blocks", &KVCacheManager::num_request_blocks, py::arg("req_id"))
      .def("free", &KVCacheManager::free, py::arg("req_id"))
      .def(
          "get_computed_blocks",
          [](KVCacheManager& kv, int64_t req_id, const py::handle& tokens,
             const std::optional<std::string>& cache_salt) {
            auto a = as_1d<int64_t>(tokens, "token_ids");
            return kv.get_computed_blocks(req_id, a.data(), a.shape(0), cache_salt.value_or(""));
          },
          py::arg("req_id"), py::arg("token_ids"), py::arg("cache_salt") = py::none())
      .def(
          "num_cached_prefix_tokens",
          [](const KVCacheManager& kv, const py::handle& tokens,
             const std::optional<std::string>& cache_salt) {
            auto a = as_1d<int64_t>(tokens, "token_ids");
            return kv.num_cached_prefix_tokens(a.data(), a.shape(0), cache_salt.value_or(""));
          },
          py::arg("token_ids"), py::arg("cache_salt") = py::none(),
          "Tokens get_computed_blocks would find cached now, taking nothing "
          "(no reference, no counters); 0 with caching off.")
      .def(
          "cache_blocks",
          [](KVCacheManager& kv, int64_t req_id, const py::handle& tokens,
             std::optional<int64_t> num_tokens) {
            auto a = as_1d<int64_t>(tokens, "token_ids");
            const int64_t n = num_tokens.value_or(a.shape(0));
            if (n > a.shape(0)) {
              throw std::invalid_argument("num_tokens (" + std::to_string(n) +
                                          ") exceeds len(token_ids) (" +
                                          std::to_string(a.shape(0)) + ")");
            }
            kv.cache_blocks(req_id, a.data(), n);
          },
          py::arg("req_id"), py::arg("token_ids"), py::arg("num_tokens") = py::none())
      .def("cache_computed_blocks", &cache_computed_blocks, py::arg("batch_builder"),
           py::arg("req_ids"), py::arg("num_computed_tokens"))
      .def("reset_prefix_cache", &KVCacheManager::reset_prefix_cache)
      .def("enable_caching", &KVCacheManager::enable_caching)
      .def("prefix_cache_queries", &KVCacheManager::prefix_cache_queries)
      .def("prefix_cache_hits", &KVCacheManager::prefix_cache_hits)
      .def("num_cached_blocks", &KVCacheManager::num_cached_blocks)
      .def("_set_hash_mask_for_testing", &KVCacheManager::set_hash_mask_for_testing,
           py::arg("mask"))
      .def_property_readonly(
          "pool", [](const KVCacheManager& kv) { return &kv.pool(); },
          py::return_value_policy::reference_internal)
      .def(
          "block_table",
          [](const KVCacheManager& kv, int64_t req_id, int64_t group) {
            return to_numpy(kv.block_table(req_id, group));
          },
          py::arg("req_id"), py::arg("group") = 0)
      .def("has_request", &KVCacheManager::has_request, py::arg("req_id"))
      .def("num_requests", &KVCacheManager::num_requests)
      .def("num_free_blocks", &KVCacheManager::num_free_blocks)
      .def("num_blocks", &KVCacheManager::num_blocks)
      .def("block_size", &KVCacheManager::block_size)
      .def("usage", &KVCacheManager::usage);

  py::class_<BatchBuilder>(m, "BatchBuilder", "Token store and step-batch flattener.")
      .def(py::init<const KVCacheManager&>(), py::arg("kv_cache_manager"), py::keep_alive<1, 2>())
      .def(
          "add_request",
          [](BatchBuilder& bb, int64_t req_id, const py::handle& tokens) {
            auto a = as_1d<int64_t>(tokens, "token_ids");
            bb.add_request(req_id, a.data(), a.shape(0));
          },
          py::arg("req_id"), py::arg("token_ids"))
      .def("append_tokens", &append_tokens, py::arg("req_ids"), py::arg("token_ids"))
      .def("remove_request", &BatchBuilder::remove_request, py::arg("req_id"))
      .def("num_tokens", &BatchBuilder::num_tokens, py::arg("req_id"))
      .def("has_request", &BatchBuilder::has_request, py::arg("req_id"))
      .def("num_requests", &BatchBuilder::num_requests)
      .def(
          "token_ids",
          [](const BatchBuilder& bb, int64_t req_id) {
            const auto* t = bb.find_tokens(req_id);
            if (!t) throw std::invalid_argument("unknown request id " + std::to_string(req_id));
            return to_numpy(*t);
          },
          py::arg("req_id"))
      .def("build", &build_batch, py::arg("req_ids"), py::arg("num_computed_tokens"),
           py::arg("num_scheduled_tokens"));

  m.def(
      "prefix_block_hashes",
      [](const py::handle& tokens, int64_t block_size, const std::optional<std::string>& cache_salt,
         int64_t max_blocks) {
        if (block_size < 1) {
          throw std::invalid_argument("block_size must be >= 1, got " + std::to_string(block_size));
        }
        if (max_blocks < 0) {
          throw std::invalid_argument("max_blocks must be >= 0, got " + std::to_string(max_blocks));
        }
        auto a = as_1d<int64_t>(tokens, "token_ids");
        const int64_t n = std::min(a.shape(0) / block_size, max_blocks);
        std::vector<BlockHash> out(static_cast<size_t>(n));
        BlockHash parent = root_block_hash(cache_salt.value_or(""));
        for (int64_t i = 0; i < n; ++i) {
          parent = hash_block_tokens(parent, a.data() + i * block_size, block_size);
          out[static_cast<size_t>(i)] = parent;
        }
        return out;
      },
      py::arg("token_ids"), py::arg("block_size"), py::arg("cache_salt") = py::none(),
      py::arg("max_blocks") = std::numeric_limits<int64_t>::max(),
      "Prefix-cache hashes of the leading full blocks of token_ids, as KVCacheManager "
      "computes them (full-attention group).");
  m.def("set_num_threads", &set_num_threads, py::arg("n"),
        "Threads used by the CPU attention kernels and fused ops (>= 1; default 1).");
  m.def("get_num_threads", &get_num_threads);
  m.def("set_spin_micros", &set_spin_micros, py::arg("micros"),
        "How long the kernel threads poll for the next call before sleeping (microseconds).");
  m.def("get_spin_micros", &get_spin_micros, "The kernel threads' polling time (microseconds).");
  m.def("attention_isa", &attention_isa, "SIMD variant of the attention kernel in use.");

  m.def(
      "_paged_attention_ptr",
      [](uintptr_t out, uintptr_t query, uintptr_t key_cache, uintptr_t value_cache,
         uintptr_t block_tables, uintptr_t seq_lens, uintptr_t query_start_loc, int64_t num_tokens,
         int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
         int64_t num_blocks, int64_t block_size, int64_t max_blocks_per_seq, double scale,
         DType dtype, bool batch_invariant, int64_t sliding_window, uintptr_t sinks) {
        paged_attention(ptr<void>(out), ptr<const void>(query), ptr<const void>(key_cache),
                        ptr<const void>(value_cache), ptr<const int32_t>(block_tables),
                        ptr<const int32_t>(seq_lens), ptr<const int32_t>(query_start_loc),
                        num_tokens, num_seqs, num_heads, num_kv_heads, head_size, num_blocks,
                        block_size, max_blocks_per_seq, static_cast<float>(scale), dtype,
                        batch_invariant, sliding_window, ptr<const float>(sinks));
      },
      py::arg("out"), py::arg("query"), py::arg("key_cache"), py::arg("value_cache"),
      py::arg("block_tables"), py::arg("seq_lens"), py::arg("query_start_loc"),
      py::arg("num_tokens"), py::arg("num_seqs"), py::arg("num_heads"), py::arg("num_kv_heads"),
      py::arg("head_size"), py::arg("num_blocks"), py::arg("block_size"),
      py::arg("max_blocks_per_seq"), py::arg("scale"), py::arg("dtype"),
      py::arg("batch_invariant") = false, py::arg("sliding_window") = 0, py::arg("sinks") = 0,
      py::call_guard<py::gil_scoped_release>(),
      "Paged attention on raw data pointers (see paternoster.ops.paged_attention).");

  m.def(
      "_reshape_and_cache_ptr",
      [](uintptr_t key, uintptr_t value, uintptr_t key_cache, uintptr_t value_cache,
         uintptr_t slot_mapping, int64_t num_tokens, int64_t num_kv_heads, int64_t head_size,
         int64_t num_slots, DType dtype) {
        reshape_and_cache(ptr<const void>(key), ptr<const void>(value), ptr<void>(key_cache),
                          ptr<void>(value_cache), ptr<const int64_t>(slot_mapping), num_tokens,
                          num_kv_heads, head_size, num_slots, dtype);
      },
      py::arg("key"), py::arg("value"), py::arg("key_cache"), py::arg("value_cache"),
      py::arg("slot_mapping"), py::arg("num_tokens"), py::arg("num_kv_heads"),
      py::arg("head_size"), py::arg("num_slots"), py::arg("dtype"),
      py::call_guard<py::gil_scoped_release>(),
      "Write K/V rows into cache slots on raw data pointers (see paternoster.ops).");

  // Fused elementwise ops of the decoder block (see paternoster.ops).
  m.def(
      "_rms_norm_ptr",
      [](uintptr_t out, uintptr_t x, uintptr_t weight, int64_t num_tokens, int64_t hidden_size,
         double eps, DType dtype) {
        rms_norm(ptr<void>(out), ptr<const void>(x), ptr<const void>(weight), num_tokens,
                 hidden_size, eps, dtype);
      },
      py::arg("out"), py::arg("x"), py::arg("weight"), py::arg("num_tokens"),
      py::arg("hidden_size"), py::arg("eps"), py::arg("dtype"),
      py::call_guard<py::gil_scoped_release>(), "RMSNorm on raw data pointers.");
  m.def(
      "_fused_add_rms_norm_ptr",
      [](uintptr_t x, uintptr_t residual, uintptr_t weight, int64_t num_tokens,
         int64_t hidden_size, double eps, DType dtype) {
        fused_add_rms_norm(ptr<void>(x), ptr<void>(residual), ptr<const void>(weight),
                           num_tokens, hidden_size, eps, dtype);
      },
      py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("num_tokens"),
      py::arg("hidden_size"), py::arg("eps"), py::arg("dtype"),
      py::call_guard<py::gil_scoped_release>(),
      "residual += x; x = RMSNorm(residual), in place on raw data pointers.");
  m.def(
      "_mamba2_state_update_ptr",
      [](uintptr_t state, uintptr_t slots, int64_t batch, int64_t num_slots, int64_t heads,
         int64_t head_dim, int64_t groups, int64_t state_size, uintptr_t x, uintptr_t dt,
         uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t d, uintptr_t y) {
        mamba2_state_update(ptr<float>(state), ptr<const int64_t>(slots), batch, num_slots,
                            heads, head_dim, groups, state_size, ptr<const float>(x),
                            ptr<const float>(dt), ptr<const float>(a), ptr<const float>(b),
                            ptr<const float>(c), ptr<const float>(d), ptr<float>(y));
      },
      py::arg("state"), py::arg("slots"), py::arg("batch"), py::arg("num_slots"),
      py::arg("heads"), py::arg("head_dim"), py::arg("groups"), py::arg("state_size"),
      py::arg("x"), py::arg("dt"), py::arg("a"), py::arg("b"), py::arg("c"), py::arg("d"),
      py::arg("y"), py::call_guard<py::gil_scoped_release>(),
      "Mamba2's one-token state update in place on the slots (raw data pointers).");
  m.def(
      "_short_conv_update_ptr",
      [](uintptr_t conv_state, uintptr_t slots, int64_t batch, int64_t num_slots, int64_t hidden,
         int64_t kernel, uintptr_t bcx, uintptr_t weight, uintptr_t bias, uintptr_t y,
         DType dtype) {
        short_conv_update(ptr<void>(conv_state), ptr<const int64_t>(slots), batch, num_slots,
                          hidden, kernel, ptr<const void>(bcx), ptr<const void>(weight),
                          ptr<const void>(bias), ptr<void>(y), dtype);
      },
      py::arg("conv_state"), py::arg("slots"), py::arg("batch"), py::arg("num_slots"),
      py::arg("hidden"), py::arg("kernel"), py::arg("bcx"), py::arg("weight"), py::arg("bias"),
      py::arg("y"), py::arg("dtype"), py::call_guard<py::gil_scoped_release>(),
      "LFM2's gated short convolution for one token, in place on the slots.");
  m.def(
      "_silu_and_mul_ptr",
      [](uintptr_t out, uintptr_t x, int64_t num_tokens, int64_t intermediate_size,
         DType dtype) {
        silu_and_mul(ptr<void>(out), ptr<const void>(x), num_tokens, intermediate_size, dtype);
      },
      py::arg("out"), py::arg("x"), py::arg("num_tokens"), py::arg("intermediate_size"),
      py::arg("dtype"), py::call_guard<py::gil_scoped_release>(),
      "silu(gate) * up on raw data pointers.");
  m.def(
      "_rotary_embedding_ptr",
      [](uintptr_t positions, uintptr_t query, uintptr_t key, uintptr_t cos_sin_cache,
         int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
         int64_t query_stride, int64_t key_stride, int64_t max_positions, bool is_neox,
         DType dtype) {
        rotary_embedding(ptr<const int64_t>(positions), ptr<void>(query), ptr<void>(key),
                         ptr<const void>(cos_sin_cache), num_tokens, num_heads, num_kv_heads,
                         head_size, query_stride, key_stride, max_positions, is_neox, dtype);
      },
      py::arg("positions"), py::arg("query"), py::arg("key"), py::arg("cos_sin_cache"),
      py::arg("num_tokens"), py::arg("num_heads"), py::arg("num_kv_heads"),
      py::arg("head_size"), py::arg("query_stride"), py::arg("key_stride"),
      py::arg("max_positions"), py::arg("is_neox"), py::arg("dtype"),
      py::call_guard<py::gil_scoped_release>(), "RoPE in place on raw data pointers.");

  // Linear layers, dense or GGUF block-quantized (see paternoster/linear.h).
  m.def("weight_row_bytes", &weight_row_bytes, py::arg("format"), py::arg("in_features"),
        "Bytes of one weight row of in_features values in `format`.");
  m.def("linear_isa", &linear_isa, "SIMD variant of the linear kernel in use.");
  m.def("available_linear_isas", &available_linear_isas,
        "SIMD variants of the linear kernel this build and CPU can run, best first.");
  m.def(
      "_linear_ptr",
      [](uintptr_t out, DType out_dtype, uintptr_t x, DType x_dtype, uintptr_t weight,
         WeightFormat format, uintptr_t bias, int64_t num_tokens, int64_t out_features,
         int64_t in_features, const std::string& isa, bool batch_invariant) {
        if (isa.empty()) {
          linear(ptr<void>(out), out_dtype, ptr<const void>(x), x_dtype, ptr<const void>(weight),
                 format, ptr<const void>(bias), num_tokens, out_features, in_features,
                 batch_invariant);
        } else {
          linear_isa_variant(isa.c_str(), ptr<void>(out), out_dtype, ptr<const void>(x), x_dtype,
                             ptr<const void>(weight), format, ptr<const void>(bias), num_tokens,
                             out_features, in_features, batch_invariant);
        }
      },
      py::arg("out"), py::arg("out_dtype"), py::arg("x"), py::arg("x_dtype"), py::arg("weight"),
      py::arg("format"), py::arg("bias"), py::arg("num_tokens"), py::arg("out_features"),
      py::arg("in_features"), py::arg("isa") = "", py::arg("batch_invariant") = false,
      py::call_guard<py::gil_scoped_release>(),
      "out = x W^T (+ bias) on raw data pointers (bias 0: none; isa '': the default; "
      "batch_invariant: no 8-bit activation path, see paternoster/linear.h).");
  m.def(
      "_linear_parts_ptr",
      [](uintptr_t out, DType out_dtype, uintptr_t x, DType x_dtype,
         const PartTuples& parts, uintptr_t bias, int64_t num_tokens, int64_t in_features,
         bool batch_invariant) {
        const std::vector<WeightPart> ps = weight_parts(parts);
        py::gil_scoped_release release;
        linear_parts(ptr<void>(out), out_dtype, ptr<const void>(x), x_dtype, ps.data(),
                     static_cast<int64_t>(ps.size()), ptr<const void>(bias), num_tokens,
                     in_features, batch_invariant);
      },
      py::arg("out"), py::arg("out_dtype"), py::arg("x"), py::arg("x_dtype"), py::arg("parts"),
      py::arg("bias"), py::arg("num_tokens"), py::arg("in_features"),
      py::arg("batch_invariant") = false,
      "out = x W^T (+ bias) with W the rows of parts [(data, format, rows)] stacked "
      "(paternoster/linear.h: linear_parts).");
  m.def(
      "_dequantize_rows_ptr",
      [](uintptr_t out, uintptr_t weight, WeightFormat format, int64_t num_rows,
         int64_t in_features) {
        dequantize_rows(ptr<float>(out), ptr<const void>(weight), format, num_rows, in_features);
      },
      py::arg("out"), py::arg("weight"), py::arg("format"), py::arg("num_rows"),
      py::arg("in_features"), py::call_guard<py::gil_scoped_release>(),
      "Dequantize weight rows to float32 on raw data pointers.");

  // Routed experts in one call (see paternoster/moe.h).
  py::class_<MoeExperts>(m, "MoeExperts",
                         "Routed experts run in one call on raw pointers.")
      .def(py::init([](int64_t hidden_size, int64_t intermediate_size,
                                   int64_t num_experts, int64_t top_k, bool norm_topk_prob,
                                   DType dtype, const PartTuples& router,
                                   const PartTuples& gate_up, const PartTuples& down,
                                   uintptr_t router_bias,
                                   uintptr_t gate_up_bias, uintptr_t down_bias, int activation,
                                   float alpha, float limit, bool sigmoid,
                                   uintptr_t selection_bias, float norm_eps, float scaling,
                                   int64_t groups, int64_t topk_groups) {
             const MoeBiases biases{ptr<const void>(router_bias), ptr<const void>(gate_up_bias),
                                    ptr<const void>(down_bias)};
             const MoeRouting routing{sigmoid, ptr<const float>(selection_bias), norm_eps,
                                      scaling, groups, topk_groups};
             return new MoeExperts(hidden_size, intermediate_size, num_experts, top_k,
                                   norm_topk_prob, dtype, weight_parts(router),
                                   weight_parts(gate_up), weight_parts(down), biases,
                                   static_cast<MoeActivation>(activation), alpha, limit,
                                   routing);
           }),
           py::arg("hidden_size"), py::arg("intermediate_size"), py::arg("num_experts"),
           py::arg("top_k"), py::arg("norm_topk_prob"), py::arg("dtype"), py::arg("router"),
           py::arg("gate_up"), py::arg("down"), py::arg("router_bias") = 0,
           py::arg("gate_up_bias") = 0, py::arg("down_bias") = 0, py::arg("activation") = 0,
           py::arg("alpha") = 0.0f, py::arg("limit") = 0.0f, py::arg("sigmoid") = false,
           py::arg("selection_bias") = 0, py::arg("norm_eps") = 0.0f,
           py::arg("scaling") = 1.0f, py::arg("groups") = 1, py::arg("topk_groups") = 1)
      .def(
          "_forward_ptr",
          [](const MoeExperts& e, uintptr_t out, uintptr_t x, int64_t num_tokens,
             bool batch_invariant) {
            e.forward(ptr<void>(out), ptr<const void>(x), num_tokens, batch_invariant);
          },
          py::arg("out"), py::arg("x"), py::arg("num_tokens"), py::arg("batch_invariant"),
          py::call_guard<py::gil_scoped_release>(), "out = the block on x (paternoster/moe.h).");
  m.def(
      "_moe_route_ptr",
      [](uintptr_t weights, uintptr_t experts, uintptr_t logits, int64_t num_tokens,
         int64_t num_experts, int64_t top_k, bool renormalize) {
        moe_route(ptr<float>(weights), ptr<int32_t>(experts), ptr<const float>(logits),
                  num_tokens, num_experts, top_k, renormalize);
      },
      py::arg("weights"), py::arg("experts"), py::arg("logits"), py::arg("num_tokens"),
      py::arg("num_experts"), py::arg("top_k"), py::arg("renormalize"),
      py::call_guard<py::gil_scoped_release>(), "Softmax top-k routing (paternoster/moe.h).");

  // The decoder stack in one call (see paternoster/decoder.h).
  py::class_<DecoderStack>(m, "DecoderStack",
                           "A Llama-family decoder stack run in one call on raw pointers.")
      .def(py::init([](int64_t hidden_size, int64_t num_heads, int64_t num_kv_heads,
                       int64_t head_size, int64_t intermediate_size, double rms_norm_eps,
                       DType dtype, uintptr_t cos_sin_cache, int64_t max_positions, bool is_neox,
                       int64_t num_blocks, int64_t block_size, bool batch_invariant,
                       const std::vector<std::vector<uint64_t>>& layers, uintptr_t final_norm,
                       const std::vector<py::object>& moe) {
             if (!moe.empty() && moe.size() != layers.size()) {
               throw std::invalid_argument("moe needs one entry (or None) per layer");
             }
             DecoderConfig c;
             c.hidden_size = hidden_size;
             c.num_heads = num_heads;
             c.num_kv_heads = num_kv_heads;
             c.head_size = head_size;
             c.intermediate_size = intermediate_size;
             c.rms_norm_eps = rms_norm_eps;
             c.dtype = dtype;
             c.cos_sin_cache = ptr<const void>(cos_sin_cache);
             c.max_positions = max_positions;
             c.is_neox = is_neox;
             c.num_blocks = num_blocks;
             c.block_size = block_size;
             c.batch_invariant = batch_invariant;
             std::vector<DecoderLayer> ls;
             for (const auto& f : layers) {
               // 20 fields, then per projection stored in parts: its slot
               // (0 qkv, 1 o, 2 gate_up, 3 down), count, (data, format, rows) each.
               if (f.size() < 20) throw std::invalid_argument("a layer needs 20 fields");
               auto w = [&](size_t i) {
                 return DecoderWeight{ptr<const void>(f[i]), static_cast<WeightFormat>(f[i + 1]),
                                      ptr<const void>(f[i + 2]), {}};
               };
               DecoderLayer l;
               l.input_norm = ptr<const void>(f[0]);
               l.post_attention_norm = ptr<const void>(f[1]);
               l.qkv = w(2);
               l.o = w(5);
               l.gate_up = w(8);
               l.down = w(11);
               l.key_cache = ptr<void>(f[14]);
               l.value_cache = ptr<void>(f[15]);
               l.q_norm = ptr<const void>(f[16]);
               l.k_norm = ptr<const void>(f[17]);
               l.use_rope = f[18] != 0;
               l.sliding_window = static_cast<int64_t>(f[19]);
               DecoderWeight* slots[] = {&l.qkv, &l.o, &l.gate_up, &l.down};
               for (size_t i = 20; i < f.size();) {
                 if (i + 2 > f.size() || f[i] > 3 || i + 2 + 3 * f[i + 1] > f.size()) {
                   throw std::invalid_argument("malformed weight parts in a layer's fields");
                 }
                 DecoderWeight* slot = slots[f[i]];
                 for (uint64_t p = 0; p < f[i + 1]; ++p) {
                   const size_t at = i + 2 + 3 * p;
                   slot->parts.push_back(WeightPart{ptr<const void>(f[at]),
                                                    static_cast<WeightFormat>(f[at + 1]),
                                                    static_cast<int64_t>(f[at + 2])});
                 }
                 i += 2 + 3 * f[i + 1];
               }
               if (!moe.empty() && !moe[ls.size()].is_none()) {
                 l.moe = moe[ls.size()].cast<const MoeExperts*>();
               }
               ls.push_back(l);
             }
             return new DecoderStack(c, std::move(ls), ptr<const void>(final_norm));
           }),
           py::arg("hidden_size"), py::arg("num_heads"), py::arg("num_kv_heads"),
           py::arg("head_size"), py::arg("intermediate_size"), py::arg("rms_norm_eps"),
           py::arg("dtype"), py::arg("cos_sin_cache"), py::arg("max_positions"),
           py::arg("is_neox"), py::arg("num_blocks"), py::arg("block_size"),
           py::arg("batch_invariant"), py::arg("layers"), py::arg("final_norm"),
           py::arg("moe") = std::vector<py::object>{}, py::keep_alive<1, 17>())
      .def(
          "_forward_ptr",
          [](DecoderStack& s, uintptr_t out, uintptr_t x, uintptr_t positions,
             uintptr_t slot_mapping, uintptr_t block_tables, uintptr_t seq_lens,
             uintptr_t query_start_loc, int64_t num_tokens, int64_t num_seqs,
             int64_t max_blocks_per_seq) {
            s.forward(ptr<void>(out), ptr<void>(x), ptr<const int64_t>(positions),
                      ptr<const int64_t>(slot_mapping), ptr<const int32_t>(block_tables),
                      ptr<const int32_t>(seq_lens), ptr<const int32_t>(query_start_loc),
                      num_tokens, num_seqs, max_blocks_per_seq);
          },
          py::arg("out"), py::arg("x"), py::arg("positions"), py::arg("slot_mapping"),
          py::arg("block_tables"), py::arg("seq_lens"), py::arg("query_start_loc"),
          py::arg("num_tokens"), py::arg("num_seqs"), py::arg("max_blocks_per_seq"),
          py::call_guard<py::gil_scoped_release>(), "One step (see paternoster/decoder.h).")
      .def_property_readonly("num_layers", &DecoderStack::num_layers);
}
