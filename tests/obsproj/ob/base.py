class Base:
    GAIN = 1.5
