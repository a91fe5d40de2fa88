// The avx2 build of the attention job (flags: ortinf/kernels/build.py).
#define RUN_JOB run_job_avx2
#define ROUND_HALF round_half_avx2
#include "attention_body.inc"
