// Settings read from environment variables, with errors that name them.
#ifndef REMAT_BASE_ENV_H_
#define REMAT_BASE_ENV_H_

#include <cstddef>

#include "absl/status/status.h"

namespace remat {

// The variable's value, or nullptr when it is unset or empty.
const char* GetEnv(const char* name);

// Each leaves `out` as it was when the variable is unset or empty, and
// returns InvalidArgument naming the variable and its value when malformed.
// Bytes as base/units.h's ParseBytes reads them ("12GiB").
absl::Status BytesFromEnv(const char* name, std::size_t* out);
// 1, true, yes / 0, false, no.
absl::Status FlagFromEnv(const char* name, bool* out);

}  // namespace remat

#endif  // REMAT_BASE_ENV_H_
