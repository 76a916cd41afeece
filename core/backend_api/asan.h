// Internal: whether this translation unit is built with AddressSanitizer, the one detection the
// simulator (poisoning its cached blocks, backend_sim/sim_backend.cpp) and the tests that depend
// on it (tests/test_sim_backend.cpp, tests/test_dry_run.cpp) share. Included only by them: a change
// here rebuilds three files, not the tree.
//
// GCC defines __SANITIZE_ADDRESS__ under -fsanitize=address; Clang answers
// __has_feature(address_sanitizer) (Clang 14, CI's, does not define the GCC macro). The nested #if
// keeps __has_feature(...) out of GCC's preprocessor where it has no such feature test.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define DITTO_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DITTO_ASAN 1
#endif
#endif
#ifndef DITTO_ASAN
#define DITTO_ASAN 0  ///< 1 under AddressSanitizer (GCC or Clang), else 0: test with #if
#endif

#if DITTO_ASAN
#include <sanitizer/asan_interface.h>  // ASAN_POISON_MEMORY_REGION, __asan_address_is_poisoned
#endif

namespace ditto::detail {
/// DITTO_ASAN as a constant, for code that needs no preprocessor branch.
inline constexpr bool kAsan = DITTO_ASAN != 0;
}  // namespace ditto::detail
