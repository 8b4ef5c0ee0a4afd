#include "kernels/cpu/cpu_isa.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && (defined(__x86_64__) || defined(__i386__))
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kvserve::cpu {
namespace {

constexpr int kNoOverride = -1;
std::atomic<int> g_override{kNoOverride};

CpuIsa ClampToSupported(CpuIsa isa) {
  while (!CpuSupportsIsa(isa)) isa = static_cast<CpuIsa>(static_cast<int>(isa) - 1);
  return isa;
}

CpuIsa IsaFromEnvironment() {
  const char* env = std::getenv("KVSERVE_CPU_ISA");
  if (env == nullptr || *env == '\0') return BestSupportedIsa();
  const std::optional<CpuIsa> parsed = ParseCpuIsa(env);
  if (!parsed.has_value()) {
    std::fprintf(stderr, "kvserve: KVSERVE_CPU_ISA='%s' is not scalar|avx2|avx512; using %s\n", env,
                 CpuIsaName(BestSupportedIsa()).data());
    return BestSupportedIsa();
  }
  const CpuIsa clamped = ClampToSupported(*parsed);
  if (clamped != *parsed) {
    std::fprintf(stderr, "kvserve: KVSERVE_CPU_ISA=%s is not supported by this CPU; using %s\n",
                 env, CpuIsaName(clamped).data());
  }
  return clamped;
}

}  // namespace

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

std::optional<CpuIsa> ParseCpuIsa(std::string_view name) {
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (name == CpuIsaName(isa)) return isa;
  }
  return std::nullopt;
}

#if defined(__x86_64__) || defined(__i386__)
namespace {
// F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c".
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
}  // namespace
#endif

bool CpuSupportsIsa(CpuIsa isa) {
#if defined(__x86_64__) || defined(__i386__)
  static const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
  static const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                             __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512vl");
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
      return avx2;
    case CpuIsa::kAvx512:
      return avx512;
  }
  return false;
#else
  return isa == CpuIsa::kScalar;
#endif
}

namespace {

bool CpuHasAvx512Vnni() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool vnni = CpuSupportsIsa(CpuIsa::kAvx512) && __builtin_cpu_supports("avx512vnni");
  return vnni;
#else
  return false;
#endif
}

// AVX512_BF16 from CPUID leaf 7, sub-leaf 1 (EAX bit 5): not every compiler's
// __builtin_cpu_supports knows it.
bool CpuHasAvx512Bf16() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool bf16 = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return CpuSupportsIsa(CpuIsa::kAvx512) &&
           __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 5)) != 0;
  }();
  return bf16;
#else
  return false;
#endif
}

// AMX-TILE and AMX-BF16 (CPUID leaf 7, sub-leaf 0, EDX bits 24 and 22), the tile state enabled by
// the OS in XCR0 (bits 17 and 18), and this process allowed to use it: Linux hands the 8 KiB of
// tile data only to processes that ask (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA,
// kernel 5.16 and later); a tile instruction otherwise kills the process with SIGILL. Asked once,
// for the whole process (threads started before and after alike).
bool CpuHasAmxBf16() {
#if defined(__linux__) && (defined(__x86_64__) || defined(__i386__))
  static const bool amx = [] {
    if (!CpuHasAvx512Bf16()) return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    constexpr unsigned kAmxBf16 = 1u << 22, kAmxTile = 1u << 24;
    if ((edx & kAmxBf16) == 0 || (edx & kAmxTile) == 0) return false;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & bit_OSXSAVE) == 0) return false;
    unsigned xcr0_lo = 0, xcr0_hi = 0;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    constexpr unsigned kTileState = (1u << 17) | (1u << 18);  // XTILECFG, XTILEDATA
    if ((xcr0_lo & kTileState) != kTileState) return false;
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return amx;
#else
  return false;
#endif
}

// A kernel feature of the avx512 path that the CPU may have: on unless the environment variable
// `env` is "0" (read once, when first asked), and forced either way by a test override.
class FeatureSwitch {
 public:
  static constexpr int kDefault = -1;

  FeatureSwitch(bool (*present)(), const char* env)
      : present_(present),
        env_off_(std::getenv(env) != nullptr && std::string_view(std::getenv(env)) == "0") {}

  bool Enabled() const {
    if (!present_()) return false;
    const int forced = override_.load(std::memory_order_relaxed);
    if (forced != kDefault) return forced != 0;
    return !env_off_;
  }
  void Override(std::optional<bool> enabled) {
    override_.store(enabled.has_value() ? static_cast<int>(*enabled) : kDefault,
                    std::memory_order_relaxed);
  }

 private:
  bool (*present_)();
  bool env_off_;
  std::atomic<int> override_{kDefault};
};

// Function-local, so that they are ready whenever a kernel first asks (even during another file's
// static initialisation).
FeatureSwitch& Vnni() {
  static FeatureSwitch feature(&CpuHasAvx512Vnni, "KVSERVE_CPU_VNNI");
  return feature;
}
FeatureSwitch& Bf16Dot() {
  static FeatureSwitch feature(&CpuHasAvx512Bf16, "KVSERVE_CPU_BF16");
  return feature;
}
FeatureSwitch& AmxBf16() {
  static FeatureSwitch feature(&CpuHasAmxBf16, "KVSERVE_CPU_AMX");
  return feature;
}

}  // namespace

bool CpuAvx512VnniEnabled() { return Vnni().Enabled(); }
void SetAvx512VnniOverride(std::optional<bool> enabled) { Vnni().Override(enabled); }
bool CpuAvx512Bf16Enabled() { return Bf16Dot().Enabled(); }
void SetAvx512Bf16Override(std::optional<bool> enabled) { Bf16Dot().Override(enabled); }
bool CpuAmxBf16Enabled() { return AmxBf16().Enabled(); }
void SetAmxBf16Override(std::optional<bool> enabled) { AmxBf16().Override(enabled); }

CpuIsa BestSupportedIsa() { return ClampToSupported(CpuIsa::kAvx512); }

CpuIsa ActiveCpuIsa() {
  const int forced = g_override.load(std::memory_order_relaxed);
  if (forced != kNoOverride) return static_cast<CpuIsa>(forced);
  static const CpuIsa from_env = IsaFromEnvironment();
  return from_env;
}

void SetCpuIsaOverride(std::optional<CpuIsa> isa) {
  g_override.store(isa.has_value() ? static_cast<int>(ClampToSupported(*isa)) : kNoOverride,
                   std::memory_order_relaxed);
}

}  // namespace kvserve::cpu
