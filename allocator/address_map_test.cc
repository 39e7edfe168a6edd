#include "allocator/address_map.h"

#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>

namespace remat {
namespace {

TEST(AddressMapTest, InsertFindErase) {
  AddressMap<int> map;
  int a = 1, b = 2;
  EXPECT_TRUE(map.empty());
  EXPECT_TRUE(map.Insert(0x1000, &a));
  EXPECT_TRUE(map.Insert(0x2000, &b));
  EXPECT_EQ(map.size(), 2u);
  EXPECT_EQ(map.Find(0x1000), &a);
  EXPECT_EQ(map.Find(0x2000), &b);
  EXPECT_EQ(map.Find(0x3000), nullptr);
  EXPECT_TRUE(map.Erase(0x1000));
  EXPECT_EQ(map.Find(0x1000), nullptr);
  EXPECT_EQ(map.Find(0x2000), &b);
  EXPECT_EQ(map.size(), 1u);
}

TEST(AddressMapTest, BadInputChangesNothing) {
  AddressMap<int> map;
  int a = 1, b = 2;
  ASSERT_TRUE(map.Insert(0x1000, &a));
  EXPECT_FALSE(map.Insert(0x1000, &b));  // already present: the first value stays
  EXPECT_EQ(map.Find(0x1000), &a);
  EXPECT_FALSE(map.Insert(0, &a));        // 0 marks an empty slot
  EXPECT_FALSE(map.Insert(0x2000, nullptr));
  EXPECT_FALSE(map.Erase(0));
  EXPECT_FALSE(map.Erase(0x3000));
  EXPECT_EQ(map.Find(0), nullptr);
  EXPECT_EQ(map.Locate(0), AddressMap<int>::kNotFound);
  EXPECT_EQ(map.Locate(0x3000), AddressMap<int>::kNotFound);
  EXPECT_EQ(map.size(), 1u);
}

// Random inserts and erases of aligned addresses that collide often (a small
// range, so runs of probes form and erase must shift entries back), checked
// against std::unordered_map after every step.
TEST(AddressMapTest, MatchesAReferenceMapUnderRandomOperations) {
  for (std::uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    AddressMap<int> map;
    std::unordered_map<std::uintptr_t, int*> reference;
    std::vector<int> values(64);
    const std::uintptr_t align = std::uintptr_t{512} << (seed % 4);
    for (int step = 0; step < 20000; ++step) {
      const std::uintptr_t key = (1 + rng() % 3000) * align;
      int* value = &values[rng() % values.size()];
      if (rng() % 3 != 0) {
        const bool inserted = reference.emplace(key, value).second;
        ASSERT_EQ(map.Insert(key, value), inserted) << "seed " << seed << " step " << step;
      } else if (rng() % 2 == 0) {
        ASSERT_EQ(map.Erase(key), reference.erase(key) == 1) << "seed " << seed;
      } else {
        // A look-up and an erase with one probe, as a free does.
        const std::size_t at = map.Locate(key);
        auto it = reference.find(key);
        ASSERT_EQ(at == AddressMap<int>::kNotFound, it == reference.end()) << "seed " << seed;
        if (it != reference.end()) {
          ASSERT_EQ(map.Value(at), it->second);
          map.EraseAt(at);
          reference.erase(it);
        }
      }
      ASSERT_EQ(map.size(), reference.size());
      const std::uintptr_t probe = (1 + rng() % 3000) * align;
      auto it = reference.find(probe);
      ASSERT_EQ(map.Find(probe), it == reference.end() ? nullptr : it->second)
          << "seed " << seed << " step " << step;
    }
    std::size_t seen = 0;
    map.ForEach([&](std::uintptr_t key, int* value) {
      ++seen;
      EXPECT_EQ(reference.at(key), value);
    });
    EXPECT_EQ(seen, reference.size());
  }
}

}  // namespace
}  // namespace remat
