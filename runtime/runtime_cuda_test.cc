// The runtime over a real GPU (ctest -L gpu): offload to pinned host memory
// and back, drop and recompute with closures that run device copies, and
// random programs under tight budgets, every byte checked on the host. Each
// test skips, saying why, where there is no usable CUDA device.
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "allocator/caching_allocator.h"
#include "base/units.h"
#include "device/cuda_device.h"
#include "gtest/gtest.h"
#include "runtime/runtime.h"

namespace remat {
namespace {

// The word at index i of the pattern `seed`.
std::uint32_t PatternWord(std::size_t i, std::uint32_t seed) {
  return static_cast<std::uint32_t>(i) * 2654435761u ^ (seed * 40503u + 17u);
}

class RuntimeCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = CudaDevice::Create();
    if (!device.ok()) GTEST_SKIP() << "no usable CUDA device: " << device.status();
    device_ = std::move(device).value();
  }

  void TearDown() override {
    runtime_.reset();
    allocator_.reset();
    if (device_ && stream_ != kDefaultStream) {
      EXPECT_TRUE(device_->DestroyStream(stream_).ok());
    }
    for (void* p : host_) EXPECT_TRUE(device_->FreeHost(p).ok());
  }

  void Start(std::size_t budget, RuntimeOptions options, bool expandable = false) {
    auto alloc = CachingAllocator::Create(device_.get(),
                                          {.budget = budget, .expandable_segments = expandable});
    ASSERT_TRUE(alloc.ok()) << alloc.status();
    allocator_ = std::move(alloc).value();
    auto rt = Runtime::Create(allocator_.get(), std::move(options));
    ASSERT_TRUE(rt.ok()) << rt.status();
    runtime_ = std::move(rt).value();
    auto stream = device_->CreateStream();
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = *stream;
  }

  void* PinnedHost(std::size_t bytes) {
    auto host = device_->AllocateHost(bytes);
    EXPECT_TRUE(host.ok()) << host.status();
    if (!host.ok()) return nullptr;
    host_.push_back(*host);
    return *host;
  }

  // A pinned buffer holding pattern `seed`.
  const void* Pattern(std::size_t bytes, std::uint32_t seed) {
    auto* words = static_cast<std::uint32_t*>(PinnedHost(bytes));
    if (words == nullptr) return nullptr;
    for (std::size_t i = 0; i < bytes / 4; ++i) words[i] = PatternWord(i, seed);
    return words;
  }

  // Copies `bytes` at `device_ptr` to the host (after `stream_`'s work) and
  // compares them with `expected`.
  ::testing::AssertionResult DeviceHolds(const void* device_ptr, const void* expected,
                                         std::size_t bytes) {
    if (scratch_bytes_ < bytes) {
      scratch_ = PinnedHost(bytes);
      scratch_bytes_ = bytes;
    }
    std::memset(scratch_, 0xA5, bytes);
    if (auto s = device_->CopyAsync(scratch_, device_ptr, bytes, CopyKind::kDeviceToHost, stream_);
        !s.ok()) {
      return ::testing::AssertionFailure() << s;
    }
    if (auto s = device_->SynchronizeStream(stream_); !s.ok()) {
      return ::testing::AssertionFailure() << s;
    }
    if (std::memcmp(scratch_, expected, bytes) != 0) {
      return ::testing::AssertionFailure() << "the device's bytes differ from those produced";
    }
    return ::testing::AssertionSuccess();
  }

  std::unique_ptr<CudaDevice> device_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<Runtime> runtime_;
  Stream stream_ = kDefaultStream;
  std::vector<void*> host_;
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
};

TEST_F(RuntimeCudaTest, OffloadedTensorsComeBackByteForByte) {
  constexpr std::size_t kBytes = 32 * kMiB;
  constexpr int kTensors = 12;  // 384 MiB of tensors under a 128 MiB budget
  Start(128 * kMiB, {.policy = "lru", .enable_drop = false});
  std::vector<TensorId> ids;
  std::vector<const void*> patterns;
  for (int i = 0; i < kTensors; ++i) {
    patterns.push_back(Pattern(kBytes, i));
    auto guard = runtime_->Create(kBytes, {.allow_offload = true}, stream_);
    ASSERT_TRUE(guard.ok()) << guard.status();
    ASSERT_TRUE(device_->CopyAsync(guard->ptr(), patterns.back(), kBytes,
                                   CopyKind::kHostToDevice, stream_).ok());
    ids.push_back(guard->id());
  }
  EXPECT_GT(runtime_->stats().offloads, 0u);
  // Twice round, so that every tensor is offloaded and restored at least once.
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kTensors; ++i) {
      auto guard = runtime_->Acquire(ids[i], stream_);
      ASSERT_TRUE(guard.ok()) << guard.status();
      EXPECT_TRUE(DeviceHolds(guard->ptr(), patterns[i], kBytes)) << "tensor " << i;
    }
  }
  const RuntimeStats stats = runtime_->stats();
  EXPECT_GE(stats.restored_bytes, kTensors * kBytes);
  for (TensorId id : ids) ASSERT_TRUE(runtime_->Free(id).ok());
  ASSERT_TRUE(device_->Synchronize().ok());
  EXPECT_EQ(allocator_->GetStats().allocated_bytes.all().current, 0);
}

// keep_addresses on the driver's virtual memory: an offload unmaps the pages
// under the tensor and keeps the range; the restore maps fresh pages at the
// same address. A pointer taken before the offload (a framework's data_ptr)
// reads the same bytes after.
TEST_F(RuntimeCudaTest, KeptAddressesSurviveOffloadAndRestore) {
  if (device_->PageSize() == 0) GTEST_SKIP() << device_->Describe() << " has no virtual memory";
  constexpr std::size_t kBytes = 16 * kMiB;
  constexpr int kTensors = 6;  // 96 MiB of tensors under a 40 MiB budget
  Start(40 * kMiB, {.policy = "lru", .enable_drop = false, .keep_addresses = true},
        /*expandable=*/true);
  std::vector<TensorId> ids;
  std::vector<void*> ptrs;
  std::vector<const void*> patterns;
  for (int i = 0; i < kTensors; ++i) {
    patterns.push_back(Pattern(kBytes, 100 + i));
    auto guard = runtime_->Create(kBytes, {.allow_offload = true}, stream_);
    ASSERT_TRUE(guard.ok()) << guard.status();
    ASSERT_TRUE(device_->CopyAsync(guard->ptr(), patterns.back(), kBytes,
                                   CopyKind::kHostToDevice, stream_).ok());
    ids.push_back(guard->id());
    ptrs.push_back(guard->ptr());
  }
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kTensors; ++i) {
      auto guard = runtime_->Acquire(ids[i], stream_);
      ASSERT_TRUE(guard.ok()) << guard.status();
      EXPECT_EQ(guard->ptr(), ptrs[i]) << "tensor " << i << " moved";
      EXPECT_TRUE(DeviceHolds(ptrs[i], patterns[i], kBytes)) << "tensor " << i;
    }
  }
  const RuntimeStats stats = runtime_->stats();
  EXPECT_GT(stats.kept_addresses, 0u);
  EXPECT_EQ(stats.moved_restores, 0u);
  for (TensorId id : ids) ASSERT_TRUE(runtime_->Free(id).ok());
  ASSERT_TRUE(device_->Synchronize().ok());
  EXPECT_EQ(allocator_->GetStats().allocated_bytes.all().current, 0);
}

TEST_F(RuntimeCudaTest, PrefetchedTensorIsRightOnAnotherStream) {
  constexpr std::size_t kBytes = 48 * kMiB;
  Start(128 * kMiB, {.policy = "lru", .enable_drop = false});
  const void* first = Pattern(kBytes, 101);
  auto a = runtime_->Create(kBytes, {.allow_offload = true}, stream_);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(device_->CopyAsync(a->ptr(), first, kBytes, CopyKind::kHostToDevice, stream_).ok());
  const TensorId id = a->id();
  a->Release();
  // Two more tensors push the first out.
  std::vector<TensorId> others;
  for (int i = 0; i < 2; ++i) {
    auto g = runtime_->Create(kBytes, {.allow_offload = true}, stream_);
    ASSERT_TRUE(g.ok()) << g.status();
    others.push_back(g->id());
  }
  auto state = runtime_->State(id);
  ASSERT_TRUE(state.ok());
  ASSERT_TRUE(*state == TensorState::kOnHost || *state == TensorState::kOffloading)
      << TensorStateName(*state);
  ASSERT_TRUE(runtime_->Free(others[0]).ok());
  ASSERT_TRUE(runtime_->Prefetch(id, stream_).ok());

  auto other_stream = device_->CreateStream();
  ASSERT_TRUE(other_stream.ok());
  auto back = runtime_->Acquire(id, *other_stream);
  ASSERT_TRUE(back.ok()) << back.status();
  // The check reads on stream_, which must wait for other_stream's view of it.
  ASSERT_TRUE(device_->SynchronizeStream(*other_stream).ok());
  EXPECT_TRUE(DeviceHolds(back->ptr(), first, kBytes));
  EXPECT_GE(runtime_->stats().prefetches, 1u);
  back->Release();
  ASSERT_TRUE(runtime_->Free(id).ok());
  ASSERT_TRUE(runtime_->Free(others[1]).ok());
  ASSERT_TRUE(device_->Synchronize().ok());
  EXPECT_TRUE(device_->DestroyStream(*other_stream).ok());
}

// x[i+1] = x[i] rotated left by `shift` bytes, computed on the device by two
// device-to-device copies: a closure the runtime can rerun.
RecomputeFn RotateClosure(Device* device, std::size_t shift) {
  return [device, shift](const RecomputeArgs& args) -> absl::Status {
    const auto* in = static_cast<const char*>(args.inputs[0]);
    auto* out = static_cast<char*>(args.output);
    if (auto s = device->CopyAsync(out, in + shift, args.bytes - shift,
                                   CopyKind::kDeviceToDevice, args.stream);
        !s.ok()) {
      return s;
    }
    return device->CopyAsync(out + args.bytes - shift, in, shift, CopyKind::kDeviceToDevice,
                             args.stream);
  };
}

void RotateOnHost(const std::vector<unsigned char>& in, std::size_t shift,
                  std::vector<unsigned char>& out) {
  out.resize(in.size());
  std::memcpy(out.data(), in.data() + shift, in.size() - shift);
  std::memcpy(out.data() + in.size() - shift, in.data(), shift);
}

TEST_F(RuntimeCudaTest, DroppedChainIsRecomputedOnTheDevice) {
  constexpr std::size_t kBytes = 16 * kMiB;
  constexpr int kLayers = 24;  // 400 MiB of chain under a 96 MiB budget
  Start(96 * kMiB, {.policy = "dtr", .enable_offload = false});
  std::vector<std::vector<unsigned char>> expected(kLayers + 1);
  expected[0].resize(kBytes);
  const void* x0 = Pattern(kBytes, 7);
  std::memcpy(expected[0].data(), x0, kBytes);

  std::vector<TensorId> ids;
  {
    auto g = runtime_->Create(kBytes, {}, stream_);  // the input: never evicted
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(device_->CopyAsync(g->ptr(), x0, kBytes, CopyKind::kHostToDevice, stream_).ok());
    ids.push_back(g->id());
  }
  for (int i = 1; i <= kLayers; ++i) {
    const std::size_t shift = 4096 * static_cast<std::size_t>(i);
    RotateOnHost(expected[i - 1], shift, expected[i]);
    auto in = runtime_->Acquire(ids.back(), stream_);
    ASSERT_TRUE(in.ok()) << in.status();
    TensorOptions options{.recompute = RotateClosure(device_.get(), shift),
                          .inputs = {ids.back()},
                          .compute_ns = 1000,
                          .allow_drop = true};
    auto out = runtime_->Create(kBytes, std::move(options), stream_);
    ASSERT_TRUE(out.ok()) << out.status();
    void* const inputs[] = {in->ptr()};
    RecomputeFn first = RotateClosure(device_.get(), shift);
    ASSERT_TRUE(first({.inputs = inputs, .output = out->ptr(), .bytes = kBytes,
                       .stream = stream_}).ok());
    ids.push_back(out->id());
  }
  EXPECT_GT(runtime_->stats().drops, 0u);
  // Backward: the last layer first, each recomputed from what is left.
  for (int i = kLayers; i >= 0; --i) {
    auto g = runtime_->Acquire(ids[i], stream_);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(DeviceHolds(g->ptr(), expected[i].data(), kBytes)) << "layer " << i;
    g->Release();
    if (i > 0) {
      ASSERT_TRUE(runtime_->Free(ids[i]).ok());
    }
  }
  EXPECT_GT(runtime_->stats().recomputes, 0u);
  ASSERT_TRUE(runtime_->Free(ids[0]).ok());
  ASSERT_TRUE(device_->Synchronize().ok());
  EXPECT_EQ(allocator_->GetStats().allocated_bytes.all().current, 0);
}

// Random programs: tensors made by rotating an earlier one, read back at
// random, under a budget of a third of what they need; drop, offload or both.
class RuntimeCudaRandomTest : public RuntimeCudaTest,
                              public ::testing::WithParamInterface<const char*> {};

TEST_P(RuntimeCudaRandomTest, EveryAcquireSeesTheBytesProduced) {
  const std::string mode = GetParam();
  constexpr std::size_t kBytes = 8 * kMiB;
  constexpr int kTensors = 40;
  Start(kTensors * kBytes / 3, {.policy = "dtr",
                                .enable_drop = mode != "offload",
                                .enable_offload = mode != "drop"});
  std::mt19937 rng(2026);
  std::vector<std::vector<unsigned char>> expected;
  std::vector<TensorId> ids;
  {
    const void* x0 = Pattern(kBytes, 3);
    expected.emplace_back(static_cast<const unsigned char*>(x0),
                          static_cast<const unsigned char*>(x0) + kBytes);
    auto g = runtime_->Create(kBytes, {}, stream_);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(device_->CopyAsync(g->ptr(), x0, kBytes, CopyKind::kHostToDevice, stream_).ok());
    ids.push_back(g->id());
  }
  int checked = 0;
  for (int i = 1; i < kTensors; ++i) {
    const std::size_t from = rng() % ids.size();
    const std::size_t shift = 256 * (1 + rng() % 1000);
    expected.emplace_back();
    RotateOnHost(expected[from], shift, expected.back());
    auto in = runtime_->Acquire(ids[from], stream_);
    ASSERT_TRUE(in.ok()) << in.status();
    TensorOptions options{.recompute = RotateClosure(device_.get(), shift),
                          .inputs = {ids[from]},
                          .compute_ns = 1000 + static_cast<std::int64_t>(rng() % 100000),
                          .allow_drop = mode != "offload",
                          .allow_offload = mode != "drop"};
    auto out = runtime_->Create(kBytes, std::move(options), stream_);
    ASSERT_TRUE(out.ok()) << out.status();
    void* const inputs[] = {in->ptr()};
    ASSERT_TRUE(RotateClosure(device_.get(), shift)({.inputs = inputs, .output = out->ptr(),
                                                     .bytes = kBytes, .stream = stream_}).ok());
    ids.push_back(out->id());
    in->Release();
    out->Release();
    for (int k = 0; k < 2; ++k) {
      const std::size_t j = rng() % ids.size();
      auto g = runtime_->Acquire(ids[j], stream_);
      ASSERT_TRUE(g.ok()) << g.status();
      ASSERT_TRUE(DeviceHolds(g->ptr(), expected[j].data(), kBytes)) << "tensor " << j;
      ++checked;
    }
  }
  for (std::size_t j = ids.size(); j-- > 0;) {
    auto g = runtime_->Acquire(ids[j], stream_);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(DeviceHolds(g->ptr(), expected[j].data(), kBytes)) << "tensor " << j;
    ++checked;
  }
  const RuntimeStats stats = runtime_->stats();
  EXPECT_GT(stats.drops + stats.offloads, 0u);
  RecordProperty("checked", checked);
  for (TensorId id : ids) ASSERT_TRUE(runtime_->Free(id).ok());
  ASSERT_TRUE(device_->Synchronize().ok());
  EXPECT_EQ(allocator_->GetStats().allocated_bytes.all().current, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, RuntimeCudaRandomTest,
                         ::testing::Values("drop", "offload", "both"));

}  // namespace
}  // namespace remat
