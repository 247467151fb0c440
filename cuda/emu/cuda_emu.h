// A CPU emulation of the CUDA execution model, so the kernels in cuda/src run
// (slowly, exactly) on a machine without a GPU: the kernel sources compile
// unchanged as host C++ with this header force-included (-include), after
// cuda/emu/rewrite_launches.py has turned each `kernel<<<grid, block, smem,
// stream>>>(args)` into `::pn_emu::launch(kernel, grid, block, smem, stream)(args)`.
//
// Model (the CUDA C++ Programming Guide's, restricted to what the kernels use):
//   - A launch runs its thread blocks one after another on the calling thread.
//     Every CUDA thread of a block is a fiber (its own stack); fibers switch
//     only at __syncthreads(), __syncwarp() and warp shuffles, so between two
//     of those each thread runs alone, in an order the scheduler chooses. With
//     a schedule seed (set_schedule_seed) that order is shuffled per round: a
//     missing barrier between a shared-memory write and another thread's read
//     then changes the result between seeds.
//   - __shared__ variables are function-local statics (one block at a time).
//     Dynamic shared memory (`extern __shared__ T name[]`, rewritten to
//     dynamic_shared<T>()) is a buffer of the launch's smem bytes, filled with
//     0xff bytes (NaN floats, -1 ints) before each block, as a GPU leaves it
//     uninitialised. More than 48 KiB of it needs the kernel's
//     cudaFuncAttributeMaxDynamicSharedMemorySize first (up to an H100's 227 KiB
//     opt-in), else the launch fails with cudaErrorInvalidValue, as on a GPU.
//   - Barriers count the threads that have not exited, as on Volta and later.
//     Checked, and reported as a launch failure (cudaErrorLaunchFailure with
//     the reason in cudaGetErrorString): a shuffle that names an exited or
//     missing lane or a mask other than 0xffffffff, lanes of one warp that
//     wait at different kinds of barrier, and a block whose threads can no
//     longer all meet at a barrier (deadlock).
//   - __ldg of a misaligned address fails the launch (a GPU would fault).
//   - Launch configurations are checked like the runtime's (block <= 1024
//     threads, grid y/z <= 65535, no empty grid): cudaErrorInvalidConfiguration.
//   - Device pointers are host pointers; streams are ignored (launches are
//     synchronous).
// Not modelled: timing, occupancy, register limits, the static shared-memory
// limit (ptxas checks it), memory coalescing, and data races other than those
// a different order exposes.
#pragma once

// Runtime API calls of the host code, served by the emulator (emu_runtime.cc).
#define cudaGetLastError pn_emu_cudaGetLastError
#define cudaPeekAtLastError pn_emu_cudaPeekAtLastError
#define cudaGetDevice pn_emu_cudaGetDevice
#define cudaSetDevice pn_emu_cudaSetDevice
#define cudaGetDeviceCount pn_emu_cudaGetDeviceCount
#define cudaDeviceGetAttribute pn_emu_cudaDeviceGetAttribute
#define cudaGetErrorName pn_emu_cudaGetErrorName
#define cudaGetErrorString pn_emu_cudaGetErrorString
#define cudaFuncSetAttribute pn_emu_cudaFuncSetAttribute

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <utility>

// Execution-space and memory-space specifiers: host code now; shared memory is
// a static (thread_local so that two host threads may launch at once).
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ static thread_local
#define __launch_bounds__(...)

namespace pn_emu {

// The emulated thread that is running (set by the scheduler).
struct ThreadState {
  uint3 thread_idx;
};
extern thread_local ThreadState* current_thread;
extern thread_local uint3 block_idx;
extern thread_local dim3 block_dim;
extern thread_local dim3 grid_dim;

// Barriers and the shuffle exchange (emu_runtime.cc).
void syncthreads();
void syncwarp(unsigned mask);
uint32_t shfl_xor_bits(unsigned mask, uint32_t bits, int lane_mask, int width);

// Fails the launch from inside a kernel with `why` (never returns).
[[noreturn]] void fault(const char* why);

// Runs `body` as every thread of every block of the grid, with `shared_bytes`
// of dynamic shared memory (checked against `kernel`'s
// cudaFuncAttributeMaxDynamicSharedMemorySize); the result is also the value
// cudaGetLastError() reports next.
cudaError_t run_grid(dim3 grid, dim3 block, size_t shared_bytes, const void* kernel,
                     const std::function<void()>& body);

// The running block's dynamic shared memory (16-byte aligned); fails the
// launch when it has none.
void* dynamic_shared_memory();

template <typename T>
T* dynamic_shared() {
  return static_cast<T*>(dynamic_shared_memory());
}

// 0: threads run in index order between barriers; otherwise the seed of a
// per-round shuffle of that order. Returns the previous seed.
uint64_t set_schedule_seed(uint64_t seed);

// Counters since the last reset_stats(): launches, thread blocks, threads,
// fiber switches.
struct Stats {
  uint64_t launches, blocks, threads, switches;
};
Stats stats();
void reset_stats();

// `kernel<<<grid, block, smem, stream>>>(args...)` after the rewrite.
template <typename... P>
class Launcher {
 public:
  Launcher(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes)
      : kernel_(kernel), grid_(grid), block_(block), shared_bytes_(shared_bytes) {}
  template <typename... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P), "kernel argument count");
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);  // by value, as on a GPU
    void (*kernel)(P...) = kernel_;
    run_grid(grid_, block_, shared_bytes_, reinterpret_cast<const void*>(kernel_),
             [&params, kernel] { std::apply(kernel, params); });
  }

 private:
  void (*kernel_)(P...);
  dim3 grid_;
  dim3 block_;
  size_t shared_bytes_;
};

template <typename... P>
Launcher<P...> launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes = 0,
                      cudaStream_t /*stream*/ = nullptr) {
  return Launcher<P...>(kernel, grid, block, shared_bytes);
}

template <typename T>
uint32_t to_bits(T v) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

template <typename T>
T from_bits(uint32_t b) {
  T v;
  std::memcpy(&v, &b, 4);
  return v;
}

}  // namespace pn_emu

// cudaFuncSetAttribute(kernel, attr, value) of the runtime's C++ API (a
// template nvcc alone declares) over the emulator's C function.
template <typename... P>
inline cudaError_t pn_emu_cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr,
                                               int value) {
  return pn_emu_cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

// Built-in variables.
#define threadIdx (::pn_emu::current_thread->thread_idx)
#define blockIdx (::pn_emu::block_idx)
#define blockDim (::pn_emu::block_dim)
#define gridDim (::pn_emu::grid_dim)

// Device intrinsics the kernels use.
inline void __syncthreads() { ::pn_emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::pn_emu::syncwarp(mask); }

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  return ::pn_emu::from_bits<T>(
      ::pn_emu::shfl_xor_bits(mask, ::pn_emu::to_bits(var), lane_mask, width));
}

// A misaligned vector load faults on a GPU (cudaErrorMisalignedAddress); here
// it fails the launch.
template <typename T>
inline T __ldg(const T* p) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) ::pn_emu::fault("misaligned __ldg");
  return *p;
}

inline float __uint_as_float(unsigned int u) { return ::pn_emu::from_bits<float>(u); }
inline unsigned int __float_as_uint(float f) { return ::pn_emu::to_bits(f); }

// Device-side min/max of CUDA's math library (integer overloads).
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
