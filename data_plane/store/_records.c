/*
 * Compiled twins of the SDK's record codecs (sdk/record_codec.py: PythonRecordCodec): the consumer's
 * pull-body decoder, the producer's batch body and message ids. The SDK loads this module
 * without the store engine (data_plane/store/compiled.py); tests compare each function with its
 * pure-Python twin.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_slots.h"
#include "_bytes.h"
#include "_properties.h"
#include "_layouts.h" /* the CommitLog record's layout: generated from layouts.py */


static PyObject *s_body, *s_properties;

/* ---- the producer's message ids ------------------------------------------------------------
 * unique_ids(head, counter, n) -> [head + "%04X" % (next(counter) & 0xFFFF) for n ids]
 * ``head`` is the ASCII hex before the counter (ip, pid, random, ms since the month began);
 * ``counter`` the producer's itertools.count, advanced n times in one C call, so no other
 * thread takes a value between the batch's first and last id. Twin: sdk.message.py_unique_ids. */
static PyObject *unique_ids(PyObject *self, PyObject *args) {
    PyObject *head, *counter;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "UOn", &head, &counter, &n)) return NULL;
    if (!PyUnicode_IS_ASCII(head) || n < 0 || !PyIter_Check(counter)) {
        PyErr_SetString(PyExc_ValueError, "unique_ids: an ASCII head, an iterator and a count >= 0");
        return NULL;
    }
    static const char hex[] = "0123456789ABCDEF";
    Py_ssize_t hlen = PyUnicode_GET_LENGTH(head);
    const char *h = (const char *)PyUnicode_DATA(head);
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *c = PyIter_Next(counter);
        if (!c) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "unique_ids: the counter ran out");
            Py_DECREF(out);
            return NULL;
        }
        unsigned long v = PyLong_AsUnsignedLongMask(c);
        Py_DECREF(c);
        if (v == (unsigned long)-1 && PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *id = PyUnicode_New(hlen + 4, 127);
        if (!id) {
            Py_DECREF(out);
            return NULL;
        }
        char *d = (char *)PyUnicode_DATA(id);
        memcpy(d, h, (size_t)hlen);
        d[hlen] = hex[(v >> 12) & 0xF];
        d[hlen + 1] = hex[(v >> 8) & 0xF];
        d[hlen + 2] = hex[(v >> 4) & 0xF];
        d[hlen + 3] = hex[v & 0xF];
        PyList_SET_ITEM(out, i, id);
    }
    return out;
}

/* ---- pull bodies: the consumer's decoder ---------------------------------------------------
 * decode_records(body, cls, broker_name, check_crc, topics, hosts, host_of) -> Decoded
 *   (a struct sequence: messages, compressed)
 * Splits a PULL_MESSAGE body (CommitLog records back to back, the layout at the top of this
 * file) into ``cls`` objects (sdk.message.MessageExt), with the checks of the pure-Python
 * PythonRecordCodec.decode_records: magic, nested lengths inside the record, body CRC, properties
 * ending with their separator and valid UTF-8. ``topics`` (raw bytes -> str) and ``hosts``
 * (8 raw bytes -> (ip, port), filled through ``host_of``) are the caller's caches. The objects
 * are made without running ``cls.__init__``: each slot in RECORD_FIELDS is written directly.
 * What a consumer seldom reads is left for the object to make on first use: the properties stay
 * their raw bytes (``_raw_properties``; ``_properties`` None), and ``_offset_msg_id`` and
 * ``_extra`` are None. ``compressed`` counts records whose sys flag says their body is
 * zlib-compressed; the caller inflates those. A record that is not sound raises ValueError
 * naming its byte position.
 *
 * properties_dict(raw) -> dict: the raw properties of a record ("name\x01value\x02"...) as
 * MessageExt.properties makes them on first use. */
enum {
    MX_TOPIC, MX_BODY, MX_RAW_PROPERTIES, MX_PROPERTIES, MX_QUEUE_ID, MX_QUEUE_OFFSET, MX_BROKER_NAME,
    MX_OFFSET_MSG_ID, MX_COMMIT_LOG_OFFSET, MX_BORN_TS, MX_BORN_HOST, MX_STORE_TS, MX_STORE_HOST,
    MX_RECONSUME, MX_SYS_FLAG, MX_FLAG, MX_STORE_SIZE, MX_EXTRA, MX_FIELDS
};
static const char *mx_names[MX_FIELDS] = {
    "topic", "body", "_raw_properties", "_properties", "queue_id", "queue_offset", "broker_name",
    "_offset_msg_id", "commit_log_offset", "born_timestamp_ms", "born_host", "store_timestamp_ms",
    "store_host", "reconsume_times", "sys_flag", "flag", "store_size", "_extra",
};
static PyObject *mx_interned[MX_FIELDS];
static slot_t mx_slots[MX_FIELDS];

/* decode_records' answer: the records in order, and how many still carry a compressed body. */
static PyStructSequence_Field decoded_fields[] = {{"messages", NULL}, {"compressed", NULL}, {NULL, NULL}};
static PyStructSequence_Desc decoded_desc = {"data_plane.store._records.Decoded", "What decode_records answers.",
                                             decoded_fields, 2};
static PyTypeObject *decoded_type;

static PyObject *record_error(Py_ssize_t pos, const char *what) {
    PyErr_Format(PyExc_ValueError, "pull body: record at byte %zd %s", pos, what);
    return NULL;
}

/* A pull's records nearly all share their topic and hosts: the last ones looked up are kept
 * for the length of one decode_records call (raw bytes compared, the caches' objects reused). */
typedef struct {
    const unsigned char *raw;
    Py_ssize_t len;
    PyObject *obj; /* borrowed (kept alive by the caller's ``keep``), or NULL */
} last_seen;

static PyObject *seen_again(last_seen *ls, const unsigned char *raw, Py_ssize_t n) {
    if (ls->obj && ls->len == n && memcmp(ls->raw, raw, n) == 0) {
        Py_INCREF(ls->obj);
        return ls->obj;
    }
    return NULL;
}

/* Keep ``obj`` (just looked up for ``raw``; may be NULL on an error) as the last one seen,
 * holding a reference of its own in ``*keep``; returns ``obj``. */
static PyObject *seen_now(last_seen *ls, PyObject **keep, const unsigned char *raw, Py_ssize_t n, PyObject *obj) {
    if (obj) {
        Py_INCREF(obj);
        Py_XSETREF(*keep, obj);
        *ls = (last_seen){raw, n, obj};
    }
    return obj;
}

static PyObject *py_properties_dict(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*:properties_dict", &b)) return NULL;
    PyObject *d = properties_dict(b.buf, b.len);
    PyBuffer_Release(&b);
    return d;
}

static PyObject *host_tuple(PyObject *hosts, PyObject *host_of, const unsigned char *raw) {
    PyObject *key = PyBytes_FromStringAndSize((const char *)raw, 8);
    if (!key) return NULL;
    PyObject *h = PyDict_GetItemWithError(hosts, key);
    if (h) {
        Py_INCREF(h);
    } else if (!PyErr_Occurred()) {
        h = PyObject_CallOneArg(host_of, key);
        if (h) {
            if (PyDict_GET_SIZE(hosts) > 4096) PyDict_Clear(hosts);
            if (PyDict_SetItem(hosts, key, h) < 0) Py_CLEAR(h);
        }
    }
    Py_DECREF(key);
    return h;
}

static PyObject *topic_str(PyObject *topics, const unsigned char *raw, Py_ssize_t n) {
    PyObject *key = PyBytes_FromStringAndSize((const char *)raw, n);
    if (!key) return NULL;
    PyObject *t = PyDict_GetItemWithError(topics, key);
    if (t) {
        Py_INCREF(t);
    } else if (!PyErr_Occurred()) {
        t = PyUnicode_DecodeUTF8((const char *)raw, n, NULL);
        if (t && PyDict_GET_SIZE(topics) < 100000 && PyDict_SetItem(topics, key, t) < 0) Py_CLEAR(t);
    }
    Py_DECREF(key);
    return t;
}

/* The last int made for a field, reused while the next records carry the same value (a batch's
 * records share their timestamps, and often their size). */
typedef struct {
    long long value;
    PyObject *obj; /* strong reference, or NULL */
} last_int;

static PyObject *int_again(last_int *li, long long value) {
    if (li->obj && li->value == value) {
        Py_INCREF(li->obj);
        return li->obj;
    }
    PyObject *o = PyLong_FromLongLong(value);
    if (o) {
        Py_INCREF(o);
        Py_XSETREF(li->obj, o);
        li->value = value;
    }
    return o;
}

static PyObject *decode_records(PyObject *self, PyObject *args) {
    Py_buffer b;
    PyObject *cls, *broker, *topics, *hosts, *host_of;
    int check_crc;
    if (!PyArg_ParseTuple(args, "y*OUpO!O!O:decode_records", &b, &cls, &broker, &check_crc, &PyDict_Type,
                          &topics, &PyDict_Type, &hosts, &host_of))
        return NULL;
    /* Strong references: a cache dict may be cleared (it is bounded) while this call runs. */
    PyObject *last_topic = NULL, *last_born = NULL, *last_store = NULL;
    last_seen seen_topic = {0}, seen_born = {0}, seen_store = {0};
    last_int born_ts = {0}, store_ts = {0}, store_size = {0};
    PyObject *out = PyList_New(0), *result = NULL;
    Py_ssize_t compressed = 0;
    PyTypeObject *tp = out ? as_type(cls, "decode_records") : NULL;
    if (!tp) goto done;
    const unsigned char *base = b.buf;
    Py_ssize_t n = b.len, pos = 0;
    while (pos < n) {
        if (n - pos < RECORD_HEADER_SIZE) {
            record_error(pos, "is cut short");
            goto done;
        }
        const unsigned char *r = base + pos;
        int32_t total = (int32_t)get32(r), magic = (int32_t)get32(r + RECORD_HEADER_MAGIC_AT), body_len = (int32_t)get32(r + RECORD_HEADER_BODY_LENGTH_AT);
        Py_ssize_t end = pos + (Py_ssize_t)total, p = pos + RECORD_HEADER_SIZE;
        if (magic != MESSAGE_MAGIC_CODE || total < RECORD_HEADER_SIZE + 3 || end > n || body_len < 0 || p + body_len + 3 > end) {
            record_error(pos, "is not sound (magic or sizes)");
            goto done;
        }
        uint32_t crc = get32(r + RECORD_HEADER_BODY_CRC_AT);
        if (check_crc && ((~crc_update(0xFFFFFFFFu, base + p, body_len)) & 0x7FFFFFFFu) != crc) {
            record_error(pos, "fails its body CRC");
            goto done;
        }
        Py_ssize_t body_at = p;
        p += body_len;
        Py_ssize_t topic_len = base[p];
        Py_ssize_t topic_at = p + 1;
        p += 1 + topic_len;
        if (p + 2 > end) {
            record_error(pos, "is not sound (topic length)");
            goto done;
        }
        Py_ssize_t props_len = (int16_t)((base[p] << 8) | base[p + 1]);
        p += 2;
        if (props_len < 0 || p + props_len != end || (props_len && base[end - 1] != 2)) {
            record_error(pos, "is not sound (properties)");
            goto done;
        }
        long long physical = (long long)get64(r + RECORD_HEADER_PHYSICAL_OFFSET_AT);
        int32_t sys_flag = (int32_t)get32(r + RECORD_HEADER_SYS_FLAG_AT);
        PyObject *v[MX_FIELDS] = {0};
        const unsigned char *raw_topic = base + topic_at;
        v[MX_TOPIC] = seen_again(&seen_topic, raw_topic, topic_len);
        if (!v[MX_TOPIC])
            v[MX_TOPIC] =
                seen_now(&seen_topic, &last_topic, raw_topic, topic_len, topic_str(topics, raw_topic, topic_len));
        if (!v[MX_TOPIC]) {
            PyErr_Clear();
            record_error(pos, "has a topic that is not UTF-8");
            goto done;
        }
        if (!utf8_ok(base + p, props_len)) {
            Py_DECREF(v[MX_TOPIC]);
            record_error(pos, "has bad properties: not UTF-8");
            goto done;
        }
        if (props_len) {
            v[MX_RAW_PROPERTIES] = PyBytes_FromStringAndSize((const char *)base + p, props_len);
        } else {
            Py_INCREF(Py_None);
            v[MX_RAW_PROPERTIES] = Py_None;
        }
        Py_INCREF(Py_None);
        v[MX_PROPERTIES] = Py_None;
        v[MX_BODY] = PyBytes_FromStringAndSize((const char *)base + body_at, body_len);
        v[MX_QUEUE_ID] = PyLong_FromLong((int32_t)get32(r + RECORD_HEADER_QUEUE_ID_AT));
        v[MX_QUEUE_OFFSET] = PyLong_FromLongLong((long long)get64(r + RECORD_HEADER_QUEUE_OFFSET_AT));
        Py_INCREF(broker);
        v[MX_BROKER_NAME] = broker;
        Py_INCREF(Py_None);
        v[MX_OFFSET_MSG_ID] = Py_None;
        v[MX_COMMIT_LOG_OFFSET] = PyLong_FromLongLong(physical);
        v[MX_BORN_TS] = int_again(&born_ts, (long long)get64(r + RECORD_HEADER_BORN_TIMESTAMP_AT));
        v[MX_BORN_HOST] = seen_again(&seen_born, r + RECORD_HEADER_BORN_HOST_AT, 8);
        if (!v[MX_BORN_HOST])
            v[MX_BORN_HOST] = seen_now(&seen_born, &last_born, r + RECORD_HEADER_BORN_HOST_AT, 8, host_tuple(hosts, host_of, r + RECORD_HEADER_BORN_HOST_AT));
        v[MX_STORE_TS] = int_again(&store_ts, (long long)get64(r + RECORD_HEADER_STORE_TIMESTAMP_AT));
        v[MX_STORE_HOST] = seen_again(&seen_store, r + RECORD_HEADER_STORE_HOST_AT, 8);
        if (!v[MX_STORE_HOST])
            v[MX_STORE_HOST] = seen_now(&seen_store, &last_store, r + RECORD_HEADER_STORE_HOST_AT, 8, host_tuple(hosts, host_of, r + RECORD_HEADER_STORE_HOST_AT));
        v[MX_RECONSUME] = PyLong_FromLong((int32_t)get32(r + RECORD_HEADER_RECONSUME_TIMES_AT));
        v[MX_SYS_FLAG] = PyLong_FromLong(sys_flag);
        v[MX_FLAG] = PyLong_FromLong((int32_t)get32(r + RECORD_HEADER_FLAG_AT));
        v[MX_STORE_SIZE] = int_again(&store_size, total);
        Py_INCREF(Py_None);
        v[MX_EXTRA] = Py_None;
        PyObject *obj = NULL;
        int ok = 1;
        for (int f = 0; f < MX_FIELDS; f++) ok &= v[f] != NULL;
        if (ok) obj = tp->tp_alloc(tp, 0);
        if (obj) {
            for (int f = 0; f < MX_FIELDS && obj; f++) {
                if (sset(obj, mx_interned[f], &mx_slots[f], v[f]) < 0) Py_CLEAR(obj);
            }
        }
        for (int f = 0; f < MX_FIELDS; f++) Py_XDECREF(v[f]);
        if (!obj || PyList_Append(out, obj) < 0) {
            Py_XDECREF(obj);
            goto done;
        }
        Py_DECREF(obj);
        if (sys_flag & 0x1) compressed++;
        pos = end;
    }
    result = PyStructSequence_New(decoded_type);
    if (result) {
        PyObject *count = PyLong_FromSsize_t(compressed);
        if (!count) {
            Py_CLEAR(result);
            goto done;
        }
        Py_INCREF(out);
        PyStructSequence_SET_ITEM(result, 0, out);
        PyStructSequence_SET_ITEM(result, 1, count);
    }
done:
    Py_XDECREF(out);
    Py_XDECREF(last_topic);
    Py_XDECREF(last_born);
    Py_XDECREF(last_store);
    Py_XDECREF(born_ts.obj);
    Py_XDECREF(store_ts.obj);
    Py_XDECREF(store_size.obj);
    PyBuffer_Release(&b);
    return result;
}

/* ---- the producer's batch body --------------------------------------------------------------
 * plain_batch_body(msgs, unique_ids, cls) -> bytes or None
 * The SEND_BATCH_MESSAGE body (remoting/bodies.py's layout: total size, magic 0, CRC 0, flag 0,
 * body length, body, properties length, properties) of sdk Messages (exactly ``cls``, not a
 * subclass, which may say otherwise) that are plain: no user properties, no keys, no delay
 * level or delivery time. Their properties are what
 * Message.encoded_properties writes for them: "TAGS\x01<tags>\x02" when tagged, then
 * "WAIT\x01true\x02UNIQ_KEY\x01<id>\x02". None when a message is not plain (or its properties
 * would not fit their 2-byte length): the caller builds the body in Python. */
static PyObject *s_keys, *s_tags, *s_delay_level, *s_deliver_at_ms;

typedef struct {
    const char *body, *tags, *uid;
    Py_ssize_t body_len, tags_len, uid_len;
} plain_item;

/* 1 when m is plain (its item filled in, references borrowed from m and uid), 0 when not,
 * -1 with an exception. */
static int plain_item_of(PyObject *m, PyObject *uid, plain_item *it) {
    PyObject *v[5] = {SGET(m, s_body), SGET(m, s_properties), SGET(m, s_keys), SGET(m, s_delay_level),
                      SGET(m, s_deliver_at_ms)};
    PyObject *tags = SGET(m, s_tags);
    int rc = -1;
    for (int i = 0; i < 5; i++)
        if (!v[i]) goto done;
    if (!tags) goto done;
    rc = 0;
    if (!PyBytes_CheckExact(v[0]) || !PyDict_CheckExact(v[1]) || PyDict_GET_SIZE(v[1]) != 0 ||
        !PyTuple_CheckExact(v[2]) || PyTuple_GET_SIZE(v[2]) != 0 || !PyLong_CheckExact(v[3]) ||
        PyObject_IsTrue(v[3]) || v[4] != Py_None || !PyUnicode_Check(uid) || (tags != Py_None && !PyUnicode_Check(tags)))
        goto done;
    it->body = PyBytes_AS_STRING(v[0]);
    it->body_len = PyBytes_GET_SIZE(v[0]);
    it->uid = PyUnicode_AsUTF8AndSize(uid, &it->uid_len);
    it->tags = NULL;
    it->tags_len = 0;
    if (tags != Py_None) it->tags = PyUnicode_AsUTF8AndSize(tags, &it->tags_len);
    if (!it->uid || (tags != Py_None && !it->tags)) {
        rc = -1;
        goto done;
    }
    rc = 1;
done:
    for (int i = 0; i < 5; i++) Py_XDECREF(v[i]); /* the message keeps its own references */
    Py_XDECREF(tags);
    return rc;
}

static Py_ssize_t plain_props_len(const plain_item *it) {
    return (it->tags ? 5 + it->tags_len + 1 : 0) + 10 + 9 + it->uid_len + 1;
}

static PyObject *plain_batch_body(PyObject *self, PyObject *args) {
    PyObject *msgs, *uids, *cls;
    if (!PyArg_ParseTuple(args, "O!O!O:plain_batch_body", &PyList_Type, &msgs, &PyList_Type, &uids, &cls))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(msgs);
    if (PyList_GET_SIZE(uids) != n) {
        PyErr_SetString(PyExc_ValueError, "plain_batch_body: one unique id a message");
        return NULL;
    }
    plain_item *items = PyMem_Malloc(sizeof(plain_item) * (size_t)(n ? n : 1));
    if (!items) return PyErr_NoMemory();
    PyObject *result = NULL;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        int rc = (PyObject *)Py_TYPE(m) == cls ? plain_item_of(m, PyList_GET_ITEM(uids, i), &items[i]) : 0;
        if (rc < 0) goto done;
        Py_ssize_t props = rc ? plain_props_len(&items[i]) : 0;
        if (!rc || props > 0xFFFF || items[i].body_len > INT32_MAX - BATCH_ITEM_SIZE - 2 - props) {
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        total += BATCH_ITEM_SIZE + 2 + items[i].body_len + props;
        if (total > PY_SSIZE_T_MAX / 2) {
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (!result) goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < n; i++) {
        const plain_item *it = &items[i];
        Py_ssize_t props = plain_props_len(it);
        put32(w, (uint32_t)(BATCH_ITEM_SIZE + 2 + it->body_len + props));
        memset(w + BATCH_ITEM_MAGIC_AT, 0, 12); /* magic, CRC and flag: 0, as the Java client leaves them */
        put32(w + BATCH_ITEM_BODY_LENGTH_AT, (uint32_t)it->body_len);
        memcpy(w + BATCH_ITEM_SIZE, it->body, it->body_len);
        w += BATCH_ITEM_SIZE + it->body_len;
        w[0] = (unsigned char)(props >> 8);
        w[1] = (unsigned char)props;
        w += 2;
        if (it->tags) {
            memcpy(w, "TAGS\x01", 5);
            memcpy(w + 5, it->tags, it->tags_len);
            w[5 + it->tags_len] = 2;
            w += 6 + it->tags_len;
        }
        memcpy(w, "WAIT\x01true\x02UNIQ_KEY\x01", 19);
        memcpy(w + 19, it->uid, it->uid_len);
        w[19 + it->uid_len] = 2;
        w += 20 + it->uid_len;
    }
done:
    PyMem_Free(items);
    return result;
}


static PyMethodDef methods[] = {
    {"unique_ids", unique_ids, METH_VARARGS, "The producer's message ids for a batch (sdk.message.new_unique_ids)."},
    {"decode_records", decode_records, METH_VARARGS, "Split a pull body into message objects."},
    {"properties_dict", py_properties_dict, METH_VARARGS, "A record's raw properties as a dict."},
    {"plain_batch_body", plain_batch_body, METH_VARARGS, "The SEND_BATCH_MESSAGE body of plain sdk Messages."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_records", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__records(void) {
    crc_init();
    if (properties_init() < 0) return NULL;
#define INTERN(var, s) if (!(var = PyUnicode_InternFromString(s))) return NULL
    INTERN(s_body, "body"); INTERN(s_properties, "properties");
    INTERN(s_keys, "keys"); INTERN(s_tags, "tags"); INTERN(s_delay_level, "delay_level");
    INTERN(s_deliver_at_ms, "deliver_at_ms");
    for (int f = 0; f < MX_FIELDS; f++) INTERN(mx_interned[f], mx_names[f]);
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    PyObject *names = PyTuple_New(MX_FIELDS);
    if (!names) {
        Py_DECREF(m);
        return NULL;
    }
    for (int f = 0; f < MX_FIELDS; f++) {
        Py_INCREF(mx_interned[f]);
        PyTuple_SET_ITEM(names, f, mx_interned[f]);
    }
    if (PyModule_AddObject(m, "RECORD_FIELDS", names) < 0) {
        Py_DECREF(names);
        Py_DECREF(m);
        return NULL;
    }
    decoded_type = PyStructSequence_NewType(&decoded_desc);
    if (!decoded_type || PyModule_AddObject(m, "Decoded", (PyObject *)decoded_type) < 0) {
        Py_XDECREF(decoded_type);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(decoded_type);  /* the module holds one reference, decode_records the other */
    return m;
}
