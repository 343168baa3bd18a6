// WREN_HD marks a small function that both the host compiler and nvcc compile: __host__ __device__
// under nvcc, nothing elsewhere (write `WREN_HD inline` or `WREN_HD constexpr`). For the scalar
// formulas shared by the CPU and CUDA backends (core/mxfp4.h, core/q4_g64.h, core/kda_math.h), so
// both sides run one text.
#pragma once

#ifdef __CUDACC__
#define WREN_HD __host__ __device__
#else
#define WREN_HD
#endif
