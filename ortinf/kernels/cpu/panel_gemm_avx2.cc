// The avx2 build of the panel GEMMs (flags: ortinf/kernels/build.py).
#define ISA avx2
#include "panel_gemm_body.inc"
