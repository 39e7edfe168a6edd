// libFuzzer target over the allocator's public surface: the input is a program
// of operations (allocate, free, free on a stream, record a stream, bad frees,
// device work, host time, empty cache, budget changes) run on a small unbacked
// SimDevice. Whatever the program, the allocator must never crash, must reject
// bad pointers without changing its statistics, and must agree with a model of
// what is live. At the end everything is freed and the cache must empty.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocator/caching_allocator.h"
#include "tests/fuzz/fuzz_input.h"
#include "device/sim_device.h"

namespace {

using remat::fuzz::Check;
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
  auto alloc = std::move(CachingAllocator::Create(device.get(), options)).value();
  Stream streams[3] = {kDefaultStream, *device->CreateStream(), *device->CreateStream()};
  std::vector<void*> live;

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
        live[i] = live.back();
        live.pop_back();
        break;
      }
      case 6: {
        if (live.empty()) break;
        const std::size_t i = in.Byte() % live.size();
        Check(alloc->FreeOnStream(live[i], stream).ok());
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
      case 13: (void)alloc->TakeSnapshot(); break;
      default: break;
    }
    const AllocatorStats s = alloc->GetStats();
    Check(s.allocation.all().current == static_cast<std::int64_t>(live.size()));
    Check(s.allocated_bytes.all().current <= s.reserved_bytes.all().current);
    Check(static_cast<std::size_t>(s.reserved_bytes.all().current) == device->ReservedBytes());
  }
  for (void* p : live) Check(alloc->Free(p).ok());
  Check(alloc->EmptyCache().ok());
  const AllocatorStats s = alloc->GetStats();
  Check(s.reserved_bytes.all().current == 0 && s.active_bytes.all().current == 0);
  return 0;
}
