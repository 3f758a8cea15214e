/*
 * Compiled twin of data_plane/store/fastpath.py: the per-message loops of the write path.
 *
 * write_batch: lays out a batch of messages of one (topic, queue) as CommitLog records (the
 * 88-byte RocketMQ header, body, topic, properties; see message.py), and produces the
 * ConsumeQueue units (20 bytes each) and index items (key hash 4 + CommitLog offset 8) for
 * them. index_write: adds index items to an IndexFile mapping. Both must give byte-for-byte
 * what fastpath.py gives; tests run both and compare.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEADER_SIZE 88
#define MAGIC_CODE ((int32_t)0xDAA320A7)
#define TRAN_MASK (0x3 << 2)
#define TRAN_COMMIT (0x2 << 2)
#define TRAN_ROLLBACK (0x3 << 2)

/* ---- CRC-32C (Castagnoli), same as the crc32c package -------------------------------- */
static uint32_t crc_table[8][256];
static int have_sse42 = 0;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t crc_sw(uint32_t crc, const unsigned char *p, size_t n) {
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        v ^= crc;
        crc = crc_table[7][v & 0xFF] ^ crc_table[6][(v >> 8) & 0xFF] ^ crc_table[5][(v >> 16) & 0xFF] ^
              crc_table[4][(v >> 24) & 0xFF] ^ crc_table[3][(v >> 32) & 0xFF] ^
              crc_table[2][(v >> 40) & 0xFF] ^ crc_table[1][(v >> 48) & 0xFF] ^ crc_table[0][v >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

/* crc is the running (not inverted) register; start with 0xFFFFFFFF, finish with ~crc */
static inline uint32_t crc_update(uint32_t crc, const unsigned char *p, size_t n) {
#if defined(__x86_64__)
    if (have_sse42) return crc_hw(crc, p, n);
#endif
    return crc_sw(crc, p, n);
}

/* ---- big-endian stores ---------------------------------------------------------------- */
static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}
static inline void put64(unsigned char *p, uint64_t v) {
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}
static inline uint32_t get32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t get64(const unsigned char *p) {
    return ((uint64_t)get32(p) << 32) | get32(p + 4);
}

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
} item_t;

static PyObject *s_body, *s_properties, *s_flag, *s_sys_flag, *s_born_timestamp, *s_born_host,
    *s_reconsume_times, *s_prepared;

static int get_ll(PyObject *obj, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (*out == -1 && PyErr_Occurred()) return -1;
    return 0;
}

static void release_items(item_t *items, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (items[i].has_body) PyBuffer_Release(&items[i].body);
        Py_XDECREF(items[i].props);
        Py_XDECREF(items[i].born_host_obj);
    }
    PyMem_Free(items);
}

static PyObject *refuse(item_t *items, Py_ssize_t n, Py_ssize_t idx, const char *status, PyObject *reason) {
    release_items(items, n);
    if (!reason) return NULL;
    return Py_BuildValue("(insN)", 2, idx, status, reason);
}

/* Adds items [start, n) to an IndexFile mapping until they run out or the file is full. */
static Py_ssize_t index_add(unsigned char *b, long long slots, long long *count, long long max_entries,
                            long long begin_ts, long long store_ts, const unsigned char *it, Py_ssize_t n,
                            Py_ssize_t start, long long *last_phys) {
    long long entries_at = 40 + slots * 4;
    long long diff = (store_ts - begin_ts) / 1000;
    if (store_ts < begin_ts) diff = 0;
    if (diff > 0x7FFFFFFF) diff = 0x7FFFFFFF;
    Py_ssize_t i = start;
    long long c = *count;
    for (; i < n && c < max_entries; i++) {
        uint32_t h = get32(it + i * 12);
        uint64_t phys = get64(it + i * 12 + 4);
        unsigned char *slot = b + 40 + (h % (uint64_t)slots) * 4;
        long long prev = (int32_t)get32(slot);
        if (prev <= 0 || prev >= c) prev = 0;
        unsigned char *e = b + entries_at + c * 20;
        put32(e, h);
        put64(e + 4, phys);
        put32(e + 12, (uint32_t)diff);
        put32(e + 16, (uint32_t)prev);
        put32(slot, (uint32_t)c);
        c++;
        *last_phys = (long long)phys;
    }
    *count = c;
    return i;
}

/* write_batch(buf, pos, limit, file_from, msgs, topic_b, queue_id, first_qo, store_ts,
 *             store_host, max_props, max_msg, index_enabled)
 *             [, cq_target, cq_pos, cq_limit, ix_target, ix_slots, ix_count, ix_max, ix_begin_ts])
 * -> (0, end_pos, next_qo, first_qo_of_batch, cq_units | new_cq_pos, index_items | new_ix_count,
 *     last_indexed_offset)
 *  | (1, bytes_needed)                       batch does not fit before `limit`
 *  | (2, msg_index, status_name, reason)     a message is refused; nothing written */
static PyObject *write_batch(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t pos, limit;
    long long file_from, first_qo, store_ts;
    PyObject *msgs;
    Py_buffer topic, host;
    int queue_id, index_enabled;
    Py_ssize_t max_props, max_msg, cq_pos = 0, cq_limit = 0;
    PyObject *cq_target = Py_None, *ix_target = Py_None;
    long long ix_slots = 0, ix_count = 0, ix_max = 0, ix_begin_ts = 0;
    if (!PyArg_ParseTuple(args, "w*nnLO!y*iLLy*nnp|OnnOLLLL", &buf, &pos, &limit, &file_from, &PyList_Type, &msgs,
                          &topic, &queue_id, &first_qo, &store_ts, &host, &max_props, &max_msg,
                          &index_enabled, &cq_target, &cq_pos, &cq_limit, &ix_target, &ix_slots, &ix_count,
                          &ix_max, &ix_begin_ts))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = PyList_GET_SIZE(msgs);
    item_t *items = PyMem_Calloc(n ? n : 1, sizeof(item_t));
    if (!items) {
        PyErr_NoMemory();
        goto done;
    }
    if (host.len != 8 || topic.len < 1 || topic.len > 255 || pos < 0 || limit > buf.len) {
        PyErr_SetString(PyExc_ValueError, "bad arguments to write_batch");
        release_items(items, n);
        goto done;
    }
    Py_ssize_t need = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        item_t *it = &items[i];
        PyObject *body = PyObject_GetAttr(m, s_body);
        if (!body) { release_items(items, n); goto done; }
        int rc = PyObject_GetBuffer(body, &it->body, PyBUF_SIMPLE);
        Py_DECREF(body);
        if (rc < 0) { release_items(items, n); goto done; }
        it->has_body = 1;
        if (it->body.len == 0) {
            result = refuse(items, n, i, "MESSAGE_ILLEGAL", PyUnicode_FromString("message body is empty"));
            goto done;
        }
        it->props = PyObject_GetAttr(m, s_properties);
        if (!it->props) { release_items(items, n); goto done; }
        if (!PyDict_Check(it->props)) {
            result = refuse(items, n, i, "MESSAGE_ILLEGAL", PyUnicode_FromString("properties must be a dict"));
            goto done;
        }
        if (get_ll(m, s_flag, &it->flag) || get_ll(m, s_sys_flag, &it->sys_flag) ||
            get_ll(m, s_born_timestamp, &it->born_ts) || get_ll(m, s_reconsume_times, &it->reconsume) ||
            get_ll(m, s_prepared, &it->prepared)) {
            release_items(items, n);
            goto done;
        }
        it->born_host_obj = PyObject_GetAttr(m, s_born_host);
        if (!it->born_host_obj) { release_items(items, n); goto done; }
        if (!PyBytes_Check(it->born_host_obj) || PyBytes_GET_SIZE(it->born_host_obj) != 8) {
            result = refuse(items, n, i, "MESSAGE_ILLEGAL", PyUnicode_FromString("born_host must be 8 bytes"));
            goto done;
        }
        it->born_host = PyBytes_AS_STRING(it->born_host_obj);
        if (it->flag < INT32_MIN || it->flag > INT32_MAX || it->sys_flag < INT32_MIN ||
            it->sys_flag > INT32_MAX || it->reconsume < INT32_MIN || it->reconsume > INT32_MAX) {
            result = refuse(items, n, i, "MESSAGE_ILLEGAL", PyUnicode_FromString("a 4-byte field is out of range"));
            goto done;
        }
        Py_ssize_t plen = 0, ppos = 0;
        PyObject *k, *v;
        while (PyDict_Next(it->props, &ppos, &k, &v)) {
            Py_ssize_t kl, vl;
            if (!PyUnicode_Check(k) || !PyUnicode_Check(v)) {
                result = refuse(items, n, i, "MESSAGE_ILLEGAL",
                                PyUnicode_FromString("property names and values must be strings"));
                goto done;
            }
            const char *ks = PyUnicode_AsUTF8AndSize(k, &kl);
            const char *vs = ks ? PyUnicode_AsUTF8AndSize(v, &vl) : NULL;
            if (!vs) {
                PyErr_Clear();
                result = refuse(items, n, i, "MESSAGE_ILLEGAL",
                                PyUnicode_FromString("properties are not valid text"));
                goto done;
            }
            if (kl == 0 || memchr(ks, 1, kl) || memchr(ks, 2, kl) || memchr(vs, 1, vl) || memchr(vs, 2, vl)) {
                result = refuse(items, n, i, "MESSAGE_ILLEGAL",
                                PyUnicode_FromFormat("property %R is empty or holds a reserved separator "
                                                     "character (\\x01 or \\x02)", k));
                goto done;
            }
            plen += kl + vl + 2;
        }
        if (plen > max_props) {
            result = refuse(items, n, i, "PROPERTIES_SIZE_EXCEEDED",
                            PyUnicode_FromFormat("properties take %zd bytes, more than %zd", plen, max_props));
            goto done;
        }
        it->props_len = plen;
        it->total = HEADER_SIZE + it->body.len + 1 + topic.len + 2 + plen;
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
        result = Py_BuildValue("(in)", 1, need);
        goto done;
    }
    /* Outputs: CQ units and index items, sized for the worst case. */
    PyObject *cq = PyBytes_FromStringAndSize(NULL, n * 20);
    if (!cq) { release_items(items, n); goto done; }
    Py_ssize_t idx_cap = 0;
    if (index_enabled) {
        for (Py_ssize_t i = 0; i < n; i++) idx_cap += 1 + items[i].props_len / 2;
    }
    PyObject *idx = PyBytes_FromStringAndSize(NULL, idx_cap * 12);
    if (!idx) { Py_DECREF(cq); release_items(items, n); goto done; }
    unsigned char *cqp = (unsigned char *)PyBytes_AS_STRING(cq);
    unsigned char *ixp = (unsigned char *)PyBytes_AS_STRING(idx);
    Py_ssize_t ncq = 0, nix = 0;
    unsigned char *base = (unsigned char *)buf.buf;
    long long qo = first_qo, batch_first_qo = -1;
    uint32_t topic_crc = crc_update(0xFFFFFFFFu, (const unsigned char *)topic.buf, topic.len);
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
        put32(r + 4, (uint32_t)MAGIC_CODE);
        put32(r + 8, bcrc);
        put32(r + 12, (uint32_t)queue_id);
        put32(r + 16, (uint32_t)it->flag);
        put64(r + 20, (uint64_t)my_qo);
        put64(r + 28, (uint64_t)phys);
        put32(r + 36, (uint32_t)it->sys_flag);
        put64(r + 40, (uint64_t)it->born_ts);
        memcpy(r + 48, it->born_host, 8);
        put64(r + 56, (uint64_t)store_ts);
        memcpy(r + 64, host.buf, 8);
        put32(r + 72, (uint32_t)it->reconsume);
        put64(r + 76, (uint64_t)it->prepared);
        put32(r + 84, (uint32_t)it->body.len);
        unsigned char *p = r + HEADER_SIZE;
        memcpy(p, it->body.buf, it->body.len);
        p += it->body.len;
        *p++ = (unsigned char)topic.len;
        memcpy(p, topic.buf, topic.len);
        p += topic.len;
        *p++ = (unsigned char)(it->props_len >> 8);
        *p++ = (unsigned char)(it->props_len & 0xFF);
        int64_t tags_code = 0;
        PyObject *k, *v;
        Py_ssize_t ppos = 0;
        int index_it = index_enabled && tran != TRAN_ROLLBACK;
        while (PyDict_Next(it->props, &ppos, &k, &v)) {
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
                if (vl) {
                    put32(ixp + nix * 12, ~crc_update(topic_crc, (const unsigned char *)vs, vl) & 0x7FFFFFFFu);
                    put64(ixp + nix * 12 + 4, (uint64_t)phys);
                    nix++;
                }
            } else if (index_it && kl == 4 && memcmp(ks, "KEYS", 4) == 0) {
                Py_ssize_t a = 0;
                while (a < vl) {
                    while (a < vl && vs[a] == ' ') a++;
                    Py_ssize_t b = a;
                    while (b < vl && vs[b] != ' ') b++;
                    if (b > a) {
                        put32(ixp + nix * 12,
                              ~crc_update(topic_crc, (const unsigned char *)vs + a, b - a) & 0x7FFFFFFFu);
                        put64(ixp + nix * 12 + 4, (uint64_t)phys);
                        nix++;
                    }
                    a = b;
                }
            }
        }
        if (advances) {
            put64(cqp + ncq * 20, (uint64_t)phys);
            put32(cqp + ncq * 20 + 8, (uint32_t)it->total);
            put64(cqp + ncq * 20 + 12, (uint64_t)tags_code);
            ncq++;
        }
        pos += it->total;
    }
    release_items(items, n);
    if (_PyBytes_Resize(&cq, ncq * 20) < 0) { Py_DECREF(idx); goto done; }
    if (_PyBytes_Resize(&idx, nix * 12) < 0) { Py_DECREF(cq); goto done; }
    long long last_ix_phys = -1;
    /* Straight into the ConsumeQueue file when the units fit what is reserved there. */
    if (cq_target != Py_None && ncq > 0 && cq_pos >= 0 && cq_pos + ncq * 20 <= cq_limit) {
        Py_buffer cb;
        if (PyObject_GetBuffer(cq_target, &cb, PyBUF_WRITABLE) < 0) { Py_DECREF(cq); Py_DECREF(idx); goto done; }
        if (cq_limit <= cb.len) {
            memcpy((unsigned char *)cb.buf + cq_pos, PyBytes_AS_STRING(cq), ncq * 20);
            Py_DECREF(cq);
            cq = PyLong_FromSsize_t(cq_pos + ncq * 20);
        }
        PyBuffer_Release(&cb);
        if (!cq) { Py_DECREF(idx); goto done; }
    }
    /* Straight into the IndexFile when it has begun (count > 1) and has room for all items. */
    if (ix_target != Py_None && nix > 0 && ix_slots > 0 && ix_count > 1 && ix_count + nix <= ix_max) {
        Py_buffer ib;
        if (PyObject_GetBuffer(ix_target, &ib, PyBUF_WRITABLE) < 0) { Py_DECREF(cq); Py_DECREF(idx); goto done; }
        if (ib.len >= 40 + ix_slots * 4 + ix_max * 20) {
            index_add(ib.buf, ix_slots, &ix_count, ix_max, ix_begin_ts, store_ts,
                      (const unsigned char *)PyBytes_AS_STRING(idx), nix, 0, &last_ix_phys);
            Py_DECREF(idx);
            idx = PyLong_FromLongLong(ix_count);
        }
        PyBuffer_Release(&ib);
        if (!idx) { Py_DECREF(cq); goto done; }
    }
    result = Py_BuildValue("(inLLNNL)", 0, pos, qo, batch_first_qo < 0 ? 0 : batch_first_qo, cq, idx, last_ix_phys);
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&topic);
    PyBuffer_Release(&host);
    return result;
}

/* index_write(buf, hash_slots, count, max_entries, begin_ts, store_ts, items, start)
 * -> (new_count, next_start, last_offset): adds 12-byte (hash, offset) items to an IndexFile mapping until
 * the items run out or the file is full. */
static PyObject *index_write(PyObject *self, PyObject *args) {
    Py_buffer buf, items;
    long long slots, count, max_entries, begin_ts, store_ts;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "w*LLLLLy*n", &buf, &slots, &count, &max_entries, &begin_ts, &store_ts, &items,
                          &start))
        return NULL;
    PyObject *result = NULL;
    if (slots <= 0 || count < 1 || buf.len < 40 + slots * 4 + max_entries * 20 || start < 0 || items.len % 12) {
        PyErr_SetString(PyExc_ValueError, "bad arguments to index_write");
        goto done;
    }
    long long last_phys = -1;
    Py_ssize_t i = index_add(buf.buf, slots, &count, max_entries, begin_ts, store_ts, items.buf, items.len / 12,
                             start, &last_phys);
    result = Py_BuildValue("(LnL)", count, i, last_phys);
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&items);
    return result;
}

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    uint32_t c = ~crc_update(0xFFFFFFFFu, b.buf, b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"write_batch", write_batch, METH_VARARGS, "Lay out a batch of one (topic, queue) as CommitLog records."},
    {"index_write", index_write, METH_VARARGS, "Add (hash, offset) items to an IndexFile mapping."},
    {"crc32c", py_crc32c, METH_VARARGS, "CRC-32C of a buffer."},
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
    return PyModule_Create(&module);
}
