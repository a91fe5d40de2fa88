// The generic build of the fp32 expert GEMM (flags: ortinf/kernels/build.py).
#define SGEMM sgemm_generic
#include "moe_body.inc"
