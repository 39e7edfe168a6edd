// Part of the default (fast) suite on every machine, GPU or not: the CUDA
// device links, its library loads without libcuda, and Create either succeeds
// or fails with a clear status. It never crashes.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <type_traits>

#include "device/cuda_device.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

static_assert(std::is_base_of_v<Device, CudaDevice>);

TEST(CudaDeviceSkipTest, CreateSucceedsOrFailsCleanly) {
  auto device = CudaDevice::Create();
  if (device.ok()) {
    EXPECT_TRUE(CudaDevice::Available());
    EXPECT_GE(CudaDevice::DeviceCount(), 1);
    EXPECT_EQ((*device)->Describe().rfind("cuda:0 ", 0), 0u) << (*device)->Describe();
    EXPECT_GT((*device)->Capacity(), 0u);
    return;
  }
  const absl::Status& status = device.status();
  EXPECT_TRUE(status.code() == absl::StatusCode::kFailedPrecondition ||
              status.code() == absl::StatusCode::kUnavailable)
      << status;
  EXPECT_FALSE(status.message().empty());
  EXPECT_NE(status.message().find("CudaDevice::Create(0)"), std::string::npos) << status;
  EXPECT_FALSE(CudaDevice::Available());
  EXPECT_EQ(CudaDevice::DeviceCount(), 0);
  // Failing again is as clean as the first time.
  EXPECT_EQ(CudaDevice::Create().status().code(), status.code());
}

TEST(CudaDeviceSkipTest, NonexistentOrdinalsFailCleanly) {
  for (int ordinal : {-1, 1 << 20}) {
    auto device = CudaDevice::Create(ordinal);
    ASSERT_FALSE(device.ok()) << "ordinal " << ordinal;
    EXPECT_TRUE(device.status().code() == absl::StatusCode::kInvalidArgument ||
                device.status().code() == absl::StatusCode::kFailedPrecondition)
        << device.status();
  }
}

TEST(CudaDeviceSkipTest, ReportsTheCudaRuntimeItWasBuiltWith) {
  // The library's cudart is loadable and answers without a driver.
  int runtime_version = 0;
  EXPECT_EQ(cudaRuntimeGetVersion(&runtime_version), cudaSuccess);
  EXPECT_GT(runtime_version, 0);
  std::string line = "CUDA runtime " + std::to_string(runtime_version / 1000) + "." +
                     std::to_string(runtime_version % 1000 / 10) + "; " +
                     std::to_string(CudaDevice::DeviceCount()) + " usable device(s)";
  RecordProperty("cuda", line);
  std::printf("%s\n", line.c_str());
}

}  // namespace
}  // namespace remat
