#include "trace/op_trace.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "base/file.h"
#include "base/line_reader.h"
#include "base/text.h"
#include "simdjson.h"

namespace remat {
namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::element_type;
using simdjson::dom::object;

// simdjson speaks std::string_view; Debian's Abseil has a string_view of its own.
absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// A value as an error message shows it (base/text.h).
std::string Quote(std::string_view s) { return QuoteForMessage(s); }

// A JSON value as an error message shows it: minified, cut short if long.
std::string Shown(const element& e) {
  constexpr std::size_t kMax = 40;
  std::string json = simdjson::minify(e);
  if (json.size() > kMax) json = absl::StrCat(json.substr(0, kMax), "...");
  return json;
}

// --- Field access. Each object is walked once, picking out the fields the
// format knows; the getters then say why a field could not be read, and the
// caller words the message only when it must.

enum class Key : std::uint8_t {
  kOp,
  kId,
  kIds,
  kName,
  kBytes,
  kInputs,
  kOutputs,
  kCostNs,
  kAliasOf,
  kAction,
  kCount,
  kUnknown = kCount,
};

constexpr std::string_view kKeyNames[] = {"op",     "id",      "ids",     "name",    "bytes",
                                          "inputs", "outputs", "cost_ns", "alias_of",
                                          "action"};

Key KeyOf(std::string_view key) {
  switch (key.size()) {
    case 2:
      return key == "op" ? Key::kOp : key == "id" ? Key::kId : Key::kUnknown;
    case 3:
      return key == "ids" ? Key::kIds : Key::kUnknown;
    case 4:
      return key == "name" ? Key::kName : Key::kUnknown;
    case 5:
      return key == "bytes" ? Key::kBytes : Key::kUnknown;
    case 6:
      return key == "inputs" ? Key::kInputs : key == "action" ? Key::kAction : Key::kUnknown;
    case 7:
      return key == "outputs" ? Key::kOutputs : key == "cost_ns" ? Key::kCostNs : Key::kUnknown;
    case 8:
      return key == "alias_of" ? Key::kAliasOf : Key::kUnknown;
    default:
      return Key::kUnknown;
  }
}

// The known fields of one object; the first of a repeated key wins.
class Fields {
 public:
  explicit Fields(const object& obj) {
    for (const simdjson::dom::key_value_pair field : obj) {
      const Key key = KeyOf(field.key);
      if (key == Key::kUnknown || Has(key)) continue;
      present_ |= Bit(key);
      values_[static_cast<int>(key)] = field.value;
    }
  }

  bool Has(Key key) const { return (present_ & Bit(key)) != 0; }
  const element& operator[](Key key) const { return values_[static_cast<int>(key)]; }

 private:
  static std::uint32_t Bit(Key key) { return 1u << static_cast<int>(key); }

  std::uint32_t present_ = 0;
  element values_[static_cast<int>(Key::kCount)];
};

enum class FieldError { kNone, kMissing, kWrongType };

FieldError GetString(const Fields& fields, Key key, std::string_view* out) {
  if (!fields.Has(key)) return FieldError::kMissing;
  return fields[key].get_string().get(*out) == simdjson::SUCCESS ? FieldError::kNone
                                                                 : FieldError::kWrongType;
}

FieldError GetArray(const Fields& fields, Key key, array* out) {
  if (!fields.Has(key)) return FieldError::kMissing;
  return fields[key].get_array().get(*out) == simdjson::SUCCESS ? FieldError::kNone
                                                                : FieldError::kWrongType;
}

// A non-negative integer up to `max`: 4096, not -1, 4096.0 or "4096".
FieldError GetCount(const Fields& fields, Key key, std::uint64_t max, std::uint64_t* out) {
  if (!fields.Has(key)) return FieldError::kMissing;
  const element& e = fields[key];
  switch (e.type()) {
    case element_type::INT64: {
      const std::int64_t v = e.get_int64().value_unsafe();
      if (v < 0) return FieldError::kWrongType;
      *out = static_cast<std::uint64_t>(v);
      break;
    }
    case element_type::UINT64:
      *out = e.get_uint64().value_unsafe();
      break;
    default:
      return FieldError::kWrongType;
  }
  return *out <= max ? FieldError::kNone : FieldError::kWrongType;
}

// "missing 'bytes'" or "'bytes' must be a non-negative integer, found -5".
std::string Describe(FieldError error, const Fields& fields, Key key, std::string_view expected) {
  const std::string_view name = kKeyNames[static_cast<int>(key)];
  if (error == FieldError::kMissing) return absl::StrFormat("missing '%s'", name);
  return absl::StrFormat("'%s' must be %s, found %s", name, expected, Shown(fields[key]));
}

constexpr std::string_view kString = "a string";
constexpr std::string_view kNonEmptyString = "a non-empty string";
constexpr std::string_view kArray = "an array";
constexpr std::string_view kCount = "a non-negative integer";
constexpr std::string_view kCost = "a non-negative integer below 2^63";

// Ids to tensor indices without a second copy of each id: the set holds
// tensor indices and hashes each by its tensor's id.
struct IdHash {
  using is_transparent = void;
  std::size_t operator()(absl::string_view id) const { return absl::Hash<absl::string_view>{}(id); }
  std::size_t operator()(std::uint32_t i) const { return (*this)(AbslView((*tensors)[i].id)); }
  const std::vector<OpTensor>* tensors;
};

struct IdEq {
  using is_transparent = void;
  absl::string_view Id(absl::string_view id) const { return id; }
  absl::string_view Id(std::uint32_t i) const { return AbslView((*tensors)[i].id); }
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return Id(a) == Id(b);
  }
  const std::vector<OpTensor>* tensors;
};

// --- The trace being built: record syntax is checked by the caller, the
// trace's consistency (definitions, liveness, storage) here.
class TraceBuilder {
 public:
  TraceBuilder(std::string_view name, std::size_t expected_records) {
    trace_.name = std::string(name);
    trace_.records.reserve(expected_records);
    trace_.tensors.reserve(expected_records);
    refs_.reserve(expected_records);
  }
  TraceBuilder(const TraceBuilder&) = delete;  // ids_ points into trace_
  TraceBuilder& operator=(const TraceBuilder&) = delete;

  template <typename... Args>
  absl::Status Error(std::uint32_t line, const absl::FormatSpec<Args...>& format,
                     const Args&... args) const {
    return absl::InvalidArgumentError(
        absl::StrCat(trace_.name, ":", line, ": ", absl::StrFormat(format, args...)));
  }

  // Starts the record for `line`; the methods below fill it in.
  OpRecord& Begin(OpKind kind, std::uint32_t line) {
    OpRecord& record = trace_.records.emplace_back();
    record.kind = kind;
    record.line = line;
    return record;
  }

  // Accounts for the record begun last.
  void End() {
    const OpRecord& record = trace_.records.back();
    if (record.kind == OpKind::kCall) {
      ++trace_.calls;
      trace_.total_cost_ns += static_cast<std::uint64_t>(record.cost_ns);
      NoteWorkingSet(record);
    } else if (record.kind == OpKind::kConstant) {
      ++trace_.constants;
    } else if (record.kind == OpKind::kEvict) {
      ++trace_.evicts;
    } else if (record.kind == OpKind::kPrefetch) {
      ++trace_.prefetches;
    }
    if (live_bytes_ > trace_.peak_live_bytes) {
      trace_.peak_live_bytes = live_bytes_;
      trace_.peak_record = static_cast<std::uint32_t>(trace_.records.size() - 1);
    }
  }

  const OpTensor& tensor(std::uint32_t index) const { return trace_.tensors[index]; }

  std::uint32_t Intern(std::string_view name) {
    auto it = name_index_.find(AbslView(name));
    if (it != name_index_.end()) return it->second;
    const auto i = static_cast<std::uint32_t>(trace_.names.size());
    trace_.names.emplace_back(name);
    name_index_.emplace(std::string(name), i);
    return i;
  }

  // The live tensor `id`; `who()` begins the message otherwise: "call 'mm' reads".
  template <typename Who>
  absl::StatusOr<std::uint32_t> Live(std::uint32_t line, std::string_view id, const Who& who) {
    const auto it = ids_.find(AbslView(id));
    if (it == ids_.end()) {
      return Error(line, "%s %s, which no earlier line defines", who(), Quote(id));
    }
    const OpTensor& tensor = trace_.tensors[*it];
    if (tensor.released_by != kNoOpIndex) {
      return Error(line, "%s %s, which was released at line %d", who(), Quote(id),
                   trace_.records[tensor.released_by].line);
    }
    return *it;
  }

  // Defines `id` in the record begun last: with storage of its own of `bytes`,
  // or as a view of `alias_of`. `who()` begins the message on a duplicate.
  template <typename Who>
  absl::StatusOr<std::uint32_t> Define(std::uint32_t line, std::string_view id, std::uint64_t bytes,
                                       std::uint32_t alias_of, const Who& who) {
    if (id.empty()) return Error(line, "%s defines an empty id", who());
    if (trace_.tensors.size() >= kNoOpIndex) {
      return Error(line, "more than %d tensors", std::uint64_t{kNoOpIndex});
    }
    const auto index = static_cast<std::uint32_t>(trace_.tensors.size());
    const auto it = ids_.lazy_emplace(AbslView(id), [&](const auto& construct) {
      trace_.tensors.emplace_back().id = std::string(id);
      construct(index);
    });
    if (*it != index) {
      return Error(line, "%s defines %s, which was already defined at line %d", who(), Quote(id),
                   trace_.records[trace_.tensors[*it].producer].line);
    }
    OpTensor& tensor = trace_.tensors.back();
    tensor.producer = static_cast<std::uint32_t>(trace_.records.size() - 1);
    tensor.constant = trace_.records.back().kind == OpKind::kConstant;
    refs_.push_back(0);
    if (alias_of == kNoOpIndex) {
      if (bytes > UINT64_MAX - live_bytes_) {
        return Error(line, "%s defines %s: the live bytes pass 2^64", who(), Quote(id));
      }
      tensor.bytes = bytes;
      tensor.storage = index;
      live_bytes_ += bytes;
      if (tensor.constant) live_constant_bytes_ += bytes;
    } else {
      tensor.alias_of = alias_of;
      tensor.storage = trace_.tensors[alias_of].storage;
      ++trace_.views;
    }
    ++refs_[tensor.storage];
    return index;
  }

  // Drops live tensor `index`, in the record begun last.
  void Release(std::uint32_t index) {
    OpTensor& tensor = trace_.tensors[index];
    tensor.released_by = static_cast<std::uint32_t>(trace_.records.size() - 1);
    if (--refs_[tensor.storage] == 0) {
      const OpTensor& storage = trace_.tensors[tensor.storage];
      live_bytes_ -= storage.bytes;
      if (storage.constant) live_constant_bytes_ -= storage.bytes;
    }
  }

  // A call needs its inputs and outputs resident at once, with the constants
  // live then (which nothing evicts): no budget below the largest such sum
  // can run the trace.
  void NoteWorkingSet(const OpRecord& record) {
    // Inputs' storages and outputs' own (a view output needs nothing more on
    // the device: its base is there or comes back with it), each once.
    absl::InlinedVector<std::uint32_t, 8> storages;
    for (std::uint32_t t : record.inputs) storages.push_back(trace_.tensors[t].storage);
    for (std::uint32_t t : record.outputs) {
      if (!trace_.tensors[t].is_view()) storages.push_back(trace_.tensors[t].storage);
    }
    std::sort(storages.begin(), storages.end());
    storages.erase(std::unique(storages.begin(), storages.end()), storages.end());
    std::uint64_t need = live_constant_bytes_;
    for (std::uint32_t s : storages) {
      if (!trace_.tensors[s].constant) need += trace_.tensors[s].bytes;
    }
    if (need > trace_.least_budget_bytes) {
      trace_.least_budget_bytes = need;
      trace_.least_budget_record = static_cast<std::uint32_t>(trace_.records.size() - 1);
    }
  }

  // False when adding `cost_ns` would carry the total past 2^62 ns (146
  // years): a replay adds recomputes and copies to it on a signed 64-bit
  // clock, which must not wrap.
  static constexpr std::uint64_t kMaxTotalCostNs = std::uint64_t{1} << 62;
  bool CostFits(std::uint64_t cost_ns) const {
    return cost_ns <= kMaxTotalCostNs - trace_.total_cost_ns;
  }

  OpTrace Finish() && {
    trace_.live_bytes_at_end = live_bytes_;
    for (const OpTensor& tensor : trace_.tensors) {
      if (tensor.constant) trace_.constant_bytes += tensor.bytes;
    }
    return std::move(trace_);
  }

 private:
  OpTrace trace_;
  // Every id ever defined, released or not.
  absl::flat_hash_set<std::uint32_t, IdHash, IdEq> ids_{0, IdHash{&trace_.tensors},
                                                        IdEq{&trace_.tensors}};
  absl::flat_hash_map<std::string, std::uint32_t> name_index_;  // into trace_.names
  std::vector<std::uint32_t> refs_;  // per storage: its live tensors (root and views)
  std::uint64_t live_bytes_ = 0;
  std::uint64_t live_constant_bytes_ = 0;
};

// --- One record kind each. `obj` is the line's object, its `op` already read.

absl::Status ParseConstant(const Fields& obj, std::uint32_t line, TraceBuilder& b) {
  std::string_view id;
  if (FieldError e = GetString(obj, Key::kId, &id); e != FieldError::kNone) {
    return b.Error(line, "constant: %s", Describe(e, obj, Key::kId, kNonEmptyString));
  }
  std::uint64_t bytes = 0;
  if (FieldError e = GetCount(obj, Key::kBytes, UINT64_MAX, &bytes); e != FieldError::kNone) {
    return b.Error(line, "constant %s: %s", Quote(id), Describe(e, obj, Key::kBytes, kCount));
  }
  OpRecord& record = b.Begin(OpKind::kConstant, line);
  absl::StatusOr<std::uint32_t> t =
      b.Define(line, id, bytes, kNoOpIndex, [] { return std::string("constant"); });
  if (!t.ok()) return t.status();
  record.outputs.push_back(*t);
  b.End();
  return absl::OkStatus();
}

absl::Status ParseCall(const Fields& obj, std::uint32_t line, TraceBuilder& b) {
  std::string_view name;
  if (FieldError e = GetString(obj, Key::kName, &name); e != FieldError::kNone) {
    return b.Error(line, "call: %s", Describe(e, obj, Key::kName, kString));
  }
  const auto who = [name] { return absl::StrFormat("call %s", Quote(name)); };
  array inputs, outputs;
  if (FieldError e = GetArray(obj, Key::kInputs, &inputs); e != FieldError::kNone) {
    return b.Error(line, "%s: %s", who(), Describe(e, obj, Key::kInputs, kArray));
  }
  if (FieldError e = GetArray(obj, Key::kOutputs, &outputs); e != FieldError::kNone) {
    return b.Error(line, "%s: %s", who(), Describe(e, obj, Key::kOutputs, kArray));
  }
  std::uint64_t cost_ns = 0;
  if (FieldError e = GetCount(obj, Key::kCostNs, INT64_MAX, &cost_ns); e != FieldError::kNone) {
    return b.Error(line, "%s: %s", who(), Describe(e, obj, Key::kCostNs, kCost));
  }
  if (outputs.begin() == outputs.end()) {
    return b.Error(line, "%s has no outputs (a call defines at least one tensor)", who());
  }
  if (!b.CostFits(cost_ns)) return b.Error(line, "%s: the total cost passes 2^62 ns", who());

  OpRecord& record = b.Begin(OpKind::kCall, line);
  record.name = b.Intern(name);
  record.cost_ns = static_cast<std::int64_t>(cost_ns);
  record.inputs.reserve(inputs.size());
  record.outputs.reserve(outputs.size());
  std::size_t i = 0;
  for (element input : inputs) {
    std::string_view id;
    if (input.get_string().get(id) != simdjson::SUCCESS) {
      return b.Error(line, "%s: inputs[%d] must be a string, found %s", who(), i, Shown(input));
    }
    absl::StatusOr<std::uint32_t> t =
        b.Live(line, id, [&] { return absl::StrFormat("%s reads", who()); });
    if (!t.ok()) return t.status();
    record.inputs.push_back(*t);
    ++i;
  }
  i = 0;
  for (element output : outputs) {
    object out_object;
    if (output.get_object().get(out_object) != simdjson::SUCCESS) {
      return b.Error(line, "%s: outputs[%d] must be an object, found %s", who(), i, Shown(output));
    }
    const Fields out(out_object);
    std::string_view id;
    if (FieldError e = GetString(out, Key::kId, &id); e != FieldError::kNone) {
      return b.Error(line, "%s: outputs[%d]: %s", who(), i,
                     Describe(e, out, Key::kId, kNonEmptyString));
    }
    std::uint64_t bytes = 0;
    std::uint32_t alias_of = kNoOpIndex;
    std::string_view base;
    if (FieldError e = GetString(out, Key::kAliasOf, &base); e == FieldError::kNone) {
      absl::StatusOr<std::uint32_t> t = b.Live(line, base, [&] {
        return absl::StrFormat("%s output %s is a view of", who(), Quote(id));
      });
      if (!t.ok()) return t.status();
      alias_of = *t;
    } else if (e == FieldError::kWrongType) {
      return b.Error(line, "%s output %s: %s", who(), Quote(id),
                     Describe(e, out, Key::kAliasOf, kString));
    } else if (FieldError bytes_error = GetCount(out, Key::kBytes, UINT64_MAX, &bytes);
               bytes_error != FieldError::kNone) {
      return b.Error(line, "%s output %s: %s (or 'alias_of' for a view)", who(), Quote(id),
                     Describe(bytes_error, out, Key::kBytes, kCount));
    }
    absl::StatusOr<std::uint32_t> t = b.Define(line, id, bytes, alias_of, who);
    if (!t.ok()) return t.status();
    record.outputs.push_back(*t);
    ++i;
  }
  b.End();
  return absl::OkStatus();
}

absl::Status ParseUse(const Fields& obj, std::uint32_t line, TraceBuilder& b) {
  array ids;
  if (FieldError e = GetArray(obj, Key::kIds, &ids); e != FieldError::kNone) {
    return b.Error(line, "use: %s", Describe(e, obj, Key::kIds, kArray));
  }
  OpRecord& record = b.Begin(OpKind::kUse, line);
  record.inputs.reserve(ids.size());
  std::size_t i = 0;
  for (element value : ids) {
    std::string_view id;
    if (value.get_string().get(id) != simdjson::SUCCESS) {
      return b.Error(line, "use: ids[%d] must be a string, found %s", i, Shown(value));
    }
    absl::StatusOr<std::uint32_t> t = b.Live(line, id, [] { return std::string("use of"); });
    if (!t.ok()) return t.status();
    record.inputs.push_back(*t);
    ++i;
  }
  b.End();
  return absl::OkStatus();
}

absl::Status ParseRelease(const Fields& obj, std::uint32_t line, TraceBuilder& b) {
  std::string_view id;
  if (FieldError e = GetString(obj, Key::kId, &id); e != FieldError::kNone) {
    return b.Error(line, "release: %s", Describe(e, obj, Key::kId, kString));
  }
  absl::StatusOr<std::uint32_t> t = b.Live(line, id, [] { return std::string("release of"); });
  if (!t.ok()) return t.status();
  OpRecord& record = b.Begin(OpKind::kRelease, line);
  record.inputs.push_back(*t);
  b.Release(*t);
  b.End();
  return absl::OkStatus();
}

// evict and prefetch: a live tensor that is not a constant, and for evict how.
absl::Status ParseEvictOrPrefetch(const Fields& obj, std::uint32_t line, TraceBuilder& b,
                                  OpKind kind) {
  const std::string_view op = OpKindName(kind);
  std::string_view id;
  if (FieldError e = GetString(obj, Key::kId, &id); e != FieldError::kNone) {
    return b.Error(line, "%s: %s", op, Describe(e, obj, Key::kId, kString));
  }
  bool offload = false;
  if (kind == OpKind::kEvict) {
    std::string_view action;
    if (FieldError e = GetString(obj, Key::kAction, &action); e != FieldError::kNone) {
      return b.Error(line, "evict: %s", Describe(e, obj, Key::kAction, kString));
    }
    if (action != "drop" && action != "offload") {
      return b.Error(line, "evict: action %s (expected drop or offload)", Quote(action));
    }
    offload = action == "offload";
  }
  absl::StatusOr<std::uint32_t> t =
      b.Live(line, id, [op] { return absl::StrCat(AbslView(op), " of"); });
  if (!t.ok()) return t.status();
  if (b.tensor(b.tensor(*t).storage).constant) {
    return b.Error(line, "%s of %s, %s (constants stay on the device)", op, Quote(id),
                   b.tensor(*t).is_view() ? "a view of a constant" : "a constant");
  }
  OpRecord& record = b.Begin(kind, line);
  record.inputs.push_back(*t);
  record.offload = offload;
  b.End();
  return absl::OkStatus();
}

absl::Status ParsePhase(const Fields& obj, std::uint32_t line, TraceBuilder& b) {
  std::string_view name;
  if (FieldError e = GetString(obj, Key::kName, &name); e != FieldError::kNone) {
    return b.Error(line, "phase: %s", Describe(e, obj, Key::kName, kString));
  }
  OpRecord& record = b.Begin(OpKind::kPhase, line);
  record.name = b.Intern(name);
  b.End();
  return absl::OkStatus();
}

// `data` is one line, followed by at least SIMDJSON_PADDING readable bytes.
absl::Status ParseLine(simdjson::dom::parser& parser, const char* data, std::size_t size,
                       std::uint32_t line, TraceBuilder& b) {
  element doc;
  if (simdjson::error_code e = parser.parse(data, size, /*realloc_if_needed=*/false).get(doc);
      e != simdjson::SUCCESS) {
    return b.Error(line, "bad JSON: %s", simdjson::error_message(e));
  }
  object record;
  if (doc.get_object().get(record) != simdjson::SUCCESS) {
    return b.Error(line, "expected a JSON object, found %s", Shown(doc));
  }
  const Fields obj(record);
  std::string_view op;
  if (FieldError e = GetString(obj, Key::kOp, &op); e != FieldError::kNone) {
    return b.Error(line, "%s", Describe(e, obj, Key::kOp, kString));
  }
  if (op == "call") return ParseCall(obj, line, b);
  if (op == "release") return ParseRelease(obj, line, b);
  if (op == "use") return ParseUse(obj, line, b);
  if (op == "constant") return ParseConstant(obj, line, b);
  if (op == "phase") return ParsePhase(obj, line, b);
  if (op == "evict") return ParseEvictOrPrefetch(obj, line, b, OpKind::kEvict);
  if (op == "prefetch") return ParseEvictOrPrefetch(obj, line, b, OpKind::kPrefetch);
  return b.Error(line,
                 "unknown op %s (expected constant, call, use, release, phase, evict or prefetch)",
                 Quote(op));
}

bool IsBlank(const char* data, std::size_t size) {
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] != ' ' && data[i] != '\t' && data[i] != '\r') return false;
  }
  return true;
}

// Parses the lines `next` hands out (each followed by at least
// SIMDJSON_PADDING readable bytes, so it is parsed in place); `size_hint`:
// the text's bytes, for reserving.
template <class NextLine>
absl::StatusOr<OpTrace> ParseLines(NextLine next, std::string_view name, std::uint64_t size_hint) {
  constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";
  // Records run 40-250 bytes, 80 on average in the shipped traces.
  TraceBuilder builder(name, static_cast<std::size_t>(size_hint / 64));
  simdjson::dom::parser parser;
  std::uint64_t line = 0;
  std::string_view text;
  for (;;) {
    absl::StatusOr<bool> more = next(&text);
    if (!more.ok()) return more.status();
    if (!*more) break;
    if (++line > UINT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: more than %d lines", name, std::uint64_t{UINT32_MAX}));
    }
    if (line == 1 && text.substr(0, kUtf8Bom.size()) == kUtf8Bom) text.remove_prefix(kUtf8Bom.size());
    if (IsBlank(text.data(), text.size())) continue;
    absl::Status s =
        ParseLine(parser, text.data(), text.size(), static_cast<std::uint32_t>(line), builder);
    if (!s.ok()) return s;
  }
  return std::move(builder).Finish();
}

}  // namespace

std::string_view OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kConstant:
      return "constant";
    case OpKind::kCall:
      return "call";
    case OpKind::kUse:
      return "use";
    case OpKind::kRelease:
      return "release";
    case OpKind::kPhase:
      return "phase";
    case OpKind::kEvict:
      return "evict";
    case OpKind::kPrefetch:
      return "prefetch";
  }
  return "?";
}

absl::StatusOr<OpTrace> ParseOpTrace(std::string_view text, std::string_view name) {
  const simdjson::padded_string padded(text.data(), text.size());
  std::string_view rest(padded.data(), padded.size());
  // Lines split at '\n' (a trailing '\r' dropped); the rest of the padded
  // text pads each one.
  auto next = [&rest](std::string_view* line) -> absl::StatusOr<bool> {
    if (rest.empty()) return false;
    const std::size_t newline = rest.find('\n');
    *line = rest.substr(0, newline);
    rest.remove_prefix(newline == std::string_view::npos ? rest.size() : newline + 1);
    if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
    return true;
  };
  return ParseLines(next, name, text.size());
}

absl::StatusOr<OpTrace> ReadOpTrace(const std::string& path) {
  // Streamed: a bad line 1 is reported before the rest is read, and a large
  // trace costs its records, not a copy of its text.
  absl::StatusOr<std::unique_ptr<LineReader>> reader =
      LineReader::Open(path, simdjson::SIMDJSON_PADDING);
  if (!reader.ok()) return reader.status();
  LineReader* r = reader->get();
  return ParseLines([r](std::string_view* line) { return r->Next(line); }, path, r->file_size());
}

std::optional<std::uint32_t> FindOpTensor(const OpTrace& trace, std::string_view id) {
  for (std::size_t i = 0; i < trace.tensors.size(); ++i) {
    if (trace.tensors[i].id == id) return static_cast<std::uint32_t>(i);
  }
  return std::nullopt;
}

}  // namespace remat
