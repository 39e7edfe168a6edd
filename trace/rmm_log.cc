#include "trace/rmm_log.h"

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/line_reader.h"
#include "base/text.h"

namespace remat {
namespace {

constexpr std::string_view kHeader = "Thread,Time,Action,Pointer,Size,Stream";
constexpr int kNumFields = 6;

// --- Field syntax. Each returns false on text that is not what it should be.

bool ParseUnsigned(std::string_view s, int base, std::uint64_t* out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, *out, base);
  return ec == std::errc() && ptr == end;
}

bool HasHexPrefix(std::string_view s) {
  return s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
}

// RMM's fmt-based formatter writes 0x7f..., its printf-based one bare 7f....
bool ParsePointer(std::string_view s, std::uint64_t* out) {
  if (HasHexPrefix(s)) s.remove_prefix(2);
  return ParseUnsigned(s, 16, out);
}

// Streams and threads are identities: 0x-hex, decimal, or bare hex digits.
bool ParseHandle(std::string_view s, std::uint64_t* out) {
  if (HasHexPrefix(s)) return ParseUnsigned(s.substr(2), 16, out);
  return ParseUnsigned(s, 10, out) || ParseUnsigned(s, 16, out);
}

bool TwoDigits(std::string_view s, std::size_t at, int limit, std::int64_t* out) {
  if (at + 2 > s.size()) return false;
  const char a = s[at], b = s[at + 1];
  if (a < '0' || a > '9' || b < '0' || b > '9') return false;
  *out = (a - '0') * 10 + (b - '0');
  return *out < limit;
}

// HH:MM:SS[.fraction], the fraction up to nanoseconds (RMM writes microseconds).
bool ParseTime(std::string_view s, std::int64_t* ns) {
  std::int64_t h, m, sec;
  if (!TwoDigits(s, 0, 24, &h) || s.size() < 8 || s[2] != ':' || !TwoDigits(s, 3, 60, &m) ||
      s[5] != ':' || !TwoDigits(s, 6, 60, &sec)) {
    return false;
  }
  std::int64_t frac_ns = 0;
  if (s.size() > 8) {
    std::string_view frac = s.substr(9);
    if (s[8] != '.' || frac.empty() || frac.size() > 9) return false;
    std::int64_t scale = 100000000;
    for (char c : frac) {
      if (c < '0' || c > '9') return false;
      frac_ns += (c - '0') * scale;
      scale /= 10;
    }
  }
  *ns = ((h * 60 + m) * 60 + sec) * 1000000000 + frac_ns;
  return true;
}

bool ParseAction(std::string_view s, AllocAction* out) {
  if (s == "allocate") {
    *out = AllocAction::kAllocate;
  } else if (s == "free") {
    *out = AllocAction::kFree;
  } else if (s == "allocate failure") {
    *out = AllocAction::kAllocateFailure;
  } else {
    return false;
  }
  return true;
}

// A field as an error message shows it (base/text.h).
std::string Quote(std::string_view field) { return QuoteForMessage(field); }

// --- The log being built: record syntax is checked by the caller, the log's
// consistency (liveness, sizes) here.
class LogBuilder {
 public:
  LogBuilder(std::string_view name, std::size_t expected_records) {
    log_.name = std::string(name);
    log_.records.reserve(expected_records);
  }

  template <typename... Args>
  absl::Status Error(std::uint32_t line, const absl::FormatSpec<Args...>& format,
                     const Args&... args) const {
    return absl::InvalidArgumentError(
        absl::StrCat(log_.name, ":", line, ": ", absl::StrFormat(format, args...)));
  }

  absl::StatusOr<std::uint16_t> StreamIndex(std::uint64_t handle, std::uint32_t line) {
    return Intern(handle, line, "streams", &log_.streams, &stream_index_);
  }
  absl::StatusOr<std::uint16_t> ThreadIndex(std::uint64_t id, std::uint32_t line) {
    return Intern(id, line, "threads", &log_.threads, &thread_index_);
  }

  absl::Status Add(AllocRecord record, std::uint64_t ptr) {
    switch (record.action) {
      case AllocAction::kAllocate: {
        absl::Status s = Allocate(record, ptr);
        if (!s.ok()) return s;
        break;
      }
      case AllocAction::kFree: {
        absl::Status s = Free(record, ptr);
        if (!s.ok()) return s;
        break;
      }
      case AllocAction::kAllocateFailure:
        ++log_.alloc_failures;
        break;
    }
    log_.records.push_back(record);
    return absl::OkStatus();
  }

  AllocLog Finish() && {
    log_.live_at_end = live_.size();
    log_.live_bytes_at_end = live_bytes_;
    return std::move(log_);
  }

 private:
  struct Live {
    std::uint64_t size;
    std::uint32_t slot;
    std::uint32_t line;
  };
  struct ZeroByteLive {
    std::uint32_t count;  // a sentinel pointer may be handed out again while live
    std::uint32_t line;
  };

  absl::Status Allocate(AllocRecord& record, std::uint64_t ptr) {
    ++log_.allocations;
    if (record.size == 0) {
      ++log_.zero_byte_allocations;
      if (ptr != 0) {
        auto [it, inserted] = zero_live_.try_emplace(ptr, ZeroByteLive{0, record.line});
        ++it->second.count;
      }
      return absl::OkStatus();
    }
    if (ptr == 0) {
      return Error(record.line,
                   "allocate of %d bytes at a null pointer (a failed allocation is logged as "
                   "'allocate failure')",
                   record.size);
    }
    auto [it, inserted] = live_.try_emplace(ptr, Live{record.size, 0, record.line});
    if (!inserted) {
      return Error(record.line, "allocate of 0x%x which is already live (allocated at line %d)",
                   ptr, it->second.line);
    }
    if (free_slots_.empty()) {
      it->second.slot = log_.num_slots++;
    } else {
      it->second.slot = free_slots_.back();
      free_slots_.pop_back();
    }
    record.slot = it->second.slot;
    // No memory holds 2^64 bytes: a log whose live sizes add up past that has
    // wrong sizes, and a wrapped sum would report a peak that is not its own.
    std::uint64_t live = 0;
    if (__builtin_add_overflow(live_bytes_, record.size, &live)) {
      return Error(record.line,
                   "allocate of %d bytes with %d bytes already live: the live sizes add up "
                   "past 2^64 bytes, more than any memory holds",
                   record.size, live_bytes_);
    }
    live_bytes_ = live;
    if (live_bytes_ > log_.peak_requested_bytes) log_.peak_requested_bytes = live_bytes_;
    return absl::OkStatus();
  }

  absl::Status Free(AllocRecord& record, std::uint64_t ptr) {
    ++log_.frees;
    if (record.size == 0 && ptr == 0) return absl::OkStatus();  // free(nullptr)
    auto it = live_.find(ptr);
    auto zero = ptr == 0 ? zero_live_.end() : zero_live_.find(ptr);
    // A zero-byte free matches a zero-byte allocation first, a sized one a
    // sized allocation: the same address may be both at once.
    if (record.size == 0 && zero != zero_live_.end()) {
      if (--zero->second.count == 0) zero_live_.erase(zero);
      return absl::OkStatus();
    }
    if (record.size != 0 && it != live_.end() && it->second.size == record.size) {
      record.slot = it->second.slot;
      free_slots_.push_back(it->second.slot);
      live_bytes_ -= record.size;
      live_.erase(it);
      return absl::OkStatus();
    }
    if (it != live_.end()) {
      return Error(record.line,
                   "free of 0x%x with size %d, but it was allocated with %d bytes at line %d", ptr,
                   record.size, it->second.size, it->second.line);
    }
    if (zero != zero_live_.end()) {
      return Error(record.line,
                   "free of 0x%x with size %d, but it was allocated with 0 bytes at line %d", ptr,
                   record.size, zero->second.line);
    }
    return Error(record.line, "free of 0x%x which is not live", ptr);
  }

  absl::StatusOr<std::uint16_t> Intern(std::uint64_t value, std::uint32_t line, const char* what,
                                       std::vector<std::uint64_t>* values,
                                       absl::flat_hash_map<std::uint64_t, std::uint16_t>* index) {
    auto it = index->find(value);
    if (it != index->end()) return it->second;
    if (values->size() > UINT16_MAX) {
      return Error(line, "more than %d distinct %s", UINT16_MAX + 1, what);
    }
    const auto i = static_cast<std::uint16_t>(values->size());
    values->push_back(value);
    index->emplace(value, i);
    return i;
  }

  AllocLog log_;
  absl::flat_hash_map<std::uint64_t, Live> live_;
  absl::flat_hash_map<std::uint64_t, ZeroByteLive> zero_live_;
  std::vector<std::uint32_t> free_slots_;
  std::uint64_t live_bytes_ = 0;
  absl::flat_hash_map<std::uint64_t, std::uint16_t> stream_index_;
  absl::flat_hash_map<std::uint64_t, std::uint16_t> thread_index_;
};

// Splits `line` at commas into exactly kNumFields fields; returns how many it found.
int SplitFields(std::string_view line, std::string_view (&fields)[kNumFields]) {
  int n = 0;
  while (true) {
    const std::size_t comma = line.find(',');
    if (n < kNumFields) fields[n] = line.substr(0, comma);
    ++n;
    if (comma == std::string_view::npos) return n;
    line.remove_prefix(comma + 1);
  }
}

absl::Status ParseLine(std::string_view text, std::uint32_t line, LogBuilder& builder) {
  std::string_view f[kNumFields];
  const int n = SplitFields(text, f);
  if (n != kNumFields) {
    return builder.Error(line, "expected %d fields (%s), found %d", kNumFields, kHeader, n);
  }
  AllocRecord record;
  record.line = line;
  std::uint64_t thread = 0, ptr = 0, stream = 0;
  if (!ParseHandle(f[0], &thread)) {
    return builder.Error(line, "bad Thread %s (expected a decimal or 0x-hex id)", Quote(f[0]));
  }
  if (!ParseTime(f[1], &record.time_ns)) {
    return builder.Error(line, "bad Time %s (expected HH:MM:SS.ffffff)", Quote(f[1]));
  }
  if (!ParseAction(f[2], &record.action)) {
    return builder.Error(line, "unknown Action %s (expected allocate, free or allocate failure)",
                         Quote(f[2]));
  }
  if (!ParsePointer(f[3], &ptr)) {
    return builder.Error(line, "bad Pointer %s (expected a hex address)", Quote(f[3]));
  }
  if (!ParseUnsigned(f[4], 10, &record.size)) {
    return builder.Error(line, "bad Size %s (expected a decimal byte count)", Quote(f[4]));
  }
  if (!ParseHandle(f[5], &stream)) {
    return builder.Error(line, "bad Stream %s (expected a 0x-hex or decimal handle)", Quote(f[5]));
  }
  absl::StatusOr<std::uint16_t> thread_index = builder.ThreadIndex(thread, line);
  if (!thread_index.ok()) return thread_index.status();
  absl::StatusOr<std::uint16_t> stream_index = builder.StreamIndex(stream, line);
  if (!stream_index.ok()) return stream_index.status();
  record.thread = *thread_index;
  record.stream = *stream_index;
  return builder.Add(record, ptr);
}

// The next line of `text` from `*pos`, without its "\n" or "\r\n".
std::string_view NextLine(std::string_view text, std::size_t* pos) {
  const std::size_t start = *pos;
  std::size_t end = text.find('\n', start);
  if (end == std::string_view::npos) end = text.size();
  *pos = end + 1;
  std::string_view line = text.substr(start, end - start);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

}  // namespace

namespace {

// Parses the lines `next` hands out; `size_hint`: the text's bytes, for reserving.
template <class Next>
absl::StatusOr<AllocLog> ParseLines(Next next, std::string_view name, std::uint64_t size_hint) {
  constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";
  std::string_view header;
  absl::StatusOr<bool> more = next(&header);
  if (!more.ok()) return more.status();
  if (header.substr(0, kUtf8Bom.size()) == kUtf8Bom) header.remove_prefix(kUtf8Bom.size());
  if (!*more) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: empty log (expected the header '%s')", name, kHeader));
  }
  if (header != kHeader) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s:1: expected the header '%s', found %s", name, kHeader, Quote(header)));
  }
  // RMM lines are 50-70 bytes; reserving for 40 avoids regrowth on most logs.
  LogBuilder builder(name, static_cast<std::size_t>(size_hint / 40));
  std::uint64_t line = 1;
  std::string_view fields;
  for (;;) {
    more = next(&fields);
    if (!more.ok()) return more.status();
    if (!*more) break;
    if (++line > UINT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: more than %d lines", name, std::uint64_t{UINT32_MAX}));
    }
    if (fields.empty()) continue;  // a blank line carries nothing
    absl::Status s = ParseLine(fields, static_cast<std::uint32_t>(line), builder);
    if (!s.ok()) return s;
  }
  return std::move(builder).Finish();
}

}  // namespace

absl::StatusOr<AllocLog> ParseRmmLog(std::string_view text, std::string_view name) {
  std::size_t pos = 0;
  auto next = [text, &pos](std::string_view* line) -> absl::StatusOr<bool> {
    if (pos >= text.size()) return false;
    *line = NextLine(text, &pos);
    return true;
  };
  return ParseLines(next, name, text.size());
}

absl::StatusOr<AllocLog> ReadRmmLog(const std::string& path) {
  // Streamed: a bad header is reported before the rest is read, and a large
  // log costs its events, not a copy of its text.
  absl::StatusOr<std::unique_ptr<LineReader>> reader = LineReader::Open(path);
  if (!reader.ok()) return reader.status();
  LineReader* r = reader->get();
  return ParseLines([r](std::string_view* line) { return r->Next(line); }, path, r->file_size());
}

}  // namespace remat
