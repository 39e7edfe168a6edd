// DeviceSpec: which device a door builds, said once.
//
// The doors name a device in three ways: environment variables (the
// LD_PRELOAD shim and PyTorch's pluggable allocator: REMAT_DEVICE,
// REMAT_SIM_CAPACITY, REMAT_SIM_BACKED), a C option struct (libremat.so), and
// command-line flags (`remat run --device`). Each fills one DeviceSpec, and
// MakeDevice makes the device from it.
#ifndef REMAT_DEVICE_DEVICE_SPEC_H_
#define REMAT_DEVICE_DEVICE_SPEC_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "device/sim_device.h"

namespace remat {

struct DeviceSpec {
  enum class Kind : std::uint8_t { kCuda, kSim };
  Kind kind = Kind::kCuda;
  int cuda_ordinal = 0;
  SimDeviceOptions sim;  // kSim: capacity, backed or not, costs

  // "cuda" or "sim"; anything else is InvalidArgument naming what is accepted.
  static absl::StatusOr<Kind> ParseKind(std::string_view text);
  // Sets what REMAT_DEVICE (cuda|sim), REMAT_SIM_CAPACITY (bytes) and
  // REMAT_SIM_BACKED (1|0) say; leaves the rest. A malformed variable is
  // InvalidArgument naming it, and the spec is left as it was.
  absl::Status ReadEnvironment();
  // "cuda:0", "sim (80.00 GiB, unbacked)".
  std::string Describe() const;
};

// The device a spec names (in the library remat_device_maker, which brings
// the CUDA device where the build has it). A CUDA device in a build without
// the CUDA toolkit is FailedPrecondition saying so.
absl::StatusOr<std::unique_ptr<Device>> MakeDevice(const DeviceSpec& spec);

}  // namespace remat

#endif  // REMAT_DEVICE_DEVICE_SPEC_H_
