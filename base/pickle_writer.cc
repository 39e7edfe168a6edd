#include "base/pickle_writer.h"

#include <bit>
#include <cassert>
#include <limits>

namespace remat {
namespace {

// The protocol-2 opcodes used here (pickletools names).
constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kMark = '(';
constexpr char kEmptyDict = '}';
constexpr char kSetItems = 'u';
constexpr char kEmptyList = ']';
constexpr char kAppends = 'e';
constexpr char kTuple = 't';
constexpr char kBinUnicode = 'X';  // 4-byte little-endian length, then UTF-8
constexpr char kBinInt1 = 'K';     // 1-byte unsigned
constexpr char kBinInt2 = 'M';     // 2-byte unsigned, little-endian
constexpr char kBinInt = 'J';      // 4-byte signed, little-endian
constexpr char kLong1 = '\x8a';    // 1-byte length, then two's complement, little-endian
constexpr char kBinFloat = 'G';    // 8-byte IEEE 754, big-endian
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kNone = 'N';

// Fewest bytes that hold `value` as two's complement (sign bit included).
int SignedWidth(std::int64_t value) {
  int bytes = 1;
  while (bytes < 8) {
    const std::int64_t limit = std::int64_t{1} << (8 * bytes - 1);
    if (value >= -limit && value < limit) break;
    ++bytes;
  }
  return bytes;
}

}  // namespace

PickleWriter::PickleWriter() {
  Op(kProto);
  out_ += '\x02';
}

void PickleWriter::Mark() {
  Op(kMark);
  ++open_containers_;
}

void PickleWriter::Close() {
  assert(open_containers_ > 0 && "End without a matching Begin");
  --open_containers_;
}

PickleWriter& PickleWriter::BeginDict() {
  Op(kEmptyDict);
  Mark();
  return *this;
}

PickleWriter& PickleWriter::EndDict() {
  Close();
  Op(kSetItems);
  return *this;
}

PickleWriter& PickleWriter::BeginList() {
  Op(kEmptyList);
  Mark();
  return *this;
}

PickleWriter& PickleWriter::EndList() {
  Close();
  Op(kAppends);
  return *this;
}

PickleWriter& PickleWriter::BeginTuple() {
  Mark();
  return *this;
}

PickleWriter& PickleWriter::EndTuple() {
  Close();
  Op(kTuple);
  return *this;
}

void PickleWriter::AppendLittleEndian(std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out_ += static_cast<char>((value >> (8 * i)) & 0xff);
}

void PickleWriter::Long1(std::uint64_t value, int bytes) {
  Op(kLong1);
  out_ += static_cast<char>(bytes);
  AppendLittleEndian(value, bytes > 8 ? 8 : bytes);
  for (int i = 8; i < bytes; ++i) out_ += '\0';  // sign byte of a uint64 above INT64_MAX
}

PickleWriter& PickleWriter::String(std::string_view utf8) {
  Op(kBinUnicode);
  AppendLittleEndian(utf8.size(), 4);
  out_ += utf8;
  return *this;
}

PickleWriter& PickleWriter::Int(std::int64_t value) {
  if (value >= 0 && value <= 0xff) {
    Op(kBinInt1);
    AppendLittleEndian(static_cast<std::uint64_t>(value), 1);
  } else if (value >= 0 && value <= 0xffff) {
    Op(kBinInt2);
    AppendLittleEndian(static_cast<std::uint64_t>(value), 2);
  } else if (value >= std::numeric_limits<std::int32_t>::min() &&
             value <= std::numeric_limits<std::int32_t>::max()) {
    Op(kBinInt);
    AppendLittleEndian(static_cast<std::uint64_t>(value), 4);
  } else {
    Long1(static_cast<std::uint64_t>(value), SignedWidth(value));
  }
  return *this;
}

PickleWriter& PickleWriter::Uint(std::uint64_t value) {
  if (value <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return Int(static_cast<std::int64_t>(value));
  }
  Long1(value, 9);  // the top bit is set: a ninth, zero byte keeps it positive
  return *this;
}

PickleWriter& PickleWriter::Double(double value) {
  Op(kBinFloat);
  const auto bits = std::bit_cast<std::uint64_t>(value);
  for (int i = 7; i >= 0; --i) out_ += static_cast<char>((bits >> (8 * i)) & 0xff);
  return *this;
}

PickleWriter& PickleWriter::Bool(bool value) {
  Op(value ? kNewTrue : kNewFalse);
  return *this;
}

PickleWriter& PickleWriter::None() {
  Op(kNone);
  return *this;
}

std::string PickleWriter::Finish() {
  assert(open_containers_ == 0 && "Finish with a container still open");
  Op(kStop);
  return std::move(out_);
}

}  // namespace remat
