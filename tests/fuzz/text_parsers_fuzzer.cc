// libFuzzer target over the small text parsers every tool and door takes
// input through: byte sizes ("1.5GiB"), policy specs ("dtr:staleness_exp=2")
// the budget accounting ("live") and the allocator settings
// ("expandable_segments:True,max_split_size_mb:256"). Whatever the text: no crash, an error
// says something, and what parses is consistent (a size formats, a policy's
// own spec parses back into the same policy).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "allocator/alloc_conf.h"
#include "base/units.h"
#include "policies/policy_spec.h"
#include "policies/registry.h"
#include "device/sim_device.h"
#include "sim/op_replay.h"

namespace {
void Check(bool ok) {
  if (!ok) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  absl::StatusOr<std::uint64_t> bytes = remat::ParseBytes(text);
  if (bytes.ok()) {
    Check(!remat::FormatBytes(*bytes).empty());
    absl::StatusOr<std::uint64_t> again = remat::ParseBytes(std::to_string(*bytes));
    Check(again.ok() && *again == *bytes);
  } else {
    Check(!bytes.status().message().empty());
  }

  absl::StatusOr<remat::policies::ParsedSpec> spec = remat::policies::ParseSpec(text);
  if (!spec.ok()) Check(!spec.status().message().empty());
  auto policy = remat::policies::Create(text);
  if (policy.ok()) {
    const std::string canonical = (*policy)->Spec();
    auto again = remat::policies::Create(canonical);
    Check(again.ok() && (*again)->Spec() == canonical);
  } else {
    Check(!policy.status().message().empty());
  }

  // Settings: all or nothing, and what parses makes an allocator.
  remat::AllocatorOptions options;
  const remat::AllocatorOptions before = options;
  absl::Status conf = remat::ApplyAllocConf(text, &options);
  if (!conf.ok()) {
    Check(!conf.message().empty());
    Check(options.expandable_segments == before.expandable_segments &&
          options.max_split_size == before.max_split_size &&
          options.roundup_divisions == before.roundup_divisions &&
          options.garbage_collection_threshold == before.garbage_collection_threshold);
  } else {
    static remat::SimDevice* device = remat::SimDevice::Create({.capacity = remat::kGiB}).value().release();
    auto made = remat::CachingAllocator::Create(device, options);
    Check(made.ok());
    auto p = (*made)->Allocate(3 * remat::kMiB + 1);
    Check(p.ok() && (*made)->Free(*p).ok());
  }

  absl::StatusOr<remat::Accounting> accounting = remat::ParseAccounting(text);
  if (accounting.ok()) Check(text == remat::AccountingName(*accounting));
  return 0;
}
