import os
from collections import namedtuple

from dp import dconsts

P = namedtuple("P", dconsts.FIELDS)
Q = namedtuple("Q", os.environ.get("DP_FIELDS", "a b").split())
