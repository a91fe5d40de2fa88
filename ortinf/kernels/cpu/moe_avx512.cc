// The avx512 build of the fp32 expert GEMM (flags: ortinf/kernels/build.py).
#define SGEMM sgemm_avx512
#include "moe_body.inc"
