// Found through NVRTC's include path (NUMBA_CUDA_NVRTC_EXTRA_SEARCH_PATHS=sp/include), not
// beside this file: the angle form, and a header in a subfolder of the search path.
#include <sp_gain.h>
#include "sub/sp_bias.h"

extern "C" __device__ int sp_gain(float* out, float x) {
    *out = x * SP_GAIN + SP_BIAS;
    return 0;
}
