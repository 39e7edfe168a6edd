#include "tools/remat/exit_codes.h"

#include <iostream>
#include <string>

namespace remat::tools {

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return kExitOk;
  if (absl::IsInvalidArgument(status) || absl::IsNotFound(status)) return kExitUsage;
  return kExitFailure;
}

int ReportError(std::string_view command, const absl::Status& status) {
  std::cerr << "remat " << command << ": " << std::string(status.message()) << "\n";
  return ExitCodeFor(status);
}

}  // namespace remat::tools
