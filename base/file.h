// Whole files read into memory (traces and logs are parsed from text), and
// outputs (snapshots, timelines) written in one go.
#ifndef REMAT_BASE_FILE_H_
#define REMAT_BASE_FILE_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace remat {

// The bytes of the file at `path`. NotFound when it cannot be opened,
// DataLoss when reading fails; messages start with the path.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Replaces the file at `path` with `bytes`. InvalidArgument when it cannot be
// created (no such directory, a directory in the way, no permission),
// DataLoss when writing fails (a full disk); messages start with the path.
absl::Status WriteFile(const std::string& path, std::string_view bytes);

// Whether WriteFile(path, ...) can create the file, checked without touching
// it, so a command can refuse a bad output path before it does any work.
// InvalidArgument naming the path and the reason when it cannot.
absl::Status CheckWritable(const std::string& path);

}  // namespace remat

#endif  // REMAT_BASE_FILE_H_
