// The avx2 build of the quantized MatMul (flags: ortinf/kernels/build.py).
#define ISA_SUFFIX avx2
#include "qmatmul_body.inc"
