// Command-line options that take a byte size ("80GiB", "512MiB", "4096").
#ifndef REMAT_TOOLS_REMAT_BYTE_SIZE_OPTION_H_
#define REMAT_TOOLS_REMAT_BYTE_SIZE_OPTION_H_

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

}  // namespace remat::tools

#endif  // REMAT_TOOLS_REMAT_BYTE_SIZE_OPTION_H_
