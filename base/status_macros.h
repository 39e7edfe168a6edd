#ifndef REMAT_BASE_STATUS_MACROS_H_
#define REMAT_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define REMAT_CONCAT_INNER_(a, b) a##b
#define REMAT_CONCAT_(a, b) REMAT_CONCAT_INNER_(a, b)

#define REMAT_RETURN_IF_ERROR(expr)                  \
  do {                                               \
    ::absl::Status remat_status_ = (expr);           \
    if (!remat_status_.ok()) return remat_status_;   \
  } while (0)

#define REMAT_ASSIGN_OR_RETURN(lhs, expr) \
  REMAT_ASSIGN_OR_RETURN_IMPL_(REMAT_CONCAT_(remat_statusor_, __LINE__), lhs, expr)

#define REMAT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#endif  // REMAT_BASE_STATUS_MACROS_H_
