/* bucketstore._native: the C library compiled into the extension module (setup.py), so the
 * package needs no libbucketstore.so at run time, and the binding's two hot paths in C: reading
 * bucket data into Op and Chunk tuples, and queueing saves, a batch per call. The rest of the
 * Python API (bucketstore/_core.py) calls the library's bs_* functions in this same shared
 * object through ctypes: those calls happen per batch or per commit, not per op. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "storage.h"

#if PY_VERSION_HEX < 0x030A0000 /* Py_NewRef is 3.10's */
static inline PyObject *Py_NewRef(PyObject *o) {
  Py_INCREF(o);
  return o;
}
#endif

/* Set once by setup(): the namedtuple classes results are built as, the OpType members by
 * type number, the lookup encoder (bucketstore._core._save_lookup: the key of values, params
 * checked) and InvalidArgumentError. */
static PyTypeObject *op_cls, *chunk_cls;
static PyObject *op_types, *encode_lookup, *inval_cls;

static PyObject *native_setup(PyObject *self, PyObject *args) {
  PyObject *o, *c, *t, *e, *x;
  (void)self;
  if (!PyArg_ParseTuple(args, "O!O!O!OO", &PyType_Type, &o, &PyType_Type, &c, &PyTuple_Type, &t, &e,
                        &x))
    return NULL;
  Py_XSETREF(inval_cls, Py_NewRef(x));
  Py_XSETREF(op_cls, (PyTypeObject *)Py_NewRef(o));
  Py_XSETREF(chunk_cls, (PyTypeObject *)Py_NewRef(c));
  Py_XSETREF(op_types, Py_NewRef(t));
  Py_XSETREF(encode_lookup, Py_NewRef(e));
  Py_RETURN_NONE;
}

/* A named tuple of class cls from n new references (stolen; NULL = an error already set): what
 * tuple.__new__(cls, items) builds, without the call. */
static PyObject *named(PyTypeObject *cls, PyObject **items, Py_ssize_t n) {
  PyObject *t = NULL;
  Py_ssize_t i;
  for (i = 0; i < n; i++)
    if (!items[i]) goto out;
  t = cls->tp_alloc(cls, n);
  if (t)
    for (i = 0; i < n; i++) PyTuple_SET_ITEM(t, i, items[i]), items[i] = NULL;
out:
  for (i = 0; i < n; i++) Py_XDECREF(items[i]);
  return t;
}

/* A borrowed field as str (None when absent): UTF-8, any other byte as a surrogate escape. */
static PyObject *field(bs_val v) {
  if (!v.data) return Py_NewRef(Py_None);
  return PyUnicode_DecodeUTF8(v.data, (Py_ssize_t)v.size, "surrogateescape");
}

static PyObject *opt_id(uint64_t id) {
  return id ? PyLong_FromUnsignedLongLong(id) : Py_NewRef(Py_None);
}

/* The object type of the chunk's previous op: most ops of a bucket repeat it, and they share
 * one str then. */
typedef struct {
  bs_val val;
  PyObject *str; /* borrowed from the previous Op */
} last_type;

static PyObject *object_type(bs_val v, last_type *last) {
  if (last->str && v.data && v.size == last->val.size && !memcmp(v.data, last->val.data, v.size))
    return Py_NewRef(last->str);
  last->str = NULL, last->val = v;
  return field(v);
}

static PyObject *op_tuple(const bs_op *op, last_type *last) {
  PyObject *f[8], *t;
  Py_ssize_t type = (Py_ssize_t)op->type;
  f[0] = PyLong_FromUnsignedLongLong(op->op_id);
  f[1] = type > 0 && type < PyTuple_GET_SIZE(op_types) ? Py_NewRef(PyTuple_GET_ITEM(op_types, type))
                                                       : PyLong_FromSsize_t(type);
  f[2] = object_type(op->object_type, last);
  f[3] = field(op->object_id);
  f[4] = field(op->subkey);
  f[5] = field(op->data);
  f[6] = PyLong_FromUnsignedLong(op->checksum);
  f[7] = opt_id(op->target_op);
  if (!(t = named(op_cls, f, 8))) return NULL;
  last->str = PyTuple_GET_ITEM(t, 2);
  /* An Op holds str, int, None and an OpType member, none of which can lead back to it: it is
   * never part of a cycle, so the collector need not track it (a batch makes thousands, and
   * each collection would walk them all). */
  PyObject_GC_UnTrack(t);
  return t;
}

typedef struct {
  PyObject *chunks;
  PyThreadState *ts; /* the released thread state: callbacks take the GIL back */
} reader;

static int on_chunk(const bs_chunk *c, void *payload) {
  reader *r = payload;
  PyObject *f[6], *ch;
  int rc = 0;
  PyEval_RestoreThread(r->ts);
  last_type last = {{NULL, 0}, NULL};
  f[5] = PyList_New((Py_ssize_t)c->n_ops);
  for (size_t i = 0; f[5] && i < c->n_ops; i++) {
    PyObject *op = op_tuple(&c->ops[i], &last);
    if (!op)
      Py_CLEAR(f[5]);
    else
      PyList_SET_ITEM(f[5], (Py_ssize_t)i, op);
  }
  f[0] = field(c->bucket);
  f[1] = PyLong_FromUnsignedLongLong(c->after);
  f[2] = PyLong_FromUnsignedLongLong(c->next_after);
  f[3] = PyBool_FromLong(c->has_more);
  f[4] = opt_id(c->target_op);
  ch = named(chunk_cls, f, 6);
  if (!ch || PyList_Append(r->chunks, ch) < 0) rc = BS_ECANCELED; /* the Python error stays set */
  Py_XDECREF(ch);
  r->ts = PyEval_SaveThread();
  return rc;
}

static PyObject *result(int rc, const bs_error *err, PyObject *value) {
  if (!value) return NULL;
  return Py_BuildValue("(iyN)", rc, rc ? err->msg : "", value);
}

/* bucket_data(storage, checkpoint, [(name bytes, after)], limit, chunk_bytes, max_bytes)
 * -> (rc, message, (chunks, has_more)): one bs_get_bucket_data call, the GIL released but
 * while a chunk's tuples are built. The arguments are checked by the caller. */
static PyObject *native_bucket_data(PyObject *self, PyObject *args) {
  void *st;
  PyObject *h, *reqs, *fast;
  unsigned long long cp;
  bs_batch_options o = BS_BATCH_OPTIONS_INIT;
  Py_ssize_t limit, chunk_bytes, max_bytes;
  bs_error err = {0};
  bs_bucket_request *req;
  reader r;
  Py_ssize_t n, i;
  int rc, more = 0;
  (void)self;
  if (!PyArg_ParseTuple(args, "OKOnnn", &h, &cp, &reqs, &limit, &chunk_bytes, &max_bytes))
    return NULL;
  o.limit = (size_t)limit, o.chunk_bytes = (size_t)chunk_bytes, o.max_bytes = (size_t)max_bytes;
  if (!(st = PyLong_AsVoidPtr(h)) && PyErr_Occurred()) return NULL;
  if (!(fast = PySequence_Fast(reqs, "requests: expected a sequence"))) return NULL;
  n = PySequence_Fast_GET_SIZE(fast);
  if (!(req = PyMem_Calloc(n ? (size_t)n : 1, sizeof *req))) {
    Py_DECREF(fast);
    return PyErr_NoMemory();
  }
  for (i = 0; i < n; i++) {
    PyObject *it = PySequence_Fast_GET_ITEM(fast, i);
    char *data;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(it, "y#K", &data, &size, &req[i].after)) goto fail;
    req[i].bucket.data = data, req[i].bucket.size = (size_t)size;
  }
  if (!(r.chunks = PyList_New(0))) goto fail;
  r.ts = PyEval_SaveThread();
  rc = bs_get_bucket_data(&more, st, cp, req, (size_t)n, &o, on_chunk, &r, &err);
  PyEval_RestoreThread(r.ts);
  PyMem_Free(req);
  Py_DECREF(fast);
  if (PyErr_Occurred()) {
    Py_DECREF(r.chunks);
    return NULL;
  }
  return result(rc, &err, Py_BuildValue("(NO)", r.chunks, more ? Py_True : Py_False));
fail:
  PyMem_Free(req);
  Py_DECREF(fast);
  return NULL;
}

/* ---- Saves ---------------------------------------------------------------------------------- */

/* One batch's C arrays, and the Python objects whose bytes they borrow. */
typedef struct {
  PyObject *keep; /* a list: every sequence and bytes object made along the way */
  bs_save *saves;
  Py_ssize_t n;
} batch;

/* Raises InvalidArgumentError(BS_EINVAL, message); returns -1. */
static int inval(const char *fmt, ...) {
  PyObject *msg, *e = NULL;
  va_list ap;
  va_start(ap, fmt);
  msg = PyUnicode_FromFormatV(fmt, ap);
  va_end(ap);
  if (msg) e = PyObject_CallFunction(inval_cls, "iN", BS_EINVAL, msg);
  if (e) PyErr_SetObject(inval_cls, e);
  Py_XDECREF(e);
  return -1;
}

/* *out = the bytes of o: a str's UTF-8 (refused with InvalidArgumentError, a ValueError, when it
 * is not valid Unicode: lone surrogates), a bytes' bytes, another buffer's copy. */
static int val(batch *b, PyObject *o, bs_val *out, const char *what, Py_ssize_t i,
               const char *field_name) {
  Py_ssize_t size;
  const char *data;
  if (PyUnicode_Check(o)) {
    if (!(data = PyUnicode_AsUTF8AndSize(o, &size))) {
      if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return -1;
      PyErr_Clear(); /* (bucketstore._core.NOT_UNICODE says the same) */
      return inval("%s[%zd]%s: not valid Unicode (a lone surrogate); pass bytes for bytes that "
                   "are not UTF-8",
                   what, i, field_name);
    }
  } else if (PyBytes_Check(o)) {
    data = PyBytes_AS_STRING(o), size = PyBytes_GET_SIZE(o);
  } else if (PyObject_CheckBuffer(o)) {
    PyObject *copy = PyBytes_FromObject(o);
    if (!copy || PyList_Append(b->keep, copy) < 0) {
      Py_XDECREF(copy);
      return -1;
    }
    Py_DECREF(copy);
    data = PyBytes_AS_STRING(copy), size = PyBytes_GET_SIZE(copy);
  } else {
    PyErr_Format(PyExc_TypeError, "%s[%zd]%s: expected str or bytes, got %.100s", what, i,
                 field_name, Py_TYPE(o)->tp_name);
    return -1;
  }
  out->data = data, out->size = (size_t)size;
  return 0;
}

/* A sequence as a list or tuple kept alive by the batch (NULL: error set). */
static PyObject *seq(batch *b, PyObject *o, const char *msg) {
  PyObject *f;
  if (PyUnicode_Check(o) || PyBytes_Check(o)) {
    PyErr_SetString(PyExc_TypeError, msg);
    return NULL;
  }
  if (!(f = PySequence_Fast(o, msg))) return NULL;
  if (PyList_Append(b->keep, f) < 0) f = NULL;
  Py_XDECREF(f);
  return f;
}

static void *arena(batch *b, size_t n, size_t size) {
  /* a bytes object as the allocation: freed with the batch's keep list */
  PyObject *mem = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n ? n * size : 1));
  if (!mem || PyList_Append(b->keep, mem) < 0) {
    Py_XDECREF(mem);
    return NULL;
  }
  Py_DECREF(mem);
  memset(PyBytes_AS_STRING(mem), 0, n ? n * size : 1);
  return PyBytes_AS_STRING(mem);
}

static int tag_of(PyObject *t, Py_ssize_t i) {
  long v = 0;
  if (PyUnicode_Check(t)) {
    if (PyUnicode_CompareWithASCIIString(t, "insert") == 0) return BS_INSERT;
    if (PyUnicode_CompareWithASCIIString(t, "update") == 0) return BS_UPDATE;
    if (PyUnicode_CompareWithASCIIString(t, "delete") == 0) return BS_DELETE;
  } else if (PyLong_Check(t) && !PyBool_Check(t)) {
    v = PyLong_AsLong(t);
    if (v >= BS_INSERT && v <= BS_DELETE) return (int)v;
    PyErr_Clear();
  }
  return inval("saves[%zd].tag: %R is not one of 'insert', 'update', 'delete'", i, t);
}

static int rows_of(batch *b, PyObject *o, bs_save *s, Py_ssize_t i) {
  static const char *names[4] = {".bucket", ".object_type", ".object_id", ".data"};
  PyObject *rows = seq(b, o, "rows: expected a sequence of (bucket, object_type, object_id, data)");
  bs_row *out;
  Py_ssize_t n, j;
  if (!rows) return -1;
  n = PySequence_Fast_GET_SIZE(rows);
  if (!(out = arena(b, (size_t)n, sizeof *out))) return -1;
  for (j = 0; j < n; j++) {
    PyObject *r = PySequence_Fast_GET_ITEM(rows, j);
    bs_val *f[4] = {&out[j].bucket, &out[j].object_type, &out[j].object_id, &out[j].data};
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 4) {
      if (!(r = seq(b, r, "rows: expected (bucket, object_type, object_id, data)"))) return -1;
      if (PySequence_Fast_GET_SIZE(r) != 4) {
        PyErr_Format(PyExc_TypeError, "rows[%zd]: expected (bucket, object_type, object_id, data)",
                     j);
        return -1;
      }
    }
    for (int k = 0; k < 4; k++)
      if (val(b, PySequence_Fast_GET_ITEM(r, k), f[k], "rows", j, names[k]) < 0) return -1;
  }
  s->rows = out, s->n_rows = (size_t)n;
  return 0;
}

static int lookups_of(batch *b, PyObject *o, bs_save *s) {
  PyObject *ls = seq(b, o, "lookups: expected a sequence of (values, params)");
  bs_lookup *out;
  Py_ssize_t n, j;
  if (!ls) return -1;
  n = PySequence_Fast_GET_SIZE(ls);
  if (!n) return 0;
  if (!(out = arena(b, (size_t)n, sizeof *out))) return -1;
  for (j = 0; j < n; j++) {
    PyObject *l = PySequence_Fast_GET_ITEM(ls, j), *key, *params;
    bs_val *pv;
    Py_ssize_t np;
    if (!(l = seq(b, l, "lookups: expected (values, params)"))) return -1;
    if (PySequence_Fast_GET_SIZE(l) != 2) {
      PyErr_Format(PyExc_TypeError, "lookups[%zd]: expected (values, params)", j);
      return -1;
    }
    params =
        seq(b, PySequence_Fast_GET_ITEM(l, 1), "lookups params: expected a list of JSON texts");
    if (!params) return -1;
    key = PyObject_CallFunctionObjArgs(encode_lookup, PySequence_Fast_GET_ITEM(l, 0), params, NULL);
    if (!key || PyList_Append(b->keep, key) < 0 || val(b, key, &out[j].key, "lookups", j, "") < 0) {
      Py_XDECREF(key);
      return -1;
    }
    Py_DECREF(key);
    np = PySequence_Fast_GET_SIZE(params);
    if (!(pv = arena(b, (size_t)np, sizeof *pv))) return -1;
    for (Py_ssize_t k = 0; k < np; k++)
      if (val(b, PySequence_Fast_GET_ITEM(params, k), &pv[k], "lookups params", k, "") < 0)
        return -1;
    out[j].params = pv, out[j].n_params = (size_t)np;
  }
  s->lookups = out, s->n_lookups = (size_t)n;
  return 0;
}

/* One save: (table, tag, id, rows, lookups, old_id, store), Writer.save's arguments. */
static int save_of(batch *b, PyObject *o, bs_save *s, Py_ssize_t i) {
  PyObject *table, *tag, *id, *rows = NULL, *lookups = NULL, *old_id = Py_None, *store = Py_None;
  int t;
  if (!PyTuple_Check(o)) {
    PyErr_Format(PyExc_TypeError,
                 "saves[%zd]: expected a tuple (table, tag, id, rows, lookups, old_id, store)", i);
    return -1;
  }
  if (!PyArg_UnpackTuple(o, "save", 3, 7, &table, &tag, &id, &rows, &lookups, &old_id, &store))
    return -1;
  if ((t = tag_of(tag, i)) < 0) return -1;
  s->version = BS_SAVE_VERSION, s->tag = (bs_tag)t;
  if (val(b, table, &s->table, "saves", i, ".table") < 0) return -1;
  if (t == BS_DELETE)
    return val(b, old_id == Py_None ? id : old_id, &s->before_id, "saves", i, ".id");
  if (val(b, id, &s->after_id, "saves", i, ".id") < 0) return -1;
  if (old_id != Py_None && val(b, old_id, &s->before_id, "saves", i, ".old_id") < 0) return -1;
  if (rows && rows_of(b, rows, s, i) < 0) return -1;
  if (lookups && lookups_of(b, lookups, s) < 0) return -1;
  if (store != Py_None && val(b, store, &s->stored_data, "saves", i, ".store") < 0) return -1;
  return 0;
}

/* save_many(writer, saves) -> (rc, message, (index, queued)): every save converted (a bad one
 * raises) and checked by the library's rules (bs_writer_check_save) before any is queued, then
 * queued in order, the GIL released; index = the save refused (a check refuses before any is
 * queued: queued 0; queueing itself may fail later, e.g. out of memory, after queued saves). */
static PyObject *native_save_many(PyObject *self, PyObject *args) {
  PyObject *h, *o, *fast;
  void *w;
  batch b;
  bs_error err = {0};
  Py_ssize_t i, done = 0;
  int rc = 0;
  PyThreadState *ts;
  (void)self;
  if (!PyArg_ParseTuple(args, "OO", &h, &o)) return NULL;
  if (!(w = PyLong_AsVoidPtr(h)) && PyErr_Occurred()) return NULL;
  if (!(b.keep = PyList_New(0))) return NULL;
  if (!(fast = seq(&b, o, "saves: expected an iterable of saves"))) goto fail;
  b.n = PySequence_Fast_GET_SIZE(fast);
  if (!(b.saves = arena(&b, (size_t)b.n, sizeof *b.saves))) goto fail;
  for (i = 0; i < b.n; i++)
    if (save_of(&b, PySequence_Fast_GET_ITEM(fast, i), &b.saves[i], i) < 0) goto fail;
  ts = PyEval_SaveThread();
  for (i = 0; i < b.n && !(rc = bs_writer_check_save(w, &b.saves[i], &err)); i++) {
  }
  if (!rc)
    for (; done < b.n && !(rc = bs_writer_save(w, &b.saves[done], &err)); done++) {
    }
  PyEval_RestoreThread(ts);
  Py_DECREF(b.keep);
  /* i < b.n: the check refused saves[i]; else queueing refused saves[done] */
  return result(rc, &err, Py_BuildValue("(nn)", i < b.n ? i : done, done));
fail:
  Py_DECREF(b.keep);
  return NULL;
}

static PyMethodDef native_methods[] = {{"setup", native_setup, METH_VARARGS, NULL},
                                       {"bucket_data", native_bucket_data, METH_VARARGS, NULL},
                                       {"save_many", native_save_many, METH_VARARGS, NULL},
                                       {NULL, NULL, 0, NULL}};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    "bucketstore._native",
    "The bucketstore C library and the binding's C functions.",
    -1,
    native_methods,
    NULL,
    NULL,
    NULL,
    NULL};

PyMODINIT_FUNC PyInit__native(void) {
  return PyModule_Create(&native_module);
}
