#define OB_LINK_GAIN 3.0f
