/* The compiled twin of data_plane/remoting/command.py's py_decode_frame, for the common frame.
 *
 * A frame (its 4-byte total length already taken off):
 *
 *     header length 4 (serialize type in the high byte) | header | body
 *
 * decode_frame(frame, cls, view_from) decodes a frame whose header is JSON (type 0) of the shape every
 * RocketMQ client sends: one object whose "code", "opaque", "flag" and "version" are integer
 * literals within a 32-bit int, "language" a string, "remark" a string or null, "extFields" an
 * object of string values (or null), any other member a string, number, true, false or null.
 * It returns ``cls`` (RemotingCommand) with every slot set, as py_decode_frame would build it, or
 * None for anything else — another serialize type, a number written as a string, a value that
 * is an array, bad JSON, invalid UTF-8, a \u escape of a surrogate — and the Python twin then
 * decides, raising its FrameError where the frame is bad. It never raises for a frame's bytes.
 * A body of view_from bytes or more is a memoryview of the frame (no copy); a smaller one, bytes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
/* The compiled twins use CPython internals (_PyType_Lookup, tp_version_tag, member descriptors)
 * as CPython 3.11 has them, the version they are tested on: any other fails to build, loudly,
 * and the pure-Python twin serves (setup.py builds this as an optional extension). */
#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030C0000
#error "built and tested against CPython 3.11 internals only: the pure-Python twin serves here"
#endif
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define MAX_HEADER_BYTES (1024 * 1024)
#define SERIALIZE_JSON 0

/* ---- slots of the command class, by offset (the class is passed in; its layout is checked
 * once per type version) ------------------------------------------------------------------ */
enum { F_BODY, F_CODE, F_EXT, F_FLAG, F_LANGUAGE, F_OPAQUE, F_RAW_HEADER, F_REMARK, F_STYPE, F_VERSION, N_FIELDS };
static const char *field_names[N_FIELDS] = {"body",   "code",       "ext_fields", "flag",           "language",
                                            "opaque", "raw_header", "remark",     "serialize_type", "version"};
static PyObject *field_interned[N_FIELDS];
static PyTypeObject *known_type; /* strong reference */
static unsigned int known_version;
static Py_ssize_t offsets[N_FIELDS];

static int layout_of(PyTypeObject *tp) {
    if (tp == known_type && tp->tp_version_tag == known_version && known_version != 0) return 1;
    if (tp->tp_alloc == NULL || !(tp->tp_flags & Py_TPFLAGS_HEAPTYPE)) return 0;
    for (int f = 0; f < N_FIELDS; f++) {
        PyObject *d = _PyType_Lookup(tp, field_interned[f]); /* borrowed; sets the version tag */
        if (!d || !Py_IS_TYPE(d, &PyMemberDescr_Type)) return 0;
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)) return 0;
        offsets[f] = m->offset;
    }
    if (tp->tp_version_tag == 0) return 0;
    Py_INCREF(tp);
    Py_XSETREF(known_type, tp);
    known_version = tp->tp_version_tag;
    return 1;
}

/* ---- a small strict JSON reader ------------------------------------------------------------ */
typedef struct {
    const unsigned char *p, *end;
    unsigned char *scratch; /* unescaped string bytes */
    Py_ssize_t scratch_cap;
} reader;

static void skip_ws(reader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

static int hex4(const unsigned char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return 0;
        v = v * 16 + d;
    }
    *out = v;
    return 1;
}

/* Bytes that end a plain run of a JSON string: the quote, the backslash, control characters. */
static unsigned char STRING_STOP[256];

/* A string at r->p (its opening quote). Sets *s and *n to its bytes: in place when it has no
 * escape, else unescaped into the scratch buffer. 0: not a string this reader takes. */
static int read_string(reader *r, const unsigned char **s, Py_ssize_t *n, int *escaped) {
    if (r->p >= r->end || *r->p != '"') return 0;
    const unsigned char *start = ++r->p, *q = start;
    while (q < r->end && !STRING_STOP[*q]) q++;
    if (q >= r->end || *q < 0x20) return 0; /* unterminated, or a raw control character */
    if (*q == '"') {
        *s = start;
        *n = q - start;
        *escaped = 0;
        r->p = q + 1;
        return 1;
    }
    /* escapes: unescape into scratch (never longer than the source) */
    Py_ssize_t need = r->end - start;
    if (need > r->scratch_cap) {
        unsigned char *b = PyMem_Realloc(r->scratch, (size_t)need);
        if (!b) {
            PyErr_NoMemory();
            return -1;
        }
        r->scratch = b;
        r->scratch_cap = need;
    }
    unsigned char *w = r->scratch;
    memcpy(w, start, (size_t)(q - start));
    w += q - start;
    while (q < r->end) {
        const unsigned char *run = q; /* a plain run up to the next stop, copied whole */
        while (q < r->end && !STRING_STOP[*q]) q++;
        memcpy(w, run, (size_t)(q - run));
        w += q - run;
        if (q >= r->end) return 0;
        unsigned char c = *q;
        if (c == '"') {
            *s = r->scratch;
            *n = w - r->scratch;
            *escaped = 1;
            r->p = q + 1;
            return 1;
        }
        if (c < 0x20) return 0;
        /* c is the backslash */
        if (q + 1 >= r->end) return 0;
        unsigned char e = q[1];
        q += 2;
        switch (e) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '/': *w++ = '/'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            unsigned cp;
            if (r->end - q < 4 || !hex4(q, &cp)) return 0;
            if (cp >= 0xD800 && cp <= 0xDFFF) return 0; /* surrogates: the Python twin decides */
            q += 4;
            if (cp < 0x80) {
                *w++ = (unsigned char)cp;
            } else if (cp < 0x800) {
                *w++ = (unsigned char)(0xC0 | (cp >> 6));
                *w++ = (unsigned char)(0x80 | (cp & 0x3F));
            } else {
                *w++ = (unsigned char)(0xE0 | (cp >> 12));
                *w++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                *w++ = (unsigned char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: return 0;
        }
    }
    return 0;
}

/* An integer literal (-?(0|[1-9][0-9]*), no fraction or exponent) within a 32-bit int. */
static int read_int32(reader *r, long *out) {
    const unsigned char *q = r->p;
    int neg = 0;
    if (q < r->end && *q == '-') {
        neg = 1;
        q++;
    }
    if (q >= r->end || *q < '0' || *q > '9') return 0;
    if (*q == '0' && q + 1 < r->end && q[1] >= '0' && q[1] <= '9') return 0;
    long long v = 0;
    int digits = 0;
    while (q < r->end && *q >= '0' && *q <= '9') {
        v = v * 10 + (*q - '0');
        if (++digits > 11) return 0;
        q++;
    }
    if (q < r->end && (*q == '.' || *q == 'e' || *q == 'E')) return 0;
    if (neg) v = -v;
    if (v < INT32_MIN || v > INT32_MAX) return 0;
    *out = (long)v;
    r->p = q;
    return 1;
}

/* Whether s[0, n) is UTF-8 (what text_of would take). */
static int is_utf8(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n && s[i] < 0x80) i++;
    if (i == n) return 1;
    PyObject *t = PyUnicode_DecodeUTF8((const char *)s, n, NULL);
    if (!t) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(t);
    return 1;
}

/* Skips a member value that is a scalar: string, number, true, false or null. */
static int skip_scalar(reader *r) {
    if (r->p >= r->end) return 0;
    unsigned char c = *r->p;
    if (c == '"') {
        const unsigned char *s;
        Py_ssize_t n;
        int esc;
        int rc = read_string(r, &s, &n, &esc);
        if (rc <= 0) return rc;
        return is_utf8(s, n); /* its text must be UTF-8 for the JSON to be valid */
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        /* strict number grammar: -?(0|[1-9]\d*)(\.\d+)? */
        const unsigned char *q = r->p;
        if (*q == '-') q++;
        if (q >= r->end || *q < '0' || *q > '9') return 0;
        if (*q == '0') q++;
        else while (q < r->end && *q >= '0' && *q <= '9') q++;
        if (q < r->end && *q == '.') {
            q++;
            if (q >= r->end || *q < '0' || *q > '9') return 0;
            while (q < r->end && *q >= '0' && *q <= '9') q++;
        }
        /* an exponent, or more digits than a double holds exactly: the twin decides */
        if (q < r->end && (*q == 'e' || *q == 'E')) return 0;
        if (q - r->p > 16) return 0;
        r->p = q;
        return 1;
    }
    static const char *words[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t k = strlen(words[i]);
        if ((size_t)(r->end - r->p) >= k && memcmp(r->p, words[i], k) == 0) {
            r->p += k;
            return 1;
        }
    }
    return 0;
}

static int is_null(reader *r) {
    if (r->end - r->p >= 4 && memcmp(r->p, "null", 4) == 0) {
        r->p += 4;
        return 1;
    }
    return 0;
}

/* Field names and single-letter keys (SEND_MESSAGE_V2's) are made once and reused. */
static PyObject *letters[128];

/* Short ASCII texts seen lately (names, "0", "false", "DefaultRegion", a topic, a group...),
 * reused instead of made again: a direct-mapped table of strs, a slot per hash of the bytes. A
 * text that changes every frame (a timestamp, an offset) just takes its slot over. */
#define TEXT_CACHE_SLOTS 256
#define TEXT_CACHE_MAX 32
static PyObject *text_cache[TEXT_CACHE_SLOTS];

static PyObject *text_of(const unsigned char *s, Py_ssize_t n) {
    if (n > TEXT_CACHE_MAX) return PyUnicode_DecodeUTF8((const char *)s, n, NULL);
    unsigned char any_high = 0;
    for (Py_ssize_t i = 0; i < n; i++) any_high |= s[i];
    if (any_high & 0x80) return PyUnicode_DecodeUTF8((const char *)s, n, NULL);
    /* the slot: length, first, middle and last bytes (a collision only costs the slot) */
    uint32_t h = n ? ((uint32_t)n * 31u + s[0]) * 31u + s[n / 2] : 0;
    h = (h * 31u + (n ? s[n - 1] : 0)) * 2654435761u;
    PyObject **slot = &text_cache[(h >> 16) & (TEXT_CACHE_SLOTS - 1)];
    PyObject *t = *slot;
    if (t && PyUnicode_GET_LENGTH(t) == n && memcmp(PyUnicode_DATA(t), s, (size_t)n) == 0) {
        Py_INCREF(t);
        return t;
    }
    t = PyUnicode_New(n, 127);
    if (!t) return NULL;
    memcpy(PyUnicode_DATA(t), s, (size_t)n);
    Py_XSETREF(*slot, t);
    Py_INCREF(t);
    return t;
}

static PyObject *key_text(const unsigned char *s, Py_ssize_t n) {
    if (n == 1 && s[0] < 128) {
        PyObject *k = letters[s[0]];
        if (!k) {
            k = PyUnicode_FromStringAndSize((const char *)s, 1);
            if (!k) return NULL;
            PyUnicode_InternInPlace(&k);
            letters[s[0]] = k; /* kept for the process's life */
            Py_INCREF(k);
        } else {
            Py_INCREF(k);
        }
        return k;
    }
    return text_of(s, n);
}

/* extFields: an object of string values -> a new dict; NULL with no error set: not taken. */
static PyObject *read_ext(reader *r) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    r->p++; /* '{' */
    skip_ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
        return d;
    }
    for (;;) {
        const unsigned char *s;
        Py_ssize_t n;
        int esc, rc;
        skip_ws(r);
        rc = read_string(r, &s, &n, &esc);
        if (rc <= 0) goto fail;
        PyObject *k = key_text(s, n);
        if (!k) goto fail;
        skip_ws(r);
        if (r->p >= r->end || *r->p != ':') {
            Py_DECREF(k);
            goto fail;
        }
        r->p++;
        skip_ws(r);
        rc = read_string(r, &s, &n, &esc);
        if (rc <= 0) {
            Py_DECREF(k);
            goto fail;
        }
        PyObject *v = text_of(s, n);
        int bad = !v || PyDict_SetItem(d, k, v) < 0;
        Py_DECREF(k);
        Py_XDECREF(v);
        if (bad) goto fail;
        skip_ws(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            continue;
        }
        if (r->p < r->end && *r->p == '}') {
            r->p++;
            return d;
        }
        goto fail;
    }
fail:
    Py_DECREF(d);
    /* not valid UTF-8: not taken (no error); anything else (no memory) stays raised */
    if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) PyErr_Clear();
    return NULL;
}

#define KEY_IS(lit) (n == (Py_ssize_t)sizeof(lit) - 1 && memcmp(s, lit, sizeof(lit) - 1) == 0)

/* ---- the JSON header's members ---------------------------------------------------------------
 * read_header walks a frame's JSON header object (r at its first byte, r->end its end): the four
 * numbers into h (code required; "version" null is 0), every other member to member(ctx, r,
 * name, n) with r at its value, which reads the value and returns 1, or 0 (not taken) or -1 (an
 * error set). Returns the same: 1 for a whole header of that shape, nothing after it. */
typedef struct {
    long code, opaque, flag, version;
} head_numbers;

/* A frame's JSON header: r set over it, its length returned; -1 for a frame too short, another
 * serialize type, or a header length that does not fit. */
static Py_ssize_t json_header(const unsigned char *base, Py_ssize_t len, reader *r) {
    if (len < 4) return -1;
    uint32_t mark = ((uint32_t)base[0] << 24) | ((uint32_t)base[1] << 16) | ((uint32_t)base[2] << 8) | base[3];
    Py_ssize_t hlen = mark & 0xFFFFFF;
    if ((mark >> 24) != SERIALIZE_JSON || hlen > len - 4 || hlen > MAX_HEADER_BYTES) return -1;
    r->p = base + 4;
    r->end = base + 4 + hlen;
    return hlen;
}

typedef int (*member_fn)(void *ctx, reader *r, const unsigned char *name, Py_ssize_t n);

static int read_header(reader *r, head_numbers *h, member_fn member, void *ctx) {
    int have_code = 0;
    skip_ws(r);
    if (r->p >= r->end || *r->p != '{') return 0;
    r->p++;
    skip_ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
    } else {
        for (;;) {
            const unsigned char *s;
            Py_ssize_t n;
            int esc;
            skip_ws(r);
            int rc = read_string(r, &s, &n, &esc);
            if (rc <= 0) return rc;
            if (esc) return 0; /* an escaped member name: the twin decides */
            skip_ws(r);
            if (r->p >= r->end || *r->p != ':') return 0;
            r->p++;
            skip_ws(r);
            if (KEY_IS("code")) {
                if (!read_int32(r, &h->code)) return 0;
                have_code = 1;
            } else if (KEY_IS("opaque")) {
                if (!read_int32(r, &h->opaque)) return 0;
            } else if (KEY_IS("flag")) {
                if (!read_int32(r, &h->flag)) return 0;
            } else if (KEY_IS("version")) {
                if (is_null(r)) h->version = 0; /* ``or 0``: null is 0 */
                else if (!read_int32(r, &h->version)) return 0;
            } else {
                rc = member(ctx, r, s, n);
                if (rc <= 0) return rc;
            }
            skip_ws(r);
            if (r->p < r->end && *r->p == ',') {
                r->p++;
                continue;
            }
            if (r->p < r->end && *r->p == '}') {
                r->p++;
                break;
            }
            return 0;
        }
    }
    skip_ws(r);
    return r->p == r->end && have_code;
}

/* Any other member: a scalar under a plain ASCII name (decode_frame and send_fields skip it). */
static int skip_member(reader *r, const unsigned char *s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (s[i] >= 0x80) return 0; /* a non-ASCII member name: the twin checks it */
    return skip_scalar(r);
}

/* decode_frame's members: extFields as a dict, remark and language as strs. */
typedef struct {
    PyObject *ext, *remark, *language;
} command_members;

static int command_member(void *ctx, reader *r, const unsigned char *s, Py_ssize_t n) {
    command_members *m = ctx;
    if (KEY_IS("extFields")) {
        Py_CLEAR(m->ext);
        if (is_null(r)) return 1;
        if (r->p >= r->end || *r->p != '{') return 0;
        m->ext = read_ext(r);
        if (!m->ext) return PyErr_Occurred() ? -1 : 0;
        return 1;
    }
    if (KEY_IS("remark") || KEY_IS("language")) {
        PyObject **slot = s[0] == 'r' ? &m->remark : &m->language;
        Py_CLEAR(*slot);
        if (is_null(r)) return slot == &m->remark; /* _as_str(None) is "", not null: the twin's */
        const unsigned char *vs;
        Py_ssize_t vn;
        int vesc;
        int rc = read_string(r, &vs, &vn, &vesc);
        if (rc <= 0) return rc;
        *slot = text_of(vs, vn);
        if (!*slot) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
            PyErr_Clear();
            return 0;
        }
        return 1;
    }
    return skip_member(r, s, n);
}

static PyObject *decode_frame(PyObject *self, PyObject *args) {
    Py_buffer b;
    PyObject *frame, *cls;
    Py_ssize_t view_from;
    if (!PyArg_ParseTuple(args, "OOn:decode_frame", &frame, &cls, &view_from)) return NULL;
    if (PyObject_GetBuffer(frame, &b, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL, *body = NULL;
    command_members m = {0};
    head_numbers h = {0};
    reader r = {0};
    if (!PyType_Check(cls) || !layout_of((PyTypeObject *)cls)) {
        PyErr_SetString(PyExc_TypeError, "decode_frame: cls must be a class of writable slots");
        goto done;
    }
    const unsigned char *base = b.buf;
    Py_ssize_t len = b.len;
    Py_ssize_t hlen = json_header(base, len, &r);
    if (hlen < 0) goto fallback;
    int rc = read_header(&r, &h, command_member, &m);
    if (rc < 0) goto done;
    if (rc == 0) goto fallback;
    PyObject *ext = m.ext, *remark = m.remark, *language = m.language;
    if (!language) {
        language = m.language = PyUnicode_InternFromString("OTHER");
        if (!language) goto done;
    }
    if (len > 4 + hlen && len - 4 - hlen >= view_from) { /* a large body: a view of the frame, as the twin */
        PyObject *whole = PyMemoryView_FromObject(frame);
        body = whole ? PySequence_GetSlice(whole, 4 + hlen, len) : NULL;
        Py_XDECREF(whole);
        if (!body) goto done;
    } else if (len > 4 + hlen) {
        body = PyBytes_FromStringAndSize((const char *)base + 4 + hlen, len - 4 - hlen);
        if (!body) goto done;
    }
    PyTypeObject *tp = (PyTypeObject *)cls;
    PyObject *cmd = tp->tp_alloc(tp, 0);
    if (!cmd) goto done;
    PyObject *values[N_FIELDS];
    values[F_BODY] = body ? body : Py_None;
    values[F_CODE] = PyLong_FromLong(h.code);
    values[F_EXT] = ext ? ext : Py_None;
    values[F_FLAG] = PyLong_FromLong(h.flag);
    values[F_LANGUAGE] = language;
    values[F_OPAQUE] = PyLong_FromLong(h.opaque);
    values[F_RAW_HEADER] = Py_None;
    values[F_REMARK] = remark ? remark : Py_None;
    values[F_STYPE] = PyLong_FromLong(SERIALIZE_JSON);
    values[F_VERSION] = PyLong_FromLong(h.version);
    int made = values[F_CODE] && values[F_FLAG] && values[F_OPAQUE] && values[F_STYPE] && values[F_VERSION];
    for (int f = 0; f < N_FIELDS; f++) {
        PyObject *v = values[f];
        if (!v) continue;
        int owned = f == F_CODE || f == F_FLAG || f == F_OPAQUE || f == F_STYPE || f == F_VERSION;
        if (!owned) Py_INCREF(v);
        *(PyObject **)((char *)cmd + offsets[f]) = v; /* a new object's slots are empty */
    }
    if (!made) {
        Py_DECREF(cmd);
        goto done;
    }
    result = cmd;
    goto done;
fallback:
    if (PyErr_Occurred()) goto done;
    Py_INCREF(Py_None);
    result = Py_None;
done:
    Py_XDECREF(m.ext);
    Py_XDECREF(m.remark);
    Py_XDECREF(m.language);
    Py_XDECREF(body);
    PyMem_Free(r.scratch);
    PyBuffer_Release(&b);
    return result;
}

/* ---- SEND_MESSAGE_V2's fields, for the broker's plain single send -------------------------
 * send_fields(frame, view_from) -> (opaque, version, topic, queue_id, sys_flag, born_timestamp,
 * flag, reconsume_times, properties, body) | None: what the broker's plain send takes from a
 * SEND_MESSAGE_V2 request (code 310, flag 0: a request that wants its answer), read straight off
 * a frame with a common JSON header (the shape decode_frame takes), with no command object and
 * no extFields dict made. extFields "b" (the topic) and "e" (the queue id) are required; "f",
 * "g", "h", "j" missing or empty are 0, as ``int(ext.get(x) or 0)`` makes them; "i" (the
 * properties text) missing is ""; "m" must not be "true" (a batch). Numbers only in the strict
 * form clients write (-?[0-9]+; born_timestamp within 64 bits, the others within 32); the body
 * non-empty, as decode_frame gives it. None for anything else: the frame then takes the command
 * path (decode_frame and the handler), which answers it or says what is wrong. Never raises for
 * a frame's bytes. The Python twin is remoting/send_frame.py's py_send_fields. */
#define SEND_MESSAGE_V2 310

/* A header number in the strict form: -?[0-9]{1,18}, within [lo, hi]. */
static int strict_number(const unsigned char *s, Py_ssize_t n, long long lo, long long hi, long long *out) {
    Py_ssize_t i = 0;
    int neg = 0;
    if (n > 0 && s[0] == '-') {
        neg = 1;
        i = 1;
    }
    if (i >= n || n - i > 18) return 0;
    long long v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (s[i] - '0');
    }
    if (neg) v = -v;
    if (v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

enum { SF_QUEUE, SF_SYS_FLAG, SF_BORN, SF_FLAG, SF_RECONSUME, SF_NUMBERS };

typedef struct {
    PyObject *topic, *props; /* new references, or NULL */
    long long numbers[SF_NUMBERS];
    int have_ext, have_queue, batch;
} send_ext;

/* extFields (r at its '{'), into st. 1: read; 0: not taken; -1: an error set (no memory). */
static int read_send_ext(reader *r, send_ext *st) {
    r->p++; /* '{' */
    skip_ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
        return 1;
    }
    for (;;) {
        const unsigned char *k, *v;
        Py_ssize_t kn, vn;
        int esc, rc;
        skip_ws(r);
        rc = read_string(r, &k, &kn, &esc);
        if (rc <= 0) return rc;
        /* a key in the scratch buffer is overwritten by an escaped value: keep its letter */
        int letter = kn == 1 && k[0] < 0x80 ? k[0] : 0;
        if (!letter && !is_utf8(k, kn)) return 0;
        skip_ws(r);
        if (r->p >= r->end || *r->p != ':') return 0;
        r->p++;
        skip_ws(r);
        rc = read_string(r, &v, &vn, &esc);
        if (rc <= 0) return rc;
        int slot = -1;
        long long lo = INT32_MIN, hi = INT32_MAX;
        switch (letter) {
        case 'b':
        case 'i': {
            PyObject *t = text_of(v, vn);
            if (!t) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
                PyErr_Clear();
                return 0;
            }
            Py_XSETREF(*(letter == 'b' ? &st->topic : &st->props), t);
            break;
        }
        case 'e': slot = SF_QUEUE; break;
        case 'f': slot = SF_SYS_FLAG; break;
        case 'g': slot = SF_BORN; lo = INT64_MIN / 10; hi = INT64_MAX / 10; break;
        case 'h': slot = SF_FLAG; break;
        case 'j': slot = SF_RECONSUME; break;
        case 'm':
            if (!is_utf8(v, vn)) return 0;
            st->batch = vn == 4 && memcmp(v, "true", 4) == 0;
            break;
        default:
            if (!is_utf8(v, vn)) return 0;
        }
        if (slot >= 0) {
            if (vn == 0 && slot != SF_QUEUE) {
                st->numbers[slot] = 0; /* ``or 0`` */
            } else if (!strict_number(v, vn, lo, hi, &st->numbers[slot])) {
                return 0;
            }
            if (slot == SF_QUEUE) st->have_queue = 1;
        }
        skip_ws(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            continue;
        }
        if (r->p < r->end && *r->p == '}') {
            r->p++;
            return 1;
        }
        return 0;
    }
}

/* The unescaping buffer of send_fields, kept between calls (the GIL guards it) unless large. */
static unsigned char *sf_scratch;
static Py_ssize_t sf_scratch_cap;

/* send_fields' members: extFields into a send_ext; the language a string, the remark a string
 * or null, as decode_frame takes them (else the twin decides). */
static int send_member(void *ctx, reader *r, const unsigned char *s, Py_ssize_t n) {
    send_ext *st = ctx;
    if (KEY_IS("extFields")) { /* a second extFields replaces the first, as in decode_frame */
        Py_CLEAR(st->topic);
        Py_CLEAR(st->props);
        memset(st->numbers, 0, sizeof st->numbers);
        st->have_queue = st->batch = 0;
        st->have_ext = !is_null(r);
        if (!st->have_ext) return 1;
        if (r->p >= r->end || *r->p != '{') return 0;
        return read_send_ext(r, st);
    }
    if (KEY_IS("language") || KEY_IS("remark")) {
        if (s[0] == 'r' && is_null(r)) return 1;
        if (r->p >= r->end || *r->p != '"') return 0;
        return skip_scalar(r);
    }
    return skip_member(r, s, n);
}

static PyObject *send_fields(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer b;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "send_fields takes 2 arguments");
        return NULL;
    }
    PyObject *frame = args[0];
    Py_ssize_t view_from = PyLong_AsSsize_t(args[1]);
    if (view_from == -1 && PyErr_Occurred()) return NULL;
    if (PyObject_GetBuffer(frame, &b, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL, *body = NULL;
    send_ext st = {0};
    head_numbers h = {0};
    reader r = {0};
    r.scratch = sf_scratch;
    r.scratch_cap = sf_scratch_cap;
    const unsigned char *base = b.buf;
    Py_ssize_t len = b.len;
    Py_ssize_t hlen = json_header(base, len, &r);
    if (hlen < 0 || len - 4 - hlen <= 0) goto fallback; /* (no body: not a send to take) */
    int rc = read_header(&r, &h, send_member, &st);
    if (rc < 0) goto done;
    if (rc == 0 || h.code != SEND_MESSAGE_V2 || h.flag != 0) goto fallback;
    if (!st.have_ext || !st.have_queue || !st.topic || st.batch) goto fallback;
    if (!st.props && !(st.props = text_of((const unsigned char *)"", 0))) goto done;
    if (len - 4 - hlen >= view_from) {
        PyObject *whole = PyMemoryView_FromObject(frame);
        body = whole ? PySequence_GetSlice(whole, 4 + hlen, len) : NULL;
        Py_XDECREF(whole);
    } else {
        body = PyBytes_FromStringAndSize((const char *)base + 4 + hlen, len - 4 - hlen);
    }
    if (!body) goto done;
    result = PyTuple_New(10);
    if (!result) goto done;
    PyObject *items[10] = {
        PyLong_FromLong(h.opaque), PyLong_FromLong(h.version), st.topic, PyLong_FromLongLong(st.numbers[SF_QUEUE]),
        PyLong_FromLongLong(st.numbers[SF_SYS_FLAG]), PyLong_FromLongLong(st.numbers[SF_BORN]),
        PyLong_FromLongLong(st.numbers[SF_FLAG]), PyLong_FromLongLong(st.numbers[SF_RECONSUME]), st.props, body,
    };
    st.topic = st.props = body = NULL; /* the tuple's now */
    for (int i = 0; i < 10; i++) {
        if (!items[i]) Py_CLEAR(result);
        if (result) PyTuple_SET_ITEM(result, i, items[i]);
        else Py_XDECREF(items[i]);
    }
    goto done;
fallback:
    if (PyErr_Occurred()) goto done;
    Py_INCREF(Py_None);
    result = Py_None;
done:
    Py_XDECREF(st.topic);
    Py_XDECREF(st.props);
    Py_XDECREF(body);
    if (r.scratch_cap > 65536) { /* a large one goes */
        PyMem_Free(r.scratch);
        r.scratch = NULL;
        r.scratch_cap = 0;
    }
    sf_scratch = r.scratch;
    sf_scratch_cap = r.scratch_cap;
    PyBuffer_Release(&b);
    return result;
}

/* ---- encoding: the frame's head (its two lengths and the JSON header) --------------------
 * frame_head(cmd, body_len) -> bytes | None: the 8 bytes of lengths and the header that
 * command.py's FRAME_PREFIX.pack(...) + encode_header(cmd) give — the same bytes, orjson's
 * escaping included — for a command of the known class with a JSON serialize type and either a
 * raw_header (bytes: taken as it is) or an int (an IntEnum too, not a bool) code, version, opaque and flag within
 * 8 bytes, a str language, a str or None remark, and extFields None or a dict of str to str. None for anything
 * else (the Python twin encodes it, or raises). */
static const char HEX[] = "0123456789abcdef";

/* Bytes JSON text escapes (control characters, the quote, the backslash); the rest of UTF-8
 * text goes as it is, as orjson writes it. */
static unsigned char NEEDS_ESCAPE[256];

/* text escaped as orjson escapes it, without quotes. At most 6 * n bytes at w. */
static unsigned char *put_escaped_bare(unsigned char *w, const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t j = i;
        while (j < n && !NEEDS_ESCAPE[s[j]]) j++;
        memcpy(w, s + i, (size_t)(j - i));
        w += j - i;
        if (j == n) break;
        unsigned char c = s[j];
        *w++ = '\\';
        switch (c) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '\n': *w++ = 'n'; break;
        case '\r': *w++ = 'r'; break;
        case '\t': *w++ = 't'; break;
        case '\b': *w++ = 'b'; break;
        case '\f': *w++ = 'f'; break;
        default:
            memcpy(w, "u00", 3);
            w[3] = (unsigned char)HEX[c >> 4];
            w[4] = (unsigned char)HEX[c & 15];
            w += 5;
        }
        i = j + 1;
    }
    return w;
}

/* "text", escaped as orjson escapes it. At most 2 + 6 * n bytes at w. */
static unsigned char *put_escaped(unsigned char *w, const unsigned char *s, Py_ssize_t n) {
    *w++ = '"';
    w = put_escaped_bare(w, s, n);
    *w++ = '"';
    return w;
}

#define MAX_EXT_ON_STACK 32

/* v in decimal into out (room for 20 digits and a sign); its length. */
static int decimal(char *out, long long v) {
    char tmp[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    int len = 0;
    if (v < 0) out[len++] = '-';
    while (n) out[len++] = tmp[--n];
    return len;
}

/* Whether a header of hlen bytes and a body of body_len fit the frame's two length fields. */
static int lengths_fit(Py_ssize_t hlen, Py_ssize_t body_len) {
    return hlen <= 0xFFFFFF && 4 + hlen + body_len <= 0x7FFFFFFF;
}

/* The frame's total length and its header length (type 0, JSON, in the high byte), big-endian. */
static void put_lengths(unsigned char *w, Py_ssize_t hlen, Py_ssize_t body_len) {
    uint32_t total = (uint32_t)(4 + hlen + body_len), mark = (uint32_t)hlen;
    for (int i = 0; i < 4; i++) {
        w[i] = (unsigned char)(total >> (24 - 8 * i));
        w[4 + i] = (unsigned char)(mark >> (24 - 8 * i));
    }
}

/* send_ok_frame(version, opaque, host_hex, wrote_offset, queue_id, queue_offset) -> bytes: the
 * whole frame of SUCCESS for one message stored at CommitLog offset wrote_offset — the header
 * broker/send.py's _SEND_OK_HEADER formats (its twin), after the frame's two lengths. The
 * message id is host_hex (the store host's address in hex, ASCII) then the offset in 16
 * uppercase hex digits. Raises TypeError or OverflowError for arguments of another kind. */
static const char SEND_OK_1[] = "{\"code\":0,\"language\":\"JAVA\",\"version\":";
static const char SEND_OK_2[] = ",\"opaque\":";
static const char SEND_OK_3[] = ",\"flag\":1,\"serializeTypeCurrentRPC\":\"JSON\",\"extFields\":{\"msgId\":\"";
static const char SEND_OK_4[] = "\",\"queueId\":\"";
static const char SEND_OK_5[] = "\",\"queueOffset\":\"";
static const char SEND_OK_6[] = "\",\"MSG_REGION\":\"DefaultRegion\",\"TRACE_ON\":\"true\"}}";
#define SEND_OK_HOST_MAX 64

static PyObject *send_ok_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "send_ok_frame takes 6 arguments");
        return NULL;
    }
    long long n[5];
    static const int which[5] = {0, 1, 3, 4, 5};
    for (int i = 0; i < 5; i++) {
        n[i] = PyLong_AsLongLong(args[which[i]]);
        if (n[i] == -1 && PyErr_Occurred()) return NULL;
    }
    if (!PyBytes_Check(args[2]) || PyBytes_GET_SIZE(args[2]) > SEND_OK_HOST_MAX) {
        PyErr_SetString(PyExc_TypeError, "send_ok_frame: host_hex must be bytes of at most 64");
        return NULL;
    }
    unsigned char buf[8 + sizeof SEND_OK_1 + sizeof SEND_OK_2 + sizeof SEND_OK_3 + sizeof SEND_OK_4 +
                      sizeof SEND_OK_5 + sizeof SEND_OK_6 + SEND_OK_HOST_MAX + 16 + 4 * 24];
    unsigned char *w = buf + 8;
#define PUT(lit) (memcpy(w, lit, sizeof lit - 1), w += sizeof lit - 1)
    PUT(SEND_OK_1);
    w += decimal((char *)w, n[0]);
    PUT(SEND_OK_2);
    w += decimal((char *)w, n[1]);
    PUT(SEND_OK_3);
    memcpy(w, PyBytes_AS_STRING(args[2]), (size_t)PyBytes_GET_SIZE(args[2]));
    w += PyBytes_GET_SIZE(args[2]);
    unsigned long long off = (unsigned long long)n[2];
    for (int i = 15; i >= 0; i--, off >>= 4) w[i] = (unsigned char)"0123456789ABCDEF"[off & 15];
    w += 16;
    PUT(SEND_OK_4);
    w += decimal((char *)w, n[3]);
    PUT(SEND_OK_5);
    w += decimal((char *)w, n[4]);
    PUT(SEND_OK_6);
#undef PUT
    put_lengths(buf, w - buf - 8, 0);
    return PyBytes_FromStringAndSize((const char *)buf, w - buf);
}

/* The frame head in buf[0, w): its two lengths put in front of the header at buf + 8, as bytes
 * (None when the lengths do not fit: the twin says why); buf freed unless it is local. */
static PyObject *finish_head(unsigned char *buf, unsigned char *w, unsigned char *local, Py_ssize_t body_len) {
    Py_ssize_t hlen = w - buf - 8;
    PyObject *out;
    if (lengths_fit(hlen, body_len)) {
        put_lengths(buf, hlen, body_len);
        out = PyBytes_FromStringAndSize((const char *)buf, 8 + hlen);
    } else {
        out = Py_None;
        Py_INCREF(out);
    }
    if (buf != local) PyMem_Free(buf);
    return out;
}

static PyObject *frame_head(PyObject *self, PyObject *args) {
    PyObject *cmd;
    Py_ssize_t body_len;
    if (!PyArg_ParseTuple(args, "On:frame_head", &cmd, &body_len)) return NULL;
    if (body_len < 0 || !layout_of(Py_TYPE(cmd))) Py_RETURN_NONE;
#define SLOT(f) (*(PyObject **)((char *)cmd + offsets[f]))
    PyObject *stype = SLOT(F_STYPE), *raw = SLOT(F_RAW_HEADER), *lang = SLOT(F_LANGUAGE), *remark = SLOT(F_REMARK),
             *ext = SLOT(F_EXT);
    PyObject *ints[4] = {SLOT(F_CODE), SLOT(F_VERSION), SLOT(F_OPAQUE), SLOT(F_FLAG)};
#undef SLOT
    if (!stype || !PyLong_CheckExact(stype) || PyLong_AsLong(stype) != SERIALIZE_JSON || !raw) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (raw != Py_None) { /* a header formatted beforehand (the broker's SEND OK): the lengths, then it */
        if (!PyBytes_CheckExact(raw)) Py_RETURN_NONE;
        Py_ssize_t hn = PyBytes_GET_SIZE(raw);
        if (!lengths_fit(hn, body_len)) Py_RETURN_NONE;
        PyObject *out = PyBytes_FromStringAndSize(NULL, 8 + hn);
        if (!out) return NULL;
        unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
        put_lengths(w, hn, body_len);
        memcpy(w + 8, PyBytes_AS_STRING(raw), (size_t)hn);
        return out;
    }
    long long nums[4];
    char digits[4][24];
    int dlen[4];
    for (int i = 0; i < 4; i++) {
        int overflow = 0;
        if (!ints[i] || !PyLong_Check(ints[i]) || PyBool_Check(ints[i])) Py_RETURN_NONE; /* (an IntEnum is its value) */
        nums[i] = PyLong_AsLongLongAndOverflow(ints[i], &overflow);
        if (overflow) Py_RETURN_NONE;
        dlen[i] = decimal(digits[i], nums[i]);
    }
    if (!lang || !PyUnicode_CheckExact(lang) || !remark || (remark != Py_None && !PyUnicode_CheckExact(remark)) ||
        !ext || (ext != Py_None && !PyDict_CheckExact(ext)))
        Py_RETURN_NONE;
    /* every text as UTF-8 (a lone surrogate is not: the twin raises for it) */
    const char *lang_s, *remark_s = NULL;
    Py_ssize_t lang_n, remark_n = 0;
    if (!(lang_s = PyUnicode_AsUTF8AndSize(lang, &lang_n))) goto not_taken;
    if (remark != Py_None && !(remark_s = PyUnicode_AsUTF8AndSize(remark, &remark_n))) goto not_taken;
    Py_ssize_t n_ext = ext == Py_None ? 0 : PyDict_GET_SIZE(ext);
    if (n_ext > MAX_EXT_ON_STACK) Py_RETURN_NONE; /* a header this big is not a hot path's */
    const char *kv[2 * MAX_EXT_ON_STACK];  /* each name and value's UTF-8 ... */
    Py_ssize_t kvn[2 * MAX_EXT_ON_STACK]; /* ... and its length */
    static const char K_CODE[] = "{\"code\":", K_LANG[] = ",\"language\":", K_VERSION[] = ",\"version\":",
                      K_OPAQUE[] = ",\"opaque\":", K_FLAG[] = ",\"flag\":",
                      K_STYPE[] = ",\"serializeTypeCurrentRPC\":\"JSON\"", K_REMARK[] = ",\"remark\":",
                      K_EXT[] = ",\"extFields\":{";
    /* the most the header can take: every text fully escaped */
    Py_ssize_t most = 256 + 6 * lang_n + 6 * remark_n;
    if (ext != Py_None) {
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *v;
        while (PyDict_Next(ext, &pos, &k, &v)) {
            if (!PyUnicode_CheckExact(k) || !PyUnicode_CheckExact(v)) Py_RETURN_NONE;
            if (!(kv[2 * i] = PyUnicode_AsUTF8AndSize(k, &kvn[2 * i]))) goto not_taken;
            if (!(kv[2 * i + 1] = PyUnicode_AsUTF8AndSize(v, &kvn[2 * i + 1]))) goto not_taken;
            most += 8 + 6 * (kvn[2 * i] + kvn[2 * i + 1]);
            i++;
        }
    }
    unsigned char local[4096], *buf = local;
    if (most > (Py_ssize_t)sizeof local) {
        if (most > 6 * 0xFFFFFF) Py_RETURN_NONE; /* the twin says why */
        buf = PyMem_Malloc((size_t)most);
        if (!buf) return PyErr_NoMemory();
    }
    unsigned char *w = buf + 8;
#define PUT(lit) (memcpy(w, lit, sizeof lit - 1), w += sizeof lit - 1)
    PUT(K_CODE); memcpy(w, digits[0], dlen[0]); w += dlen[0];
    PUT(K_LANG); w = put_escaped(w, (const unsigned char *)lang_s, lang_n);
    PUT(K_VERSION); memcpy(w, digits[1], dlen[1]); w += dlen[1];
    PUT(K_OPAQUE); memcpy(w, digits[2], dlen[2]); w += dlen[2];
    PUT(K_FLAG); memcpy(w, digits[3], dlen[3]); w += dlen[3];
    PUT(K_STYPE);
    if (remark_s) {
        PUT(K_REMARK);
        w = put_escaped(w, (const unsigned char *)remark_s, remark_n);
    }
    if (ext != Py_None) {
        PUT(K_EXT);
        for (Py_ssize_t i = 0; i < n_ext; i++) {
            if (i) *w++ = ',';
            w = put_escaped(w, (const unsigned char *)kv[2 * i], kvn[2 * i]);
            *w++ = ':';
            w = put_escaped(w, (const unsigned char *)kv[2 * i + 1], kvn[2 * i + 1]);
        }
        *w++ = '}';
    }
    *w++ = '}';
#undef PUT
    return finish_head(buf, w, local, body_len);
not_taken:
    PyErr_Clear();
    Py_RETURN_NONE;
}

/* fill_head(pieces, values, body_len): a frame's lengths and a JSON header laid out by a
 * template — pieces[0] values[0] pieces[1] ... values[n-1] pieces[n] — each value an int (in
 * decimal) or a str (JSON-escaped as orjson escapes, without quotes: the piece around it holds
 * them), each piece bytes taken as they are. None for anything else (the twin raises for it). */
#define MAX_FILL_VALUES 16
static PyObject *fill_head(PyObject *self, PyObject *args) {
    PyObject *pieces, *values;
    Py_ssize_t body_len;
    if (!PyArg_ParseTuple(args, "O!O!n:fill_head", &PyTuple_Type, &pieces, &PyTuple_Type, &values, &body_len))
        return NULL;
    Py_ssize_t nv = PyTuple_GET_SIZE(values);
    if (body_len < 0 || nv > MAX_FILL_VALUES || PyTuple_GET_SIZE(pieces) != nv + 1) Py_RETURN_NONE;
    const char *text[MAX_FILL_VALUES];
    Py_ssize_t text_n[MAX_FILL_VALUES];
    char digits[MAX_FILL_VALUES][24];
    Py_ssize_t most = 0;
    for (Py_ssize_t i = 0; i <= nv; i++) {
        PyObject *p = PyTuple_GET_ITEM(pieces, i);
        if (!PyBytes_CheckExact(p)) Py_RETURN_NONE;
        most += PyBytes_GET_SIZE(p);
    }
    for (Py_ssize_t i = 0; i < nv; i++) {
        PyObject *v = PyTuple_GET_ITEM(values, i);
        if (PyUnicode_CheckExact(v)) {
            if (!(text[i] = PyUnicode_AsUTF8AndSize(v, &text_n[i]))) goto not_taken;
            most += 6 * text_n[i];
        } else if (PyLong_CheckExact(v)) {
            int overflow = 0;
            long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow || (n == -1 && PyErr_Occurred())) goto not_taken;
            text[i] = NULL;
            text_n[i] = decimal(digits[i], n);
            most += text_n[i];
        } else {
            Py_RETURN_NONE;
        }
    }
    if (most > 6 * 0xFFFFFF) Py_RETURN_NONE; /* the twin says why */
    unsigned char local[4096], *buf = local;
    if (8 + most > (Py_ssize_t)sizeof local) {
        buf = PyMem_Malloc((size_t)(8 + most));
        if (!buf) return PyErr_NoMemory();
    }
    unsigned char *w = buf + 8;
    for (Py_ssize_t i = 0; i <= nv; i++) {
        PyObject *p = PyTuple_GET_ITEM(pieces, i);
        memcpy(w, PyBytes_AS_STRING(p), (size_t)PyBytes_GET_SIZE(p));
        w += PyBytes_GET_SIZE(p);
        if (i == nv) break;
        if (text[i]) {
            w = put_escaped_bare(w, (const unsigned char *)text[i], text_n[i]);
        } else {
            memcpy(w, digits[i], (size_t)text_n[i]);
            w += text_n[i];
        }
    }
    return finish_head(buf, w, local, body_len);
not_taken:
    PyErr_Clear();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_frame", decode_frame, METH_VARARGS,
     "decode_frame(frame, cls, view_from): the command of a frame with a common JSON header, else None."},
    {"frame_head", frame_head, METH_VARARGS,
     "frame_head(cmd, body_len): a frame's lengths and JSON header as command.py encodes them, else None."},
    {"send_ok_frame", (PyCFunction)(void (*)(void))send_ok_frame, METH_FASTCALL,
     "send_ok_frame(version, opaque, host_hex, wrote_offset, queue_id, queue_offset): a send's SUCCESS frame."},
    {"send_fields", (PyCFunction)(void (*)(void))send_fields, METH_FASTCALL,
     "send_fields(frame, view_from): SEND_MESSAGE_V2's fields for the broker's plain send, else None."},
    {"fill_head", fill_head, METH_VARARGS,
     "fill_head(pieces, values, body_len): a frame's lengths and a header from a template, else None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_codec", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__codec(void) {
    for (int c = 0; c < 0x20; c++) NEEDS_ESCAPE[c] = STRING_STOP[c] = 1;
    STRING_STOP['"'] = STRING_STOP['\\'] = 1;
    NEEDS_ESCAPE['"'] = NEEDS_ESCAPE['\\'] = 1;
    for (int f = 0; f < N_FIELDS; f++) {
        if (!(field_interned[f] = PyUnicode_InternFromString(field_names[f]))) return NULL;
    }
    return PyModule_Create(&module);
}
