// Python's `random` module, the part DeepSpeed's sparsity layouts draw from: a Mersenne Twister seeded as
// `random.seed(n)` seeds it, and `random.sample(range(n), k)` as CPython 3 computes it. With it, a layout gpt-train
// builds from --seed has the random blocks DeepSpeed's BigBird / Variable layouts get in a script that called
// `random.seed(seed)` (as Hugging Face's set_seed does) — the same generator, the same draws, in the same order.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace dscpp::sparse_attention {

class PythonRandom {
 public:
  // random.seed(seed) for a non-negative integer seed.
  explicit PythonRandom(uint64_t seed);

  // random.getrandbits(bits) for 0 <= bits <= 32.
  uint32_t getrandbits(int bits);
  // random.sample(range(n), k): k distinct values of [0, n), in the order Python draws them.
  // std::invalid_argument when k > n.
  std::vector<int64_t> sample(int64_t n, int64_t k);

 private:
  uint32_t next();           // genrand_uint32
  int64_t randbelow(int64_t n);  // _randbelow_with_getrandbits

  std::array<uint32_t, 624> state_{};
  int index_ = 624;
};

}  // namespace dscpp::sparse_attention
