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
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../store/_layouts.h" /* the record's layout: generated from store/layouts.py */

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

/* ---- writing protobuf fields ------------------------------------------------------------------- */

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

/* ---- reading: stored records ---------------------------------------------------------------- */
static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static int64_t rd64(const unsigned char *p) { return (int64_t)((uint64_t)rd32(p) << 32 | rd32(p + 4)); }

/* A CommitLog record split into its parts (layout: data_plane/store/layouts.py). */
typedef struct {
    const unsigned char *p; /* the record; p + RECORD_HEADER_..._AT reads a header field */
    int64_t queue_offset;
    span body, topic, props;
} raw_record;

/* The record in a buffer of exactly its size, its shape checked as message.parse_record checks it
 * (magic, IPv4 hosts, lengths that nest exactly, properties ending with their separator; not the
 * body CRC), and its topic ``topic``: 1, else 0 (the reference path judges it). */
static int read_record(const unsigned char *p, Py_ssize_t n, span topic, raw_record *r) {
    if (n < RECORD_HEADER_SIZE + 3 || (Py_ssize_t)(int32_t)rd32(p + RECORD_HEADER_TOTAL_SIZE_AT) != n ||
        (int32_t)rd32(p + RECORD_HEADER_MAGIC_AT) != MESSAGE_MAGIC_CODE ||
        (rd32(p + RECORD_HEADER_SYS_FLAG_AT) & 0x30) /* FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6 */)
        return 0;
    int32_t body_len = (int32_t)rd32(p + RECORD_HEADER_BODY_LENGTH_AT);
    if (body_len < 0 || RECORD_HEADER_SIZE + (Py_ssize_t)body_len + 3 > n) return 0;
    Py_ssize_t at = RECORD_HEADER_SIZE + body_len;
    Py_ssize_t topic_len = p[at++];
    if (at + topic_len + 2 > n || topic_len != topic.n || memcmp(p + at, topic.p, (size_t)topic_len) != 0) return 0;
    at += topic_len;
    int16_t props_len = (int16_t)((uint16_t)p[at] << 8 | p[at + 1]);
    at += 2;
    if (props_len < 0 || at + props_len != n || (props_len && p[n - 1] != 2)) return 0;
    r->p = p;
    r->queue_offset = rd64(p + RECORD_HEADER_QUEUE_OFFSET_AT);
    if (r->queue_offset < 0 || r->queue_offset == INT64_MAX) return 0; /* (a corrupt header: not a queue's) */
    r->body = (span){p + RECORD_HEADER_SIZE, body_len};
    r->topic = (span){p + at - 2 - topic_len, topic_len};
    r->props = (span){p + at, props_len};
    return 1;
}

#define MAX_PROPS 64
typedef struct {
    span k, v;
} prop;

/* The properties as (name, value) pairs, as decode_properties reads them ("name\x01value\x02",
 * items without \x01 dropped), when every byte is ASCII and no name comes twice: their number,
 * else -1 (the reference path decodes them). */
static int read_props(span s, prop *out) {
    for (Py_ssize_t i = 0; i < s.n; i++)
        if (s.p[i] >= 0x80) return -1;
    int np = 0;
    Py_ssize_t i = 0;
    while (i < s.n) {
        const unsigned char *e = memchr(s.p + i, 2, (size_t)(s.n - i));
        Py_ssize_t j = e ? e - s.p : s.n;
        const unsigned char *sep = j > i ? memchr(s.p + i, 1, (size_t)(j - i)) : NULL;
        if (sep) {
            span k = {s.p + i, sep - (s.p + i)};
            for (int x = 0; x < np; x++)
                if (out[x].k.n == k.n && memcmp(out[x].k.p, k.p, (size_t)k.n) == 0) return -1;
            if (np == MAX_PROPS) return -1;
            out[np].k = k;
            out[np].v = (span){sep + 1, s.p + j - (sep + 1)};
            np++;
        }
        i = j + 1;
    }
    return np;
}

static const span *prop_get(const prop *ps, int np, const char *name, Py_ssize_t len) {
    for (int i = 0; i < np; i++)
        if (ps[i].k.n == len && memcmp(ps[i].k.p, name, (size_t)len) == 0) return &ps[i].v;
    return NULL;
}
#define PROP(ps, np, lit) prop_get((ps), (np), (lit), (Py_ssize_t)sizeof(lit) - 1)

/* ---- MD5 (RFC 1321): the body digest the v5 clients check ------------------------------------ */
static uint32_t md5_k[64];
static const unsigned char md5_s[4][4] = {{7, 12, 17, 22}, {5, 9, 14, 20}, {4, 11, 16, 23}, {6, 10, 15, 21}};

static void md5_init(void) { /* K[i] = floor(|sin(i + 1)| * 2^32), as the RFC defines them */
    for (int i = 0; i < 64; i++) md5_k[i] = (uint32_t)(fabs(sin((double)(i + 1))) * 4294967296.0);
}

#define ROL(x, c) (((x) << (c)) | ((x) >> (32 - (c))))
#define MD5_STEP(F, g, i)                                                                                     \
    do {                                                                                                      \
        uint32_t f_ = (F) + a + md5_k[i] + w[g];                                                              \
        a = d;                                                                                                \
        d = c;                                                                                                \
        c = b;                                                                                                \
        b += ROL(f_, md5_s[(i) >> 4][(i) & 3]);                                                               \
    } while (0)

static void md5_block(uint32_t h[4], const unsigned char *p) {
    uint32_t w[16]; /* (each round fully unrolled: constant shifts and word indices) */
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
               (uint32_t)p[4 * i + 3] << 24;
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) MD5_STEP(d ^ (b & (c ^ d)), i, i) /* (b & c) | (~b & d) */;
#pragma GCC unroll 16
    for (int i = 16; i < 32; i++) MD5_STEP(c ^ (d & (b ^ c)), (5 * i + 1) & 15, i) /* (d & b) | (~d & c) */;
#pragma GCC unroll 16
    for (int i = 32; i < 48; i++) MD5_STEP(b ^ c ^ d, (3 * i + 5) & 15, i);
#pragma GCC unroll 16
    for (int i = 48; i < 64; i++) MD5_STEP(c ^ (b | ~d), (7 * i) & 15, i);
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
}

static const char HEX_UPPER[] = "0123456789ABCDEF";

/* The MD5 of [p, p+n) as 32 upper-case hex digits (what hashlib's hexdigest().upper() gives). */
static void md5_hex(const unsigned char *p, size_t n, char out[32]) {
    uint32_t h[4] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u};
    size_t i = 0;
    for (; i + 64 <= n; i += 64) md5_block(h, p + i);
    unsigned char tail[128] = {0};
    size_t rest = n - i, len = rest + 9 <= 64 ? 64 : 128;
    memcpy(tail, p + i, rest);
    tail[rest] = 0x80;
    uint64_t bits = (uint64_t)n * 8;
    for (int k = 0; k < 8; k++) tail[len - 8 + k] = (unsigned char)(bits >> (8 * k));
    md5_block(h, tail);
    if (len == 128) md5_block(h, tail + 64);
    for (int k = 0; k < 16; k++) {
        unsigned char byte = (unsigned char)(h[k >> 2] >> (8 * (k & 3)));
        out[2 * k] = HEX_UPPER[byte >> 4];
        out[2 * k + 1] = HEX_UPPER[byte & 15];
    }
}

static PyObject *md5_upper(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    char out[32];
    md5_hex(b.buf, (size_t)b.len, out);
    PyBuffer_Release(&b);
    return PyUnicode_FromStringAndSize(out, 32);
}

/* ---- writing: a stored record as a received message ------------------------------------------ */
/* Wire (apache.rocketmq.v2): ReceiveMessageResponse 2: message (Message); see the top for
 * Message and SystemProperties, and 15: invisible_duration (Duration: 1 seconds, 2 nanos). */

#define MAX_SYSTEM_NAMES 64
typedef struct {
    span names[MAX_SYSTEM_NAMES];
    int n;
} name_set;

static int name_set_of(PyObject *set, name_set *out) {
    out->n = 0;
    if (!PyAnySet_Check(set) || PySet_GET_SIZE(set) > MAX_SYSTEM_NAMES) {
        PyErr_SetString(PyExc_TypeError, "system_names: a set of at most 64 names");
        return 0;
    }
    Py_ssize_t pos = 0;
    PyObject *k;
    Py_hash_t hash;
    while (_PySet_NextEntry(set, &pos, &k, &hash)) {
        if (!PyUnicode_Check(k)) {
            PyErr_SetString(PyExc_TypeError, "system_names: names are str");
            return 0;
        }
        Py_ssize_t n;
        const char *u = PyUnicode_AsUTF8AndSize(k, &n);
        if (!u) return 0;
        out->names[out->n++] = (span){(const unsigned char *)u, n};
    }
    return 1;
}

static int named(const name_set *set, span k) {
    for (int i = 0; i < set->n; i++)
        if (set->names[i].n == k.n && memcmp(set->names[i].p, k.p, (size_t)k.n) == 0) return 1;
    return 0;
}

static int span_is(const span *s, const char *lit, Py_ssize_t n) {
    return s && s->n == n && memcmp(s->p, lit, (size_t)n) == 0;
}

/* "a.b.c.d" of 4 address bytes; its length. */
static int ip_text(const unsigned char *ip, char out[16]) {
    return snprintf(out, 16, "%u.%u.%u.%u", ip[0], ip[1], ip[2], ip[3]);
}

/* ASCII digits only, 1 to 15 of them (str.isdigit() with len <= 15 on ASCII text): the value, or -1. */
static int64_t digits_of(const span *s) {
    if (!s || s->n < 1 || s->n > 15) return -1;
    int64_t v = 0;
    for (Py_ssize_t i = 0; i < s->n; i++) {
        if (s->p[i] < '0' || s->p[i] > '9') return -1;
        v = v * 10 + (s->p[i] - '0');
    }
    return v;
}

typedef struct {
    span ns, name;
    long long queue_id;
    unsigned long long seq;
    long long attempt, invisible_ms;
    const name_set *system;
} grant;

/* One record as a framed ReceiveMessageResponse into ``out`` (its bytes from out->n on): 1, 0 on
 * an error set, -1 when the record is the reference path's to write. */
static int write_received(const raw_record *r, const grant *g, out_buf *m, out_buf *sp, out_buf *tmp,
                          out_buf *out) {
    prop ps[MAX_PROPS];
    int np = read_props(r->props, ps);
    if (np < 0) return -1;
    const span *tags = PROP(ps, np, "TAGS"), *keys = PROP(ps, np, "KEYS"), *uniq = PROP(ps, np, "UNIQ_KEY"),
               *group = PROP(ps, np, "__SHARDINGKEY"), *declared = PROP(ps, np, "V5_TYPE"),
               *trace = PROP(ps, np, "traceparent"), *due = PROP(ps, np, "TIMER_OUT_MS");
    if (!due || !due->n) due = PROP(ps, np, "TIMER_DELIVER_MS");
    if (keys) /* str.split() splits on ASCII whitespace other than spaces too: the reference's */
        for (Py_ssize_t i = 0; i < keys->n; i++)
            if (keys->p[i] != ' ' && ((keys->p[i] >= '\t' && keys->p[i] <= '\r') ||
                                      (keys->p[i] >= 0x1C && keys->p[i] <= 0x1F)))
                return -1;
    int64_t physical = rd64(r->p + RECORD_HEADER_PHYSICAL_OFFSET_AT);
    if ((!uniq || !uniq->n) && physical < 0) return -1;
    m->n = sp->n = tmp->n = 0;
    /* Message 1: topic */
    if ((g->ns.n && !w_field(tmp, 1, g->ns.p, g->ns.n)) || (g->name.n && !w_field(tmp, 2, g->name.p, g->name.n)) ||
        !w_nested(m, 1, tmp))
        return 0;
    /* Message 2: user properties, each a map entry {1: key, 2: value} */
    for (int i = 0; i < np; i++) {
        if (named(g->system, ps[i].k) || span_is(&ps[i].k, "traceparent", 11)) continue;
        tmp->n = 0;
        if ((ps[i].k.n && !w_field(tmp, 1, ps[i].k.p, ps[i].k.n)) ||
            (ps[i].v.n && !w_field(tmp, 2, ps[i].v.p, ps[i].v.n)) || !w_nested(m, 2, tmp))
            return 0;
    }
    /* SystemProperties, in field order */
    if (tags && !w_field(sp, 1, tags->p, tags->n)) return 0;
    if (keys) {
        Py_ssize_t i = 0;
        while (i < keys->n) {
            while (i < keys->n && keys->p[i] == ' ') i++;
            Py_ssize_t j = i;
            while (j < keys->n && keys->p[j] != ' ') j++;
            if (j > i && !w_field(sp, 2, keys->p + i, j - i)) return 0;
            i = j;
        }
    }
    char text[64];
    if (uniq && uniq->n) {
        if (!w_field(sp, 3, uniq->p, uniq->n)) return 0;
    } else { /* the offset message id: store host (8 bytes) and CommitLog offset, in hex */
        const unsigned char *host = r->p + RECORD_HEADER_STORE_HOST_AT;
        for (int k = 0; k < 8; k++) {
            text[2 * k] = HEX_UPPER[host[k] >> 4];
            text[2 * k + 1] = HEX_UPPER[host[k] & 15];
        }
        for (int k = 0; k < 16; k++) text[16 + k] = HEX_UPPER[((uint64_t)physical >> (60 - 4 * k)) & 15];
        if (!w_field(sp, 3, text, 32)) return 0;
    }
    md5_hex(r->body.p, (size_t)r->body.n, text);
    tmp->n = 0;
    if (!w_number(tmp, 1, 2 /* MD5 */, 0) || !w_field(tmp, 2, text, 32) || !w_nested(sp, 4, tmp)) return 0;
    int32_t flag = (int32_t)rd32(r->p + RECORD_HEADER_FLAG_AT);
    if (!w_number(sp, 5, (flag & 1) ? 2 /* GZIP */ : 1 /* IDENTITY */, 0)) return 0;
    int64_t mtype = 1; /* NORMAL */
    if (group)
        mtype = 2; /* FIFO */
    else if (declared && declared->n == 1 && declared->p[0] >= '1' && declared->p[0] <= '4')
        mtype = declared->p[0] - '0';
    if (!w_number(sp, 6, mtype, 0) || !w_millis(sp, 7, rd64(r->p + RECORD_HEADER_BORN_TIMESTAMP_AT))) return 0;
    int n = ip_text(r->p + RECORD_HEADER_BORN_HOST_AT, text);
    if (!w_field(sp, 8, text, n) || !w_millis(sp, 9, rd64(r->p + RECORD_HEADER_STORE_TIMESTAMP_AT))) return 0;
    n = ip_text(r->p + RECORD_HEADER_STORE_HOST_AT, text);
    n += snprintf(text + n, sizeof(text) - (size_t)n, ":%d", (int32_t)rd32(r->p + RECORD_HEADER_STORE_HOST_AT + 4));
    if (!w_field(sp, 10, text, n)) return 0;
    int64_t at = digits_of(due);
    if (at >= 0 && !w_millis(sp, 11, at)) return 0;
    n = snprintf(text, sizeof(text), "%lld:%lld:%016llx", g->queue_id, (long long)r->queue_offset, g->seq);
    if (!w_field(sp, 12, text, n) ||
        !w_number(sp, 13, (int32_t)rd32(r->p + RECORD_HEADER_QUEUE_ID_AT), 0) ||
        !w_number(sp, 14, r->queue_offset, 1) || !w_millis(sp, 15, g->invisible_ms) ||
        !w_number(sp, 16, g->attempt, 1))
        return 0;
    if (group && !w_field(sp, 17, group->p, group->n)) return 0;
    if (trace && trace->n && !w_field(sp, 18, trace->p, trace->n)) return 0;
    if (!w_nested(m, 3, sp)) return 0;
    if (r->body.n && !w_field(m, 4, r->body.p, r->body.n)) return 0;
    /* ReceiveMessageResponse {2: message}, after its gRPC prefix */
    tmp->n = 0;
    if (!w_nested(tmp, 2, m) || !grow(out, 5 + tmp->n)) return 0;
    unsigned char *w = out->p + out->n;
    w[0] = 0;
    put32(w + 1, (uint32_t)tmp->n);
    memcpy(w + 5, tmp->p, (size_t)tmp->n);
    out->n += 5 + tmp->n;
    return 1;
}

static int utf8_span(PyObject *text, span *out) {
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(text, &n);
    if (!u) return 0;
    *out = (span){(const unsigned char *)u, n};
    return 1;
}

/* received_records(records, topic, namespace, name, queue_id, seq, attempt, invisible_ms,
 *                  system_names) -> [framed ReceiveMessageResponse or None, ...] */
static PyObject *received_records(PyObject *self, PyObject *args) {
    PyObject *records, *topic, *ns, *name, *system_names;
    grant g;
    if (!PyArg_ParseTuple(args, "O!UUULKLLO:received_records", &PyList_Type, &records, &topic, &ns, &name,
                          &g.queue_id, &g.seq, &g.attempt, &g.invisible_ms, &system_names))
        return NULL;
    name_set system;
    span want;
    if (!name_set_of(system_names, &system) || !utf8_span(topic, &want) || !utf8_span(ns, &g.ns) ||
        !utf8_span(name, &g.name))
        return NULL;
    g.system = &system;
    Py_ssize_t count = PyList_GET_SIZE(records);
    PyObject *result = PyList_New(count);
    if (!result) return NULL;
    out_buf m = {0}, sp = {0}, tmp = {0}, out = {0};
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_buffer b;
        if (PyObject_GetBuffer(PyList_GET_ITEM(records, i), &b, PyBUF_SIMPLE) < 0) goto fail;
        raw_record r;
        int done = read_record(b.buf, b.len, want, &r) ? write_received(&r, &g, &m, &sp, &tmp, &out) : -1;
        PyBuffer_Release(&b);
        if (done == 0) goto fail;
        PyObject *item = Py_None;
        if (done > 0) {
            item = PyBytes_FromStringAndSize((const char *)out.p, out.n);
            if (!item) goto fail;
            out.n = 0;
        } else {
            Py_INCREF(item);
        }
        PyList_SET_ITEM(result, i, item);
    }
    PyMem_Free(m.p);
    PyMem_Free(sp.p);
    PyMem_Free(tmp.p);
    PyMem_Free(out.p);
    return result;
fail:
    PyMem_Free(m.p);
    PyMem_Free(sp.p);
    PyMem_Free(tmp.p);
    PyMem_Free(out.p);
    Py_DECREF(result);
    return NULL;
}

/* ---- leasing: the new messages of a receive --------------------------------------------------- */

/* lease_scan(records, topic, leases, done, tags, want, lease)
 *   -> (offsets, taken, filtered, looked, next_offset, body_bytes)
 * Records of one queue in offset order: each one neither leased nor done is leased (``leases[offset]
 * = lease``) and taken, or, when ``tags`` (a set; None: every tag) does not hold its tag, marked done
 * (``done``) and listed in ``filtered``; up to ``want`` taken. Stops at the first record it cannot
 * judge (not a sound record of ``topic``, or properties it does not read: not ASCII, a name twice);
 * ``looked`` is how many records it went through, ``next_offset`` the queue offset after the last
 * of them (-1: none). */
static PyObject *lease_scan(PyObject *self, PyObject *args) {
    PyObject *records, *topic, *leases, *done, *tags, *lease;
    Py_ssize_t want;
    if (!PyArg_ParseTuple(args, "O!UO!OOnO:lease_scan", &PyList_Type, &records, &topic, &PyDict_Type, &leases,
                          &done, &tags, &want, &lease))
        return NULL;
    if (!PySet_Check(done) || (tags != Py_None && !PyAnySet_Check(tags))) {
        PyErr_SetString(PyExc_TypeError, "lease_scan: done is a set, tags a set or None");
        return NULL;
    }
    span wire;
    if (!utf8_span(topic, &wire)) return NULL;
    PyObject *offsets = PyList_New(0), *taken = PyList_New(0), *filtered = PyList_New(0);
    if (!offsets || !taken || !filtered) goto fail;
    Py_ssize_t looked = 0, count = PyList_GET_SIZE(records);
    long long next_offset = -1, body_bytes = 0;
    while (looked < count && PyList_GET_SIZE(offsets) < want) {
        PyObject *view = PyList_GET_ITEM(records, looked);
        Py_buffer b;
        if (PyObject_GetBuffer(view, &b, PyBUF_SIMPLE) < 0) goto fail;
        raw_record r;
        int sound = read_record(b.buf, b.len, wire, &r);
        prop ps[MAX_PROPS];
        int np = sound ? read_props(r.props, ps) : 0; /* (ASCII checked with or without a tag filter) */
        if (!sound || np < 0) {
            PyBuffer_Release(&b);
            break;
        }
        PyObject *o = PyLong_FromLongLong(r.queue_offset);
        if (!o) {
            PyBuffer_Release(&b);
            goto fail;
        }
        int held = PyDict_Contains(leases, o);
        if (held == 0) held = PySet_Contains(done, o);
        int ok = held >= 0;
        if (ok && !held) {
            int accepted = 1;
            if (tags != Py_None) {
                const span *tag = PROP(ps, np, "TAGS");
                PyObject *t = tag ? PyUnicode_DecodeASCII((const char *)tag->p, tag->n, NULL) : NULL;
                accepted = tag ? (t ? PySet_Contains(tags, t) : -1) : 0;
                Py_XDECREF(t);
            }
            if (accepted < 0)
                ok = 0;
            else if (accepted)
                ok = PyDict_SetItem(leases, o, lease) == 0 && PyList_Append(offsets, o) == 0 &&
                     PyList_Append(taken, view) == 0;
            else
                ok = PySet_Add(done, o) == 0 && PyList_Append(filtered, o) == 0;
            if (ok && accepted) body_bytes += r.body.n;
        }
        Py_DECREF(o);
        PyBuffer_Release(&b); /* (the tag was read from the buffer: held until here) */
        if (!ok) goto fail;
        next_offset = r.queue_offset + 1;
        looked++;
    }
    return Py_BuildValue("(NNNnLL)", offsets, taken, filtered, looked, next_offset, body_bytes);
fail:
    Py_XDECREF(offsets);
    Py_XDECREF(taken);
    Py_XDECREF(filtered);
    return NULL;
}

static PyMethodDef methods[] = {
    {"plain_batch", plain_batch, METH_VARARGS,
     "A SendMessageRequest of plain messages of one topic as a SEND_BATCH_MESSAGE body, or None."},
    {"received_records", received_records, METH_VARARGS,
     "Stored records of one lease grant as framed ReceiveMessageResponses (None: the reference's)."},
    {"lease_scan", lease_scan, METH_VARARGS, "Lease the new records of a receive, up to a count."},
    {"md5_upper", md5_upper, METH_O, "The MD5 of a buffer as upper-case hex."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_v2_codec", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__v2_codec(void) {
    md5_init();
    return PyModule_Create(&module);
}
