// Allocation logs in RAPIDS RMM's replay format, parsed and validated.
//
// RMM's logging_resource_adaptor writes one CSV line per call:
//
//   Thread,Time,Action,Pointer,Size,Stream
//   2342727,15:47:02.841961,allocate,0x10012400000,1048576,0x0
//   2342727,15:47:02.841977,free,0x10012400000,1048576,0x0
//
// Action is `allocate`, `free` or `allocate failure`; Time is HH:MM:SS.ffffff;
// Pointer is hex (with or without 0x, as RMM's two log formatters write it);
// Size is decimal; Thread and Stream are identities only, hex with 0x or
// decimal (bare hex digits are read as hex too).
//
// The parser reads the whole text before anything is replayed, so a bad line
// anywhere means no replay at all, and the error names the line. It also checks
// the log against itself: every free matches a live allocation of the same
// size, and no pointer is handed out twice while live. Each live pointer gets a
// dense slot (reused after its free), so a replayer maps log pointers to its
// own with a flat array instead of a hash map on its hot path.
//
// Zero-byte allocations are legal: PyTorch and RMM hand out nullptr (or any
// pointer) for them and free them with size 0. They occupy nothing, so they
// get no slot and never collide with a real allocation at the same address.
#ifndef REMAT_TRACE_RMM_LOG_H_
#define REMAT_TRACE_RMM_LOG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace remat {

enum class AllocAction : std::uint8_t { kAllocate, kFree, kAllocateFailure };

// Records without a slot: zero-byte allocations and their frees, and failures.
inline constexpr std::uint32_t kNoSlot = UINT32_MAX;

struct AllocRecord {
  std::uint64_t size = 0;
  std::int64_t time_ns = 0;      // since midnight, as the log's clock read
  std::uint32_t slot = kNoSlot;  // the live pointer this allocates or frees
  std::uint32_t line = 0;        // 1-based line in the log (the header is line 1)
  std::uint16_t stream = 0;      // index into AllocLog::streams
  std::uint16_t thread = 0;      // index into AllocLog::threads
  AllocAction action = AllocAction::kAllocate;
};

struct AllocLog {
  std::string name;                    // for messages: the file name
  std::vector<AllocRecord> records;    // in log order
  std::vector<std::uint64_t> streams;  // the log's stream handles, by first appearance
  std::vector<std::uint64_t> threads;  // the log's thread ids, by first appearance
  std::uint32_t num_slots = 0;         // most pointers live at once

  std::uint64_t allocations = 0;  // `allocate` lines, zero-byte ones included
  std::uint64_t frees = 0;
  std::uint64_t alloc_failures = 0;  // `allocate failure` lines
  std::uint64_t zero_byte_allocations = 0;
  // Peak of the sum of live requested sizes, the log's own sizes.
  std::uint64_t peak_requested_bytes = 0;
  // Allocations never freed, and their bytes.
  std::uint64_t live_at_end = 0;
  std::uint64_t live_bytes_at_end = 0;
};

// Parses `text` (a whole log). `name` prefixes error messages:
// "trace.csv:17: free of 0x7f00 which is not live". InvalidArgument on any
// malformed or inconsistent line.
absl::StatusOr<AllocLog> ParseRmmLog(std::string_view text, std::string_view name);

// Reads and parses the file at `path`. NotFound when it cannot be opened.
absl::StatusOr<AllocLog> ReadRmmLog(const std::string& path);

}  // namespace remat

#endif  // REMAT_TRACE_RMM_LOG_H_
