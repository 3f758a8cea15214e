/*
 * Compiled twin of data_plane/store/fastpath.py: the per-message loops of the write path.
 *
 * write_batch: lays out a batch of messages of one (topic, queue) as CommitLog records (the
 * 88-byte RocketMQ header, body, topic, properties; see message.py), and produces the
 * ConsumeQueue units and index items (their layouts: _layouts.h, from layouts.py) for
 * them. index_write: adds index items to an IndexFile mapping. Both must give byte-for-byte
 * what fastpath.py gives; tests run both and compare. Their answers, and those of plain_batch
 * and collect_units, are struct sequences: fastpath.py's NamedTuples of the same names and
 * fields, in the same order (equal as tuples, unpacked alike, read by name).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_slots.h"  /* attribute access through __slots__ (and the CPython version guard) */
#include "_bytes.h"  /* CRC-32C, big-endian loads and stores */
#include "_layouts.h" /* the record's and index files' byte layouts: generated from layouts.py */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define TRAN_MASK (0x3 << 2)
#define TRAN_COMMIT (0x2 << 2)
#define TRAN_ROLLBACK (0x3 << 2)

/* Java String.hashCode over UTF-16 code units. */
static int32_t java_hash(PyObject *s) {
    uint32_t h = 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c >= 0x10000) {
            c -= 0x10000;
            h = 31 * h + (0xD800 + (c >> 10));
            h = 31 * h + (0xDC00 + (c & 0x3FF));
        } else {
            h = 31 * h + c;
        }
    }
    return (int32_t)h;
}

typedef struct {
    Py_buffer body;
    int has_body;
    PyObject *props; /* borrowed-from-attr reference we own */
    long long flag, sys_flag, born_ts, reconsume, prepared;
    const char *born_host;
    PyObject *born_host_obj;
    Py_ssize_t props_len, total;
    const unsigned char *raw_props; /* a plain batch body's property bytes (props is NULL then) */
} item_t;

/* ---- plain SEND_BATCH_MESSAGE bodies, laid out without store Message objects --------------
 * A batch body is a run of items (remoting/bodies.py):
 *     total 4 | magic 4 | body CRC 4 | flag 4 | body length 4 | body | properties length 2 | properties
 * It is "plain" when every item is well formed and its properties are in the form the store
 * would write them back: ASCII "name\x01value\x02" pairs, every pair terminated, no name empty
 * or repeated, no value holding \x01, and no name among ``skip`` (names the broker acts on:
 * schedule and transaction markers). Then the records can take the property bytes as they are.
 * Anything else goes the general way (store Messages), which gives the same records or the
 * reference error. */
typedef struct {
    const unsigned char *body, *props;
    Py_ssize_t body_len, props_len;
    int32_t flag;
} raw_item;

typedef struct {
    raw_item *items;
    Py_ssize_t n;
    long long sys_flag, born_ts, reconsume;
    const char *born_host;
} raw_batch;

#define MAX_PLAIN_PROPS 32
#define PLAIN_ITEMS_ON_STACK 64

/* Whether p[0, plen) are plain properties (above): 1 or 0. ``skip`` is a tuple of bytes. */
static int plain_props(const unsigned char *p, Py_ssize_t plen, PyObject *skip) {
    const unsigned char *end = p + plen;
    const unsigned char *names[MAX_PLAIN_PROPS];
    Py_ssize_t name_lens[MAX_PLAIN_PROPS];
    Py_ssize_t nskip = PyTuple_GET_SIZE(skip);
    int npairs = 0;
    while (p < end) {
        const unsigned char *k = p;
        while (p < end && *p != 1) {
            if (*p >= 0x80 || *p == 2) return 0;
            p++;
        }
        if (p >= end || p == k) return 0; /* no \x01, or an empty name */
        Py_ssize_t kl = p - k;
        p++;
        while (p < end && *p != 2) {
            if (*p >= 0x80 || *p == 1) return 0;
            p++;
        }
        if (p >= end) return 0; /* the last pair not terminated */
        p++;
        if (npairs == MAX_PLAIN_PROPS) return 0;
        for (int j = 0; j < npairs; j++)
            if (name_lens[j] == kl && memcmp(names[j], k, kl) == 0) return 0;
        for (Py_ssize_t j = 0; j < nskip; j++) {
            PyObject *sk = PyTuple_GET_ITEM(skip, j);
            if (PyBytes_GET_SIZE(sk) == kl && memcmp(PyBytes_AS_STRING(sk), k, kl) == 0) return 0;
        }
        names[npairs] = k;
        name_lens[npairs++] = kl;
    }
    return 1;
}

static int skip_is_bytes(PyObject *skip) {
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(skip); k++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(skip, k))) {
            PyErr_SetString(PyExc_TypeError, "skip must be a tuple of bytes");
            return 0;
        }
    }
    return 1;
}

/* 1: plain, 0: not plain, -1: error (skip is not a tuple of bytes). When ``items`` is given,
 * the first ``cap`` items are filled in (the caller scans again with room for all of them when
 * *n_out > cap). */
static int scan_plain(const unsigned char *b, Py_ssize_t len, Py_ssize_t max_n, PyObject *skip, raw_item *items,
                      Py_ssize_t cap, Py_ssize_t *n_out, long long *body_bytes) {
    Py_ssize_t pos = 0, n = 0;
    long long bytes = 0;
    if (!skip_is_bytes(skip)) return -1;
    while (pos < len) {
        if (len - pos < BATCH_ITEM_SIZE + 2 || n >= max_n) return 0;
        const unsigned char *r = b + pos;
        int32_t total = (int32_t)get32(r), body_len = (int32_t)get32(r + BATCH_ITEM_BODY_LENGTH_AT);
        if (total < BATCH_ITEM_SIZE + 2 || (Py_ssize_t)total > len - pos || body_len < 0 || BATCH_ITEM_SIZE + (long long)body_len + 2 > total) return 0;
        Py_ssize_t plen = ((Py_ssize_t)r[BATCH_ITEM_SIZE + body_len] << 8) | r[BATCH_ITEM_SIZE + 1 + body_len];
        if (BATCH_ITEM_SIZE + (Py_ssize_t)body_len + 2 + plen != total) return 0;
        if (!plain_props(r + BATCH_ITEM_SIZE + body_len + 2, plen, skip)) return 0;
        if (items && n < cap) {
            items[n].body = r + BATCH_ITEM_SIZE;
            items[n].body_len = body_len;
            items[n].props = r + BATCH_ITEM_SIZE + body_len + 2;
            items[n].props_len = plen;
            items[n].flag = (int32_t)get32(r + BATCH_ITEM_FLAG_AT);
        }
        bytes += body_len;
        n++;
        pos += total;
    }
    if (n == 0) return 0;
    *n_out = n;
    *body_bytes = bytes;
    return 1;
}

/* The bytes of properties given as str or bytes: 1, or 0 when a str is not ASCII (not plain:
 * the general path encodes it), or -1 with TypeError. */
static int props_bytes(PyObject *props, const unsigned char **p, Py_ssize_t *n) {
    if (PyUnicode_Check(props)) {
        if (!PyUnicode_IS_COMPACT_ASCII(props)) return 0;
        *p = PyUnicode_DATA(props);
        *n = PyUnicode_GET_LENGTH(props);
        return 1;
    }
    if (PyBytes_Check(props)) {
        *p = (const unsigned char *)PyBytes_AS_STRING(props);
        *n = PyBytes_GET_SIZE(props);
        return 1;
    }
    PyErr_SetString(PyExc_TypeError, "properties must be str or bytes");
    return -1;
}

/* plain_properties(properties, skip) -> bool: whether a message's encoded properties (str or
 * bytes) are plain (above). */
static PyObject *plain_properties(PyObject *self, PyObject *args) {
    PyObject *props, *skip;
    if (!PyArg_ParseTuple(args, "OO!:plain_properties", &props, &PyTuple_Type, &skip)) return NULL;
    if (!skip_is_bytes(skip)) return NULL;
    const unsigned char *p;
    Py_ssize_t n;
    int rc = props_bytes(props, &p, &n);
    if (rc < 0) return NULL;
    return PyBool_FromLong(rc && plain_props(p, n, skip));
}

static PyObject *structseq_of(PyTypeObject *tp, int n, PyObject **parts);

/* plain_batch's answer (fastpath.PlainCounts). */
enum { PC_MSG_COUNT, PC_BODY_BYTES, PC_FIELDS };
static PyStructSequence_Field plain_counts_fields[] = {
    {"msg_count", "the body's messages"},
    {"body_bytes", "the bytes of their bodies"},
    {NULL, NULL},
};
static PyStructSequence_Desc plain_counts_desc = {"data_plane.store._speedups.PlainCounts",
                                                  "What a quota counts of a plain batch body.", plain_counts_fields,
                                                  PC_FIELDS};
static PyTypeObject PlainCountsType;

/* plain_batch(body, max_messages, skip) -> PlainCounts(msg_count, body_bytes) | None: whether
 * write_batch can take ``body`` as it is (see above), and what a quota counts of it. */
static PyObject *plain_batch(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t max_n;
    PyObject *skip;
    if (!PyArg_ParseTuple(args, "y*nO!:plain_batch", &b, &max_n, &PyTuple_Type, &skip)) return NULL;
    Py_ssize_t n = 0;
    long long bytes = 0;
    int rc = scan_plain(b.buf, b.len, max_n, skip, NULL, 0, &n, &bytes);
    PyBuffer_Release(&b);
    if (rc < 0) return NULL;
    if (rc == 0) Py_RETURN_NONE;
    PyObject *parts[PC_FIELDS] = {PyLong_FromSsize_t(n), PyLong_FromLongLong(bytes)};
    return structseq_of(&PlainCountsType, PC_FIELDS, parts);
}

static PyObject *s_body, *s_properties, *s_flag, *s_sys_flag, *s_born_timestamp, *s_born_host,
    *s_reconsume_times, *s_prepared;

static void release_items(item_t *items, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (items[i].has_body) PyBuffer_Release(&items[i].body);
        Py_XDECREF(items[i].props);
        Py_XDECREF(items[i].born_host_obj);
    }
    PyMem_Free(items);
}

/* A struct sequence of type ``tp`` from n new references (NULL items: not made; each stolen
 * either way; fields past n are None). */
static PyObject *structseq_of(PyTypeObject *tp, int n, PyObject **parts) {
    PyObject *r = NULL;
    for (int i = 0; i < n; i++)
        if (!parts[i]) goto fail;
    r = PyStructSequence_New(tp);
    if (!r) goto fail;
    for (Py_ssize_t i = 0; i < Py_SIZE(r); i++) {
        PyObject *v = i < n ? parts[i] : Py_None;
        if (i >= n) Py_INCREF(v);
        PyStructSequence_SET_ITEM(r, i, v);
    }
    return r;
fail:
    for (int i = 0; i < n; i++) Py_XDECREF(parts[i]);
    return NULL;
}

/* write_batch's answers, read by name (fastpath.py's LaidOut, NeedsRoom and Refused are their
 * twins; None: a plain batch body that is not plain). ``outcome`` comes first in each. */
enum { WB_LAID_OUT, WB_NEEDS_ROOM, WB_REFUSED };
enum { LO_OUTCOME, LO_WRITTEN, LO_NEXT_QO, LO_FIRST_QO, LO_CQ_UNITS, LO_INDEX_ITEMS, LO_LAST_INDEXED, LO_COUNT,
       LO_TAG_CODES, LO_FIELDS };
static PyStructSequence_Field laid_out_fields[] = {
    {"outcome", "0: laid out"},
    {"written", "bytes laid out from pos"},
    {"next_queue_offset", "the queue's next offset after the batch"},
    {"first_queue_offset", "the batch's first queue offset"},
    {"cq_units", "the ConsumeQueue units (bytes; those written into cq_target are not here)"},
    {"index_items", "the index items (bytes), or the IndexFile's new count when written into ix_target"},
    {"last_indexed", "CommitLog offset of the last record written into the IndexFile, else -1"},
    {"msg_count", "the batch's messages"},
    {"tag_codes", "the tag hash code of each distinct tag"},
    {NULL, NULL},
};
static PyStructSequence_Field needs_room_fields[] = {
    {"outcome", "1: does not fit"},
    {"need", "bytes the batch needs"},
    {NULL, NULL},
};
static PyStructSequence_Field refused_fields[] = {
    {"outcome", "2: refused"},
    {"msg_index", "the refused message's index in the batch"},
    {"status", "a PutMessageStatus name"},
    {"reason", "why"},
    {NULL, NULL},
};
static PyStructSequence_Desc laid_out_desc = {"data_plane.store._speedups.LaidOut", "A batch laid out.",
                                              laid_out_fields, LO_FIELDS};
static PyStructSequence_Desc needs_room_desc = {"data_plane.store._speedups.NeedsRoom",
                                                "A batch that does not fit before limit.", needs_room_fields, 2};
static PyStructSequence_Desc refused_desc = {"data_plane.store._speedups.Refused", "A batch with a refused message.",
                                             refused_fields, 4};
static PyTypeObject LaidOutType, NeedsRoomType, RefusedType;

static PyObject *refuse(item_t *items, Py_ssize_t n, Py_ssize_t idx, const char *status, PyObject *reason) {
    release_items(items, n);
    if (!reason) return NULL;
    PyObject *parts[4] = {PyLong_FromLong(WB_REFUSED), PyLong_FromSsize_t(idx), PyUnicode_FromString(status), reason};
    return structseq_of(&RefusedType, 4, parts);
}

#define IX_AHEAD 32

/* Ask for the hash slot of index item k (12 bytes: hash 4, physical offset 8) of `it`. */
static inline void prefetch_slot(const unsigned char *b, long long slots, const unsigned char *it, Py_ssize_t k) {
    __builtin_prefetch(b + INDEX_HEADER_SIZE + (get32(it + k * INDEX_ITEM_SIZE + INDEX_ITEM_HASH_AT) % (uint64_t)slots) * HASH_SLOT_SIZE, 1, 3);
}

/* Adds items [start, n) to an IndexFile mapping until they run out or the file is full. */
static Py_ssize_t index_add(unsigned char *b, long long slots, long long *count, long long max_entries,
                            long long begin_ts, long long store_ts, const unsigned char *it, Py_ssize_t n,
                            Py_ssize_t start, long long *last_phys) {
    long long entries_at = INDEX_HEADER_SIZE + slots * HASH_SLOT_SIZE;
    long long diff = (store_ts - begin_ts) / 1000;
    if (store_ts < begin_ts) diff = 0;
    if (diff > 0x7FFFFFFF) diff = 0x7FFFFFFF;
    Py_ssize_t i = start;
    long long c = *count;
    /* Each item's hash slot lies at a random place in the slot table (20 MB by default): a
     * cache and a TLB miss each. Asking for the slots IX_AHEAD items ahead lets the misses
     * overlap instead of waiting for them one by one. */
    for (Py_ssize_t k = start; k < n && k < start + IX_AHEAD; k++) prefetch_slot(b, slots, it, k);
    for (; i < n && c < max_entries; i++) {
        if (i + IX_AHEAD < n) prefetch_slot(b, slots, it, i + IX_AHEAD);
        uint32_t h = get32(it + i * INDEX_ITEM_SIZE + INDEX_ITEM_HASH_AT);
        uint64_t phys = get64(it + i * INDEX_ITEM_SIZE + INDEX_ITEM_PHYS_AT);
        unsigned char *slot = b + INDEX_HEADER_SIZE + (h % (uint64_t)slots) * HASH_SLOT_SIZE;
        long long prev = (int32_t)get32(slot);
        if (prev <= 0 || prev >= c) prev = 0;
        unsigned char *e = b + entries_at + c * INDEX_ENTRY_SIZE;
        put32(e + INDEX_ENTRY_HASH_AT, h);
        put64(e + INDEX_ENTRY_PHYS_AT, phys);
        put32(e + INDEX_ENTRY_TIME_DIFF_AT, (uint32_t)diff);
        put32(e + INDEX_ENTRY_PREV_AT, (uint32_t)prev);
        put32(slot, (uint32_t)c);
        c++;
        *last_phys = (long long)phys;
    }
    *count = c;
    return i;
}

/* pwrite all of [p, p+n) at `offset` (short writes continued, EINTR retried); -1 with an
 * OSError set when the file refuses it. Holds the GIL: one append's bytes take microseconds. */
static int write_fully(int fd, const unsigned char *p, Py_ssize_t n, long long offset) {
    while (n > 0) {
        ssize_t w = pwrite(fd, p, (size_t)n, (off_t)offset);
        if (w < 0) {
            if (errno == EINTR) continue;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        if (w == 0) {
            errno = ENOSPC;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        p += w;
        n -= w;
        offset += w;
    }
    return 0;
}

/* items[i] from a store Message: 0 with *plen its properties' encoded length, or -1 with
 * *result the refusal (NULL: an error raised); the items are released then. */
static int item_of_message(item_t *items, Py_ssize_t n, Py_ssize_t i, PyObject *m, Py_ssize_t *plen_out,
                           PyObject **result) {
    item_t *it = &items[i];
    PyObject *body = SGET(m, s_body);
    if (!body) { release_items(items, n); *result = NULL; return -1; }
    int rc = PyObject_GetBuffer(body, &it->body, PyBUF_SIMPLE);
    Py_DECREF(body);
    if (rc < 0) { release_items(items, n); *result = NULL; return -1; }
    it->has_body = 1;
    if (it->body.len == 0) {
        *result = refuse(items, n, i, "MESSAGE_ILLEGAL", PyUnicode_FromString("message body is empty"));
        return -1;
    }
    it->props = SGET(m, s_properties);
    if (!it->props) { release_items(items, n); *result = NULL; return -1; }
    if (!PyDict_Check(it->props)) {
        *result = refuse(items, n, i, "MESSAGE_ILLEGAL", PyUnicode_FromString("properties must be a dict"));
        return -1;
    }
    if (GET_LL(m, s_flag, &it->flag) || GET_LL(m, s_sys_flag, &it->sys_flag) ||
        GET_LL(m, s_born_timestamp, &it->born_ts) || GET_LL(m, s_reconsume_times, &it->reconsume) ||
        GET_LL(m, s_prepared, &it->prepared)) {
        release_items(items, n);
        *result = NULL;
        return -1;
    }
    it->born_host_obj = SGET(m, s_born_host);
    if (!it->born_host_obj) { release_items(items, n); *result = NULL; return -1; }
    if (!PyBytes_Check(it->born_host_obj) || PyBytes_GET_SIZE(it->born_host_obj) != 8) {
        *result = refuse(items, n, i, "MESSAGE_ILLEGAL", PyUnicode_FromString("born_host must be 8 bytes"));
        return -1;
    }
    it->born_host = PyBytes_AS_STRING(it->born_host_obj);
    if (it->flag < INT32_MIN || it->flag > INT32_MAX || it->sys_flag < INT32_MIN ||
        it->sys_flag > INT32_MAX || it->reconsume < INT32_MIN || it->reconsume > INT32_MAX) {
        *result = refuse(items, n, i, "MESSAGE_ILLEGAL", PyUnicode_FromString("a 4-byte field is out of range"));
        return -1;
    }
    Py_ssize_t plen = 0, ppos = 0;
    PyObject *k, *v;
    while (PyDict_Next(it->props, &ppos, &k, &v)) {
        Py_ssize_t kl, vl;
        if (!PyUnicode_Check(k) || !PyUnicode_Check(v)) {
            *result = refuse(items, n, i, "MESSAGE_ILLEGAL",
                            PyUnicode_FromString("property names and values must be strings"));
            return -1;
        }
        const char *ks = PyUnicode_AsUTF8AndSize(k, &kl);
        const char *vs = ks ? PyUnicode_AsUTF8AndSize(v, &vl) : NULL;
        if (!vs) {
            PyErr_Clear();
            *result = refuse(items, n, i, "MESSAGE_ILLEGAL",
                            PyUnicode_FromString("properties are not valid text"));
            return -1;
        }
        if (kl == 0 || memchr(ks, 1, kl) || memchr(ks, 2, kl) || memchr(vs, 1, vl) || memchr(vs, 2, vl)) {
            *result = refuse(items, n, i, "MESSAGE_ILLEGAL",
                            PyUnicode_FromFormat("property %R is empty or holds a reserved separator "
                                                 "character (\\x01 or \\x02)", k));
            return -1;
        }
        plen += kl + vl + 2;
    }
    *plen_out = plen;
    return 0;
}

/* items[i] from a plain batch body's item (raw->items[i]): as item_of_message. */
static int item_of_raw(item_t *items, Py_ssize_t n, Py_ssize_t i, const raw_batch *raw, Py_ssize_t *plen_out,
                       PyObject **result) {
    item_t *it = &items[i];
    const raw_item *ri = &raw->items[i];
    it->body.buf = (void *)ri->body;
    it->body.len = ri->body_len;
    it->raw_props = ri->props;
    it->props_len = ri->props_len;
    it->flag = ri->flag;
    it->sys_flag = raw->sys_flag;
    it->born_ts = raw->born_ts;
    it->reconsume = raw->reconsume;
    it->prepared = 0;
    it->born_host = raw->born_host;
    if (it->body.len == 0) {
        *result = refuse(items, n, i, "MESSAGE_ILLEGAL", PyUnicode_FromString("message body is empty"));
        return -1;
    }
    if (it->sys_flag < INT32_MIN || it->sys_flag > INT32_MAX || it->reconsume < INT32_MIN ||
        it->reconsume > INT32_MAX) {
        *result = refuse(items, n, i, "MESSAGE_ILLEGAL", PyUnicode_FromString("a 4-byte field is out of range"));
        return -1;
    }
    *plen_out = it->props_len;
    return 0;
}

/* write_batch(buf, pos, limit, file_from, msgs, topic_b, queue_id, first_qo, store_ts,
 *             store_host, max_props, max_msg, index_enabled)
 *             [, cq_target, cq_pos, cq_limit, ix_target, ix_slots, ix_count, ix_max, ix_begin_ts,
 *              fd, fd_offset])
 * With fd >= 0, buf is a staging buffer: the records laid out in it are then written to fd at
 * fd_offset (before the CQ and index targets are touched; an OSError leaves those alone).
 * msgs: a list of store Messages, or a plain batch body with what its messages share (see
 * scan_plain; write_batch's argument is then (body, sys_flag, born_ts, born_host, reconsume,
 * max_messages, skip names)).
 * -> (0, end_pos, next_qo, first_qo_of_batch, cq_units | new_cq_pos, index_items | new_ix_count,
 *     last_indexed_offset, messages, tag_codes | None)
 *  | (1, bytes_needed)                       batch does not fit before `limit`
 *  | (2, msg_index, status_name, reason)     a message is refused; nothing written
 *  | (3,)                                    the body is not plain (write_batch only) */
static PyObject *write_batch_impl(Py_buffer *buf, Py_ssize_t pos, Py_ssize_t limit, long long file_from,
                                  PyObject *msgs, const char *topic_buf, Py_ssize_t topic_len, int queue_id,
                                  long long first_qo, long long store_ts, const char *host8, Py_ssize_t max_props,
                                  Py_ssize_t max_msg, int index_enabled, PyObject *cq_target,
                                  unsigned char *cq_base, Py_ssize_t cq_base_len, Py_ssize_t cq_pos,
                                  Py_ssize_t cq_limit, PyObject *ix_target, long long ix_slots, long long ix_count,
                                  long long ix_max, long long ix_begin_ts, int fd, long long fd_offset,
                                  const raw_batch *raw) {
    PyObject *result = NULL;
    Py_ssize_t start_pos = pos;
    Py_ssize_t n = raw ? raw->n : PyList_GET_SIZE(msgs);
    item_t *items = PyMem_Calloc(n ? n : 1, sizeof(item_t));
    if (!items) {
        PyErr_NoMemory();
        goto done;
    }
    if (topic_len < 1 || topic_len > 255 || pos < 0 || limit > buf->len) {
        PyErr_SetString(PyExc_ValueError, "bad arguments to write_batch");
        release_items(items, n);
        goto done;
    }
    Py_ssize_t need = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        item_t *it = &items[i];
        Py_ssize_t plen;
        int rc = raw ? item_of_raw(items, n, i, raw, &plen, &result)
                     : item_of_message(items, n, i, PyList_GET_ITEM(msgs, i), &plen, &result);
        if (rc < 0) goto done;
        if (plen > max_props) {
            result = refuse(items, n, i, "PROPERTIES_SIZE_EXCEEDED",
                            PyUnicode_FromFormat("properties take %zd bytes, more than %zd", plen, max_props));
            goto done;
        }
        it->props_len = plen;
        it->total = RECORD_HEADER_SIZE + it->body.len + 1 + topic_len + 2 + plen;
        if (it->total > max_msg) {
            result = refuse(items, n, i, "MESSAGE_ILLEGAL",
                            PyUnicode_FromFormat("message takes %zd bytes, more than the %zd allowed",
                                                 it->total, max_msg));
            goto done;
        }
        need += it->total;
    }
    if (pos + need > limit) {
        release_items(items, n);
        PyObject *parts[2] = {PyLong_FromLong(WB_NEEDS_ROOM), PyLong_FromSsize_t(need)};
        result = structseq_of(&NeedsRoomType, 2, parts);
        goto done;
    }
    /* Outputs: CQ units and index items, sized for the worst case. */
    PyObject *cq = PyBytes_FromStringAndSize(NULL, n * CQ_UNIT_SIZE);
    if (!cq) { release_items(items, n); goto done; }
    Py_ssize_t idx_cap = 0;
    if (index_enabled) {
        for (Py_ssize_t i = 0; i < n; i++) idx_cap += 1 + items[i].props_len / 2;
    }
    PyObject *idx = PyBytes_FromStringAndSize(NULL, idx_cap * INDEX_ITEM_SIZE);
    if (!idx) { Py_DECREF(cq); release_items(items, n); goto done; }
    unsigned char *cqp = (unsigned char *)PyBytes_AS_STRING(cq);
    unsigned char *ixp = (unsigned char *)PyBytes_AS_STRING(idx);
    Py_ssize_t ncq = 0, nix = 0;
    unsigned char *base = (unsigned char *)buf->buf;
    long long qo = first_qo, batch_first_qo = -1;
    /* a plain body's distinct tag hash codes (held pulls wake per tag) */
    int64_t *tags_seen = raw ? PyMem_Malloc(sizeof(int64_t) * (size_t)n) : NULL;
    Py_ssize_t n_tags = 0;
    if (raw && !tags_seen) {
        Py_DECREF(cq);
        Py_DECREF(idx);
        release_items(items, n);
        PyErr_NoMemory();
        goto done;
    }
    uint32_t topic_crc = crc_update(0xFFFFFFFFu, (const unsigned char *)topic_buf, topic_len);
    topic_crc = crc_update(topic_crc, (const unsigned char *)"#", 1);
    for (Py_ssize_t i = 0; i < n; i++) {
        item_t *it = &items[i];
        unsigned char *r = base + pos;
        long long phys = file_from + pos;
        int tran = (int)(it->sys_flag & TRAN_MASK);
        int advances = tran == 0 || tran == TRAN_COMMIT;
        long long my_qo = advances ? qo++ : 0;
        if (batch_first_qo < 0) batch_first_qo = my_qo;
        uint32_t bcrc = ~crc_update(0xFFFFFFFFu, it->body.buf, it->body.len) & 0x7FFFFFFFu;
        put32(r, (uint32_t)it->total);
        put32(r + RECORD_HEADER_MAGIC_AT, (uint32_t)MESSAGE_MAGIC_CODE);
        put32(r + RECORD_HEADER_BODY_CRC_AT, bcrc);
        put32(r + RECORD_HEADER_QUEUE_ID_AT, (uint32_t)queue_id);
        put32(r + RECORD_HEADER_FLAG_AT, (uint32_t)it->flag);
        put64(r + RECORD_HEADER_QUEUE_OFFSET_AT, (uint64_t)my_qo);
        put64(r + RECORD_HEADER_PHYSICAL_OFFSET_AT, (uint64_t)phys);
        put32(r + RECORD_HEADER_SYS_FLAG_AT, (uint32_t)it->sys_flag);
        put64(r + RECORD_HEADER_BORN_TIMESTAMP_AT, (uint64_t)it->born_ts);
        memcpy(r + RECORD_HEADER_BORN_HOST_AT, it->born_host, 8);
        put64(r + RECORD_HEADER_STORE_TIMESTAMP_AT, (uint64_t)store_ts);
        memcpy(r + RECORD_HEADER_STORE_HOST_AT, host8, 8);
        put32(r + RECORD_HEADER_RECONSUME_TIMES_AT, (uint32_t)it->reconsume);
        put64(r + RECORD_HEADER_PREPARED_OFFSET_AT, (uint64_t)it->prepared);
        put32(r + RECORD_HEADER_BODY_LENGTH_AT, (uint32_t)it->body.len);
        unsigned char *p = r + RECORD_HEADER_SIZE;
        memcpy(p, it->body.buf, it->body.len);
        p += it->body.len;
        *p++ = (unsigned char)topic_len;
        memcpy(p, topic_buf, topic_len);
        p += topic_len;
        *p++ = (unsigned char)(it->props_len >> 8);
        *p++ = (unsigned char)(it->props_len & 0xFF);
        int64_t tags_code = 0;
        PyObject *k, *v;
        Py_ssize_t ppos = 0;
        int index_it = index_enabled && tran != TRAN_ROLLBACK;
        const char *uniq_s = NULL, *keys_s = NULL;
        Py_ssize_t uniq_l = 0, keys_l = 0;
        if (it->raw_props) { /* ASCII pairs as they are (scan_plain checked their form) */
            const unsigned char *q = it->raw_props, *qend = q + it->props_len;
            memcpy(p, q, it->props_len);
            p += it->props_len;
            while (q < qend) {
                const unsigned char *ks = q;
                while (*q != 1) q++;
                Py_ssize_t kl = q - ks;
                const unsigned char *vs = ++q;
                while (*q != 2) q++;
                Py_ssize_t vl = q - vs;
                q++;
                if (kl == 4 && memcmp(ks, "TAGS", 4) == 0) {
                    uint32_t h = 0;
                    for (Py_ssize_t c = 0; c < vl; c++) h = 31 * h + vs[c];
                    tags_code = (int32_t)h;
                } else if (index_it && kl == 8 && memcmp(ks, "UNIQ_KEY", 8) == 0) {
                    uniq_s = (const char *)vs;
                    uniq_l = vl;
                } else if (index_it && kl == 4 && memcmp(ks, "KEYS", 4) == 0) {
                    keys_s = (const char *)vs;
                    keys_l = vl;
                }
            }
            if (tags_seen) {
                int known = 0;
                for (Py_ssize_t t = 0; t < n_tags; t++) known |= tags_seen[t] == tags_code;
                if (!known) tags_seen[n_tags++] = tags_code;
            }
        }
        while (!it->raw_props && PyDict_Next(it->props, &ppos, &k, &v)) {
            Py_ssize_t kl, vl;
            const char *ks = PyUnicode_AsUTF8AndSize(k, &kl);
            const char *vs = PyUnicode_AsUTF8AndSize(v, &vl);
            memcpy(p, ks, kl);
            p += kl;
            *p++ = 1;
            memcpy(p, vs, vl);
            p += vl;
            *p++ = 2;
            if (kl == 4 && memcmp(ks, "TAGS", 4) == 0) {
                if (vl) tags_code = java_hash(v);
            } else if (index_it && kl == 8 && memcmp(ks, "UNIQ_KEY", 8) == 0) {
                uniq_s = vs;
                uniq_l = vl;
            } else if (index_it && kl == 4 && memcmp(ks, "KEYS", 4) == 0) {
                keys_s = vs;
                keys_l = vl;
            }
        }
        /* Index items in a fixed order whatever the order of the properties: UNIQ_KEY, then
         * each KEYS key (as the Python twin and IndexService.build do). */
        if (uniq_l > 0) {
            put32(ixp + nix * INDEX_ITEM_SIZE + INDEX_ITEM_HASH_AT, ~crc_update(topic_crc, (const unsigned char *)uniq_s, uniq_l) & 0x7FFFFFFFu);
            put64(ixp + nix * INDEX_ITEM_SIZE + INDEX_ITEM_PHYS_AT, (uint64_t)phys);
            nix++;
        }
        Py_ssize_t a = 0;
        while (a < keys_l) {
            while (a < keys_l && keys_s[a] == ' ') a++;
            Py_ssize_t b = a;
            while (b < keys_l && keys_s[b] != ' ') b++;
            if (b > a) {
                put32(ixp + nix * INDEX_ITEM_SIZE + INDEX_ITEM_HASH_AT, ~crc_update(topic_crc, (const unsigned char *)keys_s + a, b - a) & 0x7FFFFFFFu);
                put64(ixp + nix * INDEX_ITEM_SIZE + INDEX_ITEM_PHYS_AT, (uint64_t)phys);
                nix++;
            }
            a = b;
        }
        if (advances) {
            put64(cqp + ncq * CQ_UNIT_SIZE + CQ_UNIT_PHYS_AT, (uint64_t)phys);
            put32(cqp + ncq * CQ_UNIT_SIZE + CQ_UNIT_RECORD_SIZE_AT, (uint32_t)it->total);
            put64(cqp + ncq * CQ_UNIT_SIZE + CQ_UNIT_TAGS_AT, (uint64_t)tags_code);
            ncq++;
        }
        pos += it->total;
    }
    release_items(items, n);
    PyObject *tags_out = Py_None;
    Py_INCREF(tags_out);
    if (tags_seen) {
        Py_DECREF(tags_out);
        tags_out = PyTuple_New(n_tags);
        for (Py_ssize_t t = 0; tags_out && t < n_tags; t++) {
            PyObject *c = PyLong_FromLongLong(tags_seen[t]);
            if (!c) Py_CLEAR(tags_out);
            else PyTuple_SET_ITEM(tags_out, t, c);
        }
        PyMem_Free(tags_seen);
        if (!tags_out) {
            Py_DECREF(cq);
            Py_DECREF(idx);
            goto done;
        }
    }
    /* The records go to the file before any index entry names them. */
    if (fd >= 0 && write_fully(fd, base + start_pos, pos - start_pos, fd_offset) < 0) {
        Py_DECREF(cq);
        Py_DECREF(idx);
        Py_DECREF(tags_out);
        goto done;
    }
    if (_PyBytes_Resize(&cq, ncq * CQ_UNIT_SIZE) < 0) { Py_DECREF(idx); Py_DECREF(tags_out); goto done; }
    if (_PyBytes_Resize(&idx, nix * INDEX_ITEM_SIZE) < 0) { Py_DECREF(cq); Py_DECREF(tags_out); goto done; }
    long long last_ix_phys = -1;
    /* Straight into cq_base when the units fit what is reserved there: a ConsumeQueue's pending
     * units (the Appender) or its file's mapping. */
    if (cq_base && ncq > 0 && cq_pos >= 0 && cq_pos + ncq * CQ_UNIT_SIZE <= cq_limit && cq_limit <= cq_base_len) {
        memcpy(cq_base + cq_pos, PyBytes_AS_STRING(cq), ncq * CQ_UNIT_SIZE);
        Py_DECREF(cq);
        cq = PyLong_FromSsize_t(cq_pos + ncq * CQ_UNIT_SIZE);
        if (!cq) { Py_DECREF(idx); Py_DECREF(tags_out); goto done; }
    } else if (cq_target != Py_None && ncq > 0 && cq_pos >= 0 && cq_pos + ncq * CQ_UNIT_SIZE <= cq_limit) {
        Py_buffer cb;
        if (PyObject_GetBuffer(cq_target, &cb, PyBUF_WRITABLE) < 0) {
            Py_DECREF(cq); Py_DECREF(idx); Py_DECREF(tags_out);
            goto done;
        }
        if (cq_limit <= cb.len) {
            memcpy((unsigned char *)cb.buf + cq_pos, PyBytes_AS_STRING(cq), ncq * CQ_UNIT_SIZE);
            Py_DECREF(cq);
            cq = PyLong_FromSsize_t(cq_pos + ncq * CQ_UNIT_SIZE);
        }
        PyBuffer_Release(&cb);
        if (!cq) { Py_DECREF(idx); Py_DECREF(tags_out); goto done; }
    }
    /* Straight into the IndexFile when it has begun (count > 1) and has room for all items. */
    if (ix_target != Py_None && nix > 0 && ix_slots > 0 && ix_count > 1 && ix_count + nix <= ix_max) {
        Py_buffer ib;
        if (PyObject_GetBuffer(ix_target, &ib, PyBUF_WRITABLE) < 0) {
            Py_DECREF(cq); Py_DECREF(idx); Py_DECREF(tags_out);
            goto done;
        }
        if (ib.len >= INDEX_HEADER_SIZE + ix_slots * HASH_SLOT_SIZE + ix_max * INDEX_ENTRY_SIZE) {
            index_add(ib.buf, ix_slots, &ix_count, ix_max, ix_begin_ts, store_ts,
                      (const unsigned char *)PyBytes_AS_STRING(idx), nix, 0, &last_ix_phys);
            Py_DECREF(idx);
            idx = PyLong_FromLongLong(ix_count);
        }
        PyBuffer_Release(&ib);
        if (!idx) { Py_DECREF(cq); Py_DECREF(tags_out); goto done; }
    }
    PyObject *parts[LO_FIELDS] = {PyLong_FromLong(WB_LAID_OUT), PyLong_FromSsize_t(pos), PyLong_FromLongLong(qo),
                                  PyLong_FromLongLong(batch_first_qo < 0 ? 0 : batch_first_qo), cq, idx,
                                  PyLong_FromLongLong(last_ix_phys), PyLong_FromSsize_t(n), tags_out};
    result = structseq_of(&LaidOutType, LO_FIELDS, parts);
done:
    return result;
}


static PyObject *write_batch(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t pos, limit;
    long long file_from, first_qo, store_ts;
    PyObject *msgs;
    Py_buffer topic, host;
    int queue_id, index_enabled;
    Py_ssize_t max_props, max_msg, cq_pos = 0, cq_limit = 0;
    PyObject *cq_target = Py_None, *ix_target = Py_None;
    long long ix_slots = 0, ix_count = 0, ix_max = 0, ix_begin_ts = 0, fd_offset = 0;
    int fd = -1;
    if (!PyArg_ParseTuple(args, "w*nnLOy*iLLy*nnp|OnnOLLLLiL", &buf, &pos, &limit, &file_from, &msgs,
                          &topic, &queue_id, &first_qo, &store_ts, &host, &max_props, &max_msg,
                          &index_enabled, &cq_target, &cq_pos, &cq_limit, &ix_target, &ix_slots, &ix_count,
                          &ix_max, &ix_begin_ts, &fd, &fd_offset))
        return NULL;
    PyObject *result = NULL;
    /* msgs: a list of store Messages, or a plain batch body with what its messages share:
     * (body, sys_flag, born_timestamp, born_host, reconsume_times, max_messages, skip names) */
    Py_buffer body = {0}, born = {0};
    raw_batch rb = {0};
    raw_item local_items[PLAIN_ITEMS_ON_STACK], *heap_items = NULL;
    int have_body = 0, have_born = 0;
    if (host.len != 8) {
        PyErr_SetString(PyExc_ValueError, "store host must be 8 bytes");
        goto out;
    }
    if (PyTuple_Check(msgs)) {
        Py_ssize_t max_n;
        PyObject *skip;
        if (!PyArg_ParseTuple(msgs, "y*LLy*LnO!:plain batch", &body, &rb.sys_flag, &rb.born_ts, &born,
                              &rb.reconsume, &max_n, &PyTuple_Type, &skip))
            goto out;
        have_body = have_born = 1;
        if (born.len != 8) {
            PyErr_SetString(PyExc_ValueError, "born_host must be 8 bytes");
            goto out;
        }
        rb.born_host = born.buf;
        long long bytes;
        /* One scan fills the items of a batch of up to PLAIN_ITEMS_ON_STACK; a larger one is
         * scanned again into a buffer of its size (the scan was 10 % of a broker's CPU on
         * batches of 32 when every batch took two). */
        int rc = scan_plain(body.buf, body.len, max_n, skip, local_items, PLAIN_ITEMS_ON_STACK, &rb.n, &bytes);
        if (rc < 0) goto out;
        if (rc == 0) {
            result = Py_None; /* not plain: the caller takes store Messages */
            Py_INCREF(result);
            goto out;
        }
        if (rb.n <= PLAIN_ITEMS_ON_STACK) {
            rb.items = local_items;
        } else {
            rb.items = heap_items = PyMem_Malloc(sizeof(raw_item) * (size_t)rb.n);
            if (!heap_items) {
                PyErr_NoMemory();
                goto out;
            }
            scan_plain(body.buf, body.len, max_n, skip, heap_items, rb.n, &rb.n, &bytes);
        }
    } else if (!PyList_Check(msgs)) {
        PyErr_SetString(PyExc_TypeError, "write_batch takes a list of messages or a plain batch tuple");
        goto out;
    }
    result = write_batch_impl(&buf, pos, limit, file_from, msgs, topic.buf, topic.len, queue_id, first_qo, store_ts,
                              host.buf, max_props, max_msg, index_enabled, cq_target, NULL, 0, cq_pos, cq_limit,
                              ix_target, ix_slots, ix_count, ix_max, ix_begin_ts, fd, fd_offset, rb.items ? &rb : NULL);
out:
    PyMem_Free(heap_items);
    if (have_body) PyBuffer_Release(&body);
    if (have_born) PyBuffer_Release(&born);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&topic);
    PyBuffer_Release(&host);
    return result;
}

/* index_write's answer (fastpath.IndexWritten). */
enum { IW_INDEX_COUNT, IW_NEXT_ITEM, IW_LAST_INDEXED, IW_FIELDS };
static PyStructSequence_Field index_written_fields[] = {
    {"index_count", "the IndexFile's entry count after it"},
    {"next_item", "the first item not added"},
    {"last_indexed", "CommitLog offset of the last item added, -1 when none was"},
    {NULL, NULL},
};
static PyStructSequence_Desc index_written_desc = {"data_plane.store._speedups.IndexWritten",
                                                   "What index_write added to an IndexFile.", index_written_fields,
                                                   IW_FIELDS};
static PyTypeObject IndexWrittenType;

/* index_write(buf, hash_slots, count, max_entries, begin_ts, store_ts, items, start)
 * -> IndexWritten(index_count, next_item, last_indexed): adds 12-byte (hash, offset) items to an
 * IndexFile mapping until the items run out or the file is full. */
static PyObject *index_write(PyObject *self, PyObject *args) {
    Py_buffer buf, items;
    long long slots, count, max_entries, begin_ts, store_ts;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "w*LLLLLy*n", &buf, &slots, &count, &max_entries, &begin_ts, &store_ts, &items,
                          &start))
        return NULL;
    PyObject *result = NULL;
    if (slots <= 0 || count < 1 || buf.len < INDEX_HEADER_SIZE + slots * HASH_SLOT_SIZE + max_entries * INDEX_ENTRY_SIZE || start < 0 || items.len % INDEX_ITEM_SIZE) {
        PyErr_SetString(PyExc_ValueError, "bad arguments to index_write");
        goto done;
    }
    long long last_phys = -1;
    Py_ssize_t i = index_add(buf.buf, slots, &count, max_entries, begin_ts, store_ts, items.buf, items.len / INDEX_ITEM_SIZE,
                             start, &last_phys);
    PyObject *parts[IW_FIELDS] = {PyLong_FromLongLong(count), PyLong_FromSsize_t(i), PyLong_FromLongLong(last_phys)};
    result = structseq_of(&IndexWrittenType, IW_FIELDS, parts);
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&items);
    return result;
}


/* ---- positions kept as C integers -------------------------------------------------------
 * The base classes of MappedFile (FilePositions) and ConsumeQueue (QueuePositions): the
 * positions the append path reads and moves on every message, held in the object itself as C
 * long longs instead of int objects the slots point at. With 10,000 queues every append lands
 * on another queue's objects; each int object read or replaced there was a cache miss of its
 * own. Python sees plain int attributes (member descriptors). The pure-Python twins are in
 * positions.py. */
typedef struct {
    PyObject_HEAD
    /* what every append reads or moves, together in the object's first line or two */
    long long wrote_position, committed_position, file_size, file_from_offset, reserved_upto;
    unsigned char *base; /* the held view's address (NULL: none held) and length */
    Py_ssize_t length;
    int busy; /* appends writing through the view right now (it may not be dropped) */
    long long flushed_position;
    Py_buffer map; /* the file's mapping while held (map.obj set): hold_map / drop_map */
} FilePositions;

static void FilePositions_dealloc(FilePositions *f) {
    if (f->map.obj) PyBuffer_Release(&f->map);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

/* hold_map(buffer): keep a writable view of the file's mapping, so that the append path writes
 * ConsumeQueue units through its address without asking the memoryview each time. The holder
 * must call drop_map() before releasing the mapping (an exported buffer keeps it alive). */
static PyObject *FilePositions_hold_map(FilePositions *f, PyObject *obj) {
    if (f->busy) {
        PyErr_SetString(PyExc_RuntimeError, "units are pending for the held view, or an append is writing through it");
        return NULL;
    }
    if (f->map.obj) PyBuffer_Release(&f->map);
    f->base = NULL;
    f->length = 0;
    if (PyObject_GetBuffer(obj, &f->map, PyBUF_WRITABLE) < 0) {
        f->map.obj = NULL;
        return NULL;
    }
    f->base = f->map.buf;
    f->length = f->map.len;
    Py_RETURN_NONE;
}

/* drop_map() -> whether the view is let go of. Not while an append is writing through it: an
 * append runs Python code at points (a clock, a finalizer run by an allocation), so another
 * thread may be closing the file meanwhile. The held view then keeps the mapping, and the
 * closer's release fails as it does while a reader holds a slice (close() says "later"). */
static PyObject *FilePositions_drop_map(FilePositions *f, PyObject *unused) {
    if (f->busy) Py_RETURN_FALSE;
    if (f->map.obj) PyBuffer_Release(&f->map);
    f->map.obj = NULL;
    f->base = NULL;
    f->length = 0;
    Py_RETURN_TRUE;
}

static PyMethodDef FilePositions_methods[] = {
    {"hold_map", (PyCFunction)FilePositions_hold_map, METH_O, "Keep a writable view of the file's mapping."},
    {"drop_map", (PyCFunction)FilePositions_drop_map, METH_NOARGS,
     "Let go of the view hold_map kept; False while an append is writing through it."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef FilePositions_members[] = {
    {"wrote_position", T_LONGLONG, offsetof(FilePositions, wrote_position), 0, "Bytes written (laid out) so far."},
    {"committed_position", T_LONGLONG, offsetof(FilePositions, committed_position), 0,
     "Bytes handed to the file so far."},
    {"flushed_position", T_LONGLONG, offsetof(FilePositions, flushed_position), 0, "Bytes flushed to disk so far."},
    {"file_size", T_LONGLONG, offsetof(FilePositions, file_size), 0, "The file's size in bytes."},
    {"file_from_offset", T_LONGLONG, offsetof(FilePositions, file_from_offset), 0,
     "The offset of the file's first byte (its name)."},
    {"reserved_upto", T_LONGLONG, offsetof(FilePositions, reserved_upto), 0, "Bytes with disk blocks reserved."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FilePositionsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "data_plane.store._speedups.FilePositions",
    .tp_basicsize = sizeof(FilePositions),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_members = FilePositions_members,
    .tp_methods = FilePositions_methods,
    .tp_dealloc = (destructor)FilePositions_dealloc,
    .tp_doc = "A mapped file's positions in bytes, as C integers (the base of MappedFile).",
};

#define AS_FP(o) (PyObject_TypeCheck((o), &FilePositionsType) ? (FilePositions *)(o) : NULL)

/* A ConsumeQueue's pending units. With thousands of queues, writing each append's 20-byte unit
 * into its queue's file page took most of what spreading the load cost (a TLB miss and a cache
 * miss on another page each time; ~0.4 us of a 3 us append with 10,000 queues). The appender
 * therefore gathers up to PEND_UNITS units of a queue in the queue object and writes them to the
 * file together (sync_units): when they fill it, when the next unit does not follow them, and
 * before anything reads or changes the queue (every ConsumeQueue method begins with
 * sync_units, the flush round too, so the checkpoint never claims a pending unit). Pending units
 * lie right after the last file's wrote_position, at queue offsets pend_from_qo.., and fit that
 * file (pend_cap, worked out when the first was pended); while any are pending the file's held
 * view counts them as busy, so it is not dropped under them. A process killed with units pending
 * loses them with nothing else: recovery dispatches again from the checkpoint, which lies before
 * them, as it does for a crash. */
#define PEND_UNITS 8

typedef struct {
    PyObject_HEAD
    long long max_physic_offset;
    long long pend_from_qo; /* the queue offset of the first pending unit */
    int npend, pend_cap;    /* units pending; how many fit before the file's reserved end */
    unsigned int pend_gen;  /* moves each time sync_units writes: an appender that ran Python code
                             * meanwhile knows its unit was not pended */
    unsigned char pend[PEND_UNITS * CQ_UNIT_SIZE];
} QueuePositions;

static PyObject *s_cq_last_file;

/* Write the pending units to the queue's last file, through its held view. 0 on success; -1
 * with an exception when they do not fit where they belong (a ConsumeQueue changed without
 * sync_units first: a bug); the units stay pending then. */
static int queue_sync(QueuePositions *q) {
    q->pend_gen++; /* (also with nothing pending: an appender about to pend its first unit retries) */
    if (q->npend == 0) {
        q->pend_cap = 0;
        return 0;
    }
    PyObject *mf = SGET((PyObject *)q, s_cq_last_file);
    if (!mf) return -1;
    FilePositions *fp = AS_FP(mf);
    Py_ssize_t n = (Py_ssize_t)q->npend * CQ_UNIT_SIZE;
    long long limit = fp ? (fp->reserved_upto < fp->file_size ? fp->reserved_upto : fp->file_size) : 0;
    if (!fp || !fp->base || fp->file_from_offset + fp->wrote_position != q->pend_from_qo * CQ_UNIT_SIZE ||
        fp->wrote_position + n > limit || fp->wrote_position + n > fp->length) {
        Py_DECREF(mf);
        PyErr_Format(PyExc_RuntimeError, "%d pending ConsumeQueue units from queue offset %lld no longer fit its file",
                     q->npend, q->pend_from_qo);
        return -1;
    }
    memcpy(fp->base + fp->wrote_position, q->pend, (size_t)n);
    fp->wrote_position = fp->committed_position = fp->wrote_position + n;
    if (fp->busy > 0) fp->busy--; /* (taken with the first pending unit) */
    Py_DECREF(mf);
    q->npend = 0;
    q->pend_cap = 0;
    return 0;
}

static PyObject *QueuePositions_sync_units(QueuePositions *q, PyObject *unused) {
    if (queue_sync(q) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *QueuePositions_pending(QueuePositions *q, void *closure) { return PyLong_FromLong(q->npend); }

static PyMethodDef QueuePositions_methods[] = {
    {"sync_units", (PyCFunction)QueuePositions_sync_units, METH_NOARGS,
     "Write the units the appender keeps pending to the queue's file."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef QueuePositions_getset[] = {
    {"pending_units", (getter)QueuePositions_pending, NULL, "Units pending, not yet in the file.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef QueuePositions_members[] = {
    {"max_physic_offset", T_LONGLONG, offsetof(QueuePositions, max_physic_offset), 0,
     "End (offset + size) of the last record indexed; -1 before the first."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject QueuePositionsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "data_plane.store._speedups.QueuePositions",
    .tp_basicsize = sizeof(QueuePositions),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_members = QueuePositions_members,
    .tp_methods = QueuePositions_methods,
    .tp_getset = QueuePositions_getset,
    .tp_doc = "A ConsumeQueue's log position and pending units (the base of ConsumeQueue).",
};

/* ---- queue offsets ----------------------------------------------------------------------
 * QueueOffsets: the CommitLog's next queue offset of each (topic, queue id), a mapping whose
 * values live in cells (a C long long each) that are never replaced nor removed, so that the
 * appender keeps a queue's cell and reads and moves its offset there, with no look-up and no
 * int object made per append. Python reads and sets ints through the mapping as with a dict;
 * a value set there is the one the next append takes. */
typedef struct {
    PyObject_HEAD
    long long value;
} OffsetCell;

static PyTypeObject OffsetCellType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "data_plane.store._speedups.OffsetCell",
    .tp_basicsize = sizeof(OffsetCell),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One queue's next offset (QueueOffsets).",
};

typedef struct {
    PyObject_HEAD
    PyObject *cells; /* key -> OffsetCell */
} QueueOffsets;

static PyObject *QueueOffsets_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "QueueOffsets() takes no arguments");
        return NULL;
    }
    QueueOffsets *q = (QueueOffsets *)tp->tp_alloc(tp, 0);
    if (!q) return NULL;
    q->cells = PyDict_New();
    if (!q->cells) {
        Py_DECREF(q);
        return NULL;
    }
    return (PyObject *)q;
}

static void QueueOffsets_dealloc(QueueOffsets *q) {
    Py_XDECREF(q->cells);
    Py_TYPE(q)->tp_free((PyObject *)q);
}

/* The cell of ``key`` (borrowed), made at 0 when ``create`` and missing; NULL otherwise (an
 * error set, or none when missing and not created). */
static OffsetCell *offset_cell(QueueOffsets *q, PyObject *key, int create) {
    PyObject *c = PyDict_GetItemWithError(q->cells, key);
    if (c || PyErr_Occurred() || !create) return (OffsetCell *)c;
    OffsetCell *cell = PyObject_New(OffsetCell, &OffsetCellType);
    if (!cell) return NULL;
    cell->value = 0;
    int rc = PyDict_SetItem(q->cells, key, (PyObject *)cell);
    Py_DECREF(cell); /* the dict holds it */
    return rc < 0 ? NULL : cell;
}

static Py_ssize_t QueueOffsets_len(QueueOffsets *q) { return PyDict_GET_SIZE(q->cells); }

static PyObject *QueueOffsets_getitem(QueueOffsets *q, PyObject *key) {
    OffsetCell *cell = offset_cell(q, key, 0);
    if (cell) return PyLong_FromLongLong(cell->value);
    if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
    return NULL;
}

static int QueueOffsets_setitem(QueueOffsets *q, PyObject *key, PyObject *v) {
    if (!v) { /* an appender may hold the cell: a removed key would leave it writing there */
        PyErr_SetString(PyExc_TypeError, "queue offsets are not removed");
        return -1;
    }
    long long value = PyLong_AsLongLong(v);
    if (value == -1 && PyErr_Occurred()) return -1;
    if (value < 0) {
        PyErr_SetString(PyExc_ValueError, "a queue offset is not negative");
        return -1;
    }
    OffsetCell *cell = offset_cell(q, key, 1);
    if (!cell) return -1;
    cell->value = value;
    return 0;
}

static int QueueOffsets_contains(QueueOffsets *q, PyObject *key) { return PyDict_Contains(q->cells, key); }

static PyObject *QueueOffsets_get(QueueOffsets *q, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    OffsetCell *cell = offset_cell(q, args[0], 0);
    if (cell) return PyLong_FromLongLong(cell->value);
    if (PyErr_Occurred()) return NULL;
    PyObject *d = nargs == 2 ? args[1] : Py_None;
    Py_INCREF(d);
    return d;
}

static PyObject *QueueOffsets_items(QueueOffsets *q, PyObject *unused) {
    PyObject *out = PyList_New(0), *k, *c;
    Py_ssize_t pos = 0;
    while (out && PyDict_Next(q->cells, &pos, &k, &c)) {
        PyObject *pair = Py_BuildValue("(OL)", k, ((OffsetCell *)c)->value);
        if (!pair || PyList_Append(out, pair) < 0) Py_CLEAR(out);
        Py_XDECREF(pair);
    }
    return out;
}

static PyObject *QueueOffsets_iter(QueueOffsets *q) { return PyObject_GetIter(q->cells); }

static PyMappingMethods QueueOffsets_mapping = {
    .mp_length = (lenfunc)QueueOffsets_len,
    .mp_subscript = (binaryfunc)QueueOffsets_getitem,
    .mp_ass_subscript = (objobjargproc)QueueOffsets_setitem,
};

static PySequenceMethods QueueOffsets_sequence = {.sq_contains = (objobjproc)QueueOffsets_contains};

static PyMethodDef QueueOffsets_methods[] = {
    {"get", (PyCFunction)(void (*)(void))QueueOffsets_get, METH_FASTCALL, "The offset of key, or default."},
    {"items", (PyCFunction)QueueOffsets_items, METH_NOARGS, "A list of (key, offset)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject QueueOffsetsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "data_plane.store._speedups.QueueOffsets",
    .tp_basicsize = sizeof(QueueOffsets),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = QueueOffsets_new,
    .tp_dealloc = (destructor)QueueOffsets_dealloc,
    .tp_as_mapping = &QueueOffsets_mapping,
    .tp_as_sequence = &QueueOffsets_sequence,
    .tp_iter = (getiterfunc)QueueOffsets_iter,
    .tp_methods = QueueOffsets_methods,
    .tp_doc = "(topic, queue id) -> the next queue offset: a mapping of ints, values in cells the appender keeps.",
};

/* ---- Appender: the whole single-message append in one call ------------------------------
 * Works on the store's own Python objects (CommitLog, MappedFiles, ConsumeQueues, IndexFile,
 * the QueueOffsets), reading and setting the same attributes the Python path does. It
 * handles the common case only; whenever anything is unusual (a new topic or queue, a file to
 * roll over or to reserve, a refused message) it writes nothing and returns None, and the
 * caller takes the Python path, which is the reference behaviour. */
typedef struct {
    PyObject_HEAD
    PyObject *commit_log, *queue_offsets, *topic_bytes, *cq_table, *index, *dispatcher, *clock;
    char host[8];
    Py_ssize_t max_props, max_msg;
    int index_enabled;
    long long ix_slots, ix_max_entries;
    unsigned char *stage; /* records are laid out here, then pwritten to the CommitLog file */
    Py_ssize_t stage_cap;
    /* Staged records not yet written: stage[0, staged) belongs at st_pos.. of st_mf, which is
     * that file's wrote_position (the file's positions move when the stage is committed). */
    PyObject *st_mf;
    Py_ssize_t staged, st_pos, stage_commit_bytes;
    PyObject *met; /* topic -> capsule of its topic_slots (below) */
} Appender;

/* ---- the queues an appender has met -----------------------------------------------------
 * Per topic, a C array by queue id of the queue's ConsumeQueue and of its QueueOffsets cell,
 * so that an append to a known queue finds both without the two (topic, queue id) dict
 * look-ups: each of those read the dict's index and entry and then the stored key tuple and its
 * queue id int, to compare them with the new tuple — four cache misses a look-up with 10,000
 * queues. ConsumeQueues are never replaced in the store's table, nor cells in QueueOffsets, so
 * an entry stays true; a queue offset set from Python lands in the same cell. */
#define MET_MAX_TOPICS 10000
#define MET_MAX_QUEUE_ID 65535

typedef struct {
    PyObject *cq;      /* strong; NULL until met */
    OffsetCell *cell; /* strong */
} queue_slot;

typedef struct {
    PyObject *topic_b; /* the topic's encoded bytes */
    Py_ssize_t n;
    queue_slot *slots;
} topic_slots;

static void topic_slots_free(PyObject *capsule) {
    topic_slots *ts = PyCapsule_GetPointer(capsule, NULL);
    if (!ts) return;
    for (Py_ssize_t i = 0; i < ts->n; i++) {
        Py_XDECREF(ts->slots[i].cq);
        Py_XDECREF(ts->slots[i].cell);
    }
    PyMem_Free(ts->slots);
    Py_XDECREF(ts->topic_b);
    PyMem_Free(ts);
}

static topic_slots *met_topic(Appender *a, PyObject *topic) {
    PyObject *cap = PyDict_GetItemWithError(a->met, topic);
    return cap ? PyCapsule_GetPointer(cap, NULL) : NULL;
}

/* Remember (cq, cell) of topic / qid. A failure to remember is not an error (the next append
 * looks the queue up again). */
static void met_queue(Appender *a, PyObject *topic, PyObject *topic_b, long qid, PyObject *cq, OffsetCell *cell) {
    if (qid > MET_MAX_QUEUE_ID) return;
    topic_slots *ts = met_topic(a, topic);
    if (!ts) {
        if (PyErr_Occurred() || PyDict_GET_SIZE(a->met) >= MET_MAX_TOPICS) goto forget;
        ts = PyMem_Calloc(1, sizeof(topic_slots));
        if (!ts) goto forget;
        PyObject *cap = PyCapsule_New(ts, NULL, topic_slots_free);
        if (!cap) {
            PyMem_Free(ts);
            goto forget;
        }
        Py_INCREF(topic_b);
        ts->topic_b = topic_b;
        int rc = PyDict_SetItem(a->met, topic, cap);
        Py_DECREF(cap);
        if (rc < 0) goto forget;
    }
    if (qid >= ts->n) {
        Py_ssize_t n = ts->n ? ts->n : 8;
        while (n <= qid) n *= 2;
        queue_slot *grown = PyMem_Realloc(ts->slots, (size_t)n * sizeof(queue_slot));
        if (!grown) goto forget;
        memset(grown + ts->n, 0, (size_t)(n - ts->n) * sizeof(queue_slot));
        ts->slots = grown;
        ts->n = n;
    }
    Py_INCREF(cq);
    Py_INCREF(cell);
    Py_XSETREF(ts->slots[qid].cq, cq);
    Py_XSETREF(ts->slots[qid].cell, cell);
    return;
forget:
    PyErr_Clear();
}

static PyObject *s_topic, *s_queue_id, *s_mfq, *s_files, *s_mv, *s_last_file, *s_last_store_timestamp,
    *s_index_count, *s_end_phy_offset, *s_end_timestamp, *s_begin_timestamp, *s_max_entries, *s_mf,
    *s_dispatched_offset, *s_put_units, *s_put_items, *s_fd;

static void Appender_dealloc(Appender *a) {
    Py_XDECREF(a->commit_log); Py_XDECREF(a->queue_offsets); Py_XDECREF(a->topic_bytes);
    Py_XDECREF(a->cq_table); Py_XDECREF(a->index); Py_XDECREF(a->dispatcher); Py_XDECREF(a->clock);
    Py_XDECREF(a->st_mf);
    Py_XDECREF(a->met);
    PyMem_RawFree(a->stage);
    Py_TYPE(a)->tp_free((PyObject *)a);
}

/* Appender(commit_log, queue_offsets, topic_bytes, cq_table, index, dispatcher, clock or None,
 *          store_host, max_props, max_msg, index_enabled, index_hash_slots, index_max_entries) */
static int Appender_init(Appender *a, PyObject *args, PyObject *kw) {
    PyObject *cl, *qo, *tb, *cq, *ix, *disp, *clock;
    Py_buffer host;
    int ie;
    long long slots;
    a->stage_commit_bytes = 0;
    if (!PyArg_ParseTuple(args, "OO!O!O!OOOy*nnpLL|n", &cl, &QueueOffsetsType, &qo, &PyDict_Type, &tb, &PyDict_Type,
                          &cq, &ix, &disp, &clock, &host, &a->max_props, &a->max_msg, &ie, &slots,
                          &a->ix_max_entries, &a->stage_commit_bytes))
        return -1;
    if (a->stage_commit_bytes < 0) a->stage_commit_bytes = 0;
    if (host.len != 8) {
        PyBuffer_Release(&host);
        PyErr_SetString(PyExc_ValueError, "store host must be 8 bytes");
        return -1;
    }
    memcpy(a->host, host.buf, 8);
    PyBuffer_Release(&host);
    if (a->max_msg < RECORD_HEADER_SIZE || a->stage) {
        PyErr_SetString(PyExc_ValueError, "bad max message size, or Appender initialised twice");
        return -1;
    }
    /* One message of max_msg bytes fits after what may be staged; pages are only touched as
     * far as messages reach. */
    a->stage_cap = a->max_msg + a->stage_commit_bytes;
    a->stage = PyMem_RawMalloc((size_t)a->stage_cap);
    if (!a->stage) {
        PyErr_NoMemory();
        return -1;
    }
    a->met = PyDict_New();
    if (!a->met) return -1;
    Py_INCREF(cl); Py_INCREF(qo); Py_INCREF(tb); Py_INCREF(cq); Py_INCREF(ix); Py_INCREF(disp); Py_INCREF(clock);
    a->commit_log = cl; a->queue_offsets = qo; a->topic_bytes = tb; a->cq_table = cq; a->index = ix;
    a->dispatcher = disp; a->clock = clock;
    a->index_enabled = ie;
    a->ix_slots = slots;
    return 0;
}

static int get_ssize_v(PyObject *v, Py_ssize_t *out) {
    if (!v) return -1;
    *out = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}
#define GET_SSIZE(o, name, out) get_ssize_v(SGET((o), (name)), (out))

static int set_ll_v(PyObject *x, PyObject *o, PyObject *name, slot_t *c) {
    if (!x) return -1;
    int rc = sset(o, name, c, x);
    Py_DECREF(x);
    return rc;
}
#define SET_LL(o, name, v) ({ static slot_t _c; set_ll_v(PyLong_FromLongLong(v), (o), (name), &_c); })

/* Write the staged records to their file and move its positions. The GIL is held throughout,
 * so no other thread sees the file's positions half-moved. On an error nothing moves and the
 * records stay staged. */
static int stage_commit(Appender *a) {
    if (a->staged == 0) return 0;
    Py_ssize_t fd;
    if (GET_SSIZE(a->st_mf, s_fd, &fd)) return -1;
    if (fd < 0 || fd > INT32_MAX) {
        errno = EBADF;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    if (write_fully((int)fd, a->stage, a->staged, a->st_pos) < 0) return -1;
    Py_ssize_t end = a->st_pos + a->staged;
    FilePositions *fp = (FilePositions *)a->st_mf; /* appender_put staged it: a FilePositions */
    fp->wrote_position = fp->committed_position = end;
    a->staged = 0;
    Py_CLEAR(a->st_mf);
    return 0;
}

static PyObject *Appender_commit(Appender *a, PyObject *unused) {
    if (stage_commit(a) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Appender_staged(Appender *a, void *closure) { return PyLong_FromSsize_t(a->staged); }

static PyObject *ids_text(const unsigned char *b, Py_ssize_t len, long long file_from, long long offset, Py_ssize_t n,
                          const char *prefix, Py_ssize_t prefix_len);

/* An append's answer: Appended(wrote_offset, wrote_bytes, store_timestamp, queue_offset,
 * dispatch_failed, tags_code, msg_count, msg_ids) — a struct sequence, read by name. tags_code
 * is a plain item's (else None); msg_count and msg_ids a batch's (else None). */
enum { AP_WROTE_OFFSET, AP_WROTE_BYTES, AP_STORE_TIMESTAMP, AP_QUEUE_OFFSET, AP_DISPATCH_FAILED, AP_TAGS_CODE,
       AP_MSG_COUNT, AP_MSG_IDS, AP_FIELDS };
static PyStructSequence_Field appended_fields[] = {
    {"wrote_offset", "CommitLog offset of the first record"},
    {"wrote_bytes", "bytes of the records"},
    {"store_timestamp", "the records' store timestamp (ms)"},
    {"queue_offset", "ConsumeQueue offset of the first record"},
    {"dispatch_failed", "1 when a ConsumeQueue or index write failed (the store is told)"},
    {"tags_code", "a plain item's tag hash code, else None"},
    {"msg_count", "a batch's message count, else None"},
    {"msg_ids", "a batch's comma-joined message ids, else None"},
    {NULL, NULL},
};
static PyStructSequence_Desc appended_desc = {"data_plane.store._speedups.Appended", "What an append wrote.",
                                              appended_fields, AP_FIELDS};
static PyTypeObject AppendedType;


/* The records of ``topic`` / ``qid_obj``: the store Messages of the list ``msgs`` (one, or with
 * ``as_batch`` a batch — the caller's own copy, all of this topic and queue: the caller
 * checked), or (msgs NULL) the plain item ``raw``. The result of append (below), with the
 * record's tag hash code after it for a plain item, or with the message count and the
 * comma-joined message ids after it for a batch (whatever its length); None
 * when the common path does not apply (nothing written). A batch's records join the stage as a
 * single record's do (staged batches of 32 x 1 KiB measured 10-15 % faster than a pwrite each);
 * its units are not pended: the queue's pending units are synced first, and the batch's go
 * straight into the queue's file, as MessageStore._write puts them. */
static PyObject *appender_put(Appender *a, PyObject *topic, PyObject *qid_obj, PyObject *msgs, const raw_batch *raw,
                              int as_batch) {
    PyObject *result = NULL, *key = NULL, *mfq = NULL, *files = NULL;
    PyObject *cq_mf = NULL, *cq_mv = NULL, *ixf = NULL, *ix_mf = NULL, *ix_mv = NULL;
    PyObject *list = NULL, *r = NULL, *now_obj = NULL, *files_ix = NULL;
    FilePositions *cq_busy = NULL; /* the ConsumeQueue file whose view this append keeps (busy) */
    int dispatch_failed = 0;
    Py_ssize_t n = msgs ? PyList_GET_SIZE(msgs) : raw->n;
    int batch = as_batch;
    if (n < 1 || (!batch && n != 1)) goto slow;
    if (msgs) { /* the caller's own list, which no Python code changes: a copy for a batch */
        list = msgs;
        Py_INCREF(list);
    }
    if (!PyUnicode_Check(topic) || !PyLong_CheckExact(qid_obj)) goto slow;
    long qid = PyLong_AsLong(qid_obj);
    if (qid < 0 || qid > INT32_MAX) { PyErr_Clear(); goto slow; }
    PyObject *topic_b, *cq;
    OffsetCell *cell;
    topic_slots *ts = met_topic(a, topic);
    if (ts && qid < ts->n && ts->slots[qid].cq) { /* a queue met before */
        topic_b = ts->topic_b;
        cq = ts->slots[qid].cq;
        cell = ts->slots[qid].cell;
    } else {
        if (PyErr_Occurred()) goto error;
        topic_b = PyDict_GetItemWithError(a->topic_bytes, topic);
        if (!topic_b) { if (PyErr_Occurred()) goto error; goto slow; }
        key = PyTuple_Pack(2, topic, qid_obj);
        if (!key) goto error;
        /* the ConsumeQueue: must exist */
        cq = PyDict_GetItemWithError(a->cq_table, key);
        if (!cq) { if (PyErr_Occurred()) goto error; goto slow; }
        /* (a missing offset is 0, as the Python path's get(key, 0)) */
        cell = offset_cell((QueueOffsets *)a->queue_offsets, key, 1);
        if (!cell) goto error;
        met_queue(a, topic, topic_b, qid, cq, cell);
    }
    long long first_qo = cell->value; /* (cells are never removed: held by the QueueOffsets) */
    /* the CommitLog file appends go to */
    mfq = SGET(a->commit_log, s_mfq);
    if (!mfq) goto error;
    files = SGET(mfq, s_files);
    if (!files) goto error;
    if (!PyList_Check(files) || PyList_GET_SIZE(files) == 0) goto slow;
    PyObject *mf = PyList_GET_ITEM(files, PyList_GET_SIZE(files) - 1);
    if (a->staged && (mf != a->st_mf || a->staged >= a->stage_commit_bytes)) {
        if (stage_commit(a) < 0) goto error; /* an OSError: nothing of this message recorded */
    }
    Py_ssize_t wrote, file_size, reserved, file_from, fd;
    FilePositions *mfp = AS_FP(mf); /* files and queues have positions.py's compiled bases */
    if (!mfp) goto slow;
    wrote = mfp->wrote_position;
    file_size = mfp->file_size;
    reserved = mfp->reserved_upto;
    file_from = mfp->file_from_offset;
    if (GET_SSIZE(mf, s_fd, &fd)) goto error;
    if (fd < 0 || fd > INT32_MAX) goto slow;
    if (a->staged && a->st_pos != wrote) {
        /* the file moved under the stage (it cannot while the CommitLog lock is held): refuse */
        PyErr_SetString(PyExc_RuntimeError, "CommitLog file positions moved under staged records");
        goto error;
    }
    Py_ssize_t staged = a->staged;
    Py_ssize_t limit = file_size - 8;
    if (reserved < limit) limit = reserved;
    /* the ConsumeQueue: the unit joins the queue's pending units (queue_sync) when it follows
     * them, or starts them when the queue's file has room where the queue offset says */
    if (!PyObject_TypeCheck(cq, &QueuePositionsType)) goto slow;
    QueuePositions *qp = (QueuePositions *)cq;
    FilePositions *cqp = NULL;
    unsigned char *cq_base = NULL;
    Py_ssize_t cq_pos = 0, cq_limit = 0, cq_len = 0, pend_at = 0;
    int pend = !batch && qp->npend > 0 && first_qo == qp->pend_from_qo + qp->npend && qp->npend < qp->pend_cap;
    unsigned int pend_gen = 0;
    if (!pend) {
        if (queue_sync(qp) < 0) goto error;
        cq_mf = SGET(cq, s_last_file);
        if (!cq_mf) goto error;
        if (cq_mf == Py_None) goto slow;
        cqp = AS_FP(cq_mf);
        if (!cqp) goto slow;
        long long cq_size = cqp->file_size, cq_res = cqp->reserved_upto;
        cq_pos = cqp->wrote_position;
        cq_limit = cq_res < cq_size ? cq_res : cq_size;
        if (cqp->file_from_offset + cq_pos != first_qo * CQ_UNIT_SIZE || cq_pos + CQ_UNIT_SIZE > cq_limit) goto slow;
        if (batch && cqp->base && cq_limit <= cqp->length) {
            /* a batch's units go straight into the file through its held view, kept while the
             * batch is laid out */
            cq_base = cqp->base;
            cq_len = cqp->length;
            cq_busy = cqp;
            cq_busy->busy++;
        } else if (batch) {
            cq_mv = SGET(cq_mf, s_mv);
            if (!cq_mv) goto error;
        } else if (cqp->base && cq_limit <= cqp->length) { /* queue_sync writes them through the view */
            Py_ssize_t cap = (cq_limit - cq_pos) / CQ_UNIT_SIZE;
            qp->pend_from_qo = first_qo;
            qp->pend_cap = cap < PEND_UNITS ? (int)cap : PEND_UNITS;
            pend = 1;
            /* the view stays while this append runs Python code (the clock, a finalizer; another
             * thread may close the file then) and, once the unit is pended, until queue_sync */
            cq_busy = cqp;
            cq_busy->busy++;
        } else {
            cq_mv = SGET(cq_mf, s_mv);
            if (!cq_mv) goto error;
        }
    }
    if (pend) { /* write_batch_impl lays the unit out in the pending array */
        pend_gen = qp->pend_gen;
        pend_at = (Py_ssize_t)qp->npend * CQ_UNIT_SIZE;
        cq_base = qp->pend;
        cq_len = PEND_UNITS * CQ_UNIT_SIZE;
        cq_pos = pend_at;
        cq_limit = (Py_ssize_t)qp->pend_cap * CQ_UNIT_SIZE;
    }
    /* the IndexFile: begun, with room for this message's keys */
    long long ix_count = 0, ix_max = 0, ix_begin = 0;
    if (a->index_enabled && a->index != Py_None) {
        files_ix = SGET(a->index, s_files);
        if (!files_ix) goto error;
        if (!PyList_Check(files_ix) || PyList_GET_SIZE(files_ix) == 0) goto slow;
        ixf = PyList_GET_ITEM(files_ix, PyList_GET_SIZE(files_ix) - 1);
        Py_INCREF(ixf);
        Py_ssize_t c;
        if (GET_SSIZE(ixf, s_index_count, &c)) goto error;
        ix_count = c;
        ix_mf = SGET(ixf, s_mf);
        if (!ix_mf) goto error;
        Py_ssize_t ix_res;
        FilePositions *ixp = AS_FP(ix_mf);
        if (!ixp) goto slow;
        ix_res = ixp->reserved_upto;
        /* IndexFile.reserved_entries(): entries that fit the blocks reserved so far */
        ix_max = (ix_res - (INDEX_HEADER_SIZE + a->ix_slots * HASH_SLOT_SIZE)) / INDEX_ENTRY_SIZE;
        if (ix_max > a->ix_max_entries) ix_max = a->ix_max_entries;
        PyObject *bt = SGET(ixf, s_begin_timestamp);
        if (!bt) goto error;
        ix_begin = PyLong_AsLongLong(bt);
        Py_DECREF(bt);
        if (ix_count + 64 > ix_max) goto slow;
        if (ix_count > 1) { /* begun: entries go straight in; otherwise put_items begins it */
            ix_mv = SGET(ix_mf, s_mv);
            if (!ix_mv) goto error;
        }
    }
    /* the store timestamp never goes backwards; clock None = the wall clock, read here */
    long long now;
    if (a->clock == Py_None) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    } else {
        now_obj = PyObject_CallNoArgs(a->clock);
        if (!now_obj) goto error;
        now = PyLong_AsLongLong(now_obj);
    }
    Py_ssize_t last_ts;
    if (GET_SSIZE(a->commit_log, s_last_store_timestamp, &last_ts)) goto error;
    if (now < last_ts) now = last_ts;
    Py_buffer sb = {.buf = a->stage, .len = a->stage_cap};
    /* room after what is written and staged, in the file and in the stage */
    Py_ssize_t room = limit - wrote - staged;
    if (room > a->stage_cap - staged) room = a->stage_cap - staged;
    if (room < 0) goto slow;
    /* Staging (stage_commit_bytes > 0): the record joins the stage, written with the ones
     * around it; otherwise it is written to the file now. Stage position p lies at file
     * position wrote + p either way. */
    int stage_it = a->stage_commit_bytes > 0;
    r = write_batch_impl(&sb, staged, staged + room, (long long)file_from + wrote, list, PyBytes_AS_STRING(topic_b),
                         PyBytes_GET_SIZE(topic_b), (int)qid, first_qo, now, a->host, a->max_props, a->max_msg,
                         a->index_enabled, cq_mv ? cq_mv : Py_None, cq_base, cq_len, cq_pos,
                         cq_limit, ix_mv ? ix_mv : Py_None, a->ix_slots, ix_count, ix_max, ix_begin,
                         stage_it ? -1 : (int)fd, wrote, raw);
    if (!r) goto error; /* an OSError from the file: nothing recorded */
    if (!Py_IS_TYPE(r, &LaidOutType)) goto slow; /* does not fit, or refused: nothing written */
    Py_ssize_t end = wrote + PyLong_AsSsize_t(PyStructSequence_GET_ITEM(r, LO_WRITTEN)); /* end of this record */
    Py_ssize_t rec_start = wrote + staged;
    PyObject *next_qo = PyStructSequence_GET_ITEM(r, LO_NEXT_QO);
    PyObject *batch_qo = PyStructSequence_GET_ITEM(r, LO_FIRST_QO);
    PyObject *cq_out = PyStructSequence_GET_ITEM(r, LO_CQ_UNITS);
    PyObject *ix_out = PyStructSequence_GET_ITEM(r, LO_INDEX_ITEMS);
    long long last_ix = PyLong_AsLongLong(PyStructSequence_GET_ITEM(r, LO_LAST_INDEXED));
    long long end_abs = (long long)file_from + end;
    /* From here on the record is in the log: record every position, as the Python path does. */
    long long next = PyLong_AsLongLong(next_qo);
    if (next == -1 && PyErr_Occurred()) goto error;
    cell->value = next;
    if (stage_it) {
        if (!a->st_mf) {
            Py_INCREF(mf);
            a->st_mf = mf;
            a->st_pos = wrote;
        }
        a->staged = end - wrote;
    } else {
        mfp->wrote_position = mfp->committed_position = end;
    }
    if (SET_LL(a->commit_log, s_last_store_timestamp, now)) goto error;
    PyObject *unit = NULL; /* a pended unit that a sync_units meanwhile kept from counting */
    if (pend && PyLong_Check(cq_out)) {
        int ok = qp->pend_gen == pend_gen && (Py_ssize_t)qp->npend * CQ_UNIT_SIZE == pend_at &&
                 pend_at + CQ_UNIT_SIZE <= (Py_ssize_t)qp->pend_cap * CQ_UNIT_SIZE;
        if (ok && pend_at == 0) cq_busy = NULL; /* the first: its file keeps the view until queue_sync */
        if (ok) {
            qp->npend++;
            qp->max_physic_offset = end_abs;
        } else {
            /* the append ran Python code (a clock, a finalizer) while another thread wrote the
             * pending units out: this one is not pended; write it the Python way (sync_units
             * first, then the file) */
            unit = PyBytes_FromStringAndSize((const char *)qp->pend + pend_at, CQ_UNIT_SIZE);
            if (!unit) goto error;
        }
    } else if (PyLong_Check(cq_out)) {
        long long to = PyLong_AsLongLong(cq_out);
        if (to == -1 && PyErr_Occurred()) goto error;
        cqp->wrote_position = cqp->committed_position = to;
        qp->max_physic_offset = end_abs;
    }
    if (unit || (PyBytes_Check(cq_out) && PyBytes_GET_SIZE(cq_out) > 0)) {
        /* (the units start at the queue's offset before the append, as in MessageStore._write:
         * a batch's first record may be a prepared transaction, which takes none) */
        PyObject *e = PyLong_FromLongLong(end_abs), *from = PyLong_FromLongLong(first_qo);
        if (!e || !from) {
            Py_XDECREF(unit);
            Py_XDECREF(e);
            Py_XDECREF(from);
            goto error;
        }
        PyObject *x = PyObject_CallMethodObjArgs(cq, s_put_units, unit ? unit : cq_out, from, e, NULL);
        Py_XDECREF(unit);
        Py_DECREF(e);
        Py_DECREF(from);
        if (!x) {
            if (!PyErr_ExceptionMatches(PyExc_OSError)) goto error;
            PyErr_Clear(); /* stored, not indexed: the caller pauses writes until a redispatch */
            dispatch_failed = 1;
        }
        Py_XDECREF(x);
    }
    if (dispatch_failed) {
        /* as Dispatcher.dispatch_appended, which stops at the first failure: the index is left
         * as it was and dispatched_offset stays before these records, for the redispatch */
    } else if (PyLong_Check(ix_out)) {
        if (SSET(ixf, s_index_count, ix_out) || SET_LL(ixf, s_end_phy_offset, last_ix) ||
            SET_LL(ixf, s_end_timestamp, now))
            goto error;
    } else if (PyBytes_GET_SIZE(ix_out) > 0 && a->index != Py_None) {
        PyObject *t = PyLong_FromLongLong(now);
        if (!t) goto error;
        PyObject *x = PyObject_CallMethodObjArgs(a->index, s_put_items, ix_out, t, NULL);
        Py_DECREF(t);
        if (!x) {
            if (!PyErr_ExceptionMatches(PyExc_OSError)) goto error;
            PyErr_Clear();
            dispatch_failed = 1;
        }
        Py_XDECREF(x);
    }
    if (!dispatch_failed && SET_LL(a->dispatcher, s_dispatched_offset, end_abs)) goto error;
    if (batch) {
        /* the ids from the records still in the stage (stage[0] lies at file position wrote) */
        static const char hexd[] = "0123456789ABCDEF";
        char prefix[16];
        for (int k = 0; k < 8; k++) {
            prefix[2 * k] = hexd[(unsigned char)a->host[k] >> 4];
            prefix[2 * k + 1] = hexd[(unsigned char)a->host[k] & 15];
        }
        PyObject *ids = ids_text(a->stage, end - wrote, (long long)file_from + wrote,
                                 (long long)file_from + rec_start, PyLong_AsSsize_t(PyStructSequence_GET_ITEM(r, LO_COUNT)), prefix, 16);
        if (!ids) goto error;
        if (ids == Py_None) {
            Py_DECREF(ids);
            PyErr_SetString(PyExc_RuntimeError, "a batch laid out without its record sizes");
            goto error;
        }
        Py_INCREF(batch_qo);
        PyObject *count = PyStructSequence_GET_ITEM(r, LO_COUNT);
        Py_INCREF(count);
        Py_INCREF(Py_None);
        PyObject *parts[AP_FIELDS] = {PyLong_FromLongLong((long long)file_from + rec_start),
                                      PyLong_FromSsize_t(end - rec_start), PyLong_FromLongLong(now), batch_qo,
                                      PyLong_FromLong(dispatch_failed), Py_None, count, ids};
        result = structseq_of(&AppendedType, AP_FIELDS, parts);
    } else if (raw) {
        PyObject *tags = PyStructSequence_GET_ITEM(r, LO_TAG_CODES); /* the item's tag code: its only distinct one */
        PyObject *code = PyTuple_Check(tags) && PyTuple_GET_SIZE(tags) == 1 ? PyTuple_GET_ITEM(tags, 0) : NULL;
        if (!code) {
            PyErr_SetString(PyExc_RuntimeError, "a plain item laid out without its tag code");
            goto error;
        }
        Py_INCREF(batch_qo);
        Py_INCREF(code);
        PyObject *parts[AP_TAGS_CODE + 1] = {PyLong_FromLongLong((long long)file_from + rec_start),
                                             PyLong_FromSsize_t(end - rec_start), PyLong_FromLongLong(now), batch_qo,
                                             PyLong_FromLong(dispatch_failed), code};
        result = structseq_of(&AppendedType, AP_TAGS_CODE + 1, parts);
    } else {
        Py_INCREF(batch_qo);
        PyObject *parts[AP_DISPATCH_FAILED + 1] = {PyLong_FromLongLong((long long)file_from + rec_start),
                                                   PyLong_FromSsize_t(end - rec_start), PyLong_FromLongLong(now),
                                                   batch_qo, PyLong_FromLong(dispatch_failed)};
        result = structseq_of(&AppendedType, AP_DISPATCH_FAILED + 1, parts);
    }
    goto done;
slow:
    result = Py_None;
    Py_INCREF(result);
    goto done;
error:
    result = NULL;
done:
    if (cq_busy) cq_busy->busy--;
    Py_XDECREF(key); Py_XDECREF(mfq); Py_XDECREF(files);
    Py_XDECREF(cq_mf); Py_XDECREF(cq_mv); Py_XDECREF(ixf); Py_XDECREF(ix_mf);
    Py_XDECREF(ix_mv); Py_XDECREF(list); Py_XDECREF(r); Py_XDECREF(now_obj); Py_XDECREF(files_ix);
    return result;
}

static PyObject *Appender_append(Appender *a, PyObject *msg) {
    PyObject *topic = SGET(msg, s_topic);
    if (!topic) return NULL;
    PyObject *qid_obj = SGET(msg, s_queue_id);
    PyObject *list = qid_obj ? PyList_New(1) : NULL;
    PyObject *result = NULL;
    if (list) {
        Py_INCREF(msg);
        PyList_SET_ITEM(list, 0, msg);
        result = appender_put(a, topic, qid_obj, list, NULL, 0);
    }
    Py_DECREF(topic);
    Py_XDECREF(qid_obj);
    Py_XDECREF(list);
    return result;
}

/* append_batch(msgs): a list or tuple of store Messages, appended as MessageStore.append does: their
 * (wrote_offset, wrote_bytes, store_ts, first queue offset, dispatch_failed, count, ids), or
 * None when the common path does not apply or the messages do not share one topic and queue
 * (nothing written: the Python path answers). */
static PyObject *Appender_append_batch(Appender *a, PyObject *msgs) {
    if (!PyList_Check(msgs) && !PyTuple_Check(msgs)) {
        PyErr_SetString(PyExc_TypeError, "append_batch takes a list or tuple of messages");
        return NULL;
    }
    /* A copy, checked and then appended: the caller's list may change while the checks or the
     * append run Python code (a property, the store's clock, a finalizer). */
    PyObject *copy = PySequence_List(msgs);
    if (!copy) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(copy);
    PyObject *result = NULL, *topic = NULL, *qid_obj = NULL;
    if (n == 0) goto none;
    PyObject *first = PyList_GET_ITEM(copy, 0);
    topic = SGET(first, s_topic);
    qid_obj = topic ? SGET(first, s_queue_id) : NULL;
    if (!qid_obj) goto out;
    if (!PyUnicode_CheckExact(topic) || !PyLong_CheckExact(qid_obj)) goto none;
    for (Py_ssize_t i = 1; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(copy, i);
        PyObject *t = SGET(m, s_topic), *q = t ? SGET(m, s_queue_id) : NULL;
        int same = -1;
        if (q) {
            same = t == topic || (PyUnicode_CheckExact(t) && PyUnicode_Compare(t, topic) == 0);
            if (same && q != qid_obj) same = PyLong_CheckExact(q) && PyObject_RichCompareBool(q, qid_obj, Py_EQ) == 1;
        }
        Py_XDECREF(t);
        Py_XDECREF(q);
        if (same < 0 || PyErr_Occurred()) goto out;
        if (!same) goto none;
    }
    result = appender_put(a, topic, qid_obj, copy, NULL, 1);
    goto out;
none:
    result = Py_None;
    Py_INCREF(result);
out:
    Py_XDECREF(topic);
    Py_XDECREF(qid_obj);
    Py_DECREF(copy);
    return result;
}

/* append_plain(topic, queue_id, body, properties, flag, sys_flag, born_ts, born_host, reconsume, skip):
 * one message from its parts as a SEND_MESSAGE(_V2) request carries them, with no store
 * Message: ``properties`` (str or bytes) must be plain (scan_plain's rule, ``skip`` the names
 * that make it not plain) and every number in range. append's result followed by the record's
 * tag hash code; None when any of that does not hold, or the common path does not apply. */
static PyObject *Appender_append_plain(Appender *a, PyObject *const *args, Py_ssize_t nargs) {
    /* (its arguments taken as they are: PyArg_ParseTuple's format cost 1,500 instructions a call) */
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "append_plain takes 10 arguments");
        return NULL;
    }
    PyObject *topic = args[0], *qid_obj = args[1], *props = args[3], *skip = args[9];
    PyObject *nums[4] = {args[4], args[5], args[6], args[8]};
    long long flag, sys_flag, born_ts, reconsume;
    if (!PyUnicode_Check(topic) || !PyLong_Check(qid_obj) || !PyTuple_Check(skip) || !PyLong_Check(nums[0]) ||
        !PyLong_Check(nums[1]) || !PyLong_Check(nums[2]) || !PyLong_Check(nums[3])) {
        PyErr_SetString(PyExc_TypeError,
                         "append_plain(topic: str, queue_id: int, body, properties, flag: int, sys_flag: int, "
                         "born_ts: int, born_host, reconsume: int, skip: tuple)");
        return NULL;
    }
    Py_buffer body, born;
    if (PyObject_GetBuffer(args[2], &body, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[7], &born, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&body);
        return NULL;
    }
    PyObject *result = NULL;
    const unsigned char *pb;
    Py_ssize_t plen;
    if (!skip_is_bytes(skip)) goto out;
    long long *vals[4] = {&flag, &sys_flag, &born_ts, &reconsume};
    for (int i = 0; i < 4; i++) {
        int overflow;
        *vals[i] = PyLong_AsLongLongAndOverflow(nums[i], &overflow);
        if (overflow) goto not_plain; /* beyond 8 bytes: the general path says which field */
    }
    int rc = props_bytes(props, &pb, &plen);
    if (rc < 0) goto out;
    if (rc == 0) goto not_plain;
    if (born.len != 8 || body.len == 0 || flag < INT32_MIN || flag > INT32_MAX || sys_flag < INT32_MIN ||
        sys_flag > INT32_MAX || reconsume < INT32_MIN || reconsume > INT32_MAX || !plain_props(pb, plen, skip))
        goto not_plain;
    raw_item item = {.body = body.buf, .body_len = body.len, .props = pb, .props_len = plen, .flag = (int32_t)flag};
    raw_batch rb = {.items = &item, .n = 1, .sys_flag = sys_flag, .born_ts = born_ts, .reconsume = reconsume,
                    .born_host = born.buf};
    result = appender_put(a, topic, qid_obj, NULL, &rb, 0);
    goto out;
not_plain:
    result = Py_None;
    Py_INCREF(result);
out:
    PyBuffer_Release(&body);
    PyBuffer_Release(&born);
    return result;
}

static PyMethodDef Appender_methods[] = {
    {"append", (PyCFunction)Appender_append, METH_O,
     "Append one message on the common path: (wrote_offset, wrote_bytes, store_ts, queue_offset, "
     "dispatch_failed), or None."},
    {"append_plain", (PyCFunction)(void (*)(void))Appender_append_plain, METH_FASTCALL,
     "Append one plain message from its parts: append's result and its tag hash code, or None."},
    {"append_batch", (PyCFunction)Appender_append_batch, METH_O,
     "Append a list of messages of one topic and queue on the common path: append's result with "
     "the count and the comma-joined ids after it, or None."},
    {"commit", (PyCFunction)Appender_commit, METH_NOARGS, "Write the staged records to the CommitLog file."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Appender_getset[] = {
    {"staged", (getter)Appender_staged, NULL, "Bytes staged, not yet written to the CommitLog file.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "data_plane.store._speedups.Appender",
    .tp_basicsize = sizeof(Appender),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Appender_init,
    .tp_dealloc = (destructor)Appender_dealloc,
    .tp_methods = Appender_methods,
    .tp_getset = Appender_getset,
    .tp_doc = "The single-message append path of MessageStore, in C.",
};

/* ---- the store's append entry points -------------------------------------------------------
 * StoreEntry(appender, store, lock, result_type, put_ok, host_hex, switches, append_type, append_ok):
 * MessageStore.append and append_plain for the common case, each one C call (the Python methods
 * cost ~1 us an append in frames, attribute reads and the result object, a third of a single
 * append; for a batch of 32, MessageStore._write's Python took ~25 % of the append). A batch
 * goes through Appender.append_batch and is answered with a PutMessageResult holding its
 * AppendResult (``append_type``, status ``append_ok``), as _write answers. Each checks that
 * the store takes writes (running, not disk_full, dispatch_broken or fenced), takes the
 * CommitLog lock without waiting, runs the Appender and counts what it stored. Whatever it does
 * not take goes to the Python methods: append to ``store._append_general(msgs)``, append_plain
 * answers None as MessageStore.append_plain does. ``switches`` is fastpath's module dict: with
 * its COMPILED false (``fastpath.use_compiled(False)``) nothing is taken, as in the methods. */
typedef struct {
    PyObject_HEAD
    Appender *appender;
    PyObject *store_ref; /* a weak reference: the store holds its entry points (no cycle) */
    PyObject *acquire, *release, *result_type, *put_ok, *host_hex, *switches, *append_type, *append_ok;
    long long count, bytes; /* messages and bytes these entries stored */
} StoreEntry;

static PyObject *s_compiled, *s_running, *s_disk_full, *s_dispatch_broken, *s_fenced, *s_r_status, *s_r_append,
    *s_r_reason, *s_r_raw, *s_r_host_hex, *s_a_ids, *s_a_msg_num, *s_a_queue_offset, *s_a_store_timestamp,
    *s_a_wrote_bytes, *s_a_wrote_offset, *s_append_general, *s_io_refusal, *s_dispatch_failed, *empty_str,
    *empty_tuple;

static int StoreEntry_traverse(StoreEntry *e, visitproc visit, void *arg) {
    Py_VISIT(e->appender); Py_VISIT(e->store_ref); Py_VISIT(e->acquire); Py_VISIT(e->release);
    Py_VISIT(e->result_type); Py_VISIT(e->put_ok); Py_VISIT(e->host_hex); Py_VISIT(e->switches);
    Py_VISIT(e->append_type); Py_VISIT(e->append_ok);
    return 0;
}

static int StoreEntry_clear(StoreEntry *e) {
    Py_CLEAR(e->appender); Py_CLEAR(e->store_ref); Py_CLEAR(e->acquire); Py_CLEAR(e->release);
    Py_CLEAR(e->result_type); Py_CLEAR(e->put_ok); Py_CLEAR(e->host_hex); Py_CLEAR(e->switches);
    Py_CLEAR(e->append_type); Py_CLEAR(e->append_ok);
    return 0;
}

static void StoreEntry_dealloc(StoreEntry *e) {
    PyObject_GC_UnTrack(e);
    StoreEntry_clear(e);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static int StoreEntry_init(StoreEntry *e, PyObject *args, PyObject *kw) {
    PyObject *ap, *store, *lock, *rt, *ok, *hh, *sw, *at, *aok;
    if (!PyArg_ParseTuple(args, "O!OOO!OUO!O!O", &AppenderType, &ap, &store, &lock, &PyType_Type, &rt, &ok, &hh,
                          &PyDict_Type, &sw, &PyType_Type, &at, &aok))
        return -1;
    if (e->store_ref) {
        PyErr_SetString(PyExc_ValueError, "StoreEntry initialised twice");
        return -1;
    }
    e->store_ref = PyWeakref_NewRef(store, NULL);
    e->acquire = PyObject_GetAttrString(lock, "acquire");
    e->release = PyObject_GetAttrString(lock, "release");
    if (!e->store_ref || !e->acquire || !e->release) return -1;
    Py_INCREF(ap); Py_INCREF(rt); Py_INCREF(ok); Py_INCREF(hh); Py_INCREF(sw); Py_INCREF(at); Py_INCREF(aok);
    e->appender = (Appender *)ap; e->result_type = rt; e->put_ok = ok; e->host_hex = hh; e->switches = sw;
    e->append_type = at; e->append_ok = aok;
    return 0;
}

/* The store (a new reference), or NULL with an error when it is gone. */
static PyObject *entry_store(StoreEntry *e) {
    PyObject *store = e->store_ref ? PyWeakref_GetObject(e->store_ref) : NULL;
    if (!store || store == Py_None) {
        PyErr_SetString(PyExc_RuntimeError, "the store of these entry points is gone");
        return NULL;
    }
    Py_INCREF(store);
    return store;
}

/* 1 when the store takes writes (MessageStore.writable) and the compiled path is on, 0 when
 * not, -1 on an error. */
static int entry_writable(StoreEntry *e, PyObject *store) {
    if (PyDict_GetItemWithError(e->switches, s_compiled) != Py_True) return PyErr_Occurred() ? -1 : 0;
    PyObject *names[4] = {s_running, s_disk_full, s_dispatch_broken, s_fenced};
    for (int i = 0; i < 4; i++) {
        PyObject *v = PyObject_GetAttr(store, names[i]);
        if (!v) return -1;
        int t = PyObject_IsTrue(v);
        Py_DECREF(v);
        if (t < 0) return -1;
        if (t != (i == 0)) return 0;
    }
    return 1;
}

/* lock.acquire(False): 1 taken, 0 busy, -1 error. */
static int entry_lock(StoreEntry *e) {
    PyObject *no = Py_False;
    PyObject *r = PyObject_Vectorcall(e->acquire, &no, 1, NULL);
    if (!r) return -1;
    int got = r == Py_True;
    Py_DECREF(r);
    return got;
}

/* After the Appender ran under the lock: release it (keeping an exception the append raised),
 * count the stored records (``n``; -1: the count in a batch's answer) and report a failed
 * dispatch. ``r`` is the Appender's answer (a tuple, None, or NULL for an exception). An
 * OSError (the CommitLog file refused the bytes: nothing recorded) becomes
 * store._io_refusal(error) with *refused set. */
static PyObject *entry_done(StoreEntry *e, PyObject *store, PyObject *r, Py_ssize_t n, int *refused) {
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    PyObject *u = PyObject_CallNoArgs(e->release);
    if (!u) {
        Py_XDECREF(r); Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(etb);
        return NULL;
    }
    Py_DECREF(u);
    PyErr_Restore(et, ev, etb);
    if (!r) {
        if (!PyErr_ExceptionMatches(PyExc_OSError)) return NULL;
        PyErr_Fetch(&et, &ev, &etb);
        PyErr_NormalizeException(&et, &ev, &etb);
        PyObject *res = PyObject_CallMethodOneArg(store, s_io_refusal, ev ? ev : Py_None);
        Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(etb);
        *refused = 1;
        return res;
    }
    if (r == Py_None) return r;
    if (n < 0) { /* a batch: its count follows the record's numbers */
        n = Py_IS_TYPE(r, &AppendedType) && PyStructSequence_GET_ITEM(r, AP_MSG_COUNT) != Py_None
                ? PyLong_AsSsize_t(PyStructSequence_GET_ITEM(r, AP_MSG_COUNT))
                : -1;
        if (n < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "the Appender's batch count is negative");
            Py_DECREF(r);
            return NULL;
        }
    }
    long long size;
    if (!Py_IS_TYPE(r, &AppendedType) ||
        (size = PyLong_AsLongLong(PyStructSequence_GET_ITEM(r, AP_WROTE_BYTES))) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "the Appender's answer is not a record");
        Py_DECREF(r);
        return NULL;
    }
    e->count += n;
    e->bytes += size;
    int failed = PyObject_IsTrue(PyStructSequence_GET_ITEM(r, AP_DISPATCH_FAILED));
    if (failed) {
        PyObject *f = failed > 0 ? PyObject_CallMethodNoArgs(store, s_dispatch_failed) : NULL;
        if (!f) {
            Py_DECREF(r);
            return NULL;
        }
        Py_DECREF(f);
    }
    return r;
}

/* PutMessageResult.stored(r, host_hex), without the call. */
static PyObject *entry_result(StoreEntry *e, PyObject *r) {
    PyTypeObject *tp = (PyTypeObject *)e->result_type;
    PyObject *res = PyBaseObject_Type.tp_new(tp, empty_tuple, NULL);
    if (!res) return NULL;
    if (SSET(res, s_r_status, e->put_ok) < 0 || SSET(res, s_r_append, Py_None) < 0 ||
        SSET(res, s_r_reason, empty_str) < 0 || SSET(res, s_r_raw, r) < 0 || SSET(res, s_r_host_hex, e->host_hex) < 0) {
        Py_DECREF(res);
        return NULL;
    }
    return res;
}

/* PutMessageResult(PUT_OK, AppendResult(PUT_OK, offset, bytes, store ts, queue offset, count,
 * host_hex, ids)) from a batch's answer ``r`` (Appender.append_batch), without the calls. */
static PyObject *entry_batch_result(StoreEntry *e, PyObject *r) {
    PyObject *ar = PyBaseObject_Type.tp_new((PyTypeObject *)e->append_type, empty_tuple, NULL);
    if (!ar) return NULL;
    if (SSET(ar, s_r_status, e->append_ok) < 0 ||
        SSET(ar, s_a_wrote_offset, PyStructSequence_GET_ITEM(r, AP_WROTE_OFFSET)) < 0 ||
        SSET(ar, s_a_wrote_bytes, PyStructSequence_GET_ITEM(r, AP_WROTE_BYTES)) < 0 ||
        SSET(ar, s_a_store_timestamp, PyStructSequence_GET_ITEM(r, AP_STORE_TIMESTAMP)) < 0 ||
        SSET(ar, s_a_queue_offset, PyStructSequence_GET_ITEM(r, AP_QUEUE_OFFSET)) < 0 ||
        SSET(ar, s_a_msg_num, PyStructSequence_GET_ITEM(r, AP_MSG_COUNT)) < 0 ||
        SSET(ar, s_r_host_hex, e->host_hex) < 0 || SSET(ar, s_a_ids, PyStructSequence_GET_ITEM(r, AP_MSG_IDS)) < 0) {
        Py_DECREF(ar);
        return NULL;
    }
    PyObject *res = PyBaseObject_Type.tp_new((PyTypeObject *)e->result_type, empty_tuple, NULL);
    if (!res || SSET(res, s_r_status, e->put_ok) < 0 || SSET(res, s_r_append, ar) < 0 ||
        SSET(res, s_r_reason, empty_str) < 0 || SSET(res, s_r_raw, Py_None) < 0 ||
        SSET(res, s_r_host_hex, empty_str) < 0) {
        Py_XDECREF(res);
        res = NULL;
    }
    Py_DECREF(ar);
    return res;
}

static PyObject *entry_append(StoreEntry *e, PyObject *store, PyObject *msgs) {
    PyObject *msg = NULL;
    Py_ssize_t n = 0;
    if (PyList_CheckExact(msgs) || PyTuple_CheckExact(msgs)) {
        n = Py_SIZE(msgs);
        if (n == 1) msg = PyList_CheckExact(msgs) ? PyList_GET_ITEM(msgs, 0) : PyTuple_GET_ITEM(msgs, 0);
    }
    if (n < 1) return PyObject_CallMethodOneArg(store, s_append_general, msgs);
    int w = entry_writable(e, store);
    if (w <= 0) return w < 0 ? NULL : PyObject_CallMethodOneArg(store, s_append_general, msgs);
    int got = entry_lock(e);
    if (got <= 0) return got < 0 ? NULL : PyObject_CallMethodOneArg(store, s_append_general, msgs);
    PyObject *r;
    if (msg) {
        Py_INCREF(msg); /* (the list may change while the append runs Python code) */
        r = Appender_append(e->appender, msg);
        Py_DECREF(msg);
    } else { /* a batch: append_batch appends a copy */
        r = Appender_append_batch(e->appender, msgs);
    }
    int refused = 0;
    r = entry_done(e, store, r, msg ? 1 : -1, &refused);
    if (!r) return NULL;
    if (refused) return Py_BuildValue("(Ni)", r, -1);
    if (r == Py_None) {
        Py_DECREF(r);
        return PyObject_CallMethodOneArg(store, s_append_general, msgs);
    }
    PyObject *end =
        PyNumber_Add(PyStructSequence_GET_ITEM(r, AP_WROTE_OFFSET), PyStructSequence_GET_ITEM(r, AP_WROTE_BYTES));
    PyObject *res = end ? (msg ? entry_result(e, r) : entry_batch_result(e, r)) : NULL;
    Py_DECREF(r);
    if (!res) {
        Py_XDECREF(end);
        return NULL;
    }
    return Py_BuildValue("(NN)", res, end);
}

/* append(msgs) -> (PutMessageResult, end offset), as MessageStore.append. */
static PyObject *StoreEntry_append(StoreEntry *e, PyObject *msgs) {
    PyObject *store = entry_store(e);
    if (!store) return NULL;
    PyObject *result = entry_append(e, store, msgs);
    Py_DECREF(store);
    return result;
}

/* append_plain(...) as MessageStore.append_plain: the Appender's answer, the refusal of an I/O
 * error, or None when not taken. */
static PyObject *StoreEntry_append_plain(StoreEntry *e, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *store = entry_store(e);
    if (!store) return NULL;
    PyObject *result = NULL;
    int w = entry_writable(e, store), got = 0;
    if (w > 0) got = entry_lock(e);
    if (w < 0 || got < 0) goto out;
    if (w == 0 || got == 0) {
        result = Py_None;
        Py_INCREF(result);
        goto out;
    }
    int refused = 0;
    result = entry_done(e, store, Appender_append_plain(e->appender, args, nargs), 1, &refused);
out:
    Py_DECREF(store);
    return result;
}

static PyObject *StoreEntry_count(StoreEntry *e, void *closure) { return PyLong_FromLongLong(e->count); }
static PyObject *StoreEntry_bytes(StoreEntry *e, void *closure) { return PyLong_FromLongLong(e->bytes); }

static PyMethodDef StoreEntry_methods[] = {
    {"append", (PyCFunction)StoreEntry_append, METH_O, "MessageStore.append, the common case in C."},
    {"append_plain", (PyCFunction)(void (*)(void))StoreEntry_append_plain, METH_FASTCALL,
     "MessageStore.append_plain, in C."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef StoreEntry_getset[] = {
    {"count", (getter)StoreEntry_count, NULL, "Messages these entries stored.", NULL},
    {"bytes", (getter)StoreEntry_bytes, NULL, "Bytes these entries stored.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject StoreEntryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "data_plane.store._speedups.StoreEntry",
    .tp_basicsize = sizeof(StoreEntry),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)StoreEntry_init,
    .tp_dealloc = (destructor)StoreEntry_dealloc,
    .tp_traverse = (traverseproc)StoreEntry_traverse,
    .tp_clear = (inquiry)StoreEntry_clear,
    .tp_methods = StoreEntry_methods,
    .tp_getset = StoreEntry_getset,
    .tp_doc = "MessageStore's append entry points for the common case, in C.",
};

/* madvise over [start, start+length) of a buffer (a shared file mapping) with the GIL released;
 * returns errno (0 = done). `inward` rounds the range inward to whole pages (never touching a
 * page only partly inside it), otherwise outward. */
static PyObject *madvise_range(PyObject *args, int advice, int inward, const char *what) {
    Py_buffer b;
    Py_ssize_t start, length;
    if (!PyArg_ParseTuple(args, "w*nn", &b, &start, &length)) return NULL;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (start < 0 || length < 0 || start > b.len) {
        PyBuffer_Release(&b);
        PyErr_Format(PyExc_ValueError, "%s: range outside the buffer", what);
        return NULL;
    }
    if (start + length > b.len) length = b.len - start;
    uintptr_t base = (uintptr_t)b.buf, first = base + start, last = base + start + length;
    uintptr_t lo = inward ? (first + page - 1) & ~(page - 1) : first & ~(page - 1);
    uintptr_t hi = inward ? last & ~(page - 1) : (last + page - 1) & ~(page - 1);
    uintptr_t top = (base + b.len) & ~(page - 1);
    if (lo < base) lo = (base + page - 1) & ~(page - 1);
    if (hi > top) hi = top;
    int err = 0;
    if (hi > lo) {
        Py_BEGIN_ALLOW_THREADS
        if (madvise((void *)lo, hi - lo, advice) != 0) err = errno;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&b);
    return PyLong_FromLong(err);
}

/* release(buffer, start, length) -> errno: drops the pages wholly inside the range from the
 * process's page tables (MADV_DONTNEED; dirty pages stay dirty in the page cache). */
static PyObject *release(PyObject *self, PyObject *args) {
    return madvise_range(args, MADV_DONTNEED, 1, "release");
}

/* populate(fd, start, length, call_bytes) -> errno: brings [start, start+length) of a file into
 * the page cache (posix_fadvise WILLNEED, `call_bytes` a call: the kernel reads ahead at most
 * its readahead window per call) with the GIL released. Twin: mapped_file.py_populate. */
static PyObject *populate(PyObject *self, PyObject *args) {
    int fd;
    long long start, length, call_bytes;
    if (!PyArg_ParseTuple(args, "iLLL", &fd, &start, &length, &call_bytes)) return NULL;
    if (fd < 0 || start < 0 || length < 0 || call_bytes <= 0) {
        PyErr_SetString(PyExc_ValueError, "populate: fd, start and length >= 0, call_bytes > 0");
        return NULL;
    }
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (long long pos = start, end = start + length; pos < end && !err; pos += call_bytes) {
        long long n = end - pos < call_bytes ? end - pos : call_bytes;
        err = posix_fadvise(fd, (off_t)pos, (off_t)n, POSIX_FADV_WILLNEED);
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(err);
}

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    uint32_t c = ~crc_update(0xFFFFFFFFu, b.buf, b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}


/* ---- the pull read: ConsumeQueue units -> record slices ---------------------------------- */
/* collect_units(units, i, n, cur, cur_from, cur_end, log_min, max_nums, max_bytes, total_bytes,
 *               tags_codes, messages, queue_offsets, first_queue_offset)
 *               [, coalesce])
 * -> UnitsCollected(next_unit, total_bytes, last_phy_offset, full)
 * Walks 20-byte units from index i while each one's record lies whole in ``cur`` (the mapping of
 * the CommitLog file [cur_from, cur_end)), appending a memoryview slice per record and its queue
 * offset. With ``coalesce``, records that follow each other in the file go out as one slice (a
 * batch sent to one queue is stored back to back): fewer objects and iovecs for the socket. The
 * message count is len(queue_offsets) either way. Stops, with the unit at i not taken, when the
 * pull is full (full = 1), when the units run out, or at a unit the caller must look at itself
 * (removed, another file, cut short); next_unit is that unit's index (n when they ran out),
 * last_phy_offset the CommitLog offset of the last record taken (0 when none was). */
enum { UC_NEXT_UNIT, UC_TOTAL_BYTES, UC_LAST_PHY_OFFSET, UC_FULL, UC_FIELDS };
static PyStructSequence_Field units_collected_fields[] = {
    {"next_unit", "the unit not taken (n when the units ran out)"},
    {"total_bytes", "the pull's bytes so far"},
    {"last_phy_offset", "CommitLog offset of the last record taken, 0 when none was"},
    {"full", "1 when the pull is full, else 0"},
    {NULL, NULL},
};
static PyStructSequence_Desc units_collected_desc = {"data_plane.store._speedups.UnitsCollected",
                                                     "Where collect_units stopped.", units_collected_fields,
                                                     UC_FIELDS};
static PyTypeObject UnitsCollectedType;

static int append_slice(PyObject *list, PyObject *cur, Py_ssize_t from, Py_ssize_t to) {
    PyObject *piece = PySequence_GetSlice(cur, from, to);
    if (!piece) return -1;
    int bad = PyList_Append(list, piece);
    Py_DECREF(piece);
    return bad;
}

static PyObject *collect_units(PyObject *self, PyObject *args) {
    Py_buffer u;
    Py_ssize_t i, n, max_nums;
    long long cur_from, cur_end, log_min, max_bytes, total, first_qo;
    PyObject *cur, *tags_codes, *messages, *queue_offsets;
    int coalesce = 0;
    if (!PyArg_ParseTuple(args, "y*nnOLLLnLLOO!O!L|p:collect_units", &u, &i, &n, &cur, &cur_from, &cur_end,
                          &log_min, &max_nums, &max_bytes, &total, &tags_codes, &PyList_Type, &messages,
                          &PyList_Type, &queue_offsets, &first_qo, &coalesce))
        return NULL;
    PyObject *result = NULL;
    long long last_phy = 0;
    int full = 0;
    Py_ssize_t run_at = -1, run_end = -1; /* the slice not yet appended: [run_at, run_end) of cur */
    if (n < 0 || i < 0 || n * CQ_UNIT_SIZE > u.len) {
        PyErr_SetString(PyExc_ValueError, "collect_units: more units than bytes");
        goto done;
    }
    if (cur == Py_None) cur_end = cur_from; /* no file yet: every unit goes back to the caller */
    const unsigned char *base = u.buf;
    for (; i < n; i++) {
        const unsigned char *p = base + i * CQ_UNIT_SIZE;
        long long phy = (long long)get64(p + CQ_UNIT_PHYS_AT);
        int32_t size = (int32_t)get32(p + CQ_UNIT_RECORD_SIZE_AT);
        Py_ssize_t have = PyList_GET_SIZE(queue_offsets);
        if (have && (have >= max_nums || total + size > max_bytes)) {
            full = 1;
            break;
        }
        if (phy < log_min || size <= 0 || phy < cur_from || phy >= cur_end || phy + size > cur_end) break;
        if (tags_codes != Py_None) {
            PyObject *code = PyLong_FromLongLong((long long)get64(p + CQ_UNIT_TAGS_AT));
            if (!code) goto done;
            int in = PySequence_Contains(tags_codes, code);
            Py_DECREF(code);
            if (in < 0) goto done;
            if (!in) continue;
        }
        Py_ssize_t at = (Py_ssize_t)(phy - cur_from);
        if (coalesce && run_at >= 0 && at == run_end) {
            run_end = at + size;
        } else {
            if (run_at >= 0 && append_slice(messages, cur, run_at, run_end) < 0) goto done;
            run_at = at;
            run_end = at + size;
        }
        PyObject *qo = PyLong_FromLongLong(first_qo + i);
        if (!qo) goto done;
        int bad = PyList_Append(queue_offsets, qo);
        Py_DECREF(qo);
        if (bad) goto done;
        total += size;
        last_phy = phy;
    }
    if (run_at >= 0 && append_slice(messages, cur, run_at, run_end) < 0) goto done;
    PyObject *parts[UC_FIELDS] = {PyLong_FromSsize_t(i), PyLong_FromLongLong(total), PyLong_FromLongLong(last_phy),
                                  PyLong_FromLong(full)};
    result = structseq_of(&UnitsCollectedType, UC_FIELDS, parts);
done:
    PyBuffer_Release(&u);
    return result;
}

/* batch_ids(mapping, file_from, offset, n, prefix) -> "id,id,...": the message id of each of the
 * n records lying back to back from CommitLog offset ``offset`` in one file's mapping (prefix:
 * the store host as 16 hex digits, then the offset as 16). None when a record runs out of it. */
/* batch_ids' work on b[0, len): the id text, None when a size is not there, NULL on an error. */
static PyObject *ids_text(const unsigned char *b, Py_ssize_t len, long long file_from, long long offset, Py_ssize_t n,
                          const char *prefix, Py_ssize_t prefix_len) {
    PyObject *result = NULL;
    static const char hexd[] = "0123456789ABCDEF";
    Py_ssize_t one = prefix_len + 16;
    char *text = n > 0 ? PyMem_Malloc((size_t)(one + 1) * (size_t)n) : NULL;
    if (n > 0 && !text) {
        PyErr_NoMemory();
        goto done;
    }
    char *w = text;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long at = offset - file_from;
        if (at < 0 || at + 4 > len) {
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        if (i) *w++ = ',';
        memcpy(w, prefix, prefix_len);
        w += prefix_len;
        for (int k = 0; k < 16; k++) *w++ = hexd[((unsigned long long)offset >> (60 - 4 * k)) & 15];
        int32_t size = (int32_t)get32(b + at);
        if (size <= 0) {
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        offset += size;
    }
    result = PyUnicode_FromStringAndSize(text ? text : "", w - text);
done:
    PyMem_Free(text);
    return result;
}

static PyObject *batch_ids(PyObject *self, PyObject *args) {
    Py_buffer b;
    long long file_from, offset;
    Py_ssize_t n;
    const char *prefix;
    Py_ssize_t prefix_len;
    if (!PyArg_ParseTuple(args, "y*LLns#:batch_ids", &b, &file_from, &offset, &n, &prefix, &prefix_len)) return NULL;
    PyObject *result = ids_text(b.buf, b.len, file_from, offset, n, prefix, prefix_len);
    PyBuffer_Release(&b);
    return result;
}


static PyMethodDef methods[] = {
    {"plain_properties", plain_properties, METH_VARARGS, "Whether encoded properties are plain (see plain_batch)."},
    {"write_batch", write_batch, METH_VARARGS, "Lay out a batch of one (topic, queue) as CommitLog records."},
    {"index_write", index_write, METH_VARARGS, "Add (hash, offset) items to an IndexFile mapping."},
    {"crc32c", py_crc32c, METH_VARARGS, "CRC-32C of a buffer."},
    {"batch_ids", batch_ids, METH_VARARGS, "The comma-joined message ids of records lying back to back."},
    {"plain_batch", plain_batch, METH_VARARGS, "Whether write_batch takes a batch body as it is: PlainCounts or None."},
    {"collect_units", collect_units, METH_VARARGS, "Turn ConsumeQueue units into record slices (a pull read)."},
    {"release", release, METH_VARARGS, "Drop a range of a shared mapping from the page tables, GIL released."},
    {"populate", populate, METH_VARARGS, "Bring a range of a file into the page cache, GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__speedups(void) {
    crc_init();
#define INTERN(var, s) if (!(var = PyUnicode_InternFromString(s))) return NULL
    INTERN(s_body, "body");
    INTERN(s_properties, "properties");
    INTERN(s_flag, "flag");
    INTERN(s_sys_flag, "sys_flag");
    INTERN(s_born_timestamp, "born_timestamp");
    INTERN(s_born_host, "born_host");
    INTERN(s_reconsume_times, "reconsume_times");
    INTERN(s_prepared, "prepared_transaction_offset");
#define INTERN2(var, s) if (!(var = PyUnicode_InternFromString(s))) return NULL
    INTERN2(s_topic, "topic"); INTERN2(s_queue_id, "queue_id"); INTERN2(s_mfq, "mfq"); INTERN2(s_files, "files");
    INTERN2(s_mv, "mv"); INTERN2(s_last_file, "last_file");
    INTERN2(s_last_store_timestamp, "last_store_timestamp");
    INTERN2(s_index_count, "index_count"); INTERN2(s_end_phy_offset, "end_phy_offset");
    INTERN2(s_end_timestamp, "end_timestamp"); INTERN2(s_begin_timestamp, "begin_timestamp");
    INTERN2(s_max_entries, "max_entries"); INTERN2(s_mf, "mf"); INTERN2(s_dispatched_offset, "dispatched_offset");
    INTERN2(s_put_units, "put_units"); INTERN2(s_put_items, "put_items");
    INTERN2(s_fd, "_fd"); INTERN2(s_cq_last_file, "last_file");
    INTERN2(s_compiled, "COMPILED"); INTERN2(s_running, "running"); INTERN2(s_disk_full, "disk_full"); INTERN2(s_dispatch_broken, "dispatch_broken");
    INTERN2(s_fenced, "fenced"); INTERN2(s_r_status, "status"); INTERN2(s_r_append, "_append");
    INTERN2(s_r_reason, "reason"); INTERN2(s_r_raw, "_raw"); INTERN2(s_r_host_hex, "_host_hex");
    INTERN2(s_a_ids, "_ids"); INTERN2(s_a_msg_num, "msg_num"); INTERN2(s_a_queue_offset, "queue_offset");
    INTERN2(s_a_store_timestamp, "store_timestamp"); INTERN2(s_a_wrote_bytes, "wrote_bytes");
    INTERN2(s_a_wrote_offset, "wrote_offset");
    INTERN2(s_append_general, "_append_general"); INTERN2(s_io_refusal, "_io_refusal");
    INTERN2(s_dispatch_failed, "_dispatch_failed"); INTERN2(empty_str, "");
    if (!(empty_tuple = PyTuple_New(0))) return NULL;
    if (PyStructSequence_InitType2(&AppendedType, &appended_desc) < 0 ||
        PyStructSequence_InitType2(&LaidOutType, &laid_out_desc) < 0 ||
        PyStructSequence_InitType2(&NeedsRoomType, &needs_room_desc) < 0 ||
        PyStructSequence_InitType2(&RefusedType, &refused_desc) < 0 ||
        PyStructSequence_InitType2(&IndexWrittenType, &index_written_desc) < 0 ||
        PyStructSequence_InitType2(&UnitsCollectedType, &units_collected_desc) < 0 ||
        PyStructSequence_InitType2(&PlainCountsType, &plain_counts_desc) < 0)
        return NULL;
    if (PyType_Ready(&AppenderType) < 0 || PyType_Ready(&FilePositionsType) < 0 ||
        PyType_Ready(&QueuePositionsType) < 0 || PyType_Ready(&OffsetCellType) < 0 ||
        PyType_Ready(&QueueOffsetsType) < 0 || PyType_Ready(&StoreEntryType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Appender", (PyObject *)&AppenderType) < 0 ||
        PyModule_AddObjectRef(m, "FilePositions", (PyObject *)&FilePositionsType) < 0 ||
        PyModule_AddObjectRef(m, "QueuePositions", (PyObject *)&QueuePositionsType) < 0 ||
        PyModule_AddObjectRef(m, "QueueOffsets", (PyObject *)&QueueOffsetsType) < 0 ||
        PyModule_AddObjectRef(m, "StoreEntry", (PyObject *)&StoreEntryType) < 0 ||
        PyModule_AddObjectRef(m, "Appended", (PyObject *)&AppendedType) < 0 ||
        PyModule_AddObjectRef(m, "LaidOut", (PyObject *)&LaidOutType) < 0 ||
        PyModule_AddObjectRef(m, "NeedsRoom", (PyObject *)&NeedsRoomType) < 0 ||
        PyModule_AddObjectRef(m, "Refused", (PyObject *)&RefusedType) < 0 ||
        PyModule_AddObjectRef(m, "IndexWritten", (PyObject *)&IndexWrittenType) < 0 ||
        PyModule_AddObjectRef(m, "UnitsCollected", (PyObject *)&UnitsCollectedType) < 0 ||
        PyModule_AddObjectRef(m, "PlainCounts", (PyObject *)&PlainCountsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
