// The avx512 build of the attention job (flags: ortinf/kernels/build.py).
#define RUN_JOB run_job_avx512
#define ROUND_HALF round_half_avx512
#include "attention_body.inc"
