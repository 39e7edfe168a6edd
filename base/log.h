// Minimal logging to stderr. Debian 12's Abseil (20220623) has no absl/log.
#ifndef REMAT_BASE_LOG_H_
#define REMAT_BASE_LOG_H_

#include <string_view>

#include "absl/strings/str_format.h"

namespace remat::log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below this level are dropped. Default: kWarning, or REMAT_LOG_LEVEL
// from the environment (debug, info, warning, error).
Level MinLevel();
void SetMinLevel(Level level);
void Write(Level level, std::string_view file, int line, std::string_view message);

}  // namespace remat::log

#define REMAT_LOG(level, ...)                                                        \
  do {                                                                               \
    if (::remat::log::Level::level >= ::remat::log::MinLevel()) {                    \
      ::remat::log::Write(::remat::log::Level::level, __FILE__, __LINE__,            \
                          ::absl::StrFormat(__VA_ARGS__));                           \
    }                                                                                \
  } while (0)

#endif  // REMAT_BASE_LOG_H_
