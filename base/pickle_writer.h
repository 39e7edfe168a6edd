// A small streaming writer of Python pickles (protocol 2): plain data only
// (dicts, lists, tuples, str, int, float, bool, None), values in order, no
// memo, so Python's pickle.load (or any protocol-2 reader) reads them back.
//
//   PickleWriter p;
//   p.BeginDict().Key("sizes").BeginList().Uint(512).Uint(std::uint64_t{1} << 40).EndList()
//    .EndDict();
//   std::string bytes = p.Finish();
//
// Containers are written as an empty container, MARK, the items, and one
// SETITEMS / APPENDS / TUPLE, so a list of any length costs two opcodes beyond
// its items. Integers take the shortest encoding: BININT1, BININT2, BININT,
// then LONG1 (any 64-bit value, signed or not: addresses and sizes exceed 2^31).
#ifndef REMAT_BASE_PICKLE_WRITER_H_
#define REMAT_BASE_PICKLE_WRITER_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace remat {

class PickleWriter {
 public:
  PickleWriter();  // writes the PROTO 2 header

  // A dict's items are Key (or any value) then its value, in pairs.
  PickleWriter& BeginDict();
  PickleWriter& EndDict();
  PickleWriter& BeginList();
  PickleWriter& EndList();
  PickleWriter& BeginTuple();
  PickleWriter& EndTuple();

  PickleWriter& Key(std::string_view key) { return String(key); }
  PickleWriter& String(std::string_view utf8);
  PickleWriter& Int(std::int64_t value);
  PickleWriter& Uint(std::uint64_t value);
  PickleWriter& Double(double value);
  PickleWriter& Bool(bool value);
  PickleWriter& None();

  // Ends the pickle (STOP) and hands over its bytes. Every container must be
  // closed. Call it once: a writer makes one pickle.
  std::string Finish();

 private:
  void Op(char opcode) { out_ += opcode; }
  void Mark();
  void Close();
  void AppendLittleEndian(std::uint64_t value, int bytes);
  // LONG1: `bytes` little-endian two's complement bytes of `value`.
  void Long1(std::uint64_t value, int bytes);

  std::string out_;
  int open_containers_ = 0;
};

}  // namespace remat

#endif  // REMAT_BASE_PICKLE_WRITER_H_
