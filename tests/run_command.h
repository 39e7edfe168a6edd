// Test helpers that run other programs (the `remat` binary, python3) and
// collect what they print.
#ifndef REMAT_TESTS_RUN_COMMAND_H_
#define REMAT_TESTS_RUN_COMMAND_H_

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>

#include "gtest/gtest.h"

namespace remat::testutil {

struct CommandOutcome {
  int status = -1;  // exit status; -1 when it did not exit normally
  std::string out;  // stdout and stderr together
};

// Runs `command` with /bin/sh, stderr joined to stdout.
inline CommandOutcome RunCommand(const std::string& command) {
  CommandOutcome run;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  std::size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.out.append(buffer, n);
  const int raw = pclose(pipe);
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return run;
}

// `s` as one shell word.
inline std::string ShellQuote(std::string_view s) {
  std::string quoted = "'";
  for (char c : s) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

// A path in the test's temporary directory.
inline std::string TempPath(std::string_view name) {
  return ::testing::TempDir() + "/" + std::string(name);
}

// Writes `text` to TempPath(name); returns the path.
inline std::string WriteTempFile(std::string_view name, std::string_view text) {
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// The python3 CMake found (remat_add_test(... PYTHON)), or "" without one.
inline std::string Python3() {
#ifdef REMAT_PYTHON3
  return REMAT_PYTHON3;
#else
  return "";
#endif
}

// Runs a Python script (saved as TempPath(name)) with `args` (already quoted).
inline CommandOutcome RunPython(std::string_view name, std::string_view script,
                                const std::string& args) {
  const std::string path = WriteTempFile(name, script);
  return RunCommand(ShellQuote(Python3()) + " " + ShellQuote(path) + " " + args);
}

}  // namespace remat::testutil

#endif  // REMAT_TESTS_RUN_COMMAND_H_
