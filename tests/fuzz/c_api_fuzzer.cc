// libFuzzer target over the C ABI (remat.h), as a C program would use it: the
// input is a program of calls (allocate, free, bad frees, runtime tensors and
// calls with recompute callbacks, views, acquire, release, free, prefetch,
// state, unknown ids, bad options) on a small backed simulated device. Whatever the
// program, no call may crash; a failing call returns a status with a message
// and changes nothing; every tensor, whenever acquired, holds the bytes it was
// made with (a dropped one is recomputed, an offloaded one copied back); after
// every call the allocator's and the runtime's invariants hold (their
// CheckInvariants, through remat_c_testing.h). At the end everything is
// destroyed.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "integrations/c_api/remat.h"
#include "integrations/c_api/remat_c_testing.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using remat::fuzz::Check;
using remat::fuzz::CheckOk;
using remat::fuzz::Input;

// FUZZ_TRACE=1: each call as it is made (to read a crash's input).
bool Tracing() {
  static const bool on = std::getenv("FUZZ_TRACE") != nullptr;
  return on;
}
#define TRACE(...)                          \
  do {                                      \
    if (Tracing()) std::fprintf(stderr, __VA_ARGS__); \
  } while (0)

// A failing call says why.
void CheckFailed(remat_status s) {
  Check(s != REMAT_OK);
  Check(std::strlen(remat_last_error()) > 0);
}

constexpr std::size_t kKiB = 1024;

struct Tensor {
  std::uint64_t id;
  std::size_t bytes;
  unsigned char fill;  // every byte of it
};

// The allocator of the program being run: the callbacks enqueue their writes
// on it, in stream order, as a kernel would be (a write from the host at once
// could land before a copy still queued reads the block's old bytes).
remat_allocator* g_allocator = nullptr;

struct FillWork {
  void* p;
  std::size_t bytes;
  unsigned char fill;
};

void RunFill(void* user_data) {
  auto* w = static_cast<FillWork*>(user_data);
  std::memset(w->p, w->fill, w->bytes);
  delete w;
}

remat_status Fill(void* p, std::size_t bytes, unsigned char fill, std::uint64_t stream) {
  auto* w = new FillWork{p, bytes, fill};
  const remat_status s = remat_launch_host_func(g_allocator, stream, RunFill, w, 100);
  if (s != REMAT_OK) delete w;
  return s;
}

unsigned char FillOf(void* user_data) {
  return static_cast<unsigned char>(reinterpret_cast<std::uintptr_t>(user_data));
}

// user_data of a tensor: its fill byte (the recompute writes it again).
int Recompute(void* user_data, void* const* /*inputs*/, std::size_t /*num_inputs*/, void* output,
              std::size_t bytes, std::uint64_t stream) {
  return Fill(output, bytes, FillOf(user_data), stream) == REMAT_OK ? 0 : 1;
}

int RecomputeCall(void* user_data, void* const* /*inputs*/, std::size_t /*num_inputs*/,
                  void* const* outputs, const std::size_t* output_bytes, const int* regenerate,
                  std::size_t num_outputs, std::uint64_t stream) {
  for (std::size_t i = 0; i < num_outputs; ++i) {
    if (regenerate[i] != 0 && Fill(outputs[i], output_bytes[i], FillOf(user_data), stream) !=
                                  REMAT_OK) {
      return 1;
    }
  }
  return 0;
}

int Failing(void*, void* const*, std::size_t, void*, std::size_t, std::uint64_t) {
  remat_recompute_set_error("the fuzzer's failing callback");
  return 7;
}

std::uint64_t g_events = 0;
void CountEvent(void* /*user_data*/, const remat_event* e) {
  Check(e->kind >= REMAT_EVENT_CREATED && e->kind <= REMAT_EVENT_COLLECTED);
  ++g_events;
}

const char* const kPolicies[] = {"lru", "largest", "dtr", "dtr-eq", "msps", "hybrid",
                                 "window", "no-such-policy", "dtr:staleness_exp=", ""};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  remat_allocator_options ao;
  Check(remat_allocator_options_init(&ao) == REMAT_OK);
  ao.sim_backed = 1;
  ao.sim_capacity_bytes = 64ull << 20;
  const std::uint8_t first = in.Byte();
  ao.budget_bytes = first & 1 ? (std::uint64_t{in.Byte()} + 2) << 20 : 0;
  if (first & 2) ao.alloc_conf = "expandable_segments:True";
  remat_allocator* a = nullptr;
  if (remat_allocator_create(&ao, &a) != REMAT_OK) return 0;
  g_allocator = a;

  remat_runtime_options ro;
  Check(remat_runtime_options_init(&ro) == REMAT_OK);
  ro.policy = kPolicies[in.Byte() % (sizeof(kPolicies) / sizeof(kPolicies[0]))];
  ro.enable_drop = in.Byte() & 1;
  ro.enable_offload = in.Byte() & 1;
  ro.host_pool_bytes = 32ull << 20;
  ro.live_budget = in.Byte() & 1 ? (std::uint64_t{in.Byte()} + 1) * 64 * kKiB : 0;
  ro.learn_next_use = in.Byte() & 1;
  remat_runtime* rt = nullptr;
  TRACE("runtime %s drop=%d offload=%d live_budget=%llu budget=%llu\n", ro.policy, ro.enable_drop,
        ro.enable_offload, static_cast<unsigned long long>(ro.live_budget),
        static_cast<unsigned long long>(ao.budget_bytes));
  // Sometimes observed: events must come for what the program does, and the
  // callback must never be called back into.
  const bool observed = in.Byte() & 1;
  if ((observed ? remat_runtime_create_observed(a, &ro, CountEvent, nullptr, &rt)
                : remat_runtime_create_with_options(a, &ro, &rt)) != REMAT_OK) {
    Check(std::strlen(remat_last_error()) > 0);
    Check(remat_allocator_destroy(a) == REMAT_OK);
    return 0;
  }

  std::uint64_t side = 0;  // a second stream, for acquires
  Check(remat_stream_create(a, &side) == REMAT_OK);
  std::vector<void*> raw;        // plain allocations
  std::vector<Tensor> tensors;   // runtime tensors this program still owns
  std::uint64_t refills = 0;     // refills that succeeded (the stats count them)
  while (!in.empty()) {
    const std::uint8_t op = in.Byte();
    switch (op % 13) {
      case 0: {  // a plain allocation, sometimes of an absurd size
        const std::uint32_t w = in.Word();
        const std::size_t bytes = w & 0x80000000u ? std::size_t{w} << 20 : w & 0xfffff;
        void* p = nullptr;
        const remat_status s = remat_allocate(a, bytes, 0, &p);
        if (s == REMAT_OK && p != nullptr) raw.push_back(p);
        if (s != REMAT_OK) CheckFailed(s);
        break;
      }
      case 1: {  // free one, or a bad pointer (changes nothing)
        if (!raw.empty() && (in.Byte() & 1)) {
          const std::size_t i = in.Byte() % raw.size();
          Check(remat_deallocate(a, raw[i]) == REMAT_OK);
          raw[i] = raw.back();
          raw.pop_back();
        } else {
          remat_stats before, after;
          Check(remat_get_stats(a, &before) == REMAT_OK);
          char* bad = raw.empty() ? reinterpret_cast<char*>(0x4000)
                                  : static_cast<char*>(raw[in.Byte() % raw.size()]) + 1;
          CheckFailed(remat_deallocate(a, bad));
          Check(remat_get_stats(a, &after) == REMAT_OK);
          Check(before.allocated_bytes == after.allocated_bytes &&
                before.allocations == after.allocations);
        }
        break;
      }
      case 2:
      case 3: {  // a tensor, droppable and/or offloadable, with inputs
        remat_tensor_options to;
        Check(remat_tensor_options_init(&to) == REMAT_OK);
        const std::uint8_t flags = in.Byte();
        to.allow_drop = flags & 1;
        to.allow_offload = flags >> 1 & 1;
        to.recompute = flags & 4 ? Failing : Recompute;
        if (flags & 8) to.recompute = nullptr;  // drop without a callback: refused
        std::uint64_t inputs[2];
        to.num_inputs = 0;
        for (int k = 0; k < (flags >> 4 & 3) && k < 2; ++k) {
          inputs[to.num_inputs++] =
              tensors.empty() || (flags & 0x40) ? in.Word() : tensors[in.Byte() % tensors.size()].id;
        }
        to.inputs = to.num_inputs > 0 ? inputs : nullptr;
        to.compute_ns = in.Byte();
        const unsigned char fill = static_cast<unsigned char>(in.Byte() | 1);
        to.user_data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(fill));
        const std::size_t bytes = (std::size_t{in.Byte()} + 1) * 4 * kKiB;
        std::uint64_t id = 0;
        void* p = nullptr;
        const remat_status s = remat_tensor_create(rt, bytes, &to, 0, &id, &p);
        TRACE("create %zu B drop=%d offload=%d flags=%#x inputs=%zu fill=%#x -> %d id %llu\n",
              bytes, to.allow_drop, to.allow_offload, flags, to.num_inputs, fill, s,
              static_cast<unsigned long long>(id));
        if (s != REMAT_OK) {
          CheckFailed(s);
          break;
        }
        Check(Fill(p, bytes, fill, 0) == REMAT_OK);
        Check(remat_tensor_release(rt, id) == REMAT_OK);
        // A failing callback may only be used where nothing will be dropped.
        if (!(flags & 4) || !to.allow_drop) tensors.push_back({id, bytes, fill});
        else Check(remat_tensor_free(rt, id) == REMAT_OK);
        break;
      }
      case 4: {  // a call with several outputs
        remat_call_options co;
        std::memset(&co, 0, sizeof(co));
        co.allow_drop = 1;
        co.allow_offload = in.Byte() & 1;
        co.recompute = RecomputeCall;
        const unsigned char fill = static_cast<unsigned char>(in.Byte() | 1);
        co.user_data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(fill));
        co.compute_ns = 100;
        const std::size_t n = in.Byte() % 4 + 1;
        std::size_t sizes[4];
        std::uint64_t ids[4] = {0, 0, 0, 0};
        void* ptrs[4] = {nullptr, nullptr, nullptr, nullptr};
        for (std::size_t i = 0; i < n; ++i) sizes[i] = (std::size_t{in.Byte()} + 1) * kKiB;
        const remat_status s = remat_call_create(rt, n, sizes, &co, 0, ids, ptrs);
        TRACE("call of %zu outputs fill=%#x offload=%d -> %d first id %llu\n", n, fill,
              co.allow_offload, s, static_cast<unsigned long long>(ids[0]));
        if (s != REMAT_OK) {
          CheckFailed(s);
          break;
        }
        for (std::size_t i = 0; i < n; ++i) {
          Check(Fill(ptrs[i], sizes[i], fill, 0) == REMAT_OK);
          Check(remat_tensor_release(rt, ids[i]) == REMAT_OK);
          tensors.push_back({ids[i], sizes[i], fill});
        }
        break;
      }
      case 5:
      case 6: {  // acquire: the bytes it was made with
        if (tensors.empty()) break;
        const Tensor& t = tensors[in.Byte() % tensors.size()];
        const std::uint64_t on = op & 0x80 ? side : 0;
        void* p = nullptr;
        // Or (a quarter of them), where it was dropped, refilled: the program
        // writes its own copy.
        const bool refill = (op & 0x60) == 0x60;
        const remat_status s =
            refill ? remat_tensor_refill(rt, t.id, on, &p) : remat_tensor_acquire(rt, t.id, on, &p);
        TRACE("%s %llu -> %d\n", refill ? "refill" : "acquire",
              static_cast<unsigned long long>(t.id), s);
        if (s != REMAT_OK) {
          CheckFailed(s);  // no room for it now (or not dropped): it stays as it was
          break;
        }
        if (refill) {
          ++refills;
          Check(Fill(p, t.bytes, t.fill, on) == REMAT_OK);
        }
        // Its bytes were written on stream 0 (or by a recompute or copy on
        // `on`): as on a GPU, reading them on another stream needs both done.
        Check(remat_stream_synchronize(a, on) == REMAT_OK);
        Check(remat_stream_synchronize(a, 0) == REMAT_OK);
        const auto* bytes = static_cast<const unsigned char*>(p);
        for (std::size_t i = 0; i < t.bytes; i += 1021) {
          if (bytes[i] != t.fill) TRACE("  byte %zu is %#x, not %#x\n", i, bytes[i], t.fill);
          Check(bytes[i] == t.fill);
        }
        Check(bytes[t.bytes - 1] == t.fill);
        Check(remat_tensor_release(rt, t.id) == REMAT_OK);
        break;
      }
      case 7: {  // the owner lets one go
        if (tensors.empty()) break;
        const std::size_t i = in.Byte() % tensors.size();
        TRACE("free %llu\n", static_cast<unsigned long long>(tensors[i].id));
        Check(remat_tensor_free(rt, tensors[i].id) == REMAT_OK);
        tensors[i] = tensors.back();
        tensors.pop_back();
        break;
      }
      case 8: {  // unknown or already-freed ids: refused, nothing changes
        const std::uint64_t id = in.Word() | (std::uint64_t{1} << 40);
        void* p = nullptr;
        CheckFailed(remat_tensor_acquire(rt, id, 0, &p));
        CheckFailed(remat_tensor_refill(rt, id, 0, &p));
        CheckFailed(remat_tensor_release(rt, id));
        CheckFailed(remat_tensor_free(rt, id));
        remat_tensor_state state;
        CheckFailed(remat_tensor_get_state(rt, id, &state));
        break;
      }
      case 9: {  // release without a pin: refused
        if (tensors.empty()) break;
        CheckFailed(remat_tensor_release(rt, tensors[in.Byte() % tensors.size()].id));
        break;
      }
      case 10: {
        if (tensors.empty()) break;
        (void)remat_tensor_prefetch(rt, tensors[in.Byte() % tensors.size()].id, 0);
        break;
      }
      case 12: {  // a view: evicted and restored with its base, the same bytes
        if (tensors.empty()) break;
        const Tensor base = tensors[in.Byte() % tensors.size()];
        if (op & 0x80) {
          // Or one more output of base's call, made now: its callback fills
          // every output with the call's byte (refused for a lone tensor).
          const std::size_t bytes = (std::size_t{in.Byte()} + 1) * kKiB;
          std::uint64_t id = 0;
          void* p = nullptr;
          const remat_status s =
              remat_call_add_output(rt, base.id, bytes, in.Byte() & 1, in.Byte() & 1, 0, &id, &p);
          TRACE("add output to %llu -> %d id %llu\n", static_cast<unsigned long long>(base.id),
                s, static_cast<unsigned long long>(id));
          if (s != REMAT_OK) {
            CheckFailed(s);
            break;
          }
          Check(Fill(p, bytes, base.fill, 0) == REMAT_OK);
          Check(remat_tensor_release(rt, id) == REMAT_OK);
          tensors.push_back({id, bytes, base.fill});
          break;
        }
        std::uint64_t view = 0;
        const remat_status s = remat_tensor_create_view(rt, base.id, &view);
        TRACE("view of %llu -> %d id %llu\n", static_cast<unsigned long long>(base.id), s,
              static_cast<unsigned long long>(view));
        if (s != REMAT_OK) {
          CheckFailed(s);
          break;
        }
        tensors.push_back({view, base.bytes, base.fill});
        break;
      }
      case 11: {
        remat_runtime_stats st;
        Check(remat_runtime_get_stats(rt, &st) == REMAT_OK);
        Check(st.pinned_by_api == 0);
        Check(st.refills == refills);
        if (ro.live_budget != 0) Check(st.resident_bytes <= ro.live_budget);
        (void)remat_empty_cache(a);
        // A step ends (learn_next_use): refused without it, and nothing else changes.
        const remat_status ended = remat_runtime_end_step(rt);
        Check(ro.learn_next_use ? ended == REMAT_OK : ended == REMAT_FAILED_PRECONDITION);
        // And the allocator's (placement learned from the step, with expandable segments).
        Check(remat_end_step(a) == REMAT_OK);
        break;
      }
    }
    CheckOk(remat::c_api_testing::CheckInvariants(a, rt));
  }
  for (const Tensor& t : tensors) {
    Check(remat_tensor_free(rt, t.id) == REMAT_OK);
    CheckOk(remat::c_api_testing::CheckInvariants(a, rt));
  }
  for (void* p : raw) Check(remat_deallocate(a, p) == REMAT_OK);
  CheckOk(remat::c_api_testing::CheckInvariants(a, rt));
  Check(remat_runtime_destroy(rt) == REMAT_OK);
  CheckOk(remat::c_api_testing::CheckInvariants(a, nullptr));
  Check(remat_stream_destroy(a, side) == REMAT_OK);
  Check(remat_allocator_destroy(a) == REMAT_OK);
  return 0;
}
