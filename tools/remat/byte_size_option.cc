#include "tools/remat/byte_size_option.h"

#include <limits>

#include "allocator/alloc_conf.h"
#include "allocator/caching_allocator.h"
#include "base/units.h"

namespace remat::tools {
namespace {

// Checked while CLI11 parses, so a bad size reads like any other usage error.
CLI::Validator ByteSize() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        absl::StatusOr<std::uint64_t> bytes = ParseBytes(text);
        if (!bytes.ok()) return std::string(bytes.status().message());
        if (*bytes == 0) return "must be more than 0 bytes";
        return "";
      },
      "", "BYTES");
}

}  // namespace

CLI::Option* AddByteSizeOption(CLI::App& app, const std::string& name, std::uint64_t* bytes,
                               const std::string& description, const std::string& default_text) {
  CLI::Option* option = app.add_option_function<std::string>(
      name, [bytes](const std::string& text) { *bytes = *ParseBytes(text); }, description);
  option->check(ByteSize())->type_name("BYTES");
  if (!default_text.empty()) option->default_str(default_text);
  return option;
}

CLI::Option* AddMaxSplitOption(CLI::App& app, std::size_t* bytes) {
  CLI::Option* option = app.add_option_function<std::string>(
      "--max-split",
      [bytes](const std::string& text) {
        if (text == "auto") {
          *bytes = 0;
        } else if (text == "none") {
          *bytes = std::numeric_limits<std::size_t>::max();
        } else {
          *bytes = static_cast<std::size_t>(*ParseBytes(text));
        }
      },
      "Split no block above this size (auto: 64MiB under a reserved budget, halved for "
      "a run made again when runs with the higher limit did not finish or were beaten in "
      "a policy's trials, up to twice, unless --alloc-conf or --retry-anywhere is given; "
      "else no limit; none: no limit)");
  option
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            if (text == "auto" || text == "none") return "";
            absl::StatusOr<std::uint64_t> parsed = ParseBytes(text);
            if (!parsed.ok()) return std::string(parsed.status().message());
            if (*parsed < kMinLargeAlloc) return "must be at least 10MiB, or auto or none";
            return "";
          },
          "", "SIZE|none|auto"))
      ->default_str("auto");
  return option;
}

CLI::Option* AddAllocConfOption(CLI::App& app, std::string* conf) {
  return app
      .add_option("--alloc-conf", *conf,
                  "Allocator settings with PyTorch's keys, e.g. expandable_segments:True,"
                  "max_split_size_mb:256 (also roundup_power2_divisions, "
                  "garbage_collection_threshold, release_lock_on_cudamalloc)")
      ->type_name("STRING")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            AllocatorOptions probe;
            absl::Status s = ApplyAllocConf(text, &probe);
            return s.ok() ? std::string() : std::string(s.message());
          },
          "", "alloc-conf"));
}

void AddLinkOptions(CLI::App& app, LinkFlags* link) {
  app.add_option("--link-gbps", link->gbps, "Host link bandwidth, GB/s")
      ->capture_default_str()
      ->check(CLI::Range(1e-3, 1e6));
  app.add_option("--link-latency-us", link->latency_us,
                 "Latency of each copy on the host link, microseconds")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  AddByteSizeOption(app, "--host-memory", &link->host_memory,
                    "Pinned host memory offloads may hold (default 64GiB)");
}

}  // namespace remat::tools
