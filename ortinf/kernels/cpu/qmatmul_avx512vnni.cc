// The avx512vnni build of the quantized MatMul (flags: ortinf/kernels/build.py).
#define ISA_SUFFIX avx512vnni
#include "qmatmul_body.inc"
