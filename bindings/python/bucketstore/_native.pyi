# The extension module: the C library (reached through ctypes by _ffi) and the binding's C
# functions.
