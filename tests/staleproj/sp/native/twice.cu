#include "sp_twice.h"

extern "C" __device__ int sp_twice(float* out, float x) {
    *out = x * SP_TWICE;
    return 0;
}
