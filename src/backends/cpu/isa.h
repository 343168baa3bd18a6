// CPU kernel levels: the instruction sets the kernels come in and their run-time detection
// (kernel code and target attributes: simd.h).
#pragma once
#include <string>

namespace wren::cpu {

/// Kernel level. Scalar = the reference kernels (f32 results bit-identical to the original
/// exact backend); Avx2 needs AVX2 + FMA; Avx512 needs AVX-512 F/BW/VL/DQ + VNNI.
enum class Isa { Scalar, Avx2, Avx512 };

/// The best level this CPU supports.
Isa best_isa();
/// Whether this CPU can run `isa`.
bool isa_supported(Isa isa);
/// "scalar", "avx2", "avx512".
const char* isa_name(Isa isa);
/// Parses "auto" (best_isa()) | "scalar" | "avx2" | "avx512"; throws wren::Error for other names
/// or for a level this CPU lacks.
Isa parse_isa(const std::string& s);

}  // namespace wren::cpu
