#pragma once
#define SP_DEEP 1.0f
