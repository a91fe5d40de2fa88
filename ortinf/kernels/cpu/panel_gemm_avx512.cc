// The avx512 build of the panel GEMMs (flags: ortinf/kernels/build.py).
#define ISA avx512
#include "panel_gemm_body.inc"
