#pragma once
#include "sp_deep.h"
#define SP_GAIN (3.0f * SP_DEEP)
