// Whole files read into memory (small inputs; traces and logs are streamed by
// LineReader instead), and outputs (snapshots, timelines) written in one go.
#ifndef REMAT_BASE_FILE_H_
#define REMAT_BASE_FILE_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace remat {

// The bytes of the file at `path`. NotFound when it cannot be opened,
// InvalidArgument for a directory, DataLoss when reading fails; messages
// start with the path.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Replaces the file at `path` with `bytes`: written to a temporary file beside
// it and renamed over it, so a reader (or an interrupted run) never sees half
// a file, and a failed write leaves what was there. InvalidArgument when it
// cannot be created (no such directory, a directory in the way, no
// permission), DataLoss when writing fails (a full disk); messages start with
// the path.
absl::Status WriteFile(const std::string& path, std::string_view bytes);

// Whether WriteFile(path, ...) can create the file, checked without touching
// it, so a command can refuse a bad output path before it does any work.
// InvalidArgument naming the path and the reason when it cannot.
absl::Status CheckWritable(const std::string& path);

// A command's file, named by the flag that gave it ("--timeline"; the input
// trace by its role, "the trace").
struct NamedPath {
  std::string_view name;
  std::string path;  // "" or "-": none (standard output), never compared
};
// Refuses, before any work, an output that would overwrite an input or
// another output (the same file, however the paths are spelled), and an
// output that cannot be written (CheckWritable). InvalidArgument naming both.
absl::Status CheckOutputPaths(const std::vector<NamedPath>& inputs,
                              const std::vector<NamedPath>& outputs);

}  // namespace remat

#endif  // REMAT_BASE_FILE_H_
