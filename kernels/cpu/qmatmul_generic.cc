// The generic build of the quantized MatMul (flags: kernels/build.py).
#define ISA_SUFFIX generic
#include "qmatmul_body.inc"
