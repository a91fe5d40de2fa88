// The generic build of the panel GEMMs (flags: ortinf/kernels/build.py).
#define ISA generic
#include "panel_gemm_body.inc"
