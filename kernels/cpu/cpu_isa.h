#ifndef KVSERVE_KERNELS_CPU_CPU_ISA_H_
#define KVSERVE_KERNELS_CPU_CPU_ISA_H_

#include <optional>
#include <string_view>

namespace kvserve::cpu {

/// The instruction-set paths the SIMD kernels are compiled for. Each path is deterministic on
/// its own; different paths sum in different orders, so results agree only within tolerance.
enum class CpuIsa { kScalar, kAvx2, kAvx512 };

/// "scalar", "avx2" or "avx512".
std::string_view CpuIsaName(CpuIsa isa);

/// Parses a CpuIsaName() string; nullopt for anything else.
std::optional<CpuIsa> ParseCpuIsa(std::string_view name);

/// Whether this machine can run `isa` (avx2 = AVX2+FMA+F16C, avx512 = that plus AVX-512 F/BW/VL).
bool CpuSupportsIsa(CpuIsa isa);

/// The best path this machine supports.
CpuIsa BestSupportedIsa();

/// The path the kernels use now: the override (SetCpuIsaOverride) if set, else the environment
/// variable KVSERVE_CPU_ISA=scalar|avx2|avx512 (read once; an unsupported or unknown value prints
/// a warning to stderr and falls back to the best supported path), else BestSupportedIsa().
CpuIsa ActiveCpuIsa();

/// Of a kernel's three paths (one function each, the same signature), the one for ActiveCpuIsa().
template <class Fn>
Fn ForActiveIsa(Fn scalar, Fn avx2, Fn avx512) {
  switch (ActiveCpuIsa()) {
    case CpuIsa::kAvx512:
      return avx512;
    case CpuIsa::kAvx2:
      return avx2;
    case CpuIsa::kScalar:
      break;
  }
  return scalar;
}

/// Forces `isa` (clamped to what the CPU supports) for all later kernel calls in this process;
/// nullopt restores the default. Meant for tests that compare paths; not for concurrent use with
/// running kernels.
void SetCpuIsaOverride(std::optional<CpuIsa> isa);

/// Whether the avx512 path's int8 kernels use AVX-512 VNNI (vpdpbusd): the CPU has it (with
/// AVX-512 VL) and neither KVSERVE_CPU_VNNI=0 nor SetAvx512VnniOverride(false) turned it off. Like
/// the ISA choice it selects kernels with their own (deterministic) summation order for q8_0 and
/// q4_0; the switch exists to test and measure both.
bool CpuAvx512VnniEnabled();

/// Forces VNNI off (false) or back on where supported (true); nullopt restores the default.
/// Meant for tests, like SetCpuIsaOverride.
void SetAvx512VnniOverride(std::optional<bool> enabled);

/// Whether the avx512 path multiplies bf16 weights with AVX512_BF16 (vdpbf16ps): the CPU has it
/// and neither KVSERVE_CPU_BF16=0 nor SetAvx512Bf16Override(false) turned it off. The x rows are
/// then rounded to bf16 (round to nearest even) before they meet the weights, as in the engines
/// that run bf16 models in bf16, and each pair of exact bf16 products goes into an fp32
/// accumulator: twice the multiply-adds per instruction of widening the weights to fp32, with
/// numerics of its own (kernels/cpu/matmul_impl.h).
bool CpuAvx512Bf16Enabled();

/// Forces the bf16 dot product off (false) or back on where supported (true); nullopt restores
/// the default. Meant for tests, like SetCpuIsaOverride.
void SetAvx512Bf16Override(std::optional<bool> enabled);

/// Whether packed bf16 weights on the bf16 dot product's path (CpuAvx512Bf16Enabled) are
/// multiplied with AMX (TDPBF16PS, Intel AMX-TILE and AMX-BF16): the CPU has it, the kernel let
/// this process use the tile state (Linux arch_prctl ARCH_REQ_XCOMP_PERM, asked once, when first
/// needed), and neither KVSERVE_CPU_AMX=0 nor SetAmxBf16Override(false) turned it off. The x rows
/// are rounded to bf16 as on that path; AMX sums each 32-element step its own way, so the results
/// are those of a path of their own (kernels/cpu/matmul_impl.h).
bool CpuAmxBf16Enabled();

/// Forces AMX off (false) or back on where usable (true); nullopt restores the default. Meant for
/// tests, like SetCpuIsaOverride.
void SetAmxBf16Override(std::optional<bool> enabled);

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_CPU_ISA_H_
