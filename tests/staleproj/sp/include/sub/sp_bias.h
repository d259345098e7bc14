#pragma once
#define SP_BIAS 0.5f
