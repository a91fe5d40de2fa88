// The avx512 build of the fp32 expert GEMM (flags: kernels/build.py).
#define SGEMM sgemm_avx512
#include "moe_body.inc"
