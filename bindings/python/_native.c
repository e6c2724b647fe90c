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

#ifndef Py_SET_SIZE /* 3.9's */
#define Py_SET_SIZE(o, n) (Py_SIZE(o) = (n))
#endif
#if PY_VERSION_HEX < 0x030A0000 /* Py_NewRef is 3.10's */
static inline PyObject *Py_NewRef(PyObject *o) {
  Py_INCREF(o);
  return o;
}
#endif

/* Set once by setup(): the namedtuple classes results are built as (Op, Chunk, RawChunk), the
 * OpType members by type number, the lookup encoder (bucketstore._core._save_lookup: the key of
 * values, params checked) and InvalidArgumentError. */
static PyTypeObject *op_cls, *chunk_cls, *raw_chunk_cls;
static PyObject *op_types, *encode_lookup, *inval_cls;

static PyObject *native_setup(PyObject *self, PyObject *args) {
  PyObject *o, *c, *t, *e, *x, *rc;
  (void)self;
  if (!PyArg_ParseTuple(args, "O!O!O!OOO!", &PyType_Type, &o, &PyType_Type, &c, &PyTuple_Type, &t,
                        &e, &x, &PyType_Type, &rc))
    return NULL;
  Py_XSETREF(raw_chunk_cls, (PyTypeObject *)Py_NewRef(rc));
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

/* A borrowed field as str (None when absent): UTF-8, any other byte as a surrogate escape.
 * ASCII (most fields: ids, subkeys, JSON rows) is checked a word at a time and copied into a new
 * str, which is what the decoder does too, less its call and set-up: a quarter of a read's
 * instructions went to PyUnicode_DecodeUTF8, about 200 a field (bench/README.md). */
static PyObject *field(bs_val v) {
  const unsigned char *p = (const unsigned char *)v.data;
  uint64_t any = 0, w;
  size_t i = 0;
  PyObject *s;
  if (!p) return Py_NewRef(Py_None);
  for (; i + 8 <= v.size; i += 8) memcpy(&w, p + i, 8), any |= w;
  for (; i < v.size; i++) any |= p[i];
  if (any & 0x8080808080808080ull)
    return PyUnicode_DecodeUTF8(v.data, (Py_ssize_t)v.size, "surrogateescape");
  if ((s = PyUnicode_New((Py_ssize_t)v.size, 127)) && v.size)
    memcpy(PyUnicode_1BYTE_DATA(s), p, v.size);
  return s;
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

static PyObject *op_type_of(uint32_t type) {
  Py_ssize_t t = (Py_ssize_t)type;
  return t > 0 && t < PyTuple_GET_SIZE(op_types) ? Py_NewRef(PyTuple_GET_ITEM(op_types, t))
                                                 : PyLong_FromSsize_t(t);
}

/* An Op: its fields written straight into the new tuple (named()'s arrays and loops were an
 * eighth of the instructions of making an Op); a field that fails leaves NULL, which the
 * tuple's dealloc skips. */
static PyObject *op_tuple(const bs_op *op, last_type *last) {
  PyObject *t = op_cls->tp_alloc(op_cls, 8), *s;
  if (!t) return NULL;
  if (!(s = PyLong_FromUnsignedLongLong(op->op_id))) goto fail;
  PyTuple_SET_ITEM(t, 0, s);
  if (!(s = op_type_of((uint32_t)op->type))) goto fail;
  PyTuple_SET_ITEM(t, 1, s);
  if (!(s = object_type(op->object_type, last))) goto fail;
  PyTuple_SET_ITEM(t, 2, s);
  if (!(s = field(op->object_id))) goto fail;
  PyTuple_SET_ITEM(t, 3, s);
  if (!(s = field(op->subkey))) goto fail;
  PyTuple_SET_ITEM(t, 4, s);
  if (!(s = field(op->data))) goto fail;
  PyTuple_SET_ITEM(t, 5, s);
  if (!(s = PyLong_FromUnsignedLong(op->checksum))) goto fail;
  PyTuple_SET_ITEM(t, 6, s);
  if (!(s = opt_id(op->target_op))) goto fail;
  PyTuple_SET_ITEM(t, 7, s);
  last->str = PyTuple_GET_ITEM(t, 2);
  /* An Op holds str, int, None and an OpType member, none of which can lead back to it: it is
   * never part of a cycle, so the collector need not track it (a batch makes thousands, and
   * each collection would walk them all). */
  PyObject_GC_UnTrack(t);
  return t;
fail:
  Py_DECREF(t);
  return NULL;
}

/* ---- Raw reads: RawOps --------------------------------------------------------------------- */

/* A chunk's ops in raw mode (Storage.bucket_data_raw): their four byte fields copied into one
 * bytes object (buffer), and per op its numbers and where each field lies in buffer. An Op is
 * six Python objects (a tuple, two ints, three str), and making and freeing them is most of what
 * a read costs in the default mode (bench/README.md); here a chunk is two objects, and a field
 * becomes a str only when it is asked for. */
enum { F_OBJECT_TYPE, F_OBJECT_ID, F_SUBKEY, F_DATA, N_FIELDS };
static const char *const field_names[N_FIELDS] = {"object_type", "object_id", "subkey", "data"};

typedef struct {
  uint64_t op_id, target_op;
  uint32_t checksum, type;
  Py_ssize_t start[N_FIELDS]; /* offset in buffer; -1: the field is absent (None) */
  Py_ssize_t size[N_FIELDS];
} raw_op;

typedef struct {
  PyVarObject ob_base; /* (PyObject_VAR_HEAD) ob_size: the number of ops */
  PyObject *buffer;    /* bytes */
  raw_op ops[1];
} raw_ops;

static PyTypeObject raw_ops_type;

static PyObject *raw_ops_new(const bs_chunk *c) {
  Py_ssize_t n = (Py_ssize_t)c->n_ops, total = 0, at = 0;
  raw_ops *r;
  char *buf;
  for (size_t i = 0; i < c->n_ops; i++) {
    const bs_op *op = &c->ops[i];
    total +=
        (Py_ssize_t)(op->object_type.size + op->object_id.size + op->subkey.size + op->data.size);
  }
  if (!(r = PyObject_NewVar(raw_ops, &raw_ops_type, n ? n : 1))) return NULL;
  Py_SET_SIZE(r, n);
  r->buffer = NULL; /* (PyObject_NewVar leaves it unset; the dealloc reads it) */
  if (!(r->buffer = PyBytes_FromStringAndSize(NULL, total))) {
    Py_DECREF(r);
    return NULL;
  }
  buf = PyBytes_AS_STRING(r->buffer);
  for (size_t i = 0; i < c->n_ops; i++) {
    const bs_op *op = &c->ops[i];
    const bs_val *v[N_FIELDS] = {&op->object_type, &op->object_id, &op->subkey, &op->data};
    raw_op *o = &r->ops[i];
    o->op_id = op->op_id, o->target_op = op->target_op;
    o->checksum = op->checksum, o->type = (uint32_t)op->type;
    for (int k = 0; k < N_FIELDS; k++) {
      o->size[k] = (Py_ssize_t)v[k]->size;
      if (!v[k]->data) {
        o->start[k] = -1;
        continue;
      }
      o->start[k] = at;
      if (v[k]->size) memcpy(buf + at, v[k]->data, v[k]->size);
      at += (Py_ssize_t)v[k]->size;
    }
  }
  return (PyObject *)r;
}

static void raw_ops_dealloc(PyObject *self) {
  Py_XDECREF(((raw_ops *)self)->buffer);
  Py_TYPE(self)->tp_free(self);
}

/* The op at index o (negative: from the end, as a list's), or NULL with IndexError/TypeError. */
static const raw_op *raw_at(raw_ops *r, PyObject *o) {
  Py_ssize_t i = PyNumber_AsSsize_t(o, PyExc_IndexError);
  if (i == -1 && PyErr_Occurred()) return NULL;
  if (i < 0) i += Py_SIZE(r);
  if (i < 0 || i >= Py_SIZE(r)) {
    PyErr_Format(PyExc_IndexError, "RawOps index out of range (%zd ops)", Py_SIZE(r));
    return NULL;
  }
  return &r->ops[i];
}

static int field_of(PyObject *name) {
  if (PyUnicode_Check(name))
    for (int k = 0; k < N_FIELDS; k++)
      if (PyUnicode_CompareWithASCIIString(name, field_names[k]) == 0) return k;
  PyErr_Format(PyExc_ValueError,
               "field: expected 'object_type', 'object_id', 'subkey' or 'data', got %R", name);
  return -1;
}

static bs_val raw_val(raw_ops *r, const raw_op *o, int k) {
  bs_val v = {NULL, 0};
  if (o->start[k] >= 0)
    v.data = PyBytes_AS_STRING(r->buffer) + o->start[k], v.size = (size_t)o->size[k];
  return v;
}

static PyObject *raw_op_id(PyObject *self, PyObject *i) {
  const raw_op *o = raw_at((raw_ops *)self, i);
  return o ? PyLong_FromUnsignedLongLong(o->op_id) : NULL;
}
static PyObject *raw_type(PyObject *self, PyObject *i) {
  const raw_op *o = raw_at((raw_ops *)self, i);
  return o ? op_type_of(o->type) : NULL;
}
static PyObject *raw_checksum(PyObject *self, PyObject *i) {
  const raw_op *o = raw_at((raw_ops *)self, i);
  return o ? PyLong_FromUnsignedLong(o->checksum) : NULL;
}
static PyObject *raw_target_op(PyObject *self, PyObject *i) {
  const raw_op *o = raw_at((raw_ops *)self, i);
  return o ? opt_id(o->target_op) : NULL;
}
#define RAW_STR(name, k)                                                                           \
  static PyObject *raw_##name(PyObject *self, PyObject *i) {                                       \
    const raw_op *o = raw_at((raw_ops *)self, i);                                                  \
    return o ? field(raw_val((raw_ops *)self, o, k)) : NULL;                                       \
  }
RAW_STR(object_type, F_OBJECT_TYPE)
RAW_STR(object_id, F_OBJECT_ID)
RAW_STR(subkey, F_SUBKEY)
RAW_STR(data, F_DATA)

/* (i, field) -> the op and the field's number, or NULL with the error set. */
static const raw_op *raw_args(PyObject *self, PyObject *const *args, Py_ssize_t n, const char *fn,
                              int *k) {
  const raw_op *o;
  if (n != 2) {
    PyErr_Format(PyExc_TypeError, "RawOps.%s(i, field) takes 2 arguments (%zd given)", fn, n);
    return NULL;
  }
  if (!(o = raw_at((raw_ops *)self, args[0])) || (*k = field_of(args[1])) < 0) return NULL;
  return o;
}

static PyObject *raw_bytes(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  int k;
  const raw_op *o = raw_args(self, args, n, "bytes", &k);
  if (!o) return NULL;
  if (o->start[k] < 0) Py_RETURN_NONE;
  return PyBytes_FromStringAndSize(PyBytes_AS_STRING(((raw_ops *)self)->buffer) + o->start[k],
                                   o->size[k]);
}
static PyObject *raw_byte_start(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  int k;
  const raw_op *o = raw_args(self, args, n, "byte_start", &k);
  return o ? PyLong_FromSsize_t(o->start[k]) : NULL;
}
static PyObject *raw_byte_end(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  int k;
  const raw_op *o = raw_args(self, args, n, "byte_end", &k);
  return o ? PyLong_FromSsize_t(o->start[k] < 0 ? -1 : o->start[k] + o->size[k]) : NULL;
}

/* ops[i]: the Op the default mode gives. */
static PyObject *raw_item(PyObject *self, Py_ssize_t i) {
  raw_ops *r = (raw_ops *)self;
  const raw_op *o;
  bs_op op;
  last_type last = {{NULL, 0}, NULL};
  if (i < 0 || i >= Py_SIZE(r)) {
    PyErr_Format(PyExc_IndexError, "RawOps index out of range (%zd ops)", Py_SIZE(r));
    return NULL;
  }
  o = &r->ops[i];
  op.op_id = o->op_id, op.type = (bs_op_type)o->type, op.checksum = o->checksum;
  op.target_op = o->target_op;
  op.object_type = raw_val(r, o, F_OBJECT_TYPE), op.object_id = raw_val(r, o, F_OBJECT_ID);
  op.subkey = raw_val(r, o, F_SUBKEY), op.data = raw_val(r, o, F_DATA);
  return op_tuple(&op, &last);
}

static Py_ssize_t raw_len(PyObject *self) {
  return Py_SIZE(self);
}

static PyObject *raw_buffer(PyObject *self, void *closure) {
  (void)closure;
  return Py_NewRef(((raw_ops *)self)->buffer);
}

static PyObject *raw_repr(PyObject *self) {
  return PyUnicode_FromFormat("<bucketstore.RawOps of %zd ops>", Py_SIZE(self));
}

static PyMethodDef raw_methods[] = {
    {"op_id", raw_op_id, METH_O, "op_id(i) -> int: Op.op_id of the op at index i."},
    {"op", raw_type, METH_O, "op(i) -> OpType: Op.op."},
    {"checksum", raw_checksum, METH_O, "checksum(i) -> int: Op.checksum (unsigned 32-bit)."},
    {"target_op", raw_target_op, METH_O, "target_op(i) -> int | None: Op.target_op."},
    {"object_type", raw_object_type, METH_O, "object_type(i) -> str | None: Op.object_type."},
    {"object_id", raw_object_id, METH_O, "object_id(i) -> str | None: Op.object_id."},
    {"subkey", raw_subkey, METH_O, "subkey(i) -> str | None: Op.subkey."},
    {"data", raw_data, METH_O, "data(i) -> str | None: Op.data."},
    {"bytes", (PyCFunction)(void (*)(void))raw_bytes, METH_FASTCALL,
     "bytes(i, field) -> bytes | None: the field's bytes (a copy)."},
    {"byte_start", (PyCFunction)(void (*)(void))raw_byte_start, METH_FASTCALL,
     "byte_start(i, field) -> int: where the field starts in buffer, -1 when it is None."},
    {"byte_end", (PyCFunction)(void (*)(void))raw_byte_end, METH_FASTCALL,
     "byte_end(i, field) -> int: where the field ends in buffer, -1 when it is None."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef raw_getset[] = {
    {"buffer", raw_buffer, NULL, "The bytes of every field of the chunk's ops.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods raw_as_sequence = {.sq_length = raw_len, .sq_item = raw_item};

static PyTypeObject raw_ops_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "bucketstore.RawOps",
    .tp_basicsize = offsetof(raw_ops, ops),
    .tp_itemsize = sizeof(raw_op),
    .tp_dealloc = raw_ops_dealloc,
    .tp_repr = raw_repr,
    .tp_as_sequence = &raw_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The ops of one chunk in raw mode (Storage.bucket_data_raw): their fields in one "
              "bytes object, decoded when read.",
    .tp_methods = raw_methods,
    .tp_getset = raw_getset,
};

/* ---- Reading -------------------------------------------------------------------------------- */

typedef struct {
  PyObject *chunks;
  PyThreadState *ts; /* the released thread state: callbacks take the GIL back */
  int raw;           /* a chunk's ops as RawOps, else a list of Op */
} reader;

static int on_chunk(const bs_chunk *c, void *payload) {
  reader *r = payload;
  PyObject *f[6], *ch;
  int rc = 0;
  PyEval_RestoreThread(r->ts);
  last_type last = {{NULL, 0}, NULL};
  if (r->raw) {
    f[5] = raw_ops_new(c);
  } else {
    f[5] = PyList_New((Py_ssize_t)c->n_ops);
    for (size_t i = 0; f[5] && i < c->n_ops; i++) {
      PyObject *op = op_tuple(&c->ops[i], &last);
      if (!op)
        Py_CLEAR(f[5]);
      else
        PyList_SET_ITEM(f[5], (Py_ssize_t)i, op);
    }
  }
  f[0] = field(c->bucket);
  f[1] = PyLong_FromUnsignedLongLong(c->after);
  f[2] = PyLong_FromUnsignedLongLong(c->next_after);
  f[3] = PyBool_FromLong(c->has_more);
  f[4] = opt_id(c->target_op);
  ch = named(r->raw ? raw_chunk_cls : chunk_cls, f, 6);
  if (!ch || PyList_Append(r->chunks, ch) < 0) rc = BS_ECANCELED; /* the Python error stays set */
  Py_XDECREF(ch);
  r->ts = PyEval_SaveThread();
  return rc;
}

static PyObject *result(int rc, const bs_error *err, PyObject *value) {
  if (!value) return NULL;
  return Py_BuildValue("(iyN)", rc, rc ? err->msg : "", value);
}

/* bucket_data(storage, checkpoint, [(name bytes, after)], limit, chunk_bytes, max_bytes, raw)
 * -> (rc, message, (chunks, has_more)): one bs_get_bucket_data call, the GIL released but
 * while a chunk's tuples are built; raw: a chunk's ops as one RawOps (chunk_cls is then
 * RawChunk's). The arguments are checked by the caller. */
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
  if (!PyArg_ParseTuple(args, "OKOnnnp", &h, &cp, &reqs, &limit, &chunk_bytes, &max_bytes, &r.raw))
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
  PyObject *m;
  if (PyType_Ready(&raw_ops_type) < 0 || !(m = PyModule_Create(&native_module))) return NULL;
  Py_INCREF(&raw_ops_type);
  if (PyModule_AddObject(m, "RawOps", (PyObject *)&raw_ops_type) < 0) {
    Py_DECREF(&raw_ops_type);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
