// The avxvnni build of the quantized MatMul (flags: ortinf/kernels/build.py).
#define ISA_SUFFIX avxvnni
#include "qmatmul_body.inc"
