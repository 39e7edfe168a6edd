#include "bench/host_allocators.h"

#include <dlfcn.h>
#include <gnu/libc-version.h>

#include <cstdint>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace remat::bench {

RematAllocator::RematAllocator() {
  SimDeviceOptions device_options;
  device_options.capacity = 4 * kTiB;
  device_options.backed = false;
  absl::StatusOr<std::unique_ptr<SimDevice>> device = SimDevice::Create(device_options);
  if (!device.ok()) {
    error_ = std::string(device.status().message());
    return;
  }
  device_ = *std::move(device);
  absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator =
      CachingAllocator::Create(device_.get());
  if (!allocator.ok()) {
    error_ = std::string(allocator.status().message());
    return;
  }
  allocator_ = *std::move(allocator);
}

namespace {

// The shared object that defines the code at `fn`, or "?" when dladdr cannot tell.
std::string DefiningObject(const void* fn) {
  Dl_info info{};
  if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "?";
  return info.dli_fname;
}

bool Contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// jemalloc's per-thread count of bytes it has allocated (0 when its stats are off).
bool JemallocThreadAllocated(std::uint64_t* out) {
  std::size_t size = sizeof(*out);
  return mallctl("thread.allocated", out, &size, nullptr, 0) == 0;
}

}  // namespace

bool LoadGlibcMalloc(std::string* error) {
  void* libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  if (libc == nullptr) {
    *error = absl::StrCat("dlopen(libc.so.6): ", dlerror());
    return false;
  }
  // A handle's lookup searches that object (and its dependencies) only.
  void* m = dlsym(libc, "__libc_malloc");
  void* f = dlsym(libc, "__libc_free");
  dlclose(libc);  // RTLD_NOLOAD took a reference to the loaded libc; libc stays
  if (m == nullptr || f == nullptr) {
    *error = "libc.so.6 has no __libc_malloc / __libc_free";
    return false;
  }
  GlibcMalloc::malloc_fn = reinterpret_cast<void* (*)(std::size_t)>(m);
  GlibcMalloc::free_fn = reinterpret_cast<void (*)(void*)>(f);
  return true;
}

bool VerifyHostAllocators(std::string* report) {
  bool ok = true;
  auto fail = [&](const std::string& why) {
    absl::StrAppend(report, "FAILED: ", why, "\n");
    ok = false;
  };

  // Versions, from each library itself.
  const char* je_version = nullptr;
  std::size_t len = sizeof(je_version);
  if (mallctl("version", &je_version, &len, nullptr, 0) != 0 || je_version == nullptr) {
    fail("mallctl(\"version\") did not answer: mallocx is not jemalloc");
    je_version = "?";
  }
  const int mi = mi_version();
  absl::StrAppend(report, "glibc    ", gnu_get_libc_version(), "  (__libc_malloc)\n");
  absl::StrAppend(report, "jemalloc ", je_version, "  (mallocx / dallocx)\n");
  absl::StrAppend(report, absl::StrFormat("mimalloc %d.%d.%d  (mi_malloc / mi_free)\n", mi / 100,
                                          (mi / 10) % 10, mi % 10));

  // Which object defines each entry point.
  const std::string libc_obj = DefiningObject(reinterpret_cast<void*>(GlibcMalloc::malloc_fn));
  const std::string libc_free_obj = DefiningObject(reinterpret_cast<void*>(GlibcMalloc::free_fn));
  const std::string bound_libc_obj = DefiningObject(dlsym(RTLD_DEFAULT, "__libc_malloc"));
  const std::string je_obj = DefiningObject(reinterpret_cast<void*>(&mallocx));
  const std::string mi_obj = DefiningObject(reinterpret_cast<void*>(&mi_malloc));
  const std::string malloc_obj = DefiningObject(dlsym(RTLD_DEFAULT, "malloc"));
  absl::StrAppend(report, "__libc_malloc is in ", libc_obj, " (__libc_free in ", libc_free_obj,
                  "; the name as the linker binds it: ", bound_libc_obj, ")\n");
  absl::StrAppend(report, "mallocx       is in ", je_obj, "\n");
  absl::StrAppend(report, "mi_malloc     is in ", mi_obj, "\n");
  absl::StrAppend(report, "malloc        is in ", malloc_obj,
                  "  (the process's malloc: what remat's own bookkeeping uses)\n");
  if (!Contains(libc_obj, "libc.so") || !Contains(libc_free_obj, "libc.so")) {
    fail("__libc_malloc / __libc_free are not glibc's libc.so");
  }
  if (!Contains(je_obj, "jemalloc")) fail("mallocx is not defined by libjemalloc");
  if (!Contains(mi_obj, "mimalloc")) fail("mi_malloc is not defined by libmimalloc");
  if (libc_obj == je_obj || libc_obj == mi_obj || je_obj == mi_obj) {
    fail("two of the host allocators come from the same object");
  }

  // Behaviour: a block from one allocator is invisible to the others.
  std::uint64_t before = 0, after_libc = 0, after_je = 0, after_mi = 0;
  const bool have_counter = JemallocThreadAllocated(&before);
  if (GlibcMalloc::malloc_fn == nullptr) {
    fail("glibc's malloc was not loaded");
    return false;
  }
  GlibcMalloc glibc;
  void* from_libc = glibc.Allocate(4096);
  if (have_counter) JemallocThreadAllocated(&after_libc);
  void* from_je = mallocx(4096, 0);
  if (have_counter) JemallocThreadAllocated(&after_je);
  void* from_mi = mi_malloc(4096);
  if (have_counter) JemallocThreadAllocated(&after_mi);
  if (from_libc == nullptr || from_je == nullptr || from_mi == nullptr) {
    fail("a 4 KiB test allocation failed");
  } else {
    if (have_counter) {
      absl::StrAppend(
          report, absl::StrFormat("jemalloc thread.allocated grew by %d after __libc_malloc, "
                                  "%d after mallocx, %d after mi_malloc (4096 each)\n",
                                  after_libc - before, after_je - after_libc, after_mi - after_je));
      if (after_libc != before) fail("__libc_malloc allocated from jemalloc");
      if (after_je == after_libc) fail("mallocx did not allocate from jemalloc");
      if (after_mi != after_je) fail("mi_malloc allocated from jemalloc");
    } else {
      absl::StrAppend(report, "jemalloc thread.allocated unavailable (stats off); skipped\n");
    }
    const bool mi_libc = mi_is_in_heap_region(from_libc);
    const bool mi_je = mi_is_in_heap_region(from_je);
    const bool mi_mi = mi_is_in_heap_region(from_mi);
    auto yes_no = [](bool b) { return b ? "yes" : "no"; };
    absl::StrAppend(report, "mi_is_in_heap_region: glibc block ", yes_no(mi_libc),
                    ", jemalloc block ", yes_no(mi_je), ", mimalloc block ", yes_no(mi_mi), "\n");
    if (mi_libc || mi_je || !mi_mi) fail("mimalloc's heap does not hold exactly its own block");
  }
  if (from_libc != nullptr) glibc.Free(from_libc);
  if (from_je != nullptr) dallocx(from_je, 0);
  if (from_mi != nullptr) mi_free(from_mi);
  return ok;
}

}  // namespace remat::bench
