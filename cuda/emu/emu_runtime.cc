// The scheduler of the CUDA emulation (see cuda_emu.h): fibers for the threads
// of a block, barriers, warp shuffles, and the few runtime API calls the host
// code makes. x86-64 System V only (the fiber switch is 12 instructions of
// assembly; a portable ucontext switch costs a system call per switch).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_emu.h"

#if !defined(__x86_64__)
#error "the CUDA emulation's fiber switch is written for x86-64"
#endif

// pn_emu_switch(save, next): pushes the callee-saved registers, stores the
// stack pointer in *save, loads `next` and pops the registers saved there.
extern "C" void pn_emu_switch(void** save, void* next);
asm(R"(
  .text
  .globl pn_emu_switch
  .type pn_emu_switch, @function
pn_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size pn_emu_switch, .-pn_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

namespace pn_emu {

thread_local ThreadState* current_thread = nullptr;
thread_local uint3 block_idx;
thread_local dim3 block_dim;
thread_local dim3 grid_dim;

namespace {

constexpr size_t kStackBytes = 256 * 1024;  // per emulated thread (+ a guard page)
constexpr int kWarpSize = 32;
// Dynamic shared memory per block: the default limit, and the most a kernel
// may opt in to (an H100/H200's cudaDevAttrMaxSharedMemoryPerBlockOptin).
constexpr int kDefaultDynamicShared = 48 * 1024;
constexpr int kMaxSharedOptin = 232448;

enum class State { kRunnable, kWaitBlock, kWaitWarp, kDone };
enum class WarpWait { kNone, kSyncwarp, kShuffle };

struct Fiber : ThreadState {
  void* sp = nullptr;
  State state = State::kRunnable;
  int linear = 0;  // x + y * bx + z * bx * by
};

struct Warp {
  int live = 0;     // lanes that exist and have not exited
  int arrived = 0;  // lanes waiting at the current warp barrier
  WarpWait kind = WarpWait::kNone;
  int phase = 0;  // shuffle buffer in use (double-buffered: one barrier a shuffle)
  uint32_t value[2][kWarpSize] = {};
};

// One emulated block in flight on this host thread.
struct Block {
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  int live = 0;
  int arrived = 0;  // threads waiting at __syncthreads
  void* scheduler_sp = nullptr;
  const std::function<void()>* body = nullptr;
  std::string error;  // set by a fiber: the launch fails with it
};

thread_local Block* g_block = nullptr;
// The running launch's dynamic shared memory (16-byte units) and its size.
struct alignas(16) Chunk16 {
  unsigned char bytes[16];
};
thread_local std::vector<Chunk16> g_dynamic_shared;
thread_local size_t g_dynamic_bytes = 0;
// cudaFuncAttributeMaxDynamicSharedMemorySize per kernel (a device-wide
// attribute, so shared by the host threads).
std::mutex g_attr_mutex;
std::unordered_map<const void*, int> g_max_dynamic_shared;

int max_dynamic_shared(const void* kernel) {
  std::lock_guard<std::mutex> lock(g_attr_mutex);
  const auto it = g_max_dynamic_shared.find(kernel);
  return it == g_max_dynamic_shared.end() ? kDefaultDynamicShared : it->second;
}
thread_local cudaError_t g_last_error = cudaSuccess;
thread_local std::string g_last_message;
thread_local uint64_t g_seed = 0;
thread_local Stats g_stats = {};

// Stacks are reused across blocks and launches (mmap'd once, guard page below).
struct StackPool {
  std::vector<char*> stacks;
  ~StackPool() {
    for (char* s : stacks) munmap(s - page(), kStackBytes + page());
  }
  static size_t page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
  char* get(size_t i) {
    while (stacks.size() <= i) {
      void* m = mmap(nullptr, kStackBytes + page(), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) {
        std::perror("pn_emu: mmap");
        std::abort();
      }
      mprotect(m, page(), PROT_NONE);
      stacks.push_back(static_cast<char*>(m) + page());
    }
    return stacks[i];
  }
};
thread_local StackPool g_stacks;

Fiber& self() { return *static_cast<Fiber*>(current_thread); }

// Back to the scheduler; returns when this fiber is scheduled again.
void yield() {
  Fiber& f = self();
  ++g_stats.switches;
  pn_emu_switch(&f.sp, g_block->scheduler_sp);
}

// Ends the launch from inside a fiber (never returns to the kernel).
[[noreturn]] void fail(const std::string& why) {
  Fiber& f = self();
  char where[128];
  std::snprintf(where, sizeof(where), " (block (%u, %u, %u), thread (%u, %u, %u))", block_idx.x,
                block_idx.y, block_idx.z, f.thread_idx.x, f.thread_idx.y, f.thread_idx.z);
  if (g_block->error.empty()) g_block->error = why + where;
  f.state = State::kDone;
  pn_emu_switch(&f.sp, g_block->scheduler_sp);
  std::abort();  // an errored block is never resumed
}

void release_warp(Warp& w, int first) {
  const int end = std::min<int>(first + kWarpSize, static_cast<int>(g_block->fibers.size()));
  for (int i = first; i < end; ++i) {
    Fiber& f = g_block->fibers[i];
    if (f.state == State::kWaitWarp) f.state = State::kRunnable;
  }
  w.arrived = 0;
  w.kind = WarpWait::kNone;
}

void release_block() {
  for (Fiber& f : g_block->fibers) {
    if (f.state == State::kWaitBlock) f.state = State::kRunnable;
  }
  g_block->arrived = 0;
}

// Waits at the barrier of this fiber's warp (kind: a shuffle or __syncwarp).
void warp_barrier(WarpWait kind) {
  Fiber& f = self();
  const int wi = f.linear / kWarpSize;
  Warp& w = g_block->warps[wi];
  if (w.kind != WarpWait::kNone && w.kind != kind) {
    fail("lanes of one warp wait at different barriers (a shuffle and __syncwarp)");
  }
  if (kind == WarpWait::kShuffle && w.live != kWarpSize) {
    fail("__shfl_xor_sync with mask 0xffffffff in a warp with exited or missing lanes");
  }
  w.kind = kind;
  f.state = State::kWaitWarp;
  if (++w.arrived == w.live) release_warp(w, wi * kWarpSize);
  yield();
}

void fiber_main() {
  Fiber& f = self();
  (*g_block->body)();
  // Exit: barriers stop counting this thread.
  Block& b = *g_block;
  Warp& w = b.warps[f.linear / kWarpSize];
  f.state = State::kDone;
  --w.live;
  --b.live;
  if (w.arrived > 0 && w.arrived == w.live) {
    if (w.kind == WarpWait::kShuffle) {
      if (b.error.empty()) b.error = "a lane exited while its warp waits at a shuffle";
    } else {
      release_warp(w, (f.linear / kWarpSize) * kWarpSize);
    }
  }
  if (b.arrived > 0 && b.arrived == b.live) release_block();
  ++g_stats.switches;
  pn_emu_switch(&f.sp, b.scheduler_sp);
  std::abort();  // a finished fiber is never resumed
}

[[noreturn]] void trampoline() {
  fiber_main();
  std::abort();
}

// A fresh stack whose first switch "returns" into trampoline().
void* initial_sp(char* stack) {
  auto top = reinterpret_cast<uintptr_t>(stack + kStackBytes) & ~uintptr_t{15};
  auto* sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                                     // trampoline's return address
  *--sp = reinterpret_cast<void*>(&trampoline);        // popped by `ret`
  for (int i = 0; i < 6; ++i) *--sp = nullptr;         // rbp rbx r12 r13 r14 r15
  return sp;
}

uint64_t next_random(uint64_t& s) {  // xorshift64*
  s ^= s >> 12;
  s ^= s << 25;
  s ^= s >> 27;
  return s * 0x2545F4914F6CDD1DULL;
}

// Runs one block to completion; returns an error message or "".
std::string run_block(Block& b, dim3 block, uint64_t& rng) {
  const int n = static_cast<int>(block.x * block.y * block.z);
  b.fibers.assign(n, Fiber{});
  b.warps.assign((n + kWarpSize - 1) / kWarpSize, Warp{});
  b.live = n;
  b.arrived = 0;
  b.error.clear();
  for (int i = 0; i < n; ++i) {
    Fiber& f = b.fibers[i];
    f.linear = i;
    f.thread_idx = make_uint3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
    f.sp = initial_sp(g_stacks.get(i));
    ++b.warps[i / kWarpSize].live;
  }
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  int done = 0;
  while (done < n) {
    if (g_seed != 0) {
      for (int i = n - 1; i > 0; --i) std::swap(order[i], order[next_random(rng) % (i + 1)]);
    }
    bool ran = false;
    for (int i : order) {
      Fiber& f = b.fibers[i];
      if (f.state != State::kRunnable) continue;
      ran = true;
      current_thread = &f;
      ++g_stats.switches;
      pn_emu_switch(&b.scheduler_sp, f.sp);
      current_thread = nullptr;
      if (!b.error.empty()) return b.error;
      if (f.state == State::kDone) ++done;
    }
    if (!ran && done < n) {
      int at_block = 0, at_warp = 0;
      for (const Fiber& f : b.fibers) {
        at_block += f.state == State::kWaitBlock;
        at_warp += f.state == State::kWaitWarp;
      }
      return "deadlock: " + std::to_string(at_block) + " threads wait at __syncthreads, " +
             std::to_string(at_warp) + " at a warp barrier, " + std::to_string(done) +
             " exited";
    }
  }
  return "";
}

const char* error_name(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    default: return "cudaErrorUnknown";
  }
}

}  // namespace

void fault(const char* why) { fail(why); }

void* dynamic_shared_memory() {
  if (g_dynamic_bytes == 0) fail("dynamic shared memory used by a launch with smem = 0");
  return g_dynamic_shared.data();
}

void syncthreads() {
  Fiber& f = self();
  Block& b = *g_block;
  f.state = State::kWaitBlock;
  if (++b.arrived == b.live) release_block();
  yield();
}

void syncwarp(unsigned mask) {
  if (mask != 0xffffffffu) fail("__syncwarp with a partial mask is not emulated");
  warp_barrier(WarpWait::kSyncwarp);
}

uint32_t shfl_xor_bits(unsigned mask, uint32_t bits, int lane_mask, int width) {
  if (mask != 0xffffffffu) fail("__shfl_xor_sync with a partial mask is not emulated");
  if (width != kWarpSize) fail("__shfl_xor_sync with width != 32 is not emulated");
  Fiber& f = self();
  Warp& w = g_block->warps[f.linear / kWarpSize];
  const int lane = f.linear % kWarpSize;
  const int phase = w.phase;
  w.value[phase][lane] = bits;
  // The last lane to arrive flips the phase: the next shuffle writes the other
  // buffer while slower lanes may still read this one.
  if (w.arrived + 1 == w.live) w.phase ^= 1;
  warp_barrier(WarpWait::kShuffle);
  return w.value[phase][(lane ^ lane_mask) & (kWarpSize - 1)];
}

cudaError_t run_grid(dim3 grid, dim3 block, size_t shared_bytes, const void* kernel,
                     const std::function<void()>& body) {
  ++g_stats.launches;
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > 1024 ||
      block.x > 1024 || block.y > 1024 || block.z > 64 || grid.y > 65535 || grid.z > 65535 ||
      grid.x > 0x7fffffffu) {
    g_last_error = cudaErrorInvalidConfiguration;
    char msg[160];
    std::snprintf(msg, sizeof(msg), "invalid launch configuration: grid (%u, %u, %u), block (%u, %u, %u)",
                  grid.x, grid.y, grid.z, block.x, block.y, block.z);
    g_last_message = msg;
    return g_last_error;
  }
  if (g_block != nullptr) {
    g_last_error = cudaErrorLaunchFailure;
    g_last_message = "a kernel launched another kernel (not emulated)";
    return g_last_error;
  }
  const int limit = max_dynamic_shared(kernel);
  if (shared_bytes > static_cast<size_t>(limit)) {
    g_last_error = cudaErrorInvalidValue;
    g_last_message = "dynamic shared memory of " + std::to_string(shared_bytes) +
                     " bytes exceeds the kernel's limit of " + std::to_string(limit) +
                     " (cudaFuncAttributeMaxDynamicSharedMemorySize)";
    return g_last_error;
  }
  g_dynamic_bytes = shared_bytes;
  g_dynamic_shared.resize((shared_bytes + 15) / 16);
  Block b;
  b.body = &body;
  g_block = &b;
  grid_dim = grid;
  block_dim = block;
  uint64_t rng = g_seed;
  std::string error;
  for (unsigned z = 0; z < grid.z && error.empty(); ++z) {
    for (unsigned y = 0; y < grid.y && error.empty(); ++y) {
      for (unsigned x = 0; x < grid.x && error.empty(); ++x) {
        block_idx = make_uint3(x, y, z);
        if (!g_dynamic_shared.empty()) {  // uninitialised, as on a GPU
          std::memset(static_cast<void*>(g_dynamic_shared.data()), 0xff,
                      g_dynamic_shared.size() * sizeof(Chunk16));
        }
        ++g_stats.blocks;
        g_stats.threads += threads;
        error = run_block(b, block, rng);
      }
    }
  }
  g_block = nullptr;
  g_dynamic_bytes = 0;
  if (!error.empty()) {
    g_last_error = cudaErrorLaunchFailure;
    g_last_message = "emulated kernel failed: " + error;
    std::fprintf(stderr, "pn_emu: %s\n", g_last_message.c_str());
  }
  return error.empty() ? cudaSuccess : cudaErrorLaunchFailure;
}

uint64_t set_schedule_seed(uint64_t seed) {
  const uint64_t old = g_seed;
  g_seed = seed;
  return old;
}

Stats stats() { return g_stats; }
void reset_stats() { g_stats = {}; }

}  // namespace pn_emu

// ------------------------------------------------------------ runtime API
extern "C" {

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = pn_emu::g_last_error;
  pn_emu::g_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return pn_emu::g_last_error; }

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device == 0) return cudaSuccess;
  pn_emu::g_last_error = cudaErrorInvalidDevice;
  pn_emu::g_last_message = "the emulation has one device (0)";
  return cudaErrorInvalidDevice;
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

// 132 multiprocessors: an H100/H200 SXM, so split-K plans match that device's.
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  if (attr == cudaDevAttrMultiProcessorCount) {
    *value = 132;
    return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}

// The attributes a launch depends on: the dynamic shared memory limit (0 ..
// kMaxSharedOptin bytes) and the carveout hint (accepted, no effect).
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (func == nullptr) return cudaErrorInvalidDeviceFunction;
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > pn_emu::kMaxSharedOptin) {
      pn_emu::g_last_error = cudaErrorInvalidValue;
      pn_emu::g_last_message = "cudaFuncAttributeMaxDynamicSharedMemorySize " +
                               std::to_string(value) + " is outside 0 .. " +
                               std::to_string(pn_emu::kMaxSharedOptin) +
                               " bytes (the device's opt-in limit)";
      return cudaErrorInvalidValue;
    }
    std::lock_guard<std::mutex> lock(pn_emu::g_attr_mutex);
    pn_emu::g_max_dynamic_shared[func] = value;
    return cudaSuccess;
  }
  if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
  return cudaErrorInvalidValue;
}

const char* cudaGetErrorName(cudaError_t error) { return pn_emu::error_name(error); }

const char* cudaGetErrorString(cudaError_t error) {
  if (error != cudaSuccess && !pn_emu::g_last_message.empty()) {
    return pn_emu::g_last_message.c_str();
  }
  return pn_emu::error_name(error);
}

}  // extern "C"
