/* bucketstore._native: the C library compiled into the extension module (setup.py), so the
 * package needs no libbucketstore.so at run time, and the binding's two hot paths in C: reading
 * bucket data into Op and Chunk tuples, and queueing saves (Writer.save and save_many: the
 * writer's lock, checks and conversions in one call). The rest of the
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
 * values, params checked), InvalidArgumentError and the exception of a status code
 * (bucketstore._core._error_msg(rc, message)). */
static PyTypeObject *op_cls, *chunk_cls, *raw_chunk_cls;
static PyObject *op_types, *encode_lookup, *inval_cls, *error_of;

/* Op's deallocator. Op is a NamedTuple class (a heap type, a tuple subclass with no __dict__ or
 * __weakref__), and the one CPython gives such a class, subtype_dealloc, checks for finalizers,
 * slots, a dict and weak references, then calls tuple's, which decrefs the items and calls
 * tp_free: 240 of the 580 instructions that freeing an Op took (bench/README.md). An Op has
 * none of those, so this does what the two end up doing: untrack (an Op made by Python code is
 * tracked), decref the items (inside the trashcan, as tuple's does: an Op made by Python code
 * may hold anything, nested Ops too), free, and drop the instance's reference to its heap type.
 * A subclass of Op keeps subtype_dealloc, which clears what the subclass added and then calls
 * this as its base's (not dropping the type's reference itself: the base is a heap type). */
/* Freed Ops of op_cls, kept for the next ones (op_new): a read frees a chunk's Ops and makes
 * the next chunk's, and allocating and freeing an Op (the collector's header, pymalloc) was 150
 * instructions of the 1,640 an op took. At most OP_FREE_MAX are kept, CPython's own bound on
 * its free list of tuples of a size (PyTuple_MAXFREELIST, 2000): about 200 kB at most, and the
 * str they keep (below) about 3 MB at most. Touched only with the GIL held; a build without the
 * GIL keeps none. */
#ifdef Py_GIL_DISABLED
enum { OP_FREE_MAX = 0 };
#else
enum { OP_FREE_MAX = 2000 };
#endif
static PyObject *op_free[OP_FREE_MAX ? OP_FREE_MAX : 1];
static int n_op_free;

/* The items of an Op that are str an op does not share with the op before it (object_id, subkey,
 * data; object_type usually is shared, see object_type()). A freed Op in op_free keeps such a str
 * when nobody else holds it (str_reusable), and the next Op made from it writes the next field's
 * characters over it when they fit (op_str): allocating and freeing the three str was about 470
 * of the 1,524 instructions an op took (bench/README.md). The other items of a freed Op are
 * NULL. */
enum { OP_STR_FIRST = 3, OP_STR_END = 6 };

/* A str is kept only up to a length whose str pymalloc allocates (objects of 512 bytes at most):
 * at most 2000 Ops hold three of them, about 3 MB, and a long row's str is not held after its
 * read. */
enum { OP_STR_KEEP_MAX = 512 - (int)sizeof(PyASCIIObject) - 1 };

/* Whether str s of a freed Op may be written over: what CPython asks before it changes a str in
 * place (unicodeobject.c, unicode_modifiable: a reference count of 1, a str and not a subclass,
 * not interned; the interned table's references are not counted before 3.12, so an interned str
 * can have a count of 1), and a compact ASCII str (one byte a character, right after its header,
 * as PyUnicode_New(n, 127) makes it; a non-ASCII field is decoded into a new str). The cached
 * hash is reset when it is written over; before 3.12 a str can also carry a wchar_t copy (wstr,
 * from the deprecated PyUnicode_AsUnicode), which would go stale: such a str is freed instead. */
static int str_reusable(PyObject *s) {
  return s && Py_REFCNT(s) == 1 && PyUnicode_CheckExact(s) && PyUnicode_IS_COMPACT_ASCII(s) &&
         PyUnicode_GET_LENGTH(s) <= OP_STR_KEEP_MAX && !PyUnicode_CHECK_INTERNED(s)
#if PY_VERSION_HEX < 0x030C0000
         && !((PyASCIIObject *)s)->wstr
#endif
      ;
}

static void op_dealloc(PyObject *self) {
  PyTypeObject *type = Py_TYPE(self);
  int keep = type == op_cls && Py_SIZE(self) == 8 && n_op_free < OP_FREE_MAX;
  PyObject_GC_UnTrack(self);
  /* (the trashcan's macros open and close a block, which clang-format does not know) */
  /* clang-format off */
  Py_TRASHCAN_BEGIN(self, op_dealloc)
  if (keep) { /* (8 items: a loop the compiler unrolls) */
    for (int i = 8; --i >= 0;) {
      PyObject *o = PyTuple_GET_ITEM(self, i);
      if (i >= OP_STR_FIRST && i < OP_STR_END && str_reusable(o)) continue;
      PyTuple_SET_ITEM(self, i, NULL);
      Py_XDECREF(o); /* (may run code that frees Ops: n_op_free is read again below) */
    }
  } else {
    for (Py_ssize_t i = Py_SIZE(self); --i >= 0;) Py_XDECREF(PyTuple_GET_ITEM(self, i));
  }
  if (keep && n_op_free < OP_FREE_MAX) {
    op_free[n_op_free++] = self; /* untracked, as op_new wants it (op_cls holds the type) */
  } else {
    if (keep) /* (the str it kept) */
      for (int i = OP_STR_FIRST; i < OP_STR_END; i++) Py_XDECREF(PyTuple_GET_ITEM(self, i));
    type->tp_free(self);
  }
  Py_DECREF(type);
  Py_TRASHCAN_END
  /* clang-format on */
}

/* A new Op, untracked, its items NULL but for the str a freed Op kept (the caller sets them all:
 * op_str for those). */
static PyObject *op_new(void) {
  PyObject *t;
  if (n_op_free) {
    t = op_free[--n_op_free];
    PyObject_InitVar((PyVarObject *)t, op_cls, 8); /* (the type's reference, a refcount of 1) */
    return t;
  }
  if (!(t = (PyObject *)PyObject_GC_NewVar(PyTupleObject, op_cls, 8))) return NULL;
  for (int i = 0; i < 8; i++) PyTuple_SET_ITEM(t, i, NULL);
  return t;
}

static void op_free_clear(void) {
  while (n_op_free) {
    PyObject *t = op_free[--n_op_free];
    for (int i = OP_STR_FIRST; i < OP_STR_END; i++) Py_XDECREF(PyTuple_GET_ITEM(t, i));
    PyObject_GC_Del(t);
  }
}

/* Whether op_dealloc can stand in for cls's deallocator: a heap type directly under tuple, its
 * instances no larger than a tuple's (no dict, no weak references), with no finalizer. */
static int plain_tuple_class(PyTypeObject *cls) {
  return (cls->tp_flags & Py_TPFLAGS_HEAPTYPE) && cls->tp_base == &PyTuple_Type &&
         cls->tp_basicsize == PyTuple_Type.tp_basicsize &&
         cls->tp_itemsize == PyTuple_Type.tp_itemsize && !cls->tp_dictoffset &&
         !cls->tp_weaklistoffset && !cls->tp_finalize && !cls->tp_del &&
         cls->tp_free == PyObject_GC_Del;
}

static PyObject *native_setup(PyObject *self, PyObject *args) {
  PyObject *o, *c, *t, *e, *x, *rc, *eo;
  (void)self;
  if (!PyArg_ParseTuple(args, "O!O!O!OOO!O", &PyType_Type, &o, &PyType_Type, &c, &PyTuple_Type, &t,
                        &e, &x, &PyType_Type, &rc, &eo))
    return NULL;
  Py_XSETREF(error_of, Py_NewRef(eo));
  Py_XSETREF(raw_chunk_cls, (PyTypeObject *)Py_NewRef(rc));
  Py_XSETREF(inval_cls, Py_NewRef(x));
  op_free_clear(); /* (Ops of the class before) */
  Py_XSETREF(op_cls, (PyTypeObject *)Py_NewRef(o));
  if (plain_tuple_class(op_cls)) op_cls->tp_dealloc = op_dealloc;
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

/* Whether the n bytes at p are ASCII: four words an iteration, then a word at a time, then the
 * last word again (overlapping what was read: no loop over the last bytes but in a field
 * shorter than a word). The byte loop this replaced took a third of field()'s instructions. */
static inline uint64_t load8(const unsigned char *p) {
  uint64_t w;
  memcpy(&w, p, 8); /* (one unaligned load) */
  return w;
}

static int ascii(const unsigned char *p, size_t n) {
  uint64_t any = 0;
  size_t i = 0;
  if (n < 8) {
    for (; i < n; i++) any |= p[i];
    return !(any & 0x80);
  }
  for (; i + 32 <= n; i += 32)
    any |= load8(p + i) | load8(p + i + 8) | load8(p + i + 16) | load8(p + i + 24);
  for (; i + 8 <= n; i += 8) any |= load8(p + i);
  any |= load8(p + n - 8);
  return !(any & 0x8080808080808080ull);
}

/* A borrowed field as str (None when absent): UTF-8, any other byte as a surrogate escape.
 * ASCII (most fields: ids, subkeys, JSON rows) is checked a word at a time and copied into a new
 * str, which is what the decoder does too, less its call and set-up: a quarter of a read's
 * instructions went to PyUnicode_DecodeUTF8, about 200 a field (bench/README.md). */
static PyObject *field(bs_val v) {
  const unsigned char *p = (const unsigned char *)v.data;
  PyObject *s;
  if (!p) return Py_NewRef(Py_None);
  if (!ascii(p, v.size)) return PyUnicode_DecodeUTF8(v.data, (Py_ssize_t)v.size, "surrogateescape");
  if ((s = PyUnicode_New((Py_ssize_t)v.size, 127)) && v.size)
    memcpy(PyUnicode_1BYTE_DATA(s), p, v.size);
  return s;
}

/* Copies the n bytes at p to d (n >= 8) and says whether they are ASCII: ascii()'s words, each
 * stored as it is read (one pass instead of the check's and memcpy's two). */
static inline void store8(unsigned char *d, uint64_t w) {
  memcpy(d, &w, 8);
}

static int copy_ascii(unsigned char *d, const unsigned char *p, size_t n) {
  uint64_t any = 0, a, b, c, e;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = load8(p + i), b = load8(p + i + 8), c = load8(p + i + 16), e = load8(p + i + 24);
    store8(d + i, a), store8(d + i + 8, b), store8(d + i + 16, c), store8(d + i + 24, e);
    any |= a | b | c | e;
  }
  for (; i + 8 <= n; i += 8) a = load8(p + i), store8(d + i, a), any |= a;
  a = load8(p + n - 8), store8(d + n - 8, a), any |= a;
  return !(any & 0x8080808080808080ull);
}

/* field(v), written over old (a str of a freed Op, str_reusable, or NULL; taken over) when v is
 * ASCII of old's length: the same str as a new one, without allocating and freeing one. */
static PyObject *op_str(bs_val v, PyObject *old) {
  const unsigned char *p = (const unsigned char *)v.data;
  if (!old) return field(v);
  if (p && v.size && (Py_ssize_t)v.size == PyUnicode_GET_LENGTH(old)) {
    unsigned char *d = PyUnicode_1BYTE_DATA(old);
    int ok;
    if (v.size >= 8)
      ok = copy_ascii(d, p, v.size);
    else if ((ok = ascii(p, v.size)))
      memcpy(d, p, v.size);
    if (ok) {
      ((PyASCIIObject *)old)->hash = -1; /* (unset: computed again when asked for) */
      return old;
    }
  }
  Py_DECREF(old); /* (its characters may have been written over: it is freed) */
  return field(v);
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

/* Whether the n bytes at x and y are equal: for 4 to 16 bytes (object types: table names) the
 * first and the last 4 or 8 bytes, overlapping, instead of a call to memcmp (45 instructions an
 * op). */
static inline uint32_t load4(const unsigned char *p) {
  uint32_t w;
  memcpy(&w, p, 4);
  return w;
}

static int same_bytes(const unsigned char *x, const unsigned char *y, size_t n) {
  if (n >= 8 && n <= 16) return load8(x) == load8(y) && load8(x + n - 8) == load8(y + n - 8);
  if (n >= 4 && n < 8) return load4(x) == load4(y) && load4(x + n - 4) == load4(y + n - 4);
  return !memcmp(x, y, n);
}

static PyObject *object_type(bs_val v, last_type *last) {
  if (last->str && v.data && v.size == last->val.size &&
      same_bytes((const unsigned char *)v.data, (const unsigned char *)last->val.data, v.size))
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
 * tuple's dealloc skips. An Op holds str, int, None and an OpType member, none of which can
 * lead back to it: it is never part of a cycle, so the collector need not track it (a batch
 * makes thousands, and each collection would walk them all). It is made untracked (op_new:
 * a freed Op, or PyObject_GC_NewVar; tp_alloc zeroes and tracks it, then it was untracked: 90
 * instructions an Op more). */
static PyObject *op_tuple(const bs_op *op, last_type *last) {
  PyObject *t = op_new(), *s;
  if (!t) return NULL;
  if (!(s = PyLong_FromUnsignedLongLong(op->op_id))) goto fail;
  PyTuple_SET_ITEM(t, 0, s);
  if (!(s = op_type_of((uint32_t)op->type))) goto fail;
  PyTuple_SET_ITEM(t, 1, s);
  if (!(s = object_type(op->object_type, last))) goto fail;
  PyTuple_SET_ITEM(t, 2, s);
  for (int i = OP_STR_FIRST; i < OP_STR_END; i++) {
    PyObject *old = PyTuple_GET_ITEM(t, i);
    PyTuple_SET_ITEM(t, i, NULL); /* (taken over by op_str) */
    if (!(s = op_str(i == 3 ? op->object_id : i == 4 ? op->subkey : op->data, old))) goto fail;
    PyTuple_SET_ITEM(t, i, s);
  }
  if (!(s = PyLong_FromUnsignedLong(op->checksum))) goto fail;
  PyTuple_SET_ITEM(t, 6, s);
  if (!(s = opt_id(op->target_op))) goto fail;
  PyTuple_SET_ITEM(t, 7, s);
  last->str = PyTuple_GET_ITEM(t, 2);
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

/* One call's C arrays, and the Python objects whose bytes they borrow. The library reads the
 * arrays with the GIL released, and a lookup's encoder (Python code) runs in the middle of a
 * batch: another thread or the encoder may change the caller's lists meanwhile, and a str the
 * arrays point into must stay alive all the same. So every object is read from something that
 * cannot change under it: the call's arguments (the caller holds them), a tuple's items (fixed
 * while the tuple lives), an item of a list held by the batch (a new reference of ours), or a
 * list or tuple the batch made (a copy, or list(iterable)). The first arrays and references live
 * on the stack: a single save (Writer.save) allocates nothing (bench/README.md: its per-call
 * list and bytes objects were a tenth of its instructions). */
enum { N_HELD_SMALL = 16, ARENA_SMALL = 768, ARENA_BLOCK = 16384, ARENA_ALIGN = 16 };

typedef struct block {
  struct block *next; /* the block allocated before it */
} block;

typedef struct {
  PyObject **held; /* held_small, or an allocation once that is full */
  Py_ssize_t n_held, cap_held;
  block *blocks; /* the arena's allocations, newest first */
  char *at;      /* the arena's free space: at .. at + left */
  size_t left;
  PyObject *held_small[N_HELD_SMALL];
  _Alignas(ARENA_ALIGN) char small[ARENA_SMALL];
} batch;

static void batch_init(batch *b) {
  b->held = b->held_small, b->n_held = 0, b->cap_held = N_HELD_SMALL;
  b->blocks = NULL, b->at = b->small, b->left = sizeof b->small;
}

static void batch_free(batch *b) {
  for (Py_ssize_t i = 0; i < b->n_held; i++) Py_DECREF(b->held[i]);
  if (b->held != b->held_small) PyMem_Free(b->held);
  while (b->blocks) {
    block *next = b->blocks->next;
    PyMem_Free(b->blocks);
    b->blocks = next;
  }
}

/* Keeps o (a new reference, taken over even when this fails) until batch_free. */
static int hold(batch *b, PyObject *o) {
  if (b->n_held == b->cap_held) {
    size_t cap = (size_t)b->cap_held * 2;
    PyObject **h = b->held == b->held_small ? PyMem_Malloc(cap * sizeof *h)
                                            : PyMem_Realloc(b->held, cap * sizeof *h);
    if (!h) {
      Py_DECREF(o);
      PyErr_NoMemory();
      return -1;
    }
    if (b->held == b->held_small) memcpy(h, b->held_small, sizeof b->held_small);
    b->held = h, b->cap_held = (Py_ssize_t)cap;
  }
  b->held[b->n_held++] = o;
  return 0;
}

/* n zeroed elements of size bytes, freed by batch_free (NULL: MemoryError set). */
static void *arena(batch *b, size_t n, size_t size) {
  size_t need;
  void *p;
  if (n > ((size_t)PY_SSIZE_T_MAX - ARENA_BLOCK) / size) {
    PyErr_NoMemory();
    return NULL;
  }
  need = (n * size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
  if (need > b->left) {
    size_t size_b = need > ARENA_BLOCK ? need : ARENA_BLOCK;
    block *blk = PyMem_Malloc(ARENA_ALIGN + size_b); /* the header padded to the alignment */
    if (!blk) {
      PyErr_NoMemory();
      return NULL;
    }
    blk->next = b->blocks, b->blocks = blk;
    b->at = (char *)blk + ARENA_ALIGN, b->left = size_b;
  }
  p = b->at, b->at += need, b->left -= need;
  memset(p, 0, need);
  return p;
}

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

/* Raises the exception class of status rc (bucketstore._core._error_msg) with message msg,
 * the library's UTF-8 (an invalid byte replaced), after prefix (NULL: none); returns NULL. */
static PyObject *raise_rc(int rc, const char *msg, PyObject *prefix) {
  PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace"), *e = NULL;
  if (text && prefix) Py_SETREF(text, PyUnicode_Concat(prefix, text));
  if (text) e = PyObject_CallFunction(error_of, "iN", rc, text);
  if (e) PyErr_SetObject((PyObject *)Py_TYPE(e), e);
  Py_XDECREF(e);
  return NULL;
}

/* *out = the bytes of o: a str's UTF-8 (refused with InvalidArgumentError, a ValueError, when it
 * is not valid Unicode: lone surrogates), a bytes' bytes, another buffer's copy (held by the
 * batch). o itself must be one that stays alive (see batch). */
static int val(batch *b, PyObject *o, bs_val *out, const char *what, Py_ssize_t i,
               const char *field_name) {
  Py_ssize_t size;
  const char *data;
  if (PyUnicode_Check(o)) {
    if (PyUnicode_IS_COMPACT_ASCII(o)) { /* (the UTF-8 is the str's own data: no call) */
      data = (const char *)PyUnicode_DATA(o), size = PyUnicode_GET_LENGTH(o);
    } else if (!(data = PyUnicode_AsUTF8AndSize(o, &size))) {
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
    if (!copy || hold(b, copy) < 0) return -1;
    data = PyBytes_AS_STRING(copy), size = PyBytes_GET_SIZE(copy);
  } else {
    PyErr_Format(PyExc_TypeError, "%s[%zd]%s: expected str or bytes, got %.100s", what, i,
                 field_name, Py_TYPE(o)->tp_name);
    return -1;
  }
  out->data = data, out->size = (size_t)size;
  return 0;
}

/* A sequence as a list or tuple held by the batch (NULL: error set): o itself when it is one
 * (the caller's: a list may change), else list(o) (the batch's own). */
static PyObject *seq(batch *b, PyObject *o, const char *msg) {
  PyObject *f;
  if (PyUnicode_Check(o) || PyBytes_Check(o)) {
    PyErr_SetString(PyExc_TypeError, msg);
    return NULL;
  }
  if (!(f = PySequence_Fast(o, msg)) || hold(b, f) < 0) return NULL;
  return f;
}

/* seq() as a tuple: a sequence read while Python code runs (the lookup encoder), which could
 * shorten a list under the index that reads it. */
static PyObject *frozen(batch *b, PyObject *o, const char *msg) {
  PyObject *f = seq(b, o, msg), *t;
  if (!f || PyTuple_CheckExact(f)) return f;
  if (!(t = PyList_AsTuple(f)) || hold(b, t) < 0) return NULL;
  return t;
}

/* "insert", "update", "delete" interned (PyInit__native): a literal in the caller's code is the
 * same object, found without comparing characters. */
static PyObject *tag_names[3];

static int tag_of(PyObject *t, Py_ssize_t i) {
  long v = 0;
  for (int k = 0; k < 3; k++)
    if (t == tag_names[k]) return BS_INSERT + k;
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

static int rows_of(batch *b, PyObject *o, bs_save *s) {
  static const char *names[4] = {".bucket", ".object_type", ".object_id", ".data"};
  PyObject *rows = seq(b, o, "rows: expected a sequence of (bucket, object_type, object_id, data)");
  bs_row *out;
  Py_ssize_t n, j;
  int shared; /* rows is the caller's list: each row is held before it is read */
  if (!rows) return -1;
  if (!(n = PySequence_Fast_GET_SIZE(rows))) return 0;
  if (!(out = arena(b, (size_t)n, sizeof *out))) return -1;
  shared = rows == o && PyList_Check(rows);
  for (j = 0; j < n; j++) {
    PyObject *r;
    bs_val *f[4] = {&out[j].bucket, &out[j].object_type, &out[j].object_id, &out[j].data};
    if (PySequence_Fast_GET_SIZE(rows) != n) { /* (a finalizer run by a collection, say) */
      PyErr_SetString(PyExc_RuntimeError, "rows: the list changed size during the save");
      return -1;
    }
    r = PySequence_Fast_GET_ITEM(rows, j);
    if (shared && hold(b, Py_NewRef(r)) < 0) return -1;
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 4) {
      if (!(r = frozen(b, r, "rows: expected (bucket, object_type, object_id, data)"))) return -1;
      if (PyTuple_GET_SIZE(r) != 4) {
        PyErr_Format(PyExc_TypeError, "rows[%zd]: expected (bucket, object_type, object_id, data)",
                     j);
        return -1;
      }
    }
    for (int k = 0; k < 4; k++)
      if (val(b, PyTuple_GET_ITEM(r, k), f[k], "rows", j, names[k]) < 0) return -1;
  }
  s->rows = out, s->n_rows = (size_t)n;
  return 0;
}

static int lookups_of(batch *b, PyObject *o, bs_save *s) {
  PyObject *ls = frozen(b, o, "lookups: expected a sequence of (values, params)");
  bs_lookup *out;
  Py_ssize_t n, j;
  if (!ls) return -1;
  if (!(n = PyTuple_GET_SIZE(ls))) return 0;
  if (!(out = arena(b, (size_t)n, sizeof *out))) return -1;
  for (j = 0; j < n; j++) {
    PyObject *l = PyTuple_GET_ITEM(ls, j), *key, *params;
    bs_val *pv;
    Py_ssize_t np;
    if (!(l = frozen(b, l, "lookups: expected (values, params)"))) return -1;
    if (PyTuple_GET_SIZE(l) != 2) {
      PyErr_Format(PyExc_TypeError, "lookups[%zd]: expected (values, params)", j);
      return -1;
    }
    if (!(params =
              frozen(b, PyTuple_GET_ITEM(l, 1), "lookups params: expected a list of JSON texts")))
      return -1;
    key = PyObject_CallFunctionObjArgs(encode_lookup, PyTuple_GET_ITEM(l, 0), params, NULL);
    if (!key || hold(b, key) < 0 || val(b, key, &out[j].key, "lookups", j, "") < 0) return -1;
    np = PyTuple_GET_SIZE(params);
    if (np && !(pv = arena(b, (size_t)np, sizeof *pv))) return -1;
    for (Py_ssize_t k = 0; k < np; k++)
      if (val(b, PyTuple_GET_ITEM(params, k), &pv[k], "lookups params", k, "") < 0) return -1;
    out[j].params = np ? pv : NULL, out[j].n_params = (size_t)np;
  }
  s->lookups = out, s->n_lookups = (size_t)n;
  return 0;
}

/* One save from Writer.save's arguments a[0..7): table, tag, id, rows, lookups, old_id, store
 * (rows and lookups NULL when absent, old_id and store None); i: its index, for messages. */
static int save_from(batch *b, PyObject *const *a, bs_save *s, Py_ssize_t i) {
  static const bs_save init = BS_SAVE_INIT;
  PyObject *id = a[2], *rows = a[3], *lookups = a[4], *old_id = a[5], *store = a[6];
  int t;
  *s = init;
  if ((t = tag_of(a[1], i)) < 0) return -1;
  s->tag = (bs_tag)t;
  if (val(b, a[0], &s->table, "saves", i, ".table") < 0) return -1;
  if (t == BS_DELETE)
    return val(b, old_id == Py_None ? id : old_id, &s->before_id, "saves", i, ".id");
  if (val(b, id, &s->after_id, "saves", i, ".id") < 0) return -1;
  if (old_id != Py_None && val(b, old_id, &s->before_id, "saves", i, ".old_id") < 0) return -1;
  if (rows && rows_of(b, rows, s) < 0) return -1;
  if (lookups && lookups_of(b, lookups, s) < 0) return -1;
  if (store != Py_None && val(b, store, &s->stored_data, "saves", i, ".store") < 0) return -1;
  return 0;
}

/* One save of Writer.save_many: a tuple (table, tag, id[, rows[, lookups[, old_id[, store]]]]). */
static int save_of(batch *b, PyObject *o, bs_save *s, Py_ssize_t i) {
  PyObject *a[7] = {NULL, NULL, NULL, NULL, NULL, Py_None, Py_None};
  if (!PyTuple_Check(o)) {
    PyErr_Format(PyExc_TypeError,
                 "saves[%zd]: expected a tuple (table, tag, id, rows, lookups, old_id, store)", i);
    return -1;
  }
  if (!PyArg_UnpackTuple(o, "save", 3, 7, &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6]))
    return -1;
  return save_from(b, a, s, i);
}

/* ---- The writer's state: WriterCore -------------------------------------------------------- */

/* A Writer's lock, its bs_writer and whether work is queued since the last flush, in C, so that
 * Writer.save and save_many (WriterBase's, below) take the lock, check and queue in one call.
 * Writer.save went through three Python functions before (save, save_many, _enter), whose
 * frames, the thread-local lookup and the lock's method calls cost more instructions than the
 * library's own work on the row (bench/README.md). The other Writer methods take the same lock
 * through acquire() and release() (the role threading.Lock had), and _Cell.close holds it while
 * it closes: the core is apart from the Writer, which a _Cell must not hold. */
typedef struct {
  PyObject_HEAD PyThread_type_lock lock;
  int held;   /* the lock is taken (changed only with the GIL held) */
  int queued; /* saves or write checkpoints queued since the last flush */
  void *h;    /* the bs_writer; NULL before it is open and once it is closed */
} writer_core;

/* The depth of library callbacks running user code in this thread (bucketstore._core._Trap):
 * a writer call inside one is refused. A thread's own, as threading.local's was. */
static _Thread_local int callback_depth;

/* Takes c's lock, as threading.Lock.acquire() does: at once when it is free, else waiting with
 * the GIL released, and running signal handlers (a KeyboardInterrupt ends the wait: -1). */
static int core_lock(writer_core *c) {
  PyLockStatus r = PyThread_acquire_lock_timed(c->lock, 0, 0);
  while (r != PY_LOCK_ACQUIRED) {
    PyThreadState *ts = PyEval_SaveThread();
    r = PyThread_acquire_lock_timed(c->lock, -1, 1);
    PyEval_RestoreThread(ts);
    if (r == PY_LOCK_INTR && Py_MakePendingCalls() < 0) return -1;
  }
  c->held = 1;
  return 0;
}

static void core_unlock(writer_core *c) {
  c->held = 0;
  PyThread_release_lock(c->lock);
}

/* Writer._enter's checks in its order: not inside a callback, the lock, an open writer. */
static int core_enter(writer_core *c) {
  if (callback_depth > 0) {
    raise_rc(BS_ESTATE, "writer calls are not allowed inside a callback", NULL);
    return -1;
  }
  if (core_lock(c) < 0) return -1;
  if (!c->h) {
    core_unlock(c);
    raise_rc(BS_ESTATE, "the writer is closed", NULL);
    return -1;
  }
  return 0;
}

static PyObject *core_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  writer_core *c;
  (void)args, (void)kw;
  if (!(c = (writer_core *)type->tp_alloc(type, 0))) return NULL;
  if (!(c->lock = PyThread_allocate_lock())) {
    Py_DECREF(c);
    return PyErr_NoMemory();
  }
  return (PyObject *)c;
}

static void core_dealloc(PyObject *self) {
  writer_core *c = (writer_core *)self;
  if (c->lock) {
    if (c->held) PyThread_release_lock(c->lock);
    PyThread_free_lock(c->lock);
  }
  Py_TYPE(self)->tp_free(self);
}

static PyObject *core_acquire(PyObject *self, PyObject *unused) {
  (void)unused;
  if (core_lock((writer_core *)self) < 0) return NULL;
  Py_RETURN_TRUE;
}

static PyObject *core_release(PyObject *self, PyObject *unused) {
  writer_core *c = (writer_core *)self;
  (void)unused;
  if (!c->held) {
    PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
    return NULL;
  }
  core_unlock(c);
  Py_RETURN_NONE;
}

/* The base class of bucketstore.Writer: its save and save_many are the Writer's methods, so
 * that w.save(...) calls C with no Python frame on the way (one cost as many instructions as the
 * C conversion of the save, bench/README.md). It makes the Writer's core (_core) with it. */
typedef struct {
  PyObject_HEAD writer_core *core;
} writer_base;

/* Writer.save's parameters: (table, tag, id, rows=(), lookups=(), *, old_id=None, store=None). */
static const char *const save_params[7] = {"table",   "tag",    "id",   "rows",
                                           "lookups", "old_id", "store"};
enum { SAVE_POSITIONAL = 5, SAVE_REQUIRED = 3 };

/* a[] = the arguments of a call of save, by parameter (rows and lookups NULL when not given,
 * old_id and store None); the errors Python's own binding of them raises. */
static int save_args(PyObject **a, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nargs > SAVE_POSITIONAL) {
    PyErr_Format(PyExc_TypeError,
                 "save() takes from 3 to 5 positional arguments but %zd were given", nargs);
    return -1;
  }
  for (Py_ssize_t i = 0; i < nargs; i++) a[i] = args[i];
  for (Py_ssize_t i = 0; i < nkw; i++) {
    PyObject *name = PyTuple_GET_ITEM(kwnames, i);
    int k = 0;
    while (k < 7 && PyUnicode_CompareWithASCIIString(name, save_params[k]) != 0) k++;
    if (k == 7) {
      PyErr_Format(PyExc_TypeError, "save() got an unexpected keyword argument '%U'", name);
      return -1;
    }
    if (k < nargs) { /* (a call's keywords are distinct) */
      PyErr_Format(PyExc_TypeError, "save() got multiple values for argument '%s'", save_params[k]);
      return -1;
    }
    a[k] = args[nargs + i];
  }
  for (int k = 0; k < SAVE_REQUIRED; k++)
    if (!a[k]) {
      PyErr_Format(PyExc_TypeError, "save() missing required argument: '%s'", save_params[k]);
      return -1;
    }
  return 0;
}

/* save(table, tag, id, rows=(), lookups=(), *, old_id=None, store=None): Writer.save, what a
 * Writer's save attribute is (bucketstore._core: no Python frame between the caller and here).
 * The library's bs_writer_save checks the save before it queues it (a refused one is not
 * queued), as save_many's bs_writer_check_save does. */
static PyObject *base_save(PyObject *self, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames) {
  writer_core *c = ((writer_base *)self)->core;
  PyObject *a[7] = {NULL, NULL, NULL, NULL, NULL, Py_None, Py_None};
  batch b;
  bs_save s;
  bs_error err = {0};
  PyThreadState *ts;
  int rc;
  if (save_args(a, args, PyVectorcall_NARGS(nargsf), kwnames) < 0 || core_enter(c) < 0) return NULL;
  batch_init(&b);
  if (save_from(&b, a, &s, 0) < 0) {
    core_unlock(c);
    batch_free(&b);
    return NULL;
  }
  ts = PyEval_SaveThread();
  rc = bs_writer_save(c->h, &s, &err);
  PyEval_RestoreThread(ts);
  if (!rc) c->queued = 1;
  core_unlock(c);
  batch_free(&b);
  if (rc) return raise_rc(rc, err.msg, NULL);
  Py_RETURN_NONE;
}

/* save_many(saves): Writer.save_many. Every save converted (a bad one raises) and checked by the
 * library's rules (bs_writer_check_save) before any is queued, then queued in order, the GIL
 * released; a refusal's message names saves[i] when there are several. A list is read as a
 * copy: the lookup encoder (Python code) runs between its items. */
static PyObject *base_save_many(PyObject *self, PyObject *o) {
  writer_core *c = ((writer_base *)self)->core;
  PyObject *saves = NULL, *at = NULL;
  batch b;
  bs_save *s = NULL;
  bs_error err = {0};
  Py_ssize_t n, i, done = 0;
  int rc = 0;
  PyThreadState *ts;
  batch_init(&b);
  /* list(saves) for any other iterable, before the writer's checks, as the Python code did */
  if (PyTuple_CheckExact(o))
    saves = Py_NewRef(o);
  else if (!(saves = PyList_Check(o) ? PyList_AsTuple(o) : PySequence_Tuple(o)))
    return NULL;
  if (hold(&b, saves) < 0 || core_enter(c) < 0) goto fail_unlocked;
  n = PyTuple_GET_SIZE(saves);
  if (n && !(s = arena(&b, (size_t)n, sizeof *s))) goto fail;
  for (i = 0; i < n; i++)
    if (save_of(&b, PyTuple_GET_ITEM(saves, i), &s[i], i) < 0) goto fail;
  ts = PyEval_SaveThread();
  for (i = 0; i < n && !(rc = bs_writer_check_save(c->h, &s[i], &err)); i++) {
  }
  if (!rc)
    for (; done < n && !(rc = bs_writer_save(c->h, &s[done], &err)); done++) {
    }
  PyEval_RestoreThread(ts);
  if (done) c->queued = 1;
  core_unlock(c);
  batch_free(&b);
  if (!rc) Py_RETURN_NONE;
  /* i < n: the check refused saves[i]; else queueing refused saves[done] (after done saves) */
  if (n > 1 && !(at = PyUnicode_FromFormat("saves[%zd]: ", i < n ? i : done))) return NULL;
  raise_rc(rc, err.msg, at);
  Py_XDECREF(at);
  return NULL;
fail:
  core_unlock(c);
fail_unlocked:
  batch_free(&b);
  return NULL;
}

static PyObject *core_get_handle(PyObject *self, void *closure) {
  void *h = ((writer_core *)self)->h;
  (void)closure;
  return h ? PyLong_FromVoidPtr(h) : Py_NewRef(Py_None);
}

static int core_set_handle(PyObject *self, PyObject *v, void *closure) {
  void *h = NULL;
  (void)closure;
  if (!v) {
    PyErr_SetString(PyExc_AttributeError, "cannot delete handle");
    return -1;
  }
  if (v != Py_None && !(h = PyLong_AsVoidPtr(v)) && PyErr_Occurred()) return -1;
  ((writer_core *)self)->h = h;
  return 0;
}

static PyObject *core_get_queued(PyObject *self, void *closure) {
  (void)closure;
  return PyBool_FromLong(((writer_core *)self)->queued);
}

static int core_set_queued(PyObject *self, PyObject *v, void *closure) {
  int q;
  (void)closure;
  if (!v) {
    PyErr_SetString(PyExc_AttributeError, "cannot delete queued");
    return -1;
  }
  if ((q = PyObject_IsTrue(v)) < 0) return -1;
  ((writer_core *)self)->queued = q;
  return 0;
}

static PyMethodDef core_methods[] = {
    {"acquire", core_acquire, METH_NOARGS, "acquire() -> True: takes the writer's lock."},
    {"release", core_release, METH_NOARGS, "release(): gives the writer's lock back."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef core_getset[] = {
    {"handle", core_get_handle, core_set_handle, "The bs_writer (an int), or None.", NULL},
    {"queued", core_get_queued, core_set_queued, "Work queued since the last flush.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject writer_core_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "bucketstore._native.WriterCore",
    .tp_basicsize = sizeof(writer_core),
    .tp_dealloc = core_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A Writer's lock, bs_writer (handle) and queued flag.",
    .tp_methods = core_methods,
    .tp_getset = core_getset,
    .tp_new = core_new,
};

static PyObject *base_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  writer_base *w;
  if (!(w = (writer_base *)type->tp_alloc(type, 0))) return NULL;
  if (!(w->core = (writer_core *)core_new(&writer_core_type, args, kw))) {
    Py_DECREF(w);
    return NULL;
  }
  return (PyObject *)w;
}

static void base_dealloc(PyObject *self) {
  Py_CLEAR(((writer_base *)self)->core);
  Py_TYPE(self)->tp_free(self);
}

static PyObject *base_get_core(PyObject *self, void *closure) {
  (void)closure;
  return Py_NewRef((PyObject *)((writer_base *)self)->core);
}

static PyMethodDef base_methods[] = {
    {"save", (PyCFunction)(void (*)(void))base_save, METH_FASTCALL | METH_KEYWORDS,
     "save($self, /, table, tag, id, rows=(), lookups=(), *, old_id=None, store=None)\n--\n\n"
     "Queues one source row change (contract.md 4.1). tag: 'insert'/'update'/'delete' (or\n"
     "Tag); id: the replica id after the change (for delete: of the deleted row); old_id:\n"
     "the replica id before, when the key changed; rows: (bucket, object_type, object_id,\n"
     "data); lookups: (values, params); store: row data kept with the source record."},
    {"save_many", base_save_many, METH_O,
     "save_many($self, saves, /)\n--\n\n"
     "Queues many source row changes with one call into the library (the fast way to\n"
     "ingest): each a tuple of save()'s arguments, (table, tag, id[, rows[, lookups[,\n"
     "old_id[, store]]]]). All are checked, by the library's rules too, before any is\n"
     "queued: a refused one queues none of them, and the error says which (saves[i])."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef base_getset[] = {
    {"_core", base_get_core, NULL, "The writer's WriterCore.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject writer_base_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "bucketstore._native.WriterBase",
    .tp_basicsize = sizeof(writer_base),
    .tp_dealloc = base_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The base of bucketstore.Writer: its save and save_many.",
    .tp_methods = base_methods,
    .tp_getset = base_getset,
    .tp_new = base_new,
};

/* callback_enter(), callback_leave(), in_callback(): the callback depth of this thread. */
static PyObject *native_callback_enter(PyObject *self, PyObject *unused) {
  (void)self, (void)unused;
  callback_depth++;
  Py_RETURN_NONE;
}

static PyObject *native_callback_leave(PyObject *self, PyObject *unused) {
  (void)self, (void)unused;
  callback_depth--;
  Py_RETURN_NONE;
}

static PyObject *native_in_callback(PyObject *self, PyObject *unused) {
  (void)self, (void)unused;
  return PyBool_FromLong(callback_depth > 0);
}

static PyMethodDef native_methods[] = {{"setup", native_setup, METH_VARARGS, NULL},
                                       {"bucket_data", native_bucket_data, METH_VARARGS, NULL},
                                       {"callback_enter", native_callback_enter, METH_NOARGS, NULL},
                                       {"callback_leave", native_callback_leave, METH_NOARGS, NULL},
                                       {"in_callback", native_in_callback, METH_NOARGS, NULL},
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
  static const char *const tags[3] = {"insert", "update", "delete"};
  for (int k = 0; k < 3; k++)
    if (!tag_names[k] && !(tag_names[k] = PyUnicode_InternFromString(tags[k]))) return NULL;
  if (PyType_Ready(&raw_ops_type) < 0 || PyType_Ready(&writer_core_type) < 0 ||
      PyType_Ready(&writer_base_type) < 0 || !(m = PyModule_Create(&native_module)))
    return NULL;
  Py_INCREF(&raw_ops_type);
  if (PyModule_AddObject(m, "RawOps", (PyObject *)&raw_ops_type) < 0) {
    Py_DECREF(&raw_ops_type);
    Py_DECREF(m);
    return NULL;
  }
  Py_INCREF(&writer_core_type);
  if (PyModule_AddObject(m, "WriterCore", (PyObject *)&writer_core_type) < 0) {
    Py_DECREF(&writer_core_type);
    Py_DECREF(m);
    return NULL;
  }
  Py_INCREF(&writer_base_type);
  if (PyModule_AddObject(m, "WriterBase", (PyObject *)&writer_base_type) < 0) {
    Py_DECREF(&writer_base_type);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
