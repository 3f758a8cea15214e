/* Record properties ("name\x01value\x02"...) as Python dicts, shared by the consumer's decoder
 * (_records.c) and the broker's batch send (broker/_batch.c). Each module that includes this
 * calls properties_init() once. */
#ifndef ORBIT_PROPERTIES_H
#define ORBIT_PROPERTIES_H
#include <stdint.h>
#include <string.h>

/* Property names and values that nearly every message carries, made once: a pull of 32
 * messages would otherwise make each of them 32 times (and free them again). */
static const char *common_texts[] = {"TAGS", "KEYS", "WAIT", "UNIQ_KEY", "true", "false", "DELAY", "RETRY_TOPIC",
                                     "REAL_TOPIC", "REAL_QID", "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET",
                                     "RECONSUME_TIME", "MAX_RECONSUME_TIMES", "ORIGIN_MESSAGE_ID", "traceparent"};
#define N_COMMON (sizeof(common_texts) / sizeof(common_texts[0]))
static PyObject *common_strs[N_COMMON];
static Py_ssize_t common_lens[N_COMMON];

static inline PyObject *text(const unsigned char *p, Py_ssize_t n) {
    if (n <= 19) {
        for (size_t c = 0; c < N_COMMON; c++) {
            if (common_lens[c] == n && memcmp(common_texts[c], p, n) == 0) {
                Py_INCREF(common_strs[c]);
                return common_strs[c];
            }
        }
    }
    return PyUnicode_DecodeUTF8((const char *)p, n, NULL);
}

/* "name\x01value\x02..." -> dict; what decode_properties does (items without a \x01 are
 * dropped, an empty item is skipped), every byte checked to be UTF-8. */
static inline PyObject *properties_dict(const unsigned char *p, Py_ssize_t n) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    Py_ssize_t i = 0;
    while (i < n) {
        const unsigned char *e = memchr(p + i, 2, n - i);
        Py_ssize_t j = e ? e - p : n;
        if (j > i) {
            const unsigned char *sep = memchr(p + i, 1, j - i);
            Py_ssize_t kl = sep ? sep - (p + i) : j - i;
            /* An item without a value is dropped, but its bytes must still be UTF-8. */
            PyObject *k = sep ? text(p + i, kl) : PyUnicode_DecodeUTF8((const char *)p + i, kl, NULL);
            PyObject *v = k && sep ? text(sep + 1, j - i - kl - 1) : NULL;
            int bad = !k || (sep && (!v || PyDict_SetItem(d, k, v) < 0));
            Py_XDECREF(k);
            Py_XDECREF(v);
            if (bad) {
                Py_DECREF(d);
                return NULL;
            }
        }
        i = j + 1;
    }
    return d;
}

/* Whether [p, p+n) is UTF-8 (the ASCII that nearly every property is, checked a word at a time). */
static inline int utf8_ok(const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (w & 0x8080808080808080ull) break;
    }
    for (; i < n; i++) {
        if (p[i] & 0x80) break;
    }
    if (i == n) return 1;
    PyObject *u = PyUnicode_DecodeUTF8((const char *)p, n, NULL);
    if (!u) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(u);
    return 1;
}

static inline int properties_init(void) {
    for (size_t c = 0; c < N_COMMON; c++) {
        if (!(common_strs[c] = PyUnicode_InternFromString(common_texts[c]))) return -1;
        common_lens[c] = (Py_ssize_t)strlen(common_texts[c]);
    }
    return 0;
}
#endif
