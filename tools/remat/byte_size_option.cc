#include "tools/remat/byte_size_option.h"

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

}  // namespace remat::tools
