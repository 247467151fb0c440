// Tests of the CUDA emulation itself (cuda/emu): barriers, shuffles, built-in
// variables, dynamic shared memory and launch checks behave as the CUDA C++
// Programming Guide says, and the faults it promises to report are reported.
// The kernels here are written for the emulator (::pn_emu::launch instead of
// <<<>>>, dynamic_shared<T>() instead of extern __shared__).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace {

// Block-wide sum through shared memory: each thread adds its value, then one
// thread per block writes the total after the barrier.
__global__ void block_sum(const int* in, int* out) {
  __shared__ int partial[256];
  const int t = threadIdx.x;
  partial[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (t < stride) partial[t] += partial[t + stride];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = partial[0];
}

TEST(CudaEmu, BlockReductionThroughSharedMemory) {
  const int blocks = 5, threads = 256;
  std::vector<int> in(blocks * threads), out(blocks, -1);
  for (int i = 0; i < blocks * threads; ++i) in[i] = i % 97;
  for (uint64_t seed : {0ull, 7ull}) {
    pn_emu::set_schedule_seed(seed);
    ::pn_emu::launch(block_sum, blocks, threads)(in.data(), out.data());
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    for (int b = 0; b < blocks; ++b) {
      int want = 0;
      for (int t = 0; t < threads; ++t) want += in[b * threads + t];
      EXPECT_EQ(out[b], want) << "block " << b << " seed " << seed;
    }
  }
  pn_emu::set_schedule_seed(0);
}

// Butterfly sum with __shfl_xor_sync: every lane ends with the warp's total.
__global__ void warp_allreduce(float* data) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = data[i];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  data[i] = v;
}

TEST(CudaEmu, XorShuffleExchangesBetweenLanes) {
  std::vector<float> data(3 * 64);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  ::pn_emu::launch(warp_allreduce, 3, 64)(data.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (size_t w = 0; w < data.size() / 32; ++w) {
    float want = 0;
    for (int l = 0; l < 32; ++l) want += static_cast<float>(w * 32 + l);
    for (int l = 0; l < 32; ++l) EXPECT_EQ(data[w * 32 + l], want) << "warp " << w;
  }
}

// One lane's value to every lane with xor offsets in a different order per lane
// group: exercises back-to-back shuffles (the emulator double-buffers them).
__global__ void shuffle_chain(int* data) {
  const int lane = threadIdx.x & 31;
  int v = lane;
  v = __shfl_xor_sync(0xffffffffu, v, 1);
  v = __shfl_xor_sync(0xffffffffu, v, 2);
  v = __shfl_xor_sync(0xffffffffu, v, 4);
  data[threadIdx.x] = v;
}

TEST(CudaEmu, BackToBackShufflesReadTheRightRound) {
  std::vector<int> data(32, -1);
  pn_emu::set_schedule_seed(3);
  ::pn_emu::launch(shuffle_chain, 1, 32)(data.data());
  pn_emu::set_schedule_seed(0);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int l = 0; l < 32; ++l) EXPECT_EQ(data[l], l ^ 7) << "lane " << l;
}

__global__ void write_indices(uint32_t* out) {
  const uint32_t block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const uint32_t thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const uint32_t per_block = blockDim.x * blockDim.y * blockDim.z;
  out[block * per_block + thread] = block * 1000 + thread;
}

TEST(CudaEmu, BuiltInVariablesCoverTheGridOnce) {
  const dim3 grid(3, 2, 2), block(4, 2, 3);
  std::vector<uint32_t> out(12 * 24, 0xffffffffu);
  ::pn_emu::launch(write_indices, grid, block)(out.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (uint32_t b = 0; b < 12; ++b) {
    for (uint32_t t = 0; t < 24; ++t) EXPECT_EQ(out[b * 24 + t], b * 1000 + t);
  }
}

// Threads that exit early no longer count at __syncthreads (Volta and later).
__global__ void early_exit(int* out) {
  __shared__ int flag;
  if (threadIdx.x >= 40) return;
  if (threadIdx.x == 0) flag = 42;
  __syncthreads();
  out[threadIdx.x] = flag;
}

TEST(CudaEmu, ExitedThreadsDoNotBlockBarriers) {
  std::vector<int> out(128, 0);
  pn_emu::set_schedule_seed(11);
  ::pn_emu::launch(early_exit, 1, 128)(out.data());
  pn_emu::set_schedule_seed(0);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int t = 0; t < 40; ++t) EXPECT_EQ(out[t], 42);
  for (int t = 40; t < 128; ++t) EXPECT_EQ(out[t], 0);
}

// A missing barrier: thread 0 writes, the others read without __syncthreads.
__global__ void missing_barrier(int* out, int value) {
  __shared__ int cell;
  if (threadIdx.x == 0) cell = value;
  out[threadIdx.x] = cell;
  __syncthreads();
}

TEST(CudaEmu, ShuffledOrdersExposeAMissingBarrier) {
  std::vector<int> out(128);
  bool stale = false;
  for (uint64_t seed = 1; seed <= 4 && !stale; ++seed) {
    pn_emu::set_schedule_seed(seed);
    ::pn_emu::launch(missing_barrier, 1, 128)(out.data(), static_cast<int>(seed) * 10);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    for (int v : out) stale |= v != static_cast<int>(seed) * 10;
  }
  pn_emu::set_schedule_seed(0);
  EXPECT_TRUE(stale) << "some thread should have read the cell before thread 0 wrote it";
}

__global__ void shuffle_after_exit(float* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void divergent_barriers(float* out) {
  if (threadIdx.x < 16) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  } else {
    __syncthreads();
  }
}

__global__ void shuffle_and_syncwarp(float* out) {
  if (threadIdx.x & 1) {
    __syncwarp();
  } else {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 2.0f, 2);
  }
}

void expect_launch_failure(const std::string& what) {
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_NE(std::string(cudaGetErrorString(cudaErrorLaunchFailure)).find(what), std::string::npos)
      << cudaGetErrorString(cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once, then cleared
}

TEST(CudaEmu, ReportsAShuffleWithAnExitedLane) {
  std::vector<float> out(32);
  ::pn_emu::launch(shuffle_after_exit, 1, 32)(out.data());
  expect_launch_failure("exited");
}

TEST(CudaEmu, ReportsADeadlock) {
  std::vector<float> out(32);
  ::pn_emu::launch(divergent_barriers, 1, 32)(out.data());
  expect_launch_failure("deadlock");
}

TEST(CudaEmu, ReportsLanesAtDifferentWarpBarriers) {
  std::vector<float> out(32);
  ::pn_emu::launch(shuffle_and_syncwarp, 1, 32)(out.data());
  expect_launch_failure("different barriers");
}

__global__ void vector_load(const char* base, int offset, uint4* out) {
  *out = __ldg(reinterpret_cast<const uint4*>(base + offset));
}

TEST(CudaEmu, ReportsAMisalignedVectorLoad) {
  alignas(16) char buf[64] = {};
  uint4 out;
  ::pn_emu::launch(vector_load, 1, 1)(buf, 16, &out);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ::pn_emu::launch(vector_load, 1, 1)(buf, 8, &out);
  expect_launch_failure("misaligned");
}

TEST(CudaEmu, ChecksTheLaunchConfiguration) {
  std::vector<uint32_t> out(4096);
  ::pn_emu::launch(write_indices, dim3(0), dim3(32))(out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  ::pn_emu::launch(write_indices, dim3(1), dim3(1025))(out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  ::pn_emu::launch(write_indices, dim3(1, 65536), dim3(1))(out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  ::pn_emu::launch(write_indices, dim3(2), dim3(32))(out.data());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Reverses each block's slice through dynamic shared memory (the launch's
// smem bytes; `extern __shared__ float buf[]` in a .cu file), and records
// what a thread read before anything was written (uninitialised, as on a GPU).
__global__ void reverse_dynamic(const float* in, float* out, uint32_t* first_word) {
  float* buf = ::pn_emu::dynamic_shared<float>();
  const int t = threadIdx.x;
  const int n = blockDim.x;
  if (t == 0) {
    uint32_t w;
    __builtin_memcpy(&w, buf + n - 1, 4);
    first_word[blockIdx.x] = w;
  }
  __syncthreads();
  buf[t] = in[blockIdx.x * n + t];
  __syncthreads();
  out[blockIdx.x * n + t] = buf[n - 1 - t];
}

TEST(CudaEmu, DynamicSharedMemoryIsPerBlockAndUninitialised) {
  const int blocks = 3, threads = 64;
  std::vector<float> in(blocks * threads), out(blocks * threads);
  std::vector<uint32_t> first(blocks, 0);
  for (int i = 0; i < blocks * threads; ++i) in[i] = static_cast<float>(i);
  ::pn_emu::launch(reverse_dynamic, blocks, threads, threads * sizeof(float))(
      in.data(), out.data(), first.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int b = 0; b < blocks; ++b) {
    EXPECT_EQ(first[b], 0xffffffffu) << "block " << b;  // not the previous block's data
    for (int t = 0; t < threads; ++t) {
      EXPECT_EQ(out[b * threads + t], in[b * threads + threads - 1 - t]);
    }
  }
}

TEST(CudaEmu, DynamicSharedMemoryAbove48KbNeedsTheOptIn) {
  const int threads = 32;
  std::vector<float> in(threads), out(threads);
  std::vector<uint32_t> first(1);
  const size_t big = 64 * 1024;
  ::pn_emu::launch(reverse_dynamic, 1, threads, big)(in.data(), out.data(), first.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cudaGetErrorString(cudaErrorInvalidValue)).find("65536 bytes"),
            std::string::npos);
  // More than an H100 allows per block is refused; the opt-in itself then works.
  EXPECT_EQ(cudaFuncSetAttribute(reverse_dynamic, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 300 * 1024),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaFuncSetAttribute(reverse_dynamic, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(big)),
            cudaSuccess);
  ::pn_emu::launch(reverse_dynamic, 1, threads, big)(in.data(), out.data(), first.data());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ::pn_emu::launch(reverse_dynamic, 1, threads, big + 4)(in.data(), out.data(), first.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

TEST(CudaEmu, ReportsDynamicSharedMemoryWithoutSmemBytes) {
  std::vector<float> in(32), out(32);
  std::vector<uint32_t> first(1);
  ::pn_emu::launch(reverse_dynamic, 1, 32)(in.data(), out.data(), first.data());
  expect_launch_failure("smem = 0");
}

TEST(CudaEmu, CountsWhatRan) {
  pn_emu::reset_stats();
  std::vector<uint32_t> out(3 * 64);
  ::pn_emu::launch(write_indices, dim3(3), dim3(64))(out.data());
  const pn_emu::Stats s = pn_emu::stats();
  EXPECT_EQ(s.launches, 1u);
  EXPECT_EQ(s.blocks, 3u);
  EXPECT_EQ(s.threads, 192u);
  EXPECT_GE(s.switches, 2u * 192u);  // into and out of every fiber at least once
}

}  // namespace
