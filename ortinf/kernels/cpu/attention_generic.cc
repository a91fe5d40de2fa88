// The generic build of the attention job (flags: ortinf/kernels/build.py).
#define RUN_JOB run_job_generic
#define ROUND_HALF round_half_generic
#include "attention_body.inc"
