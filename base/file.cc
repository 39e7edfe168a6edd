#include "base/file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include "absl/strings/str_format.h"

namespace remat {
namespace {

using FilePtr = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

FilePtr Open(const std::string& path, const char* mode) {
  return FilePtr(std::fopen(path.c_str(), mode), &std::fclose);
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  FilePtr file = Open(path, "rb");
  if (file == nullptr) {
    return absl::NotFoundError(absl::StrFormat("%s: cannot open: %s", path, std::strerror(errno)));
  }
  std::string text;
  char buffer[1 << 16];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file.get())) > 0) text.append(buffer, n);
  if (std::ferror(file.get())) {
    return absl::DataLossError(absl::StrFormat("%s: read error: %s", path, std::strerror(errno)));
  }
  return text;
}

absl::Status WriteFile(const std::string& path, std::string_view bytes) {
  FilePtr file = Open(path, "wb");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: cannot create: %s", path, std::strerror(errno)));
  }
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), file.get()) == bytes.size();
  // fclose flushes: its failure is a failed write too.
  if (!written || std::fclose(file.release()) != 0) {
    return absl::DataLossError(absl::StrFormat("%s: write error: %s", path, std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status CheckWritable(const std::string& path) {
  namespace fs = std::filesystem;
  const auto cannot = [&path](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: cannot create: %s", path, why));
  };
  if (path.empty()) return absl::InvalidArgumentError("an empty output path");
  std::error_code error;
  if (fs::is_directory(path, error)) return cannot("it is a directory");
  const fs::path parent = fs::path(path).parent_path();
  const fs::path dir = parent.empty() ? fs::path(".") : parent;
  if (!fs::is_directory(dir, error)) {
    return cannot(absl::StrFormat("no directory %s", dir.string()));
  }
  const bool exists = fs::exists(path, error);
  if (access(exists ? path.c_str() : dir.c_str(), W_OK) != 0) return cannot(std::strerror(errno));
  return absl::OkStatus();
}

}  // namespace remat
