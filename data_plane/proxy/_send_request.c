/*
 * Compiled twin of data_plane/proxy/send_request.py (PythonSendRequest): a RocketMQ 5
 * SendMessageRequest, read from its protobuf wire bytes, turned into the body of a
 * SEND_BATCH_MESSAGE (data_plane/remoting/bodies.py) in one call, without a protobuf object,
 * a properties dict or a batch item per message in Python.
 *
 * It takes only what it can store exactly as the reference path (service.MessagingService's
 * _prepare, messages.to_properties, bodies.encode_batch_item) would: two or more NORMAL
 * messages of one topic, no user properties, no message group or delivery time, every string it
 * reads well-formed UTF-8 without control characters, every field it meets one it knows with the
 * wire type the definition gives, each singular field once. For anything else it answers None and
 * the caller parses the request and takes the reference path, which stores it or says what is
 * wrong. Tests compare the two on generated requests.
 *
 * Wire (apache.rocketmq.v2): SendMessageRequest 1: messages (Message, repeated).
 *   Message           1: topic (Resource)  2: user_properties (map)  3: system_properties  4: body
 *   Resource          1: resource_namespace  2: name
 *   SystemProperties  1: tag (optional)  2: keys (repeated)  3: message_id  4: body_digest (Digest)
 *                     5: body_encoding  6: message_type  7: born_timestamp (Timestamp)  8: born_host
 *                     10: store_host  11: delivery_timestamp  12: receipt_handle  13: queue_id
 *                     14: queue_offset  16: delivery_attempt  17: message_group  18: trace_context
 *                     21: lite_topic  22: priority  (9, 15, 19, 20: not taken here)
 *   Digest            1: type  2: checksum        Timestamp  1: seconds  2: nanos
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define WT_VARINT 0
#define WT_I64 1
#define WT_LEN 2
#define WT_I32 5

#define MAX_TAG_CHARS 128
#define MAX_KEY_CHARS 128
#define MAX_KEYS 32
#define MAX_ID_CHARS 128
#define MAX_TRACE_CHARS 512
#define ITEM_HEAD 20 /* total 4 | magic 4 | body CRC 4 | flag 4 | body length 4 */
#define MAX_MESSAGES_TAKEN 1024

typedef struct {
    const unsigned char *p;
    Py_ssize_t n;
} span;

typedef struct {
    span id, tag, trace, body;
    span keys[MAX_KEYS];
    int nkeys, has_tag;
    Py_ssize_t keys_bytes; /* the keys joined with single spaces */
    int64_t born_ms;
} plain_message;

/* A varint of at most 10 bytes; 0 when it is cut or longer. */
static int get_varint(const unsigned char **at, const unsigned char *end, uint64_t *out) {
    uint64_t v = 0;
    const unsigned char *p = *at;
    for (int shift = 0; shift < 70; shift += 7) {
        if (p >= end) return 0;
        unsigned char b = *p++;
        if (shift == 63 && b > 1) return 0;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *at = p;
            *out = v;
            return 1;
        }
    }
    return 0;
}

/* Reads a message's fields in turn: ``next_field`` gives 1 and the field (its number, wire type,
 * payload for a length-delimited one, value for a varint), 0 at the end, -1 when the bytes are not
 * well formed. ``seen`` marks singular fields met, so that one given twice is noticed. */
typedef struct {
    const unsigned char *at, *end;
    uint32_t num, seen;
    int wt;
    span pl;
    uint64_t v;
} fields;

static fields reader(span s) {
    fields f = {s.p, s.p + s.n, 0, 0, 0, {s.p, 0}, 0};
    return f;
}

static int next_field(fields *f) {
    uint64_t key;
    if (f->at >= f->end) return 0;
    if (!get_varint(&f->at, f->end, &key) || key >> 3 == 0 || key >> 3 > 0x1FFFFFFF) return -1;
    f->num = (uint32_t)(key >> 3);
    f->wt = (int)(key & 7);
    f->v = 0;
    switch (f->wt) {
    case WT_VARINT:
        return get_varint(&f->at, f->end, &f->v) ? 1 : -1;
    case WT_LEN: {
        uint64_t len;
        if (!get_varint(&f->at, f->end, &len) || len > (uint64_t)(f->end - f->at)) return -1;
        f->pl.p = f->at;
        f->pl.n = (Py_ssize_t)len;
        f->at += len;
        return 1;
    }
    case WT_I64:
        if (f->end - f->at < 8) return -1;
        f->at += 8;
        return 1;
    case WT_I32:
        if (f->end - f->at < 4) return -1;
        f->at += 4;
        return 1;
    default: /* groups: not in this protocol */
        return -1;
    }
}

/* The field is a singular one met for the first time (numbers up to 31). */
static int first_time(fields *f) {
    if (f->num > 31 || (f->seen & (1u << f->num))) return 0;
    f->seen |= 1u << f->num;
    return 1;
}

/* Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF), as protobuf checks
 * proto3 strings; the number of code points, or -1. With no_controls, a byte below 0x20 is
 * refused too (property separators \x01 and \x02 among them). */
static Py_ssize_t utf8_chars(span s, int no_controls) {
    Py_ssize_t chars = 0;
    const unsigned char *p = s.p, *end = s.p + s.n;
    while (p < end) {
        unsigned char c = *p;
        if (c < 0x80) {
            if (no_controls && c < 0x20) return -1;
            p++;
        } else if (c >= 0xC2 && c <= 0xDF) {
            if (end - p < 2 || (p[1] & 0xC0) != 0x80) return -1;
            p += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return -1;
            if ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] > 0x9F)) return -1;
            p += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return -1;
            if ((c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] > 0x8F)) return -1;
            p += 4;
        } else {
            return -1;
        }
        chars++;
    }
    return chars;
}

/* The bytes of the first ``chars`` code points of well-formed UTF-8. */
static Py_ssize_t utf8_prefix(span s, Py_ssize_t chars) {
    Py_ssize_t i = 0;
    while (i < s.n && chars > 0) {
        unsigned char c = s.p[i];
        i += c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        chars--;
    }
    return i;
}

/* Timestamp: seconds and nanos, each once. */
static int read_timestamp(span s, int64_t *seconds, int64_t *nanos) {
    fields f = reader(s);
    int got;
    *seconds = *nanos = 0;
    while ((got = next_field(&f)) > 0) {
        if (f.wt != WT_VARINT || (f.num != 1 && f.num != 2) || !first_time(&f)) return 0;
        if (f.num == 1) {
            if (f.v >> 40) return 0; /* negative, or past any real clock (year 36812) */
            *seconds = (int64_t)f.v;
        } else {
            if (f.v >= 1000000000u) return 0; /* negative, or not a fraction of a second */
            *nanos = (int64_t)f.v;
        }
    }
    return got == 0;
}

/* Digest: its type and checksum, well formed; not used. */
static int read_digest(span s) {
    fields f = reader(s);
    int got;
    while ((got = next_field(&f)) > 0) {
        int ok = (f.num == 1 && f.wt == WT_VARINT && f.v <= 0x7FFFFFFF) ||
                 (f.num == 2 && f.wt == WT_LEN && utf8_chars(f.pl, 0) >= 0);
        if (!ok || !first_time(&f)) return 0;
    }
    return got == 0;
}

static int read_resource(span s, span *ns, span *name) {
    fields f = reader(s);
    int got;
    ns->n = name->n = 0;
    ns->p = name->p = s.p;
    while ((got = next_field(&f)) > 0) {
        if (f.wt != WT_LEN || (f.num != 1 && f.num != 2) || !first_time(&f) || utf8_chars(f.pl, 1) < 0) return 0;
        *(f.num == 1 ? ns : name) = f.pl;
    }
    return got == 0 && name->n > 0;
}

/* SystemProperties of a plain NORMAL message; 0 for anything the reference path must judge. */
static int read_system(span s, plain_message *m, int64_t now_ms) {
    fields f = reader(s);
    int got;
    int64_t seconds = 0, nanos = 0;
    while ((got = next_field(&f)) > 0) {
        if (f.num != 2 && !first_time(&f)) return 0; /* every field but keys is singular */
        span pl = f.pl;
        switch (f.num) {
        case 1: { /* tag: 1 to 128 characters, no '|' nor control character */
            Py_ssize_t c = f.wt == WT_LEN ? utf8_chars(pl, 1) : -1;
            if (c < 1 || c > MAX_TAG_CHARS || memchr(pl.p, '|', (size_t)pl.n)) return 0;
            m->tag = pl;
            m->has_tag = 1;
            break;
        }
        case 2: { /* a key: 1 to 128 characters, no space */
            Py_ssize_t c = f.wt == WT_LEN ? utf8_chars(pl, 1) : -1;
            if (c < 1 || c > MAX_KEY_CHARS || m->nkeys >= MAX_KEYS || memchr(pl.p, ' ', (size_t)pl.n)) return 0;
            m->keys_bytes += (m->nkeys ? 1 : 0) + pl.n;
            m->keys[m->nkeys++] = pl;
            break;
        }
        case 3: { /* message_id: 1 to 128 characters */
            Py_ssize_t c = f.wt == WT_LEN ? utf8_chars(pl, 1) : -1;
            if (c < 1 || c > MAX_ID_CHARS) return 0;
            m->id = pl;
            break;
        }
        case 4: /* body_digest: read as protobuf would, not used */
            if (f.wt != WT_LEN || !read_digest(pl)) return 0;
            break;
        case 5: /* body_encoding, queue_id, queue_offset, delivery_attempt, priority: not used */
        case 13:
        case 14:
        case 16:
        case 22:
            if (f.wt != WT_VARINT) return 0;
            break;
        case 6: /* message_type: NORMAL, or unspecified (taken as NORMAL) */
            if (f.wt != WT_VARINT || f.v > 1) return 0;
            break;
        case 7:
            if (f.wt != WT_LEN || !read_timestamp(pl, &seconds, &nanos)) return 0;
            break;
        case 8: /* born_host, store_host, receipt_handle, lite_topic: well formed, not used */
        case 10:
        case 12:
        case 21:
            if (f.wt != WT_LEN || utf8_chars(pl, 0) < 0) return 0;
            break;
        case 18: { /* trace_context: its first 512 characters, when not empty */
            Py_ssize_t c = f.wt == WT_LEN ? utf8_chars(pl, 1) : -1;
            if (c < 0) return 0;
            m->trace.p = pl.p;
            m->trace.n = c > MAX_TRACE_CHARS ? utf8_prefix(pl, MAX_TRACE_CHARS) : pl.n;
            break;
        }
        default: /* a message group, a delivery time, and what a producer does not send */
            return 0;
        }
    }
    if (got < 0 || !m->id.n) return 0;
    int64_t born = seconds * 1000 + nanos / 1000000;
    m->born_ms = born ? born : now_ms;
    return 1;
}

static int read_message(span s, plain_message *m, span *ns, span *name, Py_ssize_t max_body, int64_t now_ms) {
    fields f = reader(s);
    int got;
    memset(m, 0, sizeof(*m));
    while ((got = next_field(&f)) > 0) {
        /* topic, system properties, body, each once; user properties: the reference path */
        if (f.wt != WT_LEN || (f.num != 1 && f.num != 3 && f.num != 4) || !first_time(&f)) return 0;
        if (f.num == 1) {
            if (!read_resource(f.pl, ns, name)) return 0;
        } else if (f.num == 3) {
            if (!read_system(f.pl, m, now_ms)) return 0;
        } else {
            m->body = f.pl;
        }
    }
    return got == 0 && (f.seen & (1u << 1)) && (f.seen & (1u << 3)) && m->body.n > 0 && m->body.n <= max_body;
}

static unsigned char *put32(unsigned char *w, uint32_t v) {
    w[0] = (unsigned char)(v >> 24);
    w[1] = (unsigned char)(v >> 16);
    w[2] = (unsigned char)(v >> 8);
    w[3] = (unsigned char)v;
    return w + 4;
}

static unsigned char *put_span(unsigned char *w, span s) {
    memcpy(w, s.p, (size_t)s.n);
    return w + s.n;
}

#define LIT(w, s) (memcpy((w), (s), sizeof(s) - 1), (w) + sizeof(s) - 1)

/* The stored properties, as to_properties orders them: UNIQ_KEY, TAGS, KEYS, traceparent, V5_TYPE. */
static Py_ssize_t properties_size(const plain_message *m) {
    Py_ssize_t n = 10 + m->id.n;              /* UNIQ_KEY\x01 id \x02 */
    if (m->has_tag) n += 6 + m->tag.n;        /* TAGS\x01 tag \x02 */
    if (m->nkeys) n += 6 + m->keys_bytes;     /* KEYS\x01 k1 k2 \x02 */
    if (m->trace.n) n += 13 + m->trace.n;     /* traceparent\x01 trace \x02 */
    return n + 10;                            /* V5_TYPE\x011\x02 */
}

static unsigned char *put_properties(unsigned char *w, const plain_message *m) {
    w = LIT(w, "UNIQ_KEY\x01");
    w = put_span(w, m->id);
    *w++ = 2;
    if (m->has_tag) {
        w = LIT(w, "TAGS\x01");
        w = put_span(w, m->tag);
        *w++ = 2;
    }
    if (m->nkeys) {
        w = LIT(w, "KEYS\x01");
        for (int k = 0; k < m->nkeys; k++) {
            if (k) *w++ = ' ';
            w = put_span(w, m->keys[k]);
        }
        *w++ = 2;
    }
    if (m->trace.n) {
        w = LIT(w, "traceparent\x01");
        w = put_span(w, m->trace);
        *w++ = 2;
    }
    return LIT(w, "V5_TYPE\x01" "1\x02");
}

/* plain_batch(payload, max_messages, max_body, now_ms)
 *   -> (namespace, name, items, message_ids, born_ms, body_bytes) or None */
static PyObject *plain_batch(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t max_messages, max_body;
    long long now_ms;
    if (!PyArg_ParseTuple(args, "y*nnL:plain_batch", &b, &max_messages, &max_body, &now_ms)) return NULL;
    if (max_messages > MAX_MESSAGES_TAKEN) max_messages = MAX_MESSAGES_TAKEN;
    PyObject *result = NULL, *ids = NULL, *items = NULL;
    plain_message *msgs = PyMem_Malloc(sizeof(plain_message) * (size_t)(max_messages > 0 ? max_messages : 1));
    if (!msgs) {
        PyErr_NoMemory();
        goto done;
    }
    span whole = {b.buf, b.len}, ns = {0}, name = {0};
    fields f = reader(whole);
    Py_ssize_t count = 0, size = 0, body_bytes = 0;
    int got;
    while ((got = next_field(&f)) > 0) {
        span mns, mname;
        if (f.num != 1 || f.wt != WT_LEN || count >= max_messages) goto not_taken;
        plain_message *m = &msgs[count];
        if (!read_message(f.pl, m, &mns, &mname, max_body, now_ms)) goto not_taken;
        if (count == 0) {
            ns = mns;
            name = mname;
        } else if (mns.n != ns.n || mname.n != name.n || memcmp(mns.p, ns.p, (size_t)ns.n) ||
                   memcmp(mname.p, name.p, (size_t)name.n)) {
            goto not_taken; /* more than one topic: each is checked on its own */
        }
        Py_ssize_t props = properties_size(m);
        if (props > 0xFFFF) goto not_taken;
        size += ITEM_HEAD + m->body.n + 2 + props;
        body_bytes += m->body.n;
        count++;
    }
    if (got < 0 || count < 2) goto not_taken; /* one message: the single path */
    items = PyBytes_FromStringAndSize(NULL, size);
    ids = PyList_New(count);
    if (!items || !ids) goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(items);
    for (Py_ssize_t i = 0; i < count; i++) {
        const plain_message *m = &msgs[i];
        Py_ssize_t props = properties_size(m);
        w = put32(w, (uint32_t)(ITEM_HEAD + m->body.n + 2 + props));
        w = put32(w, 0); /* magic: the store writes its own */
        w = put32(w, 0); /* body CRC: computed where stored */
        w = put32(w, 0); /* flag */
        w = put32(w, (uint32_t)m->body.n);
        w = put_span(w, m->body);
        *w++ = (unsigned char)(props >> 8);
        *w++ = (unsigned char)props;
        w = put_properties(w, m);
        PyObject *id = PyUnicode_DecodeUTF8((const char *)m->id.p, m->id.n, NULL);
        if (!id) goto done;
        PyList_SET_ITEM(ids, i, id);
    }
    result = Py_BuildValue("(s#s#OOLn)", (const char *)ns.p, ns.n, (const char *)name.p, name.n, items, ids,
                           (long long)msgs[0].born_ms, body_bytes);
    goto done;
not_taken:
    Py_INCREF(Py_None);
    result = Py_None;
done:
    Py_XDECREF(items);
    Py_XDECREF(ids);
    PyMem_Free(msgs);
    PyBuffer_Release(&b);
    return result;
}

static PyMethodDef methods[] = {
    {"plain_batch", plain_batch, METH_VARARGS,
     "A SendMessageRequest of plain messages of one topic as a SEND_BATCH_MESSAGE body, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_send_request", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__send_request(void) { return PyModule_Create(&module); }
