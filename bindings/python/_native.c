/* bucketstore._native: the C library compiled into the extension module (setup.py), so the
 * package needs no libbucketstore.so at run time. The Python API (bucketstore/_core.py) calls
 * the library's bs_* functions in this same shared object. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "storage.h"

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    "bucketstore._native",
    "The bucketstore C library and the binding's C functions.",
    -1,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL};

PyMODINIT_FUNC PyInit__native(void) {
  return PyModule_Create(&native_module);
}
