// How the `remat` command reports failure: a message on stderr and one of a
// few exit statuses, so scripts can tell a bad invocation from a failed run.
#ifndef REMAT_TOOLS_REMAT_EXIT_CODES_H_
#define REMAT_TOOLS_REMAT_EXIT_CODES_H_

#include <string_view>

#include "absl/status/status.h"

namespace remat::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the input was fine; something else went wrong
inline constexpr int kExitUsage = 2;    // bad flags, or bad input (a missing or malformed file)
// The run was carried out and the answer is no: the trace did not fit the
// budget (`remat sim` ended as oom or thrash; `remat replay` had an OOM).
inline constexpr int kExitUnfinished = 3;

// kExitUsage for errors that blame the caller's input (InvalidArgument,
// NotFound), kExitFailure for the rest.
int ExitCodeFor(const absl::Status& status);

// Prints "remat <command>: <message>" to stderr; returns ExitCodeFor(status).
int ReportError(std::string_view command, const absl::Status& status);

}  // namespace remat::tools

#endif  // REMAT_TOOLS_REMAT_EXIT_CODES_H_
