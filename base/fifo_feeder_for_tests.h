// For tests of readers that must stop early: a named pipe (FIFO) fed by a
// thread with a first line and then 8 MiB more. A reader that returns after
// the first line and closes the pipe cuts the writer off (its next write
// fails with EPIPE); a reader that reads the whole input first does not.
#ifndef REMAT_BASE_FIFO_FEEDER_FOR_TESTS_H_
#define REMAT_BASE_FIFO_FEEDER_FOR_TESTS_H_

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <thread>

namespace remat {

class FifoFeeder {
 public:
  // Creates the FIFO at `path` (ok() says whether it could) and starts
  // writing `first_line` (with its newline) and then 8 MiB of `filler`.
  FifoFeeder(std::string path, std::string first_line, char filler) : path_(std::move(path)) {
    ::unlink(path_.c_str());
    ok_ = ::mkfifo(path_.c_str(), 0600) == 0;
    if (!ok_) return;
    ::signal(SIGPIPE, SIG_IGN);
    writer_ = std::thread([this, first_line = std::move(first_line), filler] {
      FILE* f = std::fopen(path_.c_str(), "wb");  // waits for the reader to open it
      if (f == nullptr) return;
      std::setvbuf(f, nullptr, _IONBF, 0);
      std::fwrite(first_line.data(), 1, first_line.size(), f);
      const std::string block(64 * 1024, filler);
      for (int i = 0; i < 128; ++i) {
        if (std::fwrite(block.data(), 1, block.size(), f) != block.size()) {
          cut_off_ = errno == EPIPE;
          break;
        }
      }
      std::fclose(f);
    });
  }
  ~FifoFeeder() {
    if (writer_.joinable()) writer_.join();
    ::unlink(path_.c_str());
  }
  FifoFeeder(const FifoFeeder&) = delete;
  FifoFeeder& operator=(const FifoFeeder&) = delete;

  bool ok() const { return ok_; }
  const std::string& path() const { return path_; }
  // Waits for the writer: true when the reader went away before the end.
  bool WriterWasCutOff() {
    if (writer_.joinable()) writer_.join();
    return cut_off_;
  }

 private:
  std::string path_;
  bool ok_ = false;
  bool cut_off_ = false;
  std::thread writer_;
};

}  // namespace remat

#endif  // REMAT_BASE_FIFO_FEEDER_FOR_TESTS_H_
