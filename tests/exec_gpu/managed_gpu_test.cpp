// ManagedMemory (exec/cuda/kernel_ops_cuda.hpp): every alignment a memory
// resource may be asked for is met, including the block-size alignments a
// pool resource asks of its upstream, and the blocks are usable from the host.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <memory_resource>
#include <vector>

#include "exec/cuda/kernel_ops_cuda.hpp"

namespace xc = megascope::exec::cuda;

TEST_CASE("ManagedMemory meets alignments above cudaMallocManaged's 256 bytes", "[exec][gpu]") {
  xc::ManagedMemory managed;
  for (const std::size_t alignment : {std::size_t{8}, std::size_t{256}, std::size_t{512}, std::size_t{4096},
                                      std::size_t{1} << 20, std::size_t{64} << 20}) {
    INFO("alignment " << alignment);
    void* p = managed.allocate(1000, alignment);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % alignment == 0);
    std::memset(p, 0x5a, 1000);   // managed memory: the host can write all of it
    CHECK(static_cast<unsigned char*>(p)[999] == 0x5a);
    managed.deallocate(p, 1000, alignment);
  }
}

TEST_CASE("A pool resource over ManagedMemory serves the sizes a training step allocates", "[exec][gpu]") {
  xc::ManagedMemory managed;
  std::pmr::pool_options opts;
  opts.largest_required_pool_block = std::size_t{64} << 20;
  std::pmr::synchronized_pool_resource pool(opts, &managed);
  std::vector<std::pmr::vector<float>> held;
  for (const std::size_t n : {std::size_t{1}, std::size_t{300}, std::size_t{70001}, std::size_t{1} << 22,
                              std::size_t{20} << 20}) {
    INFO(n << " floats");
    std::pmr::vector<float> v(n, 1.5f, &pool);
    CHECK(v.back() == 1.5f);
    held.push_back(std::move(v));
  }
  held.clear();
}
