#include "device/sim_device.h"

#include <atomic>
#include <cstring>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<SimDevice> MakeDevice(SimDeviceOptions options = {}) {
  auto device = SimDevice::Create(options);
  EXPECT_TRUE(device.ok()) << device.status();
  return std::move(device).value();
}

TEST(SimDeviceTest, RejectsImpossibleCapacities) {
  EXPECT_FALSE(SimDevice::Create({.capacity = 0}).ok());
  EXPECT_FALSE(SimDevice::Create({.capacity = SimDevice::kMaxCapacity + 1}).ok());
  SimDeviceOptions bad_link;
  bad_link.cost.host_to_device_gbps = 0;
  EXPECT_FALSE(SimDevice::Create(bad_link).ok());
}

TEST(SimDeviceTest, UnbackedTerabyteCostsNoHostMemory) {
  auto device = MakeDevice({.capacity = 4 * kTiB, .backed = false});
  std::vector<void*> segments;
  for (int i = 0; i < 4; ++i) {
    auto p = device->ReserveSegment(kTiB - 2 * kMiB);
    ASSERT_TRUE(p.ok()) << p.status();
    segments.push_back(*p);
  }
  EXPECT_EQ(device->num_segments(), 4u);
  EXPECT_EQ(device->FreeBytes(), 4 * 2 * kMiB);
  // The fifth does not fit the capacity.
  auto over = device->ReserveSegment(16 * kMiB);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  for (void* p : segments) ASSERT_TRUE(device->ReleaseSegment(p).ok());
  EXPECT_EQ(device->ReservedBytes(), 0u);
}

TEST(SimDeviceTest, SegmentsNeverOverlapAndAddressesAreReused) {
  auto device = MakeDevice({.capacity = kGiB});
  void* a = *device->ReserveSegment(2 * kMiB);
  void* b = *device->ReserveSegment(2 * kMiB);
  const auto ia = reinterpret_cast<std::uintptr_t>(a);
  const auto ib = reinterpret_cast<std::uintptr_t>(b);
  EXPECT_TRUE(ia + 2 * kMiB <= ib || ib + 2 * kMiB <= ia);
  ASSERT_TRUE(device->ReleaseSegment(a).ok());
  EXPECT_EQ(*device->ReserveSegment(2 * kMiB), a);
}

TEST(SimDeviceTest, BadInputIsAnErrorAndChangesNothing) {
  auto device = MakeDevice({.capacity = kGiB});
  EXPECT_EQ(device->ReserveSegment(0).status().code(), absl::StatusCode::kInvalidArgument);
  int local = 0;
  EXPECT_EQ(device->ReleaseSegment(&local).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device->FreeHost(&local).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device->DestroyStream(kDefaultStream).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device->DestroyStream(Stream{999}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device->RecordEvent(Event{999}, kDefaultStream).code(),
            absl::StatusCode::kInvalidArgument);
  // A copy into memory that is not a reserved segment is refused.
  void* seg = *device->ReserveSegment(2 * kMiB);
  char host[64] = {};
  EXPECT_FALSE(
      device->CopyAsync(static_cast<char*>(seg) + 2 * kMiB - 32, host, 64, CopyKind::kHostToDevice,
                        kDefaultStream)
          .ok());
  EXPECT_EQ(device->copied_bytes(CopyKind::kHostToDevice), 0u);
  EXPECT_EQ(device->ReservedBytes(), 2 * kMiB);
}

TEST(SimDeviceTest, BackedCopiesMoveRealBytes) {
  auto device = MakeDevice({.capacity = kGiB, .backed = true});
  void* seg = *device->ReserveSegment(4 * kMiB);
  auto* host_in = static_cast<unsigned char*>(*device->AllocateHost(kMiB));
  auto* host_out = static_cast<unsigned char*>(*device->AllocateHost(kMiB));
  for (std::size_t i = 0; i < kMiB; ++i) host_in[i] = static_cast<unsigned char>(i * 7 + 3);
  std::memset(host_out, 0, kMiB);
  Stream s = *device->CreateStream();
  ASSERT_TRUE(device->CopyAsync(seg, host_in, kMiB, CopyKind::kHostToDevice, s).ok());
  ASSERT_TRUE(device->CopyAsync(host_out, seg, kMiB, CopyKind::kDeviceToHost, s).ok());
  // Nothing has happened until the host waits.
  EXPECT_EQ(host_out[1], 0);
  ASSERT_TRUE(device->SynchronizeStream(s).ok());
  EXPECT_EQ(std::memcmp(host_in, host_out, kMiB), 0);
  EXPECT_EQ(device->copied_bytes(CopyKind::kHostToDevice), kMiB);
  EXPECT_EQ(device->copied_bytes(CopyKind::kDeviceToHost), kMiB);
}

TEST(SimDeviceTest, AStreamsClockStopsAtTheLargestTimeInsteadOfWrapping) {
  auto device = MakeDevice({.capacity = kGiB});
  Stream s = *device->CreateStream();
  const std::int64_t huge = std::numeric_limits<std::int64_t>::max() / 2 + 1;
  ASSERT_TRUE(device->LaunchHostFunc(s, [] {}, huge).ok());
  ASSERT_TRUE(device->LaunchHostFunc(s, [] {}, huge).ok());  // past 2^63: stops there
  EXPECT_EQ(*device->StreamTimeNs(s), std::numeric_limits<std::int64_t>::max());
}

TEST(SimDeviceTest, CopiesTakeLatencyPlusBytesOverBandwidth) {
  SimDeviceOptions options{.capacity = kGiB};
  options.cost.host_to_device_gbps = 10.0;  // 10 bytes per ns
  options.cost.copy_latency_ns = 1000;
  auto device = MakeDevice(options);
  void* seg = *device->ReserveSegment(2 * kMiB);
  void* host = *device->AllocateHost(kMiB);
  Stream s = *device->CreateStream();
  ASSERT_TRUE(device->CopyAsync(seg, host, 1000000, CopyKind::kHostToDevice, s).ok());
  EXPECT_EQ(*device->StreamTimeNs(s), 1000 + 100000);
  ASSERT_TRUE(device->CopyAsync(seg, host, 1000000, CopyKind::kHostToDevice, s).ok());
  EXPECT_EQ(*device->StreamTimeNs(s), 2 * 101000);
  EXPECT_EQ(device->NowNs(), 0);
  ASSERT_TRUE(device->SynchronizeStream(s).ok());
  EXPECT_EQ(device->NowNs(), 2 * 101000);
}

// One copy engine per direction: hand-computed timelines. At 10 bytes/ns and
// 1,000 ns latency, a 1,000,000-byte copy takes 101,000 ns.
TEST(SimDeviceTest, CopiesOfOneDirectionTakeTurnsAndTheTwoDirectionsOverlap) {
  SimDeviceOptions options{.capacity = kGiB};
  options.cost.host_to_device_gbps = 10.0;
  options.cost.device_to_host_gbps = 10.0;
  options.cost.copy_latency_ns = 1000;
  auto device = MakeDevice(options);
  void* seg = *device->ReserveSegment(2 * kMiB);
  void* host = *device->AllocateHost(kMiB);
  const Stream a = *device->CreateStream();
  const Stream b = *device->CreateStream();
  const Stream c = *device->CreateStream();
  // Out on a, in on b: separate engines, side by side.
  ASSERT_TRUE(device->CopyAsync(host, seg, 1000000, CopyKind::kDeviceToHost, a).ok());
  ASSERT_TRUE(device->CopyAsync(seg, host, 1000000, CopyKind::kHostToDevice, b).ok());
  EXPECT_EQ(*device->StreamTimeNs(a), 101000);
  EXPECT_EQ(*device->StreamTimeNs(b), 101000);
  // Another copy in, on a third stream: it waits for the engine, not for b.
  ASSERT_TRUE(device->CopyAsync(seg, host, 1000000, CopyKind::kHostToDevice, c).ok());
  EXPECT_EQ(*device->StreamTimeNs(c), 202000);
  // A copy out on c queues behind c's own work and then finds its engine free.
  ASSERT_TRUE(device->CopyAsync(host, seg, 500000, CopyKind::kDeviceToHost, c).ok());
  EXPECT_EQ(*device->StreamTimeNs(c), 202000 + 51000);
  // Device-to-device copies use no copy engine of the link.
  ASSERT_TRUE(device->CopyAsync(seg, seg, 1000, CopyKind::kDeviceToDevice, a).ok());
  EXPECT_LT(*device->StreamTimeNs(a), 101000 + 2000);
  // Later copies start when the host issues them if the engine is idle then.
  ASSERT_TRUE(device->SynchronizeStream(c).ok());
  ASSERT_TRUE(device->CopyAsync(seg, host, 1000000, CopyKind::kHostToDevice, a).ok());
  EXPECT_EQ(*device->StreamTimeNs(a), 253000 + 101000);
}

TEST(SimDeviceTest, WithoutCopyEnginesEveryStreamCopiesAtTheFullRate) {
  SimDeviceOptions options{.capacity = kGiB};
  options.cost.host_to_device_gbps = 10.0;
  options.cost.copy_latency_ns = 1000;
  options.cost.copy_engines = false;
  auto device = MakeDevice(options);
  void* seg = *device->ReserveSegment(2 * kMiB);
  void* host = *device->AllocateHost(kMiB);
  const Stream a = *device->CreateStream();
  const Stream b = *device->CreateStream();
  ASSERT_TRUE(device->CopyAsync(seg, host, 1000000, CopyKind::kHostToDevice, a).ok());
  ASSERT_TRUE(device->CopyAsync(seg, host, 1000000, CopyKind::kHostToDevice, b).ok());
  EXPECT_EQ(*device->StreamTimeNs(a), 101000);
  EXPECT_EQ(*device->StreamTimeNs(b), 101000);
}

TEST(SimDeviceTest, StreamsOverlapAndWaitOnEvents) {
  auto device = MakeDevice({.capacity = kGiB});
  Stream compute = *device->CreateStream();
  Stream copy = *device->CreateStream();
  ASSERT_TRUE(device->LaunchHostFunc(compute, [] {}, 5000).ok());
  ASSERT_TRUE(device->LaunchHostFunc(copy, [] {}, 3000).ok());
  // Independent streams run side by side.
  EXPECT_EQ(*device->StreamTimeNs(compute), 5000);
  EXPECT_EQ(*device->StreamTimeNs(copy), 3000);
  Event e = *device->CreateEvent();
  ASSERT_TRUE(device->RecordEvent(e, compute).ok());
  EXPECT_FALSE(*device->QueryEvent(e));
  ASSERT_TRUE(device->StreamWaitEvent(copy, e).ok());
  ASSERT_TRUE(device->LaunchHostFunc(copy, [] {}, 1000).ok());
  EXPECT_EQ(*device->StreamTimeNs(copy), 6000);
  // Host time stands still until the host waits.
  device->AdvanceHost(4999);
  EXPECT_FALSE(*device->QueryEvent(e));
  device->AdvanceHost(1);
  EXPECT_TRUE(*device->QueryEvent(e));
  ASSERT_TRUE(device->Synchronize().ok());
  EXPECT_EQ(device->NowNs(), 6000);
}

TEST(SimDeviceTest, UnrecordedEventIsComplete) {
  auto device = MakeDevice();
  Event e = *device->CreateEvent();
  EXPECT_TRUE(*device->QueryEvent(e));
  ASSERT_TRUE(device->SynchronizeEvent(e).ok());
  ASSERT_TRUE(device->DestroyEvent(e).ok());
  EXPECT_FALSE(device->QueryEvent(e).ok());
}

TEST(SimDeviceTest, HostFunctionsRunInStreamOrderWhenTheHostReachesThem) {
  auto device = MakeDevice();
  Stream s = *device->CreateStream();
  std::vector<int> order;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(device->LaunchHostFunc(s, [&order, i] { order.push_back(i); }, 100).ok());
  }
  EXPECT_TRUE(order.empty());
  device->AdvanceHost(250);
  EXPECT_EQ(order, (std::vector<int>{0, 1}));
  ASSERT_TRUE(device->SynchronizeStream(s).ok());
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(SimDeviceTest, WorkStartsNoEarlierThanTheHost) {
  auto device = MakeDevice();
  device->AdvanceHost(10000);
  ASSERT_TRUE(device->LaunchHostFunc(kDefaultStream, [] {}, 10).ok());
  EXPECT_EQ(*device->StreamTimeNs(kDefaultStream), 10010);
}

TEST(SimDeviceTest, OccupyKeepsAStreamBusyLikeAnEmptyHostFunction) {
  auto device = MakeDevice();
  Stream s = *device->CreateStream();
  device->AdvanceHost(1000);
  ASSERT_TRUE(device->Occupy(s, 500).ok());
  ASSERT_TRUE(device->Occupy(s, 250).ok());
  EXPECT_EQ(*device->StreamTimeNs(s), 1750);
  // Work queued after it starts when it ends, as after a launched function.
  std::vector<int> order;
  ASSERT_TRUE(device->LaunchHostFunc(s, [&order] { order.push_back(1); }, 100).ok());
  device->AdvanceHost(800);  // host at 1800: the function ends at 1850
  EXPECT_TRUE(order.empty());
  ASSERT_TRUE(device->SynchronizeStream(s).ok());
  EXPECT_EQ(order, std::vector<int>{1});
  EXPECT_EQ(device->NowNs(), 1850);
  // Bad input changes nothing.
  EXPECT_EQ(device->Occupy(s, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(device->Occupy(Stream{12345}, 10).ok());
  EXPECT_EQ(*device->StreamTimeNs(s), 1850);
}

TEST(SimDeviceTest, ReleaseSegmentWaitsForQueuedWork) {
  auto device = MakeDevice({.capacity = kGiB, .backed = true});
  void* seg = *device->ReserveSegment(2 * kMiB);
  std::vector<unsigned char> host(4096, 0xab);
  ASSERT_TRUE(device->CopyAsync(seg, host.data(), host.size(), CopyKind::kHostToDevice,
                                kDefaultStream)
                  .ok());
  // As cudaFree, release synchronizes: the queued copy runs before the unmap.
  ASSERT_TRUE(device->ReleaseSegment(seg).ok());
  EXPECT_GT(device->NowNs(), 0);
}

TEST(SimDeviceTest, HostCapacityIsEnforced) {
  auto device = MakeDevice({.capacity = kGiB, .host_capacity = 4 * kMiB});
  void* a = *device->AllocateHost(3 * kMiB);
  EXPECT_EQ(device->AllocateHost(2 * kMiB).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(device->FreeHost(a).ok());
  EXPECT_TRUE(device->AllocateHost(4 * kMiB).ok());
}

TEST(SimDeviceTest, AddressWindowsKeepDevicesApart) {
  auto a = SimDevice::Create({.capacity = kGiB}).value();
  auto b = SimDevice::Create({.capacity = kGiB, .address_window = 1}).value();
  auto pa = a->ReserveSegment(64 * kMiB);
  auto pb = b->ReserveSegment(64 * kMiB);
  ASSERT_TRUE(pa.ok() && pb.ok());
  // Window 0 spans 4 GiB: all of a's addresses lie below all of b's.
  EXPECT_LT(reinterpret_cast<std::uintptr_t>(*pa) + 4 * kGiB,
            reinterpret_cast<std::uintptr_t>(*pb) + 1);
  EXPECT_TRUE(a->ReleaseSegment(*pa).ok());
  EXPECT_TRUE(b->ReleaseSegment(*pb).ok());
  EXPECT_FALSE(SimDevice::Create({.capacity = kGiB, .address_window = -1}).ok());
  auto too_far = SimDevice::Create({.capacity = SimDevice::kMaxCapacity, .address_window = 1});
  ASSERT_FALSE(too_far.ok());
  EXPECT_THAT(std::string(too_far.status().message()), HasSubstr("address window 1"));
}


// --- Virtual memory ---

TEST(SimDeviceVmTest, MappedPagesHoldBytesAndCountAgainstCapacity) {
  auto device = MakeDevice({.capacity = 8 * kMiB, .backed = true});
  const std::size_t page = device->PageSize();
  ASSERT_EQ(page, 2 * kMiB);
  auto range = device->ReserveAddressRange(16 * kMiB);  // address space beyond the capacity is free
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(*range) % page, 0u);
  EXPECT_EQ(device->FreeBytes(), 8 * kMiB);
  char* base = static_cast<char*>(*range);
  std::vector<PhysicalChunk> chunks;
  for (int i = 0; i < 2; ++i) {
    auto chunk = device->CreateChunk(page);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    ASSERT_TRUE(device->Map(base + i * page, *chunk).ok());
    chunks.push_back(*chunk);
  }
  EXPECT_EQ(device->FreeBytes(), 4 * kMiB);
  // Mapped but not yet accessible: the device may not touch it.
  std::vector<char> host(4096, 'x');
  auto s = device->CopyAsync(base, host.data(), host.size(), CopyKind::kHostToDevice, kDefaultStream);
  EXPECT_THAT(s.message(), HasSubstr("not mapped with access"));
  ASSERT_TRUE(device->SetAccess(base, 2 * page).ok());
  // A copy across the two pages moves real bytes.
  ASSERT_TRUE(device->CopyAsync(base + page - 2048, host.data(), host.size(),
                                CopyKind::kHostToDevice, kDefaultStream).ok());
  ASSERT_TRUE(device->Synchronize().ok());
  EXPECT_EQ(std::memcmp(base + page - 2048, host.data(), host.size()), 0);
  // The third page is not mapped: copies into it are refused.
  s = device->CopyAsync(base + 2 * page - 16, host.data(), 32, CopyKind::kHostToDevice,
                        kDefaultStream);
  EXPECT_THAT(s.message(), HasSubstr("not mapped with access"));
  // The capacity holds two more pages, not three.
  auto c3 = device->CreateChunk(page);
  auto c4 = device->CreateChunk(page);
  ASSERT_TRUE(c3.ok() && c4.ok());
  EXPECT_EQ(device->CreateChunk(page).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(device->ReserveSegment(page).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(device->ReleaseChunk(*c3).ok());
  ASSERT_TRUE(device->ReleaseChunk(*c4).ok());
  // Unmapping gives the bytes up; the chunks are then released.
  ASSERT_TRUE(device->Unmap(base, 2 * page).ok());
  EXPECT_EQ(device->MappedBytes(), 0u);
  for (PhysicalChunk c : chunks) ASSERT_TRUE(device->ReleaseChunk(c).ok());
  EXPECT_EQ(device->FreeBytes(), 8 * kMiB);
  EXPECT_EQ(device->num_chunks(), 0u);
  ASSERT_TRUE(device->ReleaseAddressRange(*range).ok());
}

TEST(SimDeviceVmTest, MisuseIsRefusedAndChangesNothing) {
  auto device = MakeDevice({.capacity = 64 * kMiB});
  const std::size_t page = device->PageSize();
  EXPECT_FALSE(device->ReserveAddressRange(0).ok());
  EXPECT_FALSE(device->ReserveAddressRange(page + 512).ok());
  EXPECT_FALSE(device->CreateChunk(page / 2).ok());
  auto range = device->ReserveAddressRange(4 * page);
  ASSERT_TRUE(range.ok());
  char* base = static_cast<char*>(*range);
  auto chunk = device->CreateChunk(2 * page);
  ASSERT_TRUE(chunk.ok());
  EXPECT_FALSE(device->Map(base + 512, *chunk).ok());               // misaligned
  EXPECT_FALSE(device->Map(base + 3 * page, *chunk).ok());          // runs past the range
  EXPECT_FALSE(device->Map(base, PhysicalChunk{9999}).ok());        // foreign chunk
  ASSERT_TRUE(device->Map(base + page, *chunk).ok());
  auto other = device->CreateChunk(page);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(device->Map(base + 2 * page, *other).ok());          // overlaps a mapping
  EXPECT_FALSE(device->Map(base + page, *chunk).ok());              // mapped already
  EXPECT_FALSE(device->ReleaseChunk(*chunk).ok());                  // still mapped
  EXPECT_FALSE(device->Unmap(base + page, page).ok());              // half a mapping
  EXPECT_FALSE(device->SetAccess(base, 3 * page).ok());             // an unmapped page in it
  EXPECT_FALSE(device->ReleaseAddressRange(*range).ok());           // still mapped in it
  EXPECT_FALSE(device->ReleaseAddressRange(base + page).ok());      // not a range's start
  ASSERT_TRUE(device->Map(base, *other).ok());                      // the state is intact
  ASSERT_TRUE(device->Unmap(base, 3 * page).ok());                  // a run of two mappings
  EXPECT_TRUE(device->ReleaseChunk(*chunk).ok());
  EXPECT_TRUE(device->ReleaseChunk(*other).ok());
  EXPECT_TRUE(device->ReleaseAddressRange(*range).ok());
}

TEST(SimDeviceVmDeathTest, ReadingAnUnmappedBackedPageFaults) {
  auto device = MakeDevice({.capacity = 64 * kMiB, .backed = true});
  auto range = device->ReserveAddressRange(device->PageSize());
  ASSERT_TRUE(range.ok());
  volatile char* p = static_cast<char*>(*range);
  EXPECT_DEATH((void)*p, "");
}

}  // namespace
}  // namespace remat
