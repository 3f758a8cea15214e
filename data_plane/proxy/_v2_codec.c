/*
 * Compiled twin of data_plane/proxy/v2_codec.py (PythonV2Codec): a RocketMQ 5
 * SendMessageRequest, read from its protobuf wire bytes, turned into the body of a
 * SEND_BATCH_MESSAGE (data_plane/remoting/bodies.py) in one call, without a protobuf object,
 * a properties dict or a batch item per message in Python.
 *
 * It takes only what it can store exactly as the reference path (service.MessagingService's
 * _prepare, messages.to_properties, bodies.encode_batch_item) would: NORMAL
 * messages of one topic, no user properties, no message group or delivery time, every string it
 * reads well-formed UTF-8 without control characters, every field it meets one it knows with the
 * wire type the definition gives, each singular field once. For anything else it answers None and
 * the caller parses the request and takes the reference path, which stores it or says what is
 * wrong. A single message is taken too: stored as a batch of one, it is the record the single
 * path (SendProcessor.put_plain) would write. Tests compare the two on generated requests.
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
    plain_message *msgs = NULL;
    span whole = {b.buf, b.len}, ns = {0}, name = {0};
    fields f = reader(whole);
    Py_ssize_t count = 0, size = 0, body_bytes = 0;
    int got;
    /* The top-level fields counted first, without reading them: more messages than allowed are
     * the service's to refuse, and the slots are allocated once. */
    while ((got = next_field(&f)) > 0 && count <= max_messages) count++;
    if (got < 0 || count < 1 || count > max_messages) goto not_taken;
    msgs = PyMem_Malloc(sizeof(plain_message) * (size_t)count);
    if (!msgs) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t slots = count;
    f = reader(whole);
    count = 0;
    while ((got = next_field(&f)) > 0) {
        span mns, mname;
        if (f.num != 1 || f.wt != WT_LEN || count >= slots) goto not_taken;
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
    if (got < 0 || count < 1) goto not_taken;
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

/* ---- writing: a stored message as a received one ------------------------------------------ */
/* Wire (apache.rocketmq.v2): ReceiveMessageResponse 2: message (Message); see the top for
 * Message and SystemProperties, and 15: invisible_duration (Duration: 1 seconds, 2 nanos). */

typedef struct {
    unsigned char *p;
    Py_ssize_t n, cap;
} out_buf;

static int grow(out_buf *b, Py_ssize_t extra) {
    if (b->n + extra <= b->cap) return 1;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    unsigned char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (!p) {
        PyErr_NoMemory();
        return 0;
    }
    b->p = p;
    b->cap = cap;
    return 1;
}

static int w_varint(out_buf *b, uint64_t v) {
    if (!grow(b, 10)) return 0;
    while (v >= 0x80) {
        b->p[b->n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    b->p[b->n++] = (unsigned char)v;
    return 1;
}

static int w_bytes(out_buf *b, const void *p, Py_ssize_t n) {
    if (!grow(b, n)) return 0;
    memcpy(b->p + b->n, p, (size_t)n);
    b->n += n;
    return 1;
}

/* A length-delimited field. */
static int w_field(out_buf *b, uint32_t num, const void *p, Py_ssize_t n) {
    return w_varint(b, (uint64_t)num << 3 | WT_LEN) && w_varint(b, (uint64_t)n) && w_bytes(b, p, n);
}

/* A varint field; proto3 leaves out a zero unless the field tracks presence (``always``). */
static int w_number(out_buf *b, uint32_t num, int64_t v, int always) {
    if (!v && !always) return 1;
    return w_varint(b, (uint64_t)num << 3 | WT_VARINT) && w_varint(b, (uint64_t)v);
}

/* A string field from a str (UTF-8); a non-optional empty one is left out. */
static int w_str(out_buf *b, uint32_t num, PyObject *text, int always) {
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(text, &n);
    if (!u) return 0;
    if (!n && !always) return 1;
    return w_field(b, num, u, n);
}

/* Timestamp or Duration from milliseconds (seconds and nanos, floor division as Python's). */
static int w_millis(out_buf *b, uint32_t num, int64_t ms) {
    int64_t sec = ms / 1000, rest = ms % 1000;
    if (rest < 0) {
        rest += 1000;
        sec -= 1;
    }
    unsigned char tmp[32];
    out_buf t = {tmp, 0, sizeof(tmp)}; /* (two varint fields take at most 22 bytes: never grown) */
    return w_number(&t, 1, sec, 0) && w_number(&t, 2, rest * 1000000, 0) && w_field(b, num, t.p, t.n);
}

/* A nested message: ``inner`` written as field ``num`` of ``b``. */
static int w_nested(out_buf *b, uint32_t num, const out_buf *inner) { return w_field(b, num, inner->p, inner->n); }

static int get_i64(PyObject *obj, PyObject *name, int64_t *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v) return 0;
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) return 0;
    *out = x;
    return 1;
}

static PyObject *s_properties_attr, *s_flag_attr, *s_born_host, *s_store_host, *s_queue_id, *s_queue_offset,
    *s_born_ts, *s_store_ts, *s_body_attr, *k_tags, *k_keys, *k_group, *k_type, *k_timer_out, *k_timer_deliver,
    *k_trace;

/* ASCII text with no byte outside '0'..'9' and at most 15 of them (the reference's isdigit()
 * check, for the text it can decide alone): its value, or -1. */
static int64_t ascii_digits(PyObject *text) {
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(text, &n);
    if (!u || n < 1 || n > 15) return -1;
    int64_t v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (u[i] < '0' || u[i] > '9') return -1;
        v = v * 10 + (u[i] - '0');
    }
    return v;
}

/* received_message(rec, message_id, digest, namespace, name, handle, attempt, invisible_ms,
 *                  system_names) -> the framed ReceiveMessageResponse, or None */
static PyObject *received_message(PyObject *self, PyObject *args) {
    PyObject *rec, *message_id, *digest, *ns, *name, *handle, *system_names;
    long long attempt, invisible_ms;
    if (!PyArg_ParseTuple(args, "OUUUUULLO:received_message", &rec, &message_id, &digest, &ns, &name, &handle,
                          &attempt, &invisible_ms, &system_names))
        return NULL;
    out_buf m = {0}, sp = {0}, tmp = {0};
    PyObject *result = NULL, *props = NULL, *born = NULL, *store = NULL, *body = NULL;
    int64_t flag, queue_id, queue_offset, born_ts, store_ts;
    props = PyObject_GetAttr(rec, s_properties_attr);
    born = PyObject_GetAttr(rec, s_born_host);
    store = PyObject_GetAttr(rec, s_store_host);
    body = PyObject_GetAttr(rec, s_body_attr);
    if (!props || !born || !store || !body || !get_i64(rec, s_flag_attr, &flag) ||
        !get_i64(rec, s_queue_id, &queue_id) || !get_i64(rec, s_queue_offset, &queue_offset) ||
        !get_i64(rec, s_born_ts, &born_ts) || !get_i64(rec, s_store_ts, &store_ts))
        goto done;
    if (!PyDict_CheckExact(props) || !PyBytes_Check(body) || !PyTuple_Check(born) || PyTuple_GET_SIZE(born) != 2 ||
        !PyTuple_Check(store) || PyTuple_GET_SIZE(store) != 2 || !PyAnySet_Check(system_names))
        goto not_taken;

    /* Message 1: topic */
    if (!w_str(&tmp, 1, ns, 0) || !w_str(&tmp, 2, name, 0) || !w_nested(&m, 1, &tmp)) goto done;
    /* Message 2: user properties, each a map entry {1: key, 2: value} */
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(props, &pos, &k, &v)) {
        if (!PyUnicode_Check(k) || !PyUnicode_Check(v)) goto not_taken;
        int sys = PySet_Contains(system_names, k);
        if (sys < 0) goto done;
        if (sys || PyUnicode_Compare(k, k_trace) == 0) continue;
        tmp.n = 0;
        if (!w_str(&tmp, 1, k, 0) || !w_str(&tmp, 2, v, 0) || !w_nested(&m, 2, &tmp)) goto done;
    }
    /* SystemProperties, in field order */
    PyObject *tags = PyDict_GetItemWithError(props, k_tags);
    if (!tags && PyErr_Occurred()) goto done;
    if (tags && (!PyUnicode_Check(tags) || !w_str(&sp, 1, tags, 1))) goto tags_bad;
    PyObject *keys = PyDict_GetItemWithError(props, k_keys);
    if (!keys && PyErr_Occurred()) goto done;
    if (keys) {
        if (!PyUnicode_Check(keys)) goto not_taken;
        /* Keys split on whitespace (str.split): only spaces are split here, other whitespace is
         * the reference's. */
        int kind = PyUnicode_KIND(keys);
        const void *data = PyUnicode_DATA(keys);
        for (Py_ssize_t i = 0, len = PyUnicode_GET_LENGTH(keys); i < len; i++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, i);
            if (c != ' ' && Py_UNICODE_ISSPACE(c)) goto not_taken;
        }
        Py_ssize_t n;
        const char *u = PyUnicode_AsUTF8AndSize(keys, &n);
        if (!u) goto done;
        Py_ssize_t i = 0;
        while (i < n) {
            while (i < n && u[i] == ' ') i++;
            Py_ssize_t j = i;
            while (j < n && u[j] != ' ') j++;
            if (j > i && !w_field(&sp, 2, u + i, j - i)) goto done;
            i = j;
        }
    }
    if (!w_str(&sp, 3, message_id, 0)) goto done;
    tmp.n = 0;
    if (!w_number(&tmp, 1, 2 /* MD5 */, 0) || !w_str(&tmp, 2, digest, 0) || !w_nested(&sp, 4, &tmp)) goto done;
    if (!w_number(&sp, 5, (flag & 1) ? 2 /* GZIP */ : 1 /* IDENTITY */, 0)) goto done;
    PyObject *group = PyDict_GetItemWithError(props, k_group);
    if (!group && PyErr_Occurred()) goto done;
    int64_t mtype = 1; /* NORMAL */
    if (group) {
        mtype = 2; /* FIFO */
    } else {
        PyObject *declared = PyDict_GetItemWithError(props, k_type);
        if (!declared && PyErr_Occurred()) goto done;
        if (declared && PyUnicode_Check(declared) && PyUnicode_GET_LENGTH(declared) == 1) {
            Py_UCS4 c = PyUnicode_READ_CHAR(declared, 0);
            if (c >= '1' && c <= '4') mtype = c - '0';
        }
    }
    if (!w_number(&sp, 6, mtype, 0) || !w_millis(&sp, 7, born_ts)) goto done;
    if (!PyUnicode_Check(PyTuple_GET_ITEM(born, 0)) || !PyUnicode_Check(PyTuple_GET_ITEM(store, 0))) goto not_taken;
    if (!w_str(&sp, 8, PyTuple_GET_ITEM(born, 0), 0) || !w_millis(&sp, 9, store_ts)) goto done;
    {
        PyObject *host = PyUnicode_FromFormat("%U:%S", PyTuple_GET_ITEM(store, 0), PyTuple_GET_ITEM(store, 1));
        int ok = host && w_str(&sp, 10, host, 0);
        Py_XDECREF(host);
        if (!ok) goto done;
    }
    PyObject *due = PyDict_GetItemWithError(props, k_timer_out);
    if (!due && PyErr_Occurred()) goto done;
    if (!due || !PyUnicode_Check(due) || PyUnicode_GET_LENGTH(due) == 0) { /* the reference's ``or`` */
        due = PyDict_GetItemWithError(props, k_timer_deliver);
        if (!due && PyErr_Occurred()) goto done;
    }
    if (due) {
        if (!PyUnicode_Check(due)) goto not_taken;
        int64_t at = ascii_digits(due);
        if (at < 0) {
            if (PyErr_Occurred()) goto done;
            /* not plain digits: unicode digits are the reference's to judge, anything else is none */
            Py_ssize_t n;
            const char *u = PyUnicode_AsUTF8AndSize(due, &n);
            if (!u) goto done;
            for (Py_ssize_t i = 0; i < n; i++)
                if ((unsigned char)u[i] >= 0x80) goto not_taken;
        } else if (!w_millis(&sp, 11, at)) {
            goto done;
        }
    }
    if (!w_str(&sp, 12, handle, 1) || !w_number(&sp, 13, queue_id, 0) || !w_number(&sp, 14, queue_offset, 1) ||
        !w_millis(&sp, 15, invisible_ms) || !w_number(&sp, 16, attempt, 1))
        goto done;
    if (group) {
        if (!PyUnicode_Check(group) || !w_str(&sp, 17, group, 1)) goto tags_bad;
    }
    PyObject *trace = PyDict_GetItemWithError(props, k_trace);
    if (!trace && PyErr_Occurred()) goto done;
    if (trace && PyUnicode_Check(trace) && PyUnicode_GET_LENGTH(trace) > 0 && !w_str(&sp, 18, trace, 1)) goto done;
    if (!w_nested(&m, 3, &sp)) goto done;
    if (PyBytes_GET_SIZE(body) && !w_field(&m, 4, PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body))) goto done;

    /* ReceiveMessageResponse {2: message}, after its gRPC prefix */
    tmp.n = 0;
    if (!w_nested(&tmp, 2, &m)) goto done;
    result = PyBytes_FromStringAndSize(NULL, 5 + tmp.n);
    if (!result) goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(result);
    w[0] = 0;
    put32(w + 1, (uint32_t)tmp.n);
    memcpy(w + 5, tmp.p, (size_t)tmp.n);
    goto done;
tags_bad:
    if (PyErr_Occurred()) goto done;
    goto not_taken;
not_taken:
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyMem_Free(m.p);
    PyMem_Free(sp.p);
    PyMem_Free(tmp.p);
    Py_XDECREF(props);
    Py_XDECREF(born);
    Py_XDECREF(store);
    Py_XDECREF(body);
    return result;
}

static PyMethodDef methods[] = {
    {"plain_batch", plain_batch, METH_VARARGS,
     "A SendMessageRequest of plain messages of one topic as a SEND_BATCH_MESSAGE body, or None."},
    {"received_message", received_message, METH_VARARGS,
     "A stored message as a framed ReceiveMessageResponse, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_v2_codec", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__v2_codec(void) {
#define INTERN(var, s) if (!(var = PyUnicode_InternFromString(s))) return NULL
    INTERN(s_properties_attr, "properties"); INTERN(s_flag_attr, "flag"); INTERN(s_born_host, "born_host");
    INTERN(s_store_host, "store_host"); INTERN(s_queue_id, "queue_id"); INTERN(s_queue_offset, "queue_offset");
    INTERN(s_born_ts, "born_timestamp"); INTERN(s_store_ts, "store_timestamp"); INTERN(s_body_attr, "body");
    INTERN(k_tags, "TAGS"); INTERN(k_keys, "KEYS"); INTERN(k_group, "__SHARDINGKEY"); INTERN(k_type, "V5_TYPE");
    INTERN(k_timer_out, "TIMER_OUT_MS"); INTERN(k_timer_deliver, "TIMER_DELIVER_MS"); INTERN(k_trace, "traceparent");
    return PyModule_Create(&module);
}
