// pybind11 module paternoster._cuda_ops: the CUDA kernels on raw device
// pointers, torch-free (like paternoster._core). The stream is an integer
// handle (torch.cuda.Stream.cuda_stream); `device` is the CUDA device index,
// made current for the launch. Signatures and docs: python/paternoster/_cuda_ops.pyi.
//
// Linked with the static CUDA runtime: importing needs no GPU and no driver;
// a call on a machine without one raises RuntimeError naming the CUDA error.
// Error mapping: std::invalid_argument -> ValueError; a CUDA error -> RuntimeError.
//
// Built a second time as paternoster._cuda_emu (PATERNOSTER_CUDA_EMU): the same
// kernels and API on the CPU emulation of cuda/emu, where device addresses are
// host addresses; it adds set_schedule_seed() and emu_stats().
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "paternoster/cuda_attention.h"

namespace py = pybind11;
namespace pc = paternoster::cuda;

namespace {

template <typename T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": CUDA error " + cudaGetErrorName(err) + ": " +
                             cudaGetErrorString(err));
  }
}

void set_device(int device) {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device) return;
  check(cudaSetDevice(device), "cudaSetDevice");
}

cudaStream_t stream_of(uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

}  // namespace

#ifdef PATERNOSTER_CUDA_EMU
#define PN_CUDA_MODULE _cuda_emu
#else
#define PN_CUDA_MODULE _cuda_ops
#endif

PYBIND11_MODULE(PN_CUDA_MODULE, m) {
#ifdef PATERNOSTER_CUDA_EMU
  m.doc() =
      "The CUDA kernels run on the CPU emulation of the CUDA execution model (cuda/emu): "
      "addresses are host addresses; for tests.";
  m.def("set_schedule_seed", &pn_emu::set_schedule_seed, py::arg("seed"),
        "0: emulated threads run in index order between barriers; otherwise the seed of a "
        "shuffled order. Returns the previous seed.");
  m.def(
      "emu_stats",
      [](bool reset) {
        const pn_emu::Stats s = pn_emu::stats();
        if (reset) pn_emu::reset_stats();
        py::dict d;
        d["launches"] = s.launches;
        d["blocks"] = s.blocks;
        d["threads"] = s.threads;
        d["switches"] = s.switches;
        return d;
      },
      py::arg("reset") = false,
      "Kernel launches, thread blocks, threads and fiber switches since the last reset.");
#else
  m.doc() = "CUDA paged attention and reshape_and_cache on raw device pointers.";
#endif

  // module_local: _cuda_ops and _cuda_emu both bind this C++ type.
  py::enum_<pc::DType>(m, "DType", py::module_local())
      .value("float16", pc::DType::kFloat16)
      .value("bfloat16", pc::DType::kBFloat16);

  m.attr("MIN_SPLIT_TOKENS") = pc::kMinSplitTokens;
  m.attr("MAX_SPLITS") = pc::kMaxSplits;

  m.def(
      "device_count",
      []() {
        int n = 0;
        const cudaError_t err = cudaGetDeviceCount(&n);
        if (err != cudaSuccess) {
          cudaGetLastError();  // reset the runtime's last-error state
          return 0;
        }
        return n;
      },
      "CUDA devices this module's runtime sees (0 without a GPU or driver; never raises).");

  m.def(
      "reshape_and_cache",
      [](uintptr_t key, uintptr_t value, uintptr_t key_cache, uintptr_t value_cache,
         uintptr_t slot_mapping, int64_t num_tokens, int64_t num_kv_heads, int64_t head_size,
         int64_t key_stride, int64_t value_stride, int64_t num_slots, pc::DType dtype,
         int device, uintptr_t stream) {
        pc::CacheWriteArgs a;
        a.key = ptr<const void>(key);
        a.value = ptr<const void>(value);
        a.key_cache = ptr<void>(key_cache);
        a.value_cache = ptr<void>(value_cache);
        a.slot_mapping = ptr<const int64_t>(slot_mapping);
        a.num_tokens = num_tokens;
        a.num_kv_heads = num_kv_heads;
        a.head_size = head_size;
        a.key_stride = key_stride;
        a.value_stride = value_stride;
        a.num_slots = num_slots;
        a.dtype = dtype;
        pc::check_cache_write_args(a);  // ValueError before any CUDA call
        if (num_tokens == 0) return;
        set_device(device);
        check(pc::reshape_and_cache(a, stream_of(stream)), "reshape_and_cache");
      },
      py::arg("key"), py::arg("value"), py::arg("key_cache"), py::arg("value_cache"),
      py::arg("slot_mapping"), py::arg("num_tokens"), py::arg("num_kv_heads"),
      py::arg("head_size"), py::arg("key_stride"), py::arg("value_stride"), py::arg("num_slots"),
      py::arg("dtype"), py::arg("device"), py::arg("stream"),
      "Write K/V rows into their cache slots (see paternoster.ops.reshape_and_cache).");

  m.def(
      "paged_attention",
      [](uintptr_t out, uintptr_t query, uintptr_t key_cache, uintptr_t value_cache,
         uintptr_t block_tables, uintptr_t seq_lens, uintptr_t query_start_loc,
         int64_t num_tokens, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
         int64_t head_size, int64_t num_blocks, int64_t block_size, int64_t max_blocks_per_seq,
         int64_t query_stride, int64_t out_stride, int64_t max_query_len, int64_t max_seq_len,
         double scale, pc::DType dtype, uintptr_t workspace, int64_t workspace_bytes,
         int num_sms, int device, uintptr_t stream, int64_t sliding_window, uintptr_t sinks) {
        pc::PagedAttentionArgs a;
        a.out = ptr<void>(out);
        a.query = ptr<const void>(query);
        a.key_cache = ptr<const void>(key_cache);
        a.value_cache = ptr<const void>(value_cache);
        a.block_tables = ptr<const int32_t>(block_tables);
        a.seq_lens = ptr<const int32_t>(seq_lens);
        a.query_start_loc = ptr<const int32_t>(query_start_loc);
        a.num_tokens = num_tokens;
        a.num_seqs = num_seqs;
        a.num_heads = num_heads;
        a.num_kv_heads = num_kv_heads;
        a.head_size = head_size;
        a.num_blocks = num_blocks;
        a.block_size = block_size;
        a.max_blocks_per_seq = max_blocks_per_seq;
        a.query_stride = query_stride;
        a.out_stride = out_stride;
        a.max_query_len = max_query_len;
        a.max_seq_len = max_seq_len;
        a.scale = static_cast<float>(scale);
        a.dtype = dtype;
        a.workspace = ptr<void>(workspace);
        a.workspace_bytes = workspace_bytes;
        a.num_sms = num_sms;
        a.sliding_window = sliding_window;
        a.sinks = ptr<const float>(sinks);
        pc::check_paged_attention_args(a);  // ValueError before any CUDA call
        if (num_tokens == 0 || num_seqs == 0) return;
        set_device(device);
        check(pc::paged_attention(a, stream_of(stream)), "paged_attention");
      },
      py::arg("out"), py::arg("query"), py::arg("key_cache"), py::arg("value_cache"),
      py::arg("block_tables"), py::arg("seq_lens"), py::arg("query_start_loc"),
      py::arg("num_tokens"), py::arg("num_seqs"), py::arg("num_heads"), py::arg("num_kv_heads"),
      py::arg("head_size"), py::arg("num_blocks"), py::arg("block_size"),
      py::arg("max_blocks_per_seq"), py::arg("query_stride"), py::arg("out_stride"),
      py::arg("max_query_len"), py::arg("max_seq_len"), py::arg("scale"), py::arg("dtype"),
      py::arg("workspace"), py::arg("workspace_bytes"), py::arg("num_sms"), py::arg("device"),
      py::arg("stream"), py::arg("sliding_window") = 0, py::arg("sinks") = 0,
      "Paged attention (decode split-K kernel + prefill kernel); see paternoster.ops.");

  m.def("decode_num_splits", &pc::decode_num_splits, py::arg("num_seqs"), py::arg("num_heads"),
        py::arg("num_kv_heads"), py::arg("max_seq_len"), py::arg("num_sms"),
        "Context splits of the decode kernel for these sizes (before the workspace limit).");
  m.def("decode_workspace_bytes", &pc::decode_workspace_bytes, py::arg("max_num_seqs"),
        py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("head_size"),
        py::arg("max_seq_len"), py::arg("num_sms"),
        "Split-K workspace bytes for any batch of up to max_num_seqs decodes.");
}
