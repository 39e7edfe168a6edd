// AddressMap: the allocator's live allocations, from an address to its block.
//
// Every Allocate inserts one entry and every Free looks one up and erases it,
// so this map is on the hottest path there is. It is an open-addressing table
// with linear probing, made for this one job:
//   - keys are non-zero addresses (0 marks an empty slot), values pointers;
//   - the hash is a multiply by 2^64/phi, keeping the high bits (Fibonacci
//     hashing), which spreads aligned addresses (low bits all zero) evenly;
//   - at most half the slots are used, so a probe is short;
//   - erase shifts the following entries back instead of leaving tombstones,
//     so lookups never slow down after many frees.
// A general-purpose hash map (Swiss tables, with control bytes, SIMD group
// probes and tombstones) costs several times the instructions here.
//
// Not thread-safe: the allocator calls it under its lock.
#ifndef REMAT_ALLOCATOR_ADDRESS_MAP_H_
#define REMAT_ALLOCATOR_ADDRESS_MAP_H_

#include <cstddef>
#include <cstdint>
#include <memory>

namespace remat {

template <class T>
class AddressMap {
 public:
  AddressMap() { Rehash(kInitialLog2); }
  AddressMap(const AddressMap&) = delete;
  AddressMap& operator=(const AddressMap&) = delete;

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Where `key` is, for Value and EraseAt (one probe for a look-up and an
  // erase, as a free does); kNotFound when absent.
  static constexpr std::size_t kNotFound = ~std::size_t{0};
  std::size_t Locate(std::uintptr_t key) const {
    if (key == 0) return kNotFound;
    for (std::size_t i = Home(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return i;
      if (s.key == 0) return kNotFound;
    }
  }
  T* Value(std::size_t at) const { return slots_[at].value; }

  // The value stored for `key`, or nullptr.
  T* Find(std::uintptr_t key) const {
    const std::size_t at = Locate(key);
    return at != kNotFound ? Value(at) : nullptr;
  }

  // Adds `key` -> `value`; false (and nothing changes) when `key` is 0,
  // `value` is null or `key` is already present.
  bool Insert(std::uintptr_t key, T* value) {
    if (key == 0 || value == nullptr) return false;
    if (2 * (size_ + 1) > mask_ + 1) Rehash(log2_ + 1);
    std::size_t i = Home(key);
    for (; slots_[i].key != 0; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return false;
    }
    slots_[i] = Slot{key, value};
    ++size_;
    return true;
  }

  // Removes `key`; false when it was not present.
  bool Erase(std::uintptr_t key) {
    const std::size_t at = Locate(key);
    if (at == kNotFound) return false;
    EraseAt(at);
    return true;
  }

  // Removes the entry at `at` (from Locate, with nothing inserted or erased
  // since).
  void EraseAt(std::size_t at) {
    std::size_t i = at;
    // Backward shift: move each following entry of the run into the hole when
    // the hole lies on its probe path (between its home and its slot).
    for (std::size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      const std::uintptr_t k = slots_[j].key;
      if (k == 0) break;
      const std::size_t home = Home(k);
      // Cyclic distance from home: the entry may fill slot i if i is no
      // farther from its home than j is.
      if (((i - home) & mask_) < ((j - home) & mask_)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
    --size_;
  }

  // Calls fn(key, value) for every entry, in no particular order.
  template <class Fn>
  void ForEach(Fn&& fn) const {
    for (std::size_t i = 0; i <= mask_; ++i) {
      if (slots_[i].key != 0) fn(slots_[i].key, slots_[i].value);
    }
  }

 private:
  struct Slot {
    std::uintptr_t key = 0;
    T* value = nullptr;
  };
  static constexpr int kInitialLog2 = 6;

  std::size_t Home(std::uintptr_t key) const {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(key) * 0x9E3779B97F4A7C15ull) >>
                                    (64 - log2_));
  }

  void Rehash(int log2) {
    std::unique_ptr<Slot[]> old = std::move(slots_);
    const std::size_t old_capacity = old != nullptr ? mask_ + 1 : 0;
    log2_ = log2;
    mask_ = (std::size_t{1} << log2) - 1;
    slots_ = std::make_unique<Slot[]>(mask_ + 1);
    for (std::size_t i = 0; i < old_capacity; ++i) {
      if (old[i].key == 0) continue;
      std::size_t j = Home(old[i].key);
      while (slots_[j].key != 0) j = (j + 1) & mask_;
      slots_[j] = old[i];
    }
  }

  std::unique_ptr<Slot[]> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
  int log2_ = 0;
};

}  // namespace remat

#endif  // REMAT_ALLOCATOR_ADDRESS_MAP_H_
