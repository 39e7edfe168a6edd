// ForwardingDevice: a Device that passes every call on to another one, for
// tests that watch or hold back a few calls (override those) of a real
// device. Virtual memory is left out (the inner device's is not reached).
#ifndef REMAT_DEVICE_FORWARDING_DEVICE_H_
#define REMAT_DEVICE_FORWARDING_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "device/device.h"

namespace remat {

class ForwardingDevice : public Device {
 public:
  // `inner` must outlive this device.
  explicit ForwardingDevice(Device* inner) : inner_(inner) {}

  std::string Describe() const override { return inner_->Describe(); }
  std::size_t Capacity() const override { return inner_->Capacity(); }
  std::size_t FreeBytes() const override { return inner_->FreeBytes(); }
  std::int64_t NowNs() const override { return inner_->NowNs(); }
  absl::StatusOr<void*> ReserveSegment(std::size_t b) override {
    return inner_->ReserveSegment(b);
  }
  absl::Status ReleaseSegment(void* p) override { return inner_->ReleaseSegment(p); }
  absl::StatusOr<void*> AllocateHost(std::size_t b) override { return inner_->AllocateHost(b); }
  absl::Status FreeHost(void* p) override { return inner_->FreeHost(p); }
  absl::StatusOr<Stream> CreateStream() override { return inner_->CreateStream(); }
  absl::Status DestroyStream(Stream s) override { return inner_->DestroyStream(s); }
  absl::StatusOr<Event> CreateEvent() override { return inner_->CreateEvent(); }
  absl::Status DestroyEvent(Event e) override { return inner_->DestroyEvent(e); }
  absl::Status RecordEvent(Event e, Stream s) override { return inner_->RecordEvent(e, s); }
  absl::StatusOr<bool> QueryEvent(Event e) override { return inner_->QueryEvent(e); }
  absl::Status StreamWaitEvent(Stream s, Event e) override {
    return inner_->StreamWaitEvent(s, e);
  }
  absl::Status SynchronizeEvent(Event e) override { return inner_->SynchronizeEvent(e); }
  absl::Status SynchronizeStream(Stream s) override { return inner_->SynchronizeStream(s); }
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  absl::Status CopyAsync(void* d, const void* s, std::size_t b, CopyKind k, Stream st) override {
    return inner_->CopyAsync(d, s, b, k, st);
  }
  absl::Status LaunchHostFunc(Stream s, absl::AnyInvocable<void() &&> fn,
                              std::int64_t cost_ns) override {
    return inner_->LaunchHostFunc(s, std::move(fn), cost_ns);
  }

 private:
  Device* const inner_;
};

}  // namespace remat

#endif  // REMAT_DEVICE_FORWARDING_DEVICE_H_
