// Runs a "kernel" on the host: blocks one after another; inside a block, threads one after another (kernels
// without __syncthreads) or as real threads meeting at a std::barrier (kernels that synchronise).
#pragma once
#include <barrier>
#include <thread>
#include <vector>

#include "cuda_runtime.h"

namespace emu {
inline thread_local dim3 tl_block_idx, tl_thread_idx;
inline dim3 g_block_dim, g_grid_dim;
inline thread_local std::barrier<>* tl_barrier = nullptr;

template <typename Kernel, typename... Args>
void launch(Kernel kernel, dim3 grid, dim3 block, Args... args) {
  g_grid_dim = grid, g_block_dim = block;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        tl_block_idx = dim3(bx, by, bz);
        for (unsigned tz = 0; tz < block.z; ++tz)
          for (unsigned ty = 0; ty < block.y; ++ty)
            for (unsigned tx = 0; tx < block.x; ++tx) {
              tl_thread_idx = dim3(tx, ty, tz);
              kernel(args...);
            }
      }
}

// One host thread per CUDA thread of a block (created once per launch); they walk the blocks in order and
// meet at the barrier after each block, so `__shared__` (a function-local static here) is never shared across
// blocks.
template <typename Kernel, typename... Args>
void launch_synchronising(Kernel kernel, dim3 grid, dim3 block, Args... args) {
  g_grid_dim = grid, g_block_dim = block;
  const unsigned threads = block.x * block.y * block.z;
  std::barrier<> bar(threads);
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      tl_thread_idx = dim3(t % block.x, t / block.x % block.y, t / block.x / block.y);
      tl_barrier = &bar;
      for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
          tl_block_idx = dim3(bx, by, 0);
          kernel(args...);
          bar.arrive_and_wait();
        }
    });
  for (auto& th : pool) th.join();
}
}  // namespace emu

#define blockIdx (::emu::tl_block_idx)
#define threadIdx (::emu::tl_thread_idx)
#define blockDim (::emu::g_block_dim)
#define gridDim (::emu::g_grid_dim)
#define __syncthreads() (::emu::tl_barrier->arrive_and_wait())
