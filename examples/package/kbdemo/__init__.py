"""kbdemo: an example library shipping prebuilt kernels (see kernels.py and README.md)."""
