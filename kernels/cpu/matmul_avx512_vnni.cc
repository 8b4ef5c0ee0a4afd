// The AVX-512 path's int8 dot-product matmul with VNNI: matmul_int8.inc compiled with
// -mavx512vnni (q8_0 through 256-bit vpdpbusd, q4_0 in 512-bit block quads). Selected by Matmul()
// when CpuAvx512VnniEnabled().

#include "kernels/cpu/matmul_impl.h"

#if defined(__AVX512VNNI__)

#include <cstring>
#include <type_traits>

#include "kernels/cpu/avx512_intrinsics.h"

namespace kvserve::cpu::internal {
namespace {

#include "kernels/cpu/matmul_int8.inc"

}  // namespace

void MatmulColumnsAvx512Vnni(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                             int64_t n_end) {
  if (!Int8Matmul(args, plan, n_begin, n_end)) MatmulColumnsAvx512(args, plan, n_begin, n_end);
}

}  // namespace kvserve::cpu::internal

#else  // not built with the target flags (non-x86): never selected, forwards to scalar

namespace kvserve::cpu::internal {

void MatmulColumnsAvx512Vnni(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                             int64_t n_end) {
  MatmulColumnsScalar(args, plan, n_begin, n_end);
}

}  // namespace kvserve::cpu::internal

#endif
