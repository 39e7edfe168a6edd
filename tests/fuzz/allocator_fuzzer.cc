// libFuzzer target over the allocator's public surface: the input is a program
// of operations (allocate, free, free on a stream, record a stream, bad frees,
// device work, host time, empty cache, budget changes; with expandable
// segments, blocks unbacked and backed again) run on a small unbacked
// SimDevice. Whatever the program, the allocator must never crash, must reject
// bad pointers without changing its statistics, and must agree with a model of
// what is live; after every operation its invariants must hold
// (CachingAllocator::CheckInvariants). At the end everything is freed and the
// cache must empty.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <vector>

#include "allocator/caching_allocator.h"
#include "tests/fuzz/fuzz_input.h"
#include "device/sim_device.h"

namespace {

using remat::fuzz::Check;
using remat::fuzz::CheckOk;
using remat::fuzz::Input;

std::size_t SizeFrom(std::uint32_t w) {
  // Mostly small, sometimes large, rarely beyond the device.
  switch (w & 3) {
    case 0: return w >> 2 & 0xfff;                   // up to 4 KiB (incl. 0)
    case 1: return w >> 2 & 0xfffff;                 // up to 1 MiB
    case 2: return (w >> 2 & 0x3ff) * 65536 + 1;      // up to 64 MiB
    default: return std::size_t{w} << 16;            // up to 256 TiB: often too big
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace remat;
  Input in(data, size);
  auto device = std::move(SimDevice::Create({.capacity = kGiB})).value();
  AllocatorOptions options;
  options.budget = (std::size_t{in.Byte()} + 1) * 4 * kMiB;
  if (in.Byte() & 1) options.max_split_size = (std::size_t{in.Byte()} + 2) * kMiB;
  options.event_ring_capacity = in.Byte();
  options.expandable_segments = (in.Byte() & 1) != 0;
  auto alloc = std::move(CachingAllocator::Create(device.get(), options)).value();
  Stream streams[3] = {kDefaultStream, *device->CreateStream(), *device->CreateStream()};
  std::vector<void*> live;
  std::vector<void*> unbacked;  // live blocks whose pages went (Unback)
  auto forget = [&unbacked](void* p) {
    unbacked.erase(std::remove(unbacked.begin(), unbacked.end(), p), unbacked.end());
  };

  while (!in.empty()) {
    const std::uint8_t op = in.Byte();
    const Stream stream = streams[op >> 4 & 1 ? 1 : (op >> 5 & 1 ? 2 : 0)];
    switch (op & 0xf) {
      case 0: case 1: case 2: case 3: {
        absl::StatusOr<void*> p = alloc->Allocate(SizeFrom(in.Word()), stream);
        if (p.ok() && *p != nullptr) live.push_back(*p);
        break;
      }
      case 4: case 5: {
        if (live.empty()) break;
        const std::size_t i = in.Byte() % live.size();
        Check(alloc->Free(live[i]).ok());
        forget(live[i]);
        live[i] = live.back();
        live.pop_back();
        break;
      }
      case 6: {
        if (live.empty()) break;
        const std::size_t i = in.Byte() % live.size();
        Check(alloc->FreeOnStream(live[i], stream).ok());
        forget(live[i]);
        live[i] = live.back();
        live.pop_back();
        break;
      }
      case 7: {
        if (!live.empty()) Check(alloc->RecordStream(live[in.Byte() % live.size()], stream).ok());
        break;
      }
      case 8: {
        // A bad pointer: interior, foreign, or one already freed.
        const std::int64_t before = alloc->GetStats().allocation.all().allocated;
        char* bad = live.empty() ? reinterpret_cast<char*>(0x1234)
                                 : static_cast<char*>(live[in.Byte() % live.size()]) + 1 + in.Byte();
        Check(!alloc->Free(bad).ok());
        Check(alloc->GetStats().allocation.all().allocated == before);
        break;
      }
      case 9: (void)device->LaunchHostFunc(stream, [] {}, in.Word() & 0xfffff); break;
      case 10: device->AdvanceHost(in.Word() & 0xfffff); break;
      case 11: Check(alloc->EmptyCache().ok()); break;
      case 12: (void)alloc->SetBudget((std::size_t{in.Byte()} + 1) * 4 * kMiB); break;
      case 13: {  // a snapshot, or a step's end or start (placement learned from the one before)
        const std::uint8_t which = in.Byte() % 4;
        if (which == 0) alloc->BeginStep();
        if (which == 1) alloc->EndStep();
        if (which >= 2) (void)alloc->TakeSnapshot();
        break;
      }
      case 14: {
        if (live.empty()) break;
        void* p = live[in.Byte() % live.size()];
        const bool was = std::find(unbacked.begin(), unbacked.end(), p) != unbacked.end();
        absl::StatusOr<std::size_t> gone = alloc->Unback(p);
        Check(gone.ok() == (options.expandable_segments && !was));
        if (gone.ok() && *gone > 0) unbacked.push_back(p);
        break;
      }
      case 15: {
        if (unbacked.empty()) {
          // Not unbacked: refused, whatever the mode.
          if (!live.empty()) Check(!alloc->Reback(live[in.Byte() % live.size()]).ok());
          break;
        }
        const std::size_t i = in.Byte() % unbacked.size();
        absl::Status s = alloc->Reback(unbacked[i], stream);
        Check(s.ok() || absl::IsResourceExhausted(s));
        if (s.ok()) {
          unbacked[i] = unbacked.back();
          unbacked.pop_back();
        }
        break;
      }
      default: break;
    }
    // Before GetStats, which puts back a free the undo fast path set aside.
    CheckOk(alloc->CheckInvariants());
    const AllocatorStats s = alloc->GetStats();
    Check(s.allocation.all().current == static_cast<std::int64_t>(live.size()));
    if (unbacked.empty()) Check(s.allocated_bytes.all().current <= s.reserved_bytes.all().current);
    Check(static_cast<std::size_t>(s.reserved_bytes.all().current) == device->ReservedBytes());
  }
  for (void* p : live) {
    Check(alloc->Free(p).ok());
    CheckOk(alloc->CheckInvariants());
  }
  Check(alloc->EmptyCache().ok());
  CheckOk(alloc->CheckInvariants());
  const AllocatorStats s = alloc->GetStats();
  Check(s.reserved_bytes.all().current == 0 && s.active_bytes.all().current == 0);
  return 0;
}
