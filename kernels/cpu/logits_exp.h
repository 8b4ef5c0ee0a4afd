#ifndef KVSERVE_KERNELS_CPU_LOGITS_EXP_H_
#define KVSERVE_KERNELS_CPU_LOGITS_EXP_H_

// Internal to kernels/cpu/logits*.cc: the constants of ExpShifted's exp, shared by every ISA
// path so that each computes the same float operations (constexpr data only: no code here).

namespace kvserve::cpu::internal::exp_constants {

inline constexpr float kLowest = -87.33654f;  // log(FLT_MIN): below, exp is 0
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;  // exact in float: k * kLn2Hi is exact
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

}  // namespace kvserve::cpu::internal::exp_constants

#endif  // KVSERVE_KERNELS_CPU_LOGITS_EXP_H_
