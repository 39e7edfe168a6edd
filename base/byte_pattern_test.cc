#include "base/byte_pattern.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace remat {
namespace {

std::vector<unsigned char> Random(std::size_t n, std::mt19937_64& rng) {
  std::vector<unsigned char> v(n);
  for (unsigned char& c : v) c = static_cast<unsigned char>(rng());
  return v;
}

std::vector<unsigned char> Derive(std::size_t bytes, std::uint32_t tag,
                                  const std::vector<std::vector<unsigned char>>& inputs) {
  std::vector<const unsigned char*> ins;
  std::vector<std::size_t> sizes;
  for (const auto& in : inputs) {
    ins.push_back(in.data());
    sizes.push_back(in.size());
  }
  std::vector<unsigned char> out(bytes);
  WriteDerivedBytes(out.data(), bytes, tag, ins, sizes);
  return out;
}

// Sizes that are and are not multiples of the 8- and 16-byte steps, inputs
// shorter and longer than the output.
TEST(BytePatternTest, AnyOneInputByteChangedChangesTheOutput) {
  std::mt19937_64 rng(7);
  for (std::size_t bytes : {1u, 7u, 8u, 15u, 16u, 17u, 33u, 100u, 4096u}) {
    for (std::size_t in_size : {0u, 1u, 5u, 16u, 31u, 200u}) {
      std::vector<std::vector<unsigned char>> inputs = {Random(in_size, rng), Random(23, rng)};
      const std::vector<unsigned char> out = Derive(bytes, 3, inputs);
      EXPECT_EQ(out, Derive(bytes, 3, inputs)) << "deterministic";
      EXPECT_NE(out, Derive(bytes, 4, inputs)) << "the tag counts";
      for (std::size_t j = 0; j < inputs.size(); ++j) {
        // Every byte of an input the output covers, changed by any amount.
        const std::size_t used = std::min(inputs[j].size(), bytes);
        for (std::size_t k = 0; k < used; ++k) {
          auto changed = inputs;
          changed[j][k] = static_cast<unsigned char>(changed[j][k] + 1 + rng() % 255);
          ASSERT_NE(out, Derive(bytes, 3, changed))
              << "output " << bytes << " B, input " << j << " byte " << k;
        }
      }
    }
  }
}

TEST(BytePatternTest, TheChecksumSeesEveryByteAndTheLength) {
  std::mt19937_64 rng(11);
  for (std::size_t bytes : {0u, 1u, 31u, 32u, 33u, 64u, 1000u}) {
    std::vector<unsigned char> v = Random(bytes, rng);
    const std::uint64_t sum = ByteChecksum(v.data(), bytes);
    EXPECT_EQ(sum, ByteChecksum(v.data(), bytes));
    for (std::size_t k = 0; k < bytes; ++k) {
      for (unsigned char flip : {0x01, 0x80, 0xff}) {
        v[k] ^= flip;
        ASSERT_NE(sum, ByteChecksum(v.data(), bytes)) << bytes << " B, byte " << k;
        v[k] ^= flip;
      }
    }
    std::vector<unsigned char> longer = v;
    longer.push_back(0);
    EXPECT_NE(sum, ByteChecksum(longer.data(), longer.size()));
  }
}

}  // namespace
}  // namespace remat
