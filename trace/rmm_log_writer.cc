#include "trace/rmm_log_writer.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>

#include "absl/strings/str_format.h"
#include "base/file.h"

namespace remat {
namespace {

std::uint64_t ThreadId() { return static_cast<std::uint64_t>(syscall(SYS_gettid)); }

std::int64_t NanosSinceMidnight() {
  using std::chrono::nanoseconds;
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  constexpr std::int64_t kDay = 86'400'000'000'000;
  return std::chrono::duration_cast<nanoseconds>(now).count() % kDay;
}

const char* ActionText(AllocAction action) {
  switch (action) {
    case AllocAction::kAllocate: return "allocate";
    case AllocAction::kFree: return "free";
    case AllocAction::kAllocateFailure: return "allocate failure";
  }
  return "?";
}

}  // namespace

void RmmLogRecorder::Add(AllocAction action, std::uintptr_t ptr, std::uint64_t bytes,
                         std::uint64_t stream) {
  entries_.push_back(Entry{ThreadId(), NanosSinceMidnight(), action, ptr, bytes, stream});
}

void RmmLogRecorder::Allocate(const void* ptr, std::size_t bytes, std::uint64_t stream) {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  MutexLock lock(&mu_);
  if (p != 0 && bytes != 0) live_[p] = bytes;
  Add(AllocAction::kAllocate, p, bytes, stream);
}

void RmmLogRecorder::Free(const void* ptr, std::uint64_t stream) {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  MutexLock lock(&mu_);
  auto it = live_.find(p);
  if (it == live_.end()) return;
  Add(AllocAction::kFree, p, it->second, stream);
  live_.erase(it);
}

void RmmLogRecorder::AllocateFailure(std::size_t bytes, std::uint64_t stream) {
  MutexLock lock(&mu_);
  Add(AllocAction::kAllocateFailure, 0, bytes, stream);
}

std::size_t RmmLogRecorder::size() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

std::string RmmLogRecorder::Text() const {
  MutexLock lock(&mu_);
  std::string text = "Thread,Time,Action,Pointer,Size,Stream\n";
  text.reserve(text.size() + entries_.size() * 64);
  for (const Entry& e : entries_) {
    const std::int64_t us = e.time_ns / 1000;
    absl::StrAppendFormat(&text, "%d,%02d:%02d:%02d.%06d,%s,0x%x,%d,0x%x\n", e.thread,
                          us / 3'600'000'000, us / 60'000'000 % 60, us / 1'000'000 % 60,
                          us % 1'000'000, ActionText(e.action), e.ptr, e.bytes, e.stream);
  }
  return text;
}

absl::Status RmmLogRecorder::WriteTo(const std::string& path) const {
  return WriteFile(path, Text());
}

}  // namespace remat
