// Bytes that stand for a computation's result, for tests and the simulator's
// --verify mode: an output's bytes are a function of its tag and of its
// inputs' bytes, so that a recomputation from the same inputs writes the same
// bytes and a wrong input byte shows in the output. Both functions work on 8
// and 16 bytes at a time with no division: verify runs move every byte of
// every tensor, under the sanitizers too.
#ifndef REMAT_BASE_BYTE_PATTERN_H_
#define REMAT_BASE_BYTE_PATTERN_H_

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace remat {

// Writes `bytes` bytes to `out`: a pattern of `tag`, plus each input's bytes
// (repeated where the input is shorter) times an odd factor, so that any one
// input byte changed changes the output byte it lands on.
inline void WriteDerivedBytes(unsigned char* out, std::size_t bytes, std::uint32_t tag,
                              const std::vector<const unsigned char*>& ins,
                              const std::vector<std::size_t>& sizes) {
  using Bytes16 = unsigned char __attribute__((vector_size(16)));  // GCC and Clang
  std::uint64_t x = (std::uint64_t{tag} + 1) * 0x9e3779b97f4a7c15ull;
  for (std::size_t k = 0; k < bytes; k += sizeof x) {
    x += 0x9e3779b97f4a7c15ull;  // splitmix64: a new word per 8 bytes
    std::uint64_t w = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    w = (w ^ (w >> 27)) * 0x94d049bb133111ebull;
    w ^= w >> 31;
    std::memcpy(out + k, &w, std::min(sizeof w, bytes - k));
  }
  for (std::size_t j = 0; j < ins.size(); ++j) {
    if (sizes[j] == 0) continue;
    const auto factor = static_cast<unsigned char>(2 * j + 3);
    for (std::size_t at = 0; at < bytes; at += sizes[j]) {
      const std::size_t run = std::min(sizes[j], bytes - at);
      const unsigned char* in = ins[j];
      unsigned char* o = out + at;
      std::size_t i = 0;
      for (; i + sizeof(Bytes16) <= run; i += sizeof(Bytes16)) {
        Bytes16 a, b;
        std::memcpy(&a, o + i, sizeof a);
        std::memcpy(&b, in + i, sizeof b);
        a += b * factor;
        std::memcpy(o + i, &a, sizeof a);
      }
      for (; i < run; ++i) o[i] = static_cast<unsigned char>(o[i] + in[i] * factor);
    }
  }
}

// A 64-bit checksum of `bytes` bytes: four independent lanes over 8-byte
// words (so that the multiplies overlap), the tail byte by byte, then the
// lanes and the length folded together.
inline std::uint64_t ByteChecksum(const unsigned char* p, std::size_t bytes) {
  constexpr std::uint64_t kPrime = 1099511628211ull;
  std::uint64_t lane[4] = {1469598103934665603ull, 0x9e3779b97f4a7c15ull,
                           0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull};
  std::size_t k = 0;
  for (; k + 32 <= bytes; k += 32) {
    for (int i = 0; i < 4; ++i) {
      std::uint64_t w;
      std::memcpy(&w, p + k + 8 * i, sizeof w);
      lane[i] = (lane[i] ^ w) * kPrime;
      lane[i] ^= lane[i] >> 29;
    }
  }
  std::uint64_t h = lane[0] ^ std::rotl(lane[1], 17) ^ std::rotl(lane[2], 31) ^
                    std::rotl(lane[3], 47) ^ bytes;
  for (; k < bytes; ++k) h = (h ^ p[k]) * kPrime;
  return h * kPrime;
}

}  // namespace remat

#endif  // REMAT_BASE_BYTE_PATTERN_H_
