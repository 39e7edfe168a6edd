// A small streaming JSON writer: keys and values in order, commas handled.
//
//   JsonWriter w;
//   w.BeginObject().Key("events").Uint(12).Key("name").String("x").EndObject();
//   std::string text = w.Take();
#ifndef REMAT_BASE_JSON_WRITER_H_
#define REMAT_BASE_JSON_WRITER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace remat {

class JsonWriter {
 public:
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  JsonWriter& Key(std::string_view key);
  JsonWriter& String(std::string_view value);
  JsonWriter& Uint(std::uint64_t value);
  JsonWriter& Int(std::int64_t value);
  JsonWriter& Double(double value);  // non-finite values are written as null
  JsonWriter& Bool(bool value);
  JsonWriter& Null();
  // Inserts an already-serialized JSON value (from another writer).
  JsonWriter& Raw(std::string_view json);

  const std::string& text() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  void BeforeValue();
  void AppendEscaped(std::string_view s);

  std::string out_;
  // One entry per open container: whether it already holds an element.
  std::vector<bool> has_element_;
  bool after_key_ = false;
};

}  // namespace remat

#endif  // REMAT_BASE_JSON_WRITER_H_
