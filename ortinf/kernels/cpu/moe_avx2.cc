// The avx2 build of the fp32 expert GEMM (flags: ortinf/kernels/build.py).
#define SGEMM sgemm_avx2
#include "moe_body.inc"
