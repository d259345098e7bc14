#pragma once
#define SP_TWICE 2.0f
