#include "allocator/alloc_conf.h"

#include <algorithm>
#include <bit>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace remat {
namespace {

constexpr const char* kKeys[] = {"expandable_segments", "max_split_size_mb",
                                 "roundup_power2_divisions", "garbage_collection_threshold",
                                 "release_lock_on_cudamalloc"};

// Keys of PYTORCH_CUDA_ALLOC_CONF that configure PyTorch's own parts, which
// stay PyTorch's when remat is its device allocator.
constexpr const char* kPyTorchOwn[] = {"backend", "pinned_use_cuda_host_register",
                                       "pinned_num_register_threads",
                                       "pinned_use_background_threads",
                                       "pinned_reserve_segment_size_mb"};

absl::Status Bad(absl::string_view key, absl::string_view value, absl::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrFormat("allocator settings: %s:%s: %s", key, value, want));
}

absl::Status ParseBool(absl::string_view key, absl::string_view value, bool* out) {
  if (value == "True" || value == "true" || value == "1") {
    *out = true;
  } else if (value == "False" || value == "false" || value == "0") {
    *out = false;
  } else {
    return Bad(key, value, "want True or False");
  }
  return absl::OkStatus();
}

absl::Status ParseDivisions(absl::string_view key, absl::string_view text, int* out) {
  int n = 0;
  if (!absl::SimpleAtoi(text, &n) || n < 0 || n > 64 || (n > 1 && !std::has_single_bit(unsigned(n)))) {
    return Bad(key, text, "divisions must be 0, 1 or a power of two up to 64");
  }
  *out = n;
  return absl::OkStatus();
}

// "[256:1,512:2,>:4]": for each power-of-two bucket of sizes, the divisions.
absl::Status ParseDivisionList(absl::string_view key, absl::string_view text,
                               std::array<std::uint8_t, 64>* out) {
  absl::string_view inner = text;
  if (!absl::ConsumePrefix(&inner, "[") || !absl::ConsumeSuffix(&inner, "]") || inner.empty()) {
    return Bad(key, text, "want a number or a list such as [256:1,512:2,>:4]");
  }
  std::map<std::size_t, int> upto;  // interval end in bytes -> divisions
  int above = -1;
  for (absl::string_view item : absl::StrSplit(inner, ',')) {
    std::vector<absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits(':', 1));
    int divisions = 0;
    if (kv.size() != 2) return Bad(key, text, absl::StrFormat("'%s' is not SIZE_MB:DIVISIONS", item));
    kv[0] = absl::StripAsciiWhitespace(kv[0]);
    kv[1] = absl::StripAsciiWhitespace(kv[1]);
    if (absl::Status s = ParseDivisions(key, kv[1], &divisions); !s.ok()) return s;
    if (kv[0] == ">") {
      if (above >= 0) return Bad(key, text, "'>' given twice");
      above = divisions;
      continue;
    }
    std::uint64_t mb = 0;
    if (!absl::SimpleAtoi(kv[0], &mb) || mb == 0 || !std::has_single_bit(mb) || mb > (1u << 20)) {
      return Bad(key, text, absl::StrFormat("'%s': interval sizes are powers of two in MiB", kv[0]));
    }
    if (!upto.emplace(mb * kMiB, divisions).second) {
      return Bad(key, text, absl::StrFormat("%s MiB given twice", kv[0]));
    }
  }
  std::array<std::uint8_t, 64> buckets{};
  for (int b = 0; b < 64; ++b) {
    const std::size_t low = std::size_t{1} << b;  // sizes in [2^b, 2^(b+1))
    auto it = upto.upper_bound(low);
    const int d = it != upto.end() ? it->second : (above >= 0 ? above : 0);
    buckets[static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(d);
  }
  *out = buckets;
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyAllocConf(std::string_view conf_text, AllocatorOptions* options,
                            AllocConfSource source) {
  const absl::string_view conf(conf_text.data(), conf_text.size());
  AllocatorOptions o = *options;
  std::map<std::string, bool> seen;
  absl::string_view rest = absl::StripAsciiWhitespace(conf);
  if (rest.empty()) return absl::OkStatus();
  // Commas separate pairs, except inside a [...] list.
  std::vector<absl::string_view> pairs;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= rest.size(); ++i) {
    if (i < rest.size() && rest[i] == '[') ++depth;
    if (i < rest.size() && rest[i] == ']') --depth;
    if (i == rest.size() || (rest[i] == ',' && depth == 0)) {
      pairs.push_back(absl::StripAsciiWhitespace(rest.substr(start, i - start)));
      start = i + 1;
    }
  }
  for (absl::string_view pair : pairs) {
    const std::size_t colon = pair.find(':');
    if (pair.empty() || colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "allocator settings: '%s' is not KEY:VALUE (in \"%s\")", pair, conf));
    }
    const std::string key(absl::StripAsciiWhitespace(pair.substr(0, colon)));
    const absl::string_view value = absl::StripAsciiWhitespace(pair.substr(colon + 1));
    if (!seen.emplace(key, true).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("allocator settings: %s given twice", key));
    }
    if (source == AllocConfSource::kPyTorch &&
        std::find(std::begin(kPyTorchOwn), std::end(kPyTorchOwn), key) != std::end(kPyTorchOwn)) {
      continue;  // PyTorch's own (its host allocator, its backend): not ours to apply
    }
    if (key == "expandable_segments") {
      if (absl::Status s = ParseBool(key, value, &o.expandable_segments); !s.ok()) return s;
    } else if (key == "release_lock_on_cudamalloc") {
      if (absl::Status s = ParseBool(key, value, &o.release_lock_on_device_reserve); !s.ok()) {
        return s;
      }
    } else if (key == "max_split_size_mb") {
      std::uint64_t mb = 0;
      if (!absl::SimpleAtoi(value, &mb) || mb <= kSmallSize / kMiB || mb > (std::uint64_t{1} << 30)) {
        return Bad(key, value, absl::StrFormat("want a whole number of MiB above %d",
                                               kSmallSize / kMiB));
      }
      o.max_split_size = mb * kMiB;
    } else if (key == "roundup_power2_divisions") {
      if (!value.empty() && value.front() == '[') {
        if (absl::Status s = ParseDivisionList(key, value, &o.roundup_divisions); !s.ok()) return s;
      } else {
        int d = 0;
        if (absl::Status s = ParseDivisions(key, value, &d); !s.ok()) return s;
        o.roundup_divisions.fill(static_cast<std::uint8_t>(d));
      }
    } else if (key == "garbage_collection_threshold") {
      double t = 0;
      if (!absl::SimpleAtod(value, &t) || !(t > 0.0 && t < 1.0)) {
        return Bad(key, value, "want a fraction strictly between 0 and 1");
      }
      o.garbage_collection_threshold = t;
    } else {
      return absl::InvalidArgumentError(absl::StrFormat(
          "allocator settings: unknown key '%s'; known keys: %s", key, absl::StrJoin(kKeys, ", ")));
    }
  }
  *options = o;
  return absl::OkStatus();
}

}  // namespace remat
