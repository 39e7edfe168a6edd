// What the libFuzzer harnesses share: the input read as a program of bytes
// and words (zeros past its end), and a check that crashes so the fuzzer
// keeps the input.
#ifndef REMAT_TESTS_FUZZ_FUZZ_INPUT_H_
#define REMAT_TESTS_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "absl/status/status.h"

namespace remat::fuzz {

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  std::uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint32_t Word() {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 8 | Byte();
    return v;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

inline void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// An invariant check's verdict: what broke is printed before the crash.
inline void CheckOk(const absl::Status& status) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s\n", status.ToString().c_str());
  __builtin_trap();
}

}  // namespace remat::fuzz

#endif  // REMAT_TESTS_FUZZ_FUZZ_INPUT_H_
