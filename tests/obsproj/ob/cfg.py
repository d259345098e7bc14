from ob import other
from ob.base import Base


class Cfg(Base):
    OWN = 4.0
    DERIVED = other.X * 2
