import builtins

builtins.OB_GAIN = 2.0  # a name injected into builtins, read by k_builtin
