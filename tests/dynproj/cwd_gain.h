#define DP_CWD_GAIN 3.0f
