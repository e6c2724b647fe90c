/*
 * lmdb_codec.c: the encoders of the LMDB layout (lmdb_internal.h, "The codec"). Each key and
 * value of the layout table is written here and read by the decoder beside its declaration, so
 * the writer, the readers, compaction, verify and the tests cannot disagree on a byte. The
 * decoders that sit in hot read loops are inline in lmdb_internal.h.
 */
#include "lmdb_internal.h"

void bs_lmdb_op_encode(unsigned char *out, const bs_op *op) {
  int row = bs_op_carries_row(op->type);
  size_t ot = row ? op->object_type.size : 0, oi = row ? op->object_id.size : 0;
  size_t sk = row ? op->subkey.size : 0;
  out[0] = (unsigned char)op->type;
  bs_put_u32le(out + 1, op->checksum);
  bs_put_u64le(out + 5, op->target_op);
  bs_put_u16le(out + 13, (uint32_t)ot);
  bs_put_u16le(out + 15, (uint32_t)oi);
  out[17] = (unsigned char)sk;
  out += BS_OP_HEADER_SIZE;
  if (ot) memcpy(out, op->object_type.data, ot);
  out += ot;
  if (oi) memcpy(out, op->object_id.data, oi);
  out += oi;
  if (sk) memcpy(out, op->subkey.data, sk);
  out += sk;
  if (op->type == BS_OP_PUT && op->data.size) memcpy(out, op->data.data, op->data.size);
}

int bs_lmdb_bucket_key(unsigned char buf[BS_BUCKET_KEY_MAX], uint32_t stream, bs_val name,
                       MDB_val *key, bs_error *err) {
  if (name.size > BS_MAX_BUCKET_NAME)
    return bs_fail(err, BS_ETOOBIG, "bucket name of %zu bytes, over BS_MAX_BUCKET_NAME", name.size);
  bs_put_u32be(buf, stream);
  if (name.size) memcpy(buf + 4, name.data, name.size);
  key->mv_size = 4 + name.size;
  key->mv_data = buf;
  return BS_OK;
}

int bs_lmdb_bucket_id_decode(const MDB_val *v, uint64_t *id, bs_error *err) {
  if (v->mv_size != 8) return bs_fail(err, BS_ECORRUPT, "bucket id value of %zu bytes", v->mv_size);
  *id = bs_get_u64le(v->mv_data);
  return BS_OK;
}

int bs_lmdb_bucket_entry_decode(const MDB_val *k, const MDB_val *v, uint32_t *stream, bs_val *name,
                                uint64_t *id) {
  if (k->mv_size < 5 || k->mv_size > BS_BUCKET_KEY_MAX || v->mv_size != 8) return BS_ECORRUPT;
  *stream = bs_get_u32be(k->mv_data);
  name->data = (const unsigned char *)k->mv_data + 4;
  name->size = k->mv_size - 4;
  *id = bs_get_u64le(v->mv_data);
  return BS_OK;
}
