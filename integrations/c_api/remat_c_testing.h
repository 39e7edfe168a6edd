// For tests and fuzzers of the C ABI, not part of it: remat.h does not
// declare it and libremat.so does not export it (remat.map exports remat_*
// alone). A harness that compiles remat_c.cc into itself calls it.
#ifndef REMAT_INTEGRATIONS_C_API_REMAT_C_TESTING_H_
#define REMAT_INTEGRATIONS_C_API_REMAT_C_TESTING_H_

#include "absl/status/status.h"
#include "integrations/c_api/remat.h"

namespace remat::c_api_testing {

// The invariants of the allocator's CachingAllocator and, when `runtime` is
// not null, of its Runtime (each one's CheckInvariants): the first broken
// one, or OK.
absl::Status CheckInvariants(const remat_allocator* allocator, const remat_runtime* runtime);

}  // namespace remat::c_api_testing

#endif  // REMAT_INTEGRATIONS_C_API_REMAT_C_TESTING_H_
