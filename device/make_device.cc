#include <memory>
#include <utility>

#include "base/status_macros.h"
#include "device/device_spec.h"
#include "device/sim_device.h"
#ifdef REMAT_HAVE_CUDA
#include "device/cuda_device.h"
#endif

namespace remat {

absl::StatusOr<std::unique_ptr<Device>> MakeDevice(const DeviceSpec& spec) {
  switch (spec.kind) {
    case DeviceSpec::Kind::kSim: {
      REMAT_ASSIGN_OR_RETURN(std::unique_ptr<SimDevice> sim, SimDevice::Create(spec.sim));
      return std::unique_ptr<Device>(std::move(sim));
    }
    case DeviceSpec::Kind::kCuda: {
#ifdef REMAT_HAVE_CUDA
      REMAT_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> cuda,
                             CudaDevice::Create(spec.cuda_ordinal));
      return std::unique_ptr<Device>(std::move(cuda));
#else
      return absl::FailedPreconditionError(
          "remat was built without the CUDA toolkit: only the simulated device (sim) is "
          "available");
#endif
    }
  }
  return absl::InvalidArgumentError("unknown device kind");
}

}  // namespace remat
