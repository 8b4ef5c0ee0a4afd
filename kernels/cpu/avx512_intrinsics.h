#ifndef KVSERVE_KERNELS_CPU_AVX512_INTRINSICS_H_
#define KVSERVE_KERNELS_CPU_AVX512_INTRINSICS_H_

// <immintrin.h> for the AVX-512 kernel files (compiled with their own -m flags). g++ 12's
// AVX-512 intrinsics seed results with `__m512 __Y = __Y;` (_mm512_undefined_ps), which
// -Wmaybe-uninitialized flags at every inlined use (a known g++ 12 false positive): the warning
// is silenced for that header only. Declarations only: nothing here emits code.

#pragma GCC diagnostic push
#if !defined(__clang__)  // clang has no -Wmaybe-uninitialized (and no such false positive)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

#endif  // KVSERVE_KERNELS_CPU_AVX512_INTRINSICS_H_
