// The generic build of the fp32 expert GEMM (flags: kernels/build.py).
#define SGEMM sgemm_generic
#include "moe_body.inc"
