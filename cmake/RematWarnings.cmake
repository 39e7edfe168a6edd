# Warnings for our own targets only (third-party headers come in as SYSTEM).
add_library(remat_warnings INTERFACE)
target_compile_options(remat_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-missing-field-initializers>)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  target_compile_options(remat_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety>)
endif()
