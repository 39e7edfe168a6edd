// Command-line options that take a byte size ("80GiB", "512MiB", "4096").
#ifndef REMAT_TOOLS_REMAT_BYTE_SIZE_OPTION_H_
#define REMAT_TOOLS_REMAT_BYTE_SIZE_OPTION_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "CLI/CLI.hpp"

namespace remat::tools {

// Adds `--name SIZE` to `app`, parsed with remat::ParseBytes into `*bytes`
// (left as it is when the option is not given; `default_text` says what that
// means in --help, if anything). A malformed or zero size is a usage error.
CLI::Option* AddByteSizeOption(CLI::App& app, const std::string& name, std::uint64_t* bytes,
                               const std::string& description,
                               const std::string& default_text = "");

// Adds `--max-split SIZE|none|auto` to `app`: the size above which the
// simulated allocator splits no block, into `*bytes` as
// OpReplayOptions::max_split_size takes it (auto: 0, none: SIZE_MAX). Sizes
// under 10 MiB, the large pool's threshold, are a usage error.
CLI::Option* AddMaxSplitOption(CLI::App& app, std::size_t* bytes);

// Adds `--alloc-conf STRING`: the allocator settings with PyTorch's keys
// (allocator/alloc_conf.h), checked when parsed: a bad string is a usage error.
CLI::Option* AddAllocConfOption(CLI::App& app, std::string* conf);

// The host link as `remat sim` and `remat sweep` model it: --link-gbps (each
// way), --link-latency-us (per copy) and --host-memory (pinned host memory,
// a budget of its own).
struct LinkFlags {
  double gbps = 25.0;
  double latency_us = 2.0;
  std::uint64_t host_memory = 64ull << 30;
  std::int64_t latency_ns() const { return static_cast<std::int64_t>(latency_us * 1000); }
};
void AddLinkOptions(CLI::App& app, LinkFlags* link);

}  // namespace remat::tools

#endif  // REMAT_TOOLS_REMAT_BYTE_SIZE_OPTION_H_
