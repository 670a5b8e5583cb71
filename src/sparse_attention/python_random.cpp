// MT19937 with CPython's seeding (init_by_array over the seed's 32-bit words, least significant first) and CPython's
// sample(): a pool drawn without replacement when the population is small beside k, else rejection against a set.
#include "dscpp/sparse_attention/python_random.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <unordered_set>

namespace dscpp::sparse_attention {
namespace {

constexpr int kN = 624, kM = 397;

int bit_length(uint64_t n) {
  int bits = 0;
  for (; n; n >>= 1) ++bits;
  return bits;
}

}  // namespace

PythonRandom::PythonRandom(uint64_t seed) {
  std::vector<uint32_t> key;
  for (uint64_t n = seed; n; n >>= 32) key.push_back(static_cast<uint32_t>(n & 0xffffffffu));
  if (key.empty()) key.push_back(0);  // random.seed(0): one word, zero
  auto& mt = state_;
  mt[0] = 19650218u;  // init_genrand(19650218)
  for (int i = 1; i < kN; ++i) mt[i] = 1812433253u * (mt[i - 1] ^ (mt[i - 1] >> 30)) + static_cast<uint32_t>(i);
  int i = 1;
  size_t j = 0;
  for (int k = std::max<int>(kN, static_cast<int>(key.size())); k > 0; --k) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525u)) + key[j] + static_cast<uint32_t>(j);
    if (++i >= kN) {
      mt[0] = mt[kN - 1];
      i = 1;
    }
    if (++j >= key.size()) j = 0;
  }
  for (int k = kN - 1; k > 0; --k) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    if (++i >= kN) {
      mt[0] = mt[kN - 1];
      i = 1;
    }
  }
  mt[0] = 0x80000000u;
  index_ = kN;
}

uint32_t PythonRandom::next() {
  auto& mt = state_;
  if (index_ >= kN) {
    for (int k = 0; k < kN; ++k) {
      const uint32_t y = (mt[k] & 0x80000000u) | (mt[(k + 1) % kN] & 0x7fffffffu);
      mt[k] = mt[(k + kM) % kN] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    index_ = 0;
  }
  uint32_t y = mt[index_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint32_t PythonRandom::getrandbits(int bits) {
  if (bits < 0 || bits > 32) throw std::invalid_argument("PythonRandom::getrandbits: 0 to 32 bits");
  return bits == 0 ? 0 : next() >> (32 - bits);
}

int64_t PythonRandom::randbelow(int64_t n) {
  const int bits = bit_length(static_cast<uint64_t>(n));
  if (bits > 32) throw std::invalid_argument("PythonRandom: populations up to 2^32 - 1");
  int64_t r = getrandbits(bits);
  while (r >= n) r = getrandbits(bits);
  return r;
}

std::vector<int64_t> PythonRandom::sample(int64_t n, int64_t k) {
  if (k < 0 || k > n) {
    throw std::invalid_argument("sample: " + std::to_string(k) + " values from a population of " +
                                std::to_string(n) + " (Python's \"Sample larger than population or is negative\")");
  }
  std::vector<int64_t> out(static_cast<size_t>(k));
  // CPython: a list of n is smaller than a set of k when n <= setsize.
  int64_t setsize = 21;
  if (k > 5) setsize += static_cast<int64_t>(std::pow(4.0, std::ceil(std::log(static_cast<double>(k * 3)) / std::log(4.0))));
  if (n <= setsize) {
    std::vector<int64_t> pool(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pool[i] = i;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t j = randbelow(n - i);
      out[i] = pool[j];
      pool[j] = pool[n - i - 1];  // the unselected last value into the vacancy
    }
  } else {
    std::unordered_set<int64_t> selected;
    for (int64_t i = 0; i < k; ++i) {
      int64_t j = randbelow(n);
      while (selected.count(j)) j = randbelow(n);
      selected.insert(j);
      out[i] = j;
    }
  }
  return out;
}

}  // namespace dscpp::sparse_attention
