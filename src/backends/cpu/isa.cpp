// CPU kernel level detection (see isa.h).
#include "backends/cpu/isa.h"

#include "core/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define WREN_CPUID 1
#else
#define WREN_CPUID 0
#endif

namespace wren::cpu {

bool isa_supported(Isa isa) {
#if WREN_CPUID
  __builtin_cpu_init();
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::Avx512:
      return isa_supported(Isa::Avx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
  }
  return false;
#else
  return isa == Isa::Scalar;
#endif
}

Isa best_isa() {
  if (isa_supported(Isa::Avx512)) return Isa::Avx512;
  if (isa_supported(Isa::Avx2)) return Isa::Avx2;
  return Isa::Scalar;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

Isa parse_isa(const std::string& s) {
  if (s == "auto") return best_isa();
  for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (s != isa_name(i)) continue;
    check(isa_supported(i), "--isa " + s + ": this CPU does not support it (best here: " +
                                isa_name(best_isa()) + ")");
    return i;
  }
  throw Error("--isa: '" + s + "' is not a kernel level (expected auto, scalar, avx2 or avx512)");
}

}  // namespace wren::cpu
