#include "base/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace remat::log {
namespace {

Level LevelFromEnvironment() {
  const char* text = std::getenv("REMAT_LOG_LEVEL");
  if (text == nullptr) return Level::kWarning;
  if (std::strcmp(text, "debug") == 0) return Level::kDebug;
  if (std::strcmp(text, "info") == 0) return Level::kInfo;
  if (std::strcmp(text, "error") == 0) return Level::kError;
  return Level::kWarning;
}

std::atomic<int>& MinLevelStorage() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnvironment())};
  return level;
}

}  // namespace

Level MinLevel() { return static_cast<Level>(MinLevelStorage().load(std::memory_order_relaxed)); }
void SetMinLevel(Level level) { MinLevelStorage().store(static_cast<int>(level)); }

void Write(Level level, std::string_view file, int line, std::string_view message) {
  static constexpr const char* kNames[] = {"debug", "info", "warning", "error"};
  const std::size_t slash = file.rfind('/');
  if (slash != std::string_view::npos) file.remove_prefix(slash + 1);
  std::fprintf(stderr, "remat %s %.*s:%d: %.*s\n", kNames[static_cast<int>(level)],
               static_cast<int>(file.size()), file.data(), line, static_cast<int>(message.size()),
               message.data());
}

}  // namespace remat::log
