#include "base/line_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/units.h"

namespace remat {

absl::StatusOr<std::unique_ptr<LineReader>> LineReader::Open(const std::string& path,
                                                             std::size_t padding,
                                                             std::size_t chunk,
                                                             std::size_t max_line) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrFormat("%s: cannot open: %s", path, std::strerror(errno)));
  }
  struct stat st {};
  std::uint64_t size = 0;
  if (::fstat(fd, &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrFormat("%s: is a directory, not a file", path));
    }
    if (S_ISREG(st.st_mode)) size = static_cast<std::uint64_t>(st.st_size);
  }
  return std::unique_ptr<LineReader>(
      new LineReader(path, fd, padding, chunk < 16 ? 16 : chunk, max_line, size));
}

LineReader::LineReader(std::string path, int fd, std::size_t padding, std::size_t chunk,
                       std::size_t max_line, std::uint64_t file_size)
    : path_(std::move(path)),
      fd_(fd),
      padding_(padding),
      max_line_(max_line),
      buffer_(chunk + padding),
      capacity_(chunk),
      file_size_(file_size) {}

LineReader::~LineReader() { ::close(fd_); }

absl::Status LineReader::TooLong() const {
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: line %d is longer than %s, the longest line a trace may have (no newline, or not "
      "a trace?)",
      path_, lines_ + 1, FormatBytes(max_line_)));
}

absl::StatusOr<bool> LineReader::Next(std::string_view* line) {
  for (;;) {
    char* const data = buffer_.data();
    if (begin_ < end_) {
      const void* newline = std::memchr(data + begin_, '\n', end_ - begin_);
      if (newline != nullptr || eof_) {
        const std::size_t stop =
            newline != nullptr ? static_cast<std::size_t>(static_cast<const char*>(newline) - data)
                               : end_;
        std::size_t size = stop - begin_;
        if (size > 0 && data[begin_ + size - 1] == '\r') --size;
        if (size > max_line_) return TooLong();
        *line = std::string_view(data + begin_, size);
        begin_ = newline != nullptr ? stop + 1 : end_;
        ++lines_;
        return true;
      }
    } else if (eof_) {
      return false;
    }
    // No whole line in the buffer: move what is left to the front (growing
    // the buffer for a line longer than it) and read more.
    if (begin_ > 0) {
      std::memmove(data, data + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    // More than the cap (and a '\r') with no newline yet: refused now, not
    // once the whole of the line is in memory.
    if (end_ > max_line_ + 1) return TooLong();
    if (end_ == capacity_) {
      capacity_ = std::min(capacity_ * 2, max_line_ + 2);
      buffer_.resize(capacity_ + padding_);
    }
    ssize_t n;
    do {
      n = ::read(fd_, buffer_.data() + end_, capacity_ - end_);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
      return absl::DataLossError(absl::StrFormat("%s: read error: %s", path_, std::strerror(errno)));
    }
    if (n == 0) eof_ = true;
    end_ += static_cast<std::size_t>(n);
    bytes_read_ += static_cast<std::uint64_t>(n);
  }
}

}  // namespace remat
