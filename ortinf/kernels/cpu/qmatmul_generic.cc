// The generic build of the quantized MatMul (flags: ortinf/kernels/build.py).
#define ISA_SUFFIX generic
#include "qmatmul_body.inc"
