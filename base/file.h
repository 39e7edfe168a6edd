// Whole files read into memory (traces and logs are parsed from text).
#ifndef REMAT_BASE_FILE_H_
#define REMAT_BASE_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace remat {

// The bytes of the file at `path`. NotFound when it cannot be opened,
// DataLoss when reading fails; messages start with the path.
absl::StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace remat

#endif  // REMAT_BASE_FILE_H_
