// LineReader: a text file read line by line through a fixed buffer, so a
// reader sees line 1 before the rest of the file is read, and memory stays at
// the buffer (plus the longest line) however large the file is.
//
//   absl::StatusOr<std::unique_ptr<LineReader>> r = LineReader::Open(path);
//   std::string_view line;
//   while (true) {
//     absl::StatusOr<bool> more = (*r)->Next(&line);
//     if (!more.ok()) return more.status();   // a read error
//     if (!*more) break;                      // the end
//     ... line (no '\n', no trailing '\r'), valid until the next call ...
//   }
//
// `padding` bytes after each line are readable (their contents unspecified),
// for parsers that read past the end of their input (simdjson).
//
// A line longer than `max_line` bytes (kMaxLine by default: 16 MiB, where the
// longest line of a recorded trace is about a kilobyte) is refused as soon as
// that many bytes have come without a newline, so a file with none costs the
// cap in memory, not its size.
#ifndef REMAT_BASE_LINE_READER_H_
#define REMAT_BASE_LINE_READER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace remat {

class LineReader {
 public:
  static constexpr std::size_t kDefaultChunk = std::size_t{1} << 20;
  static constexpr std::size_t kMaxLine = std::size_t{16} << 20;

  // NotFound when `path` cannot be opened, InvalidArgument for a directory;
  // messages start with the path.
  static absl::StatusOr<std::unique_ptr<LineReader>> Open(const std::string& path,
                                                          std::size_t padding = 0,
                                                          std::size_t chunk = kDefaultChunk,
                                                          std::size_t max_line = kMaxLine);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line into `*line`: true, or false at the end of the file.
  // DataLoss (naming the path) when reading fails; InvalidArgument naming the
  // path, the line number and the cap for a line longer than `max_line`.
  absl::StatusOr<bool> Next(std::string_view* line);

  // The file's size when it is a regular file (0 otherwise), for reserving.
  std::uint64_t file_size() const { return file_size_; }
  // Bytes read from the file so far.
  std::uint64_t bytes_read() const { return bytes_read_; }

 private:
  LineReader(std::string path, int fd, std::size_t padding, std::size_t chunk,
             std::size_t max_line, std::uint64_t file_size);
  absl::Status TooLong() const;

  const std::string path_;
  const int fd_;
  const std::size_t padding_;
  const std::size_t max_line_;
  std::uint64_t lines_ = 0;  // lines returned so far
  std::vector<char> buffer_;  // capacity_ + padding_ bytes
  std::size_t capacity_;
  std::size_t begin_ = 0;  // unread data: [begin_, end_)
  std::size_t end_ = 0;
  bool eof_ = false;
  std::uint64_t file_size_;
  std::uint64_t bytes_read_ = 0;
};

}  // namespace remat

#endif  // REMAT_BASE_LINE_READER_H_
