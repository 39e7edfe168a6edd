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
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: is a directory, not a file", path));
  }
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

namespace {

// Writes `bytes` to `path` in place (what a device or a pipe needs).
absl::Status WriteInPlace(const std::string& path, std::string_view bytes) {
  FilePtr file = Open(path, "wb");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: cannot create: %s", path, std::strerror(errno)));
  }
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), file.get()) == bytes.size();
  if (!written || std::fclose(file.release()) != 0) {
    return absl::DataLossError(absl::StrFormat("%s: write error: %s", path, std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFile(const std::string& path, std::string_view bytes) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);  // through links
  if (fs::exists(status) && !fs::is_regular_file(status)) return WriteInPlace(path, bytes);
  // A link is written through: the file it names is the one replaced.
  std::string target = path;
  if (fs::is_symlink(fs::symlink_status(path, error))) {
    const fs::path resolved = fs::canonical(path, error);
    if (!error) target = resolved.string();
  }
  // Beside the target (a rename does not cross file systems), named by the
  // process so two writers do not share it.
  const std::string temp = absl::StrFormat("%s.tmp.%d", target, static_cast<int>(getpid()));
  FilePtr file = Open(temp, "wb");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: cannot create: %s", path, std::strerror(errno)));
  }
  bool written = std::fwrite(bytes.data(), 1, bytes.size(), file.get()) == bytes.size();
  // On disk before it takes the name, so a crash leaves the old file or the new.
  written = written && std::fflush(file.get()) == 0 && fsync(fileno(file.get())) == 0;
  if (fs::exists(status)) {
    fs::permissions(temp, status.permissions(), error);  // the replaced file's mode
  }
  // fclose flushes: its failure is a failed write too.
  if (!written || std::fclose(file.release()) != 0) {
    const int error = errno;
    std::remove(temp.c_str());
    return absl::DataLossError(absl::StrFormat("%s: write error: %s", path, std::strerror(error)));
  }
  if (std::rename(temp.c_str(), target.c_str()) != 0) {
    const int error = errno;
    std::remove(temp.c_str());
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: cannot create: %s", path, std::strerror(error)));
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
  const fs::file_status status = fs::status(path, error);
  const bool exists = fs::exists(status);
  if (exists && access(path.c_str(), W_OK) != 0) return cannot(std::strerror(errno));
  // A regular file is replaced through a temporary file beside it (WriteFile):
  // its directory must take one. A device or a pipe is written in place.
  if (exists && !fs::is_regular_file(status)) return absl::OkStatus();
  fs::path beside = dir;
  if (fs::is_symlink(fs::symlink_status(path, error))) {
    const fs::path resolved = fs::canonical(path, error);
    if (!error) beside = resolved.parent_path();
  }
  if (access(beside.c_str(), W_OK) != 0) return cannot(std::strerror(errno));
  return absl::OkStatus();
}

namespace {

bool Named(const NamedPath& p) { return !p.path.empty() && p.path != "-"; }

// Whether two paths name one file: the same file where both exist (links
// and spellings included), else the same normalised absolute path.
bool SameFile(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::exists(a, error) && fs::exists(b, error)) {
    const bool same = fs::equivalent(a, b, error);
    if (!error) return same;
  }
  const fs::path ca = fs::weakly_canonical(fs::absolute(a, error), error);
  const fs::path cb = fs::weakly_canonical(fs::absolute(b, error), error);
  return ca == cb;
}

}  // namespace

absl::Status CheckOutputPaths(const std::vector<NamedPath>& inputs,
                              const std::vector<NamedPath>& outputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& out = outputs[i];
    if (!Named(out)) continue;
    for (const NamedPath& in : inputs) {
      if (Named(in) && SameFile(out.path, in.path)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s %s is %s: refusing to overwrite an input", out.name, out.path, in.name));
      }
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (Named(outputs[j]) && SameFile(out.path, outputs[j].path)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s and %s name the same file (%s): each output needs its own", outputs[j].name,
            out.name, out.path));
      }
    }
    if (absl::Status writable = CheckWritable(out.path); !writable.ok()) return writable;
  }
  return absl::OkStatus();
}

}  // namespace remat
