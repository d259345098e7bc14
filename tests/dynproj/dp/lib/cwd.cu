#include "cwd_gain.h"

extern "C" __device__ int dp_cwd_gain(float* out, float x) {
    *out = x * DP_CWD_GAIN;
    return 0;
}
