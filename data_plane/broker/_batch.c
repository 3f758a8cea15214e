/*
 * Compiled twin of the broker's batch send decoding (data_plane/broker/batch_decode.py:
 * PythonBatchDecoder): a SEND_BATCH_MESSAGE body split into store Messages in one call. Tests
 * compare it with its pure-Python twin.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../store/_slots.h"
#include "../store/_bytes.h"
#include "../store/_properties.h"
#include "../store/_layouts.h" /* the batch item's layout: generated from store/layouts.py */

static PyObject *s_body, *s_properties, *s_flag, *s_sys_flag, *s_born_host, *s_queue_id;
/* ---- the broker's batch send: SEND_BATCH_MESSAGE bodies -> store Messages ----------------- */
/* Batch body item (big-endian): total 4 | magic 4 | body CRC 4 | flag 4 | body length 4 | body |
 * properties length 2 | properties. batch_messages(body, cls, topic, queue_id, sys_flag, born_ts,
 * born_host, reconsume, max_messages) -> [cls(...)] with every field set, or None when the body
 * is anything but well formed (the Python decoder then says what is wrong). */
static PyObject *s_msg_topic, *s_msg_born_ts, *s_msg_reconsume, *s_msg_prepared;

static PyObject *batch_messages(PyObject *self, PyObject *args) {
    Py_buffer b;
    PyObject *cls, *topic, *queue_id, *sys_flag, *born_ts, *born_host, *reconsume;
    Py_ssize_t max_messages;
    if (!PyArg_ParseTuple(args, "y*OOOOOOOn:batch_messages", &b, &cls, &topic, &queue_id, &sys_flag, &born_ts,
                          &born_host, &reconsume, &max_messages))
        return NULL;
    PyObject *out = PyList_New(0), *result = NULL, *zero = PyLong_FromLong(0);
    PyTypeObject *tp = out && zero ? as_type(cls, "batch_messages") : NULL;
    if (!tp) goto done;
    const unsigned char *base = b.buf;
    Py_ssize_t n = b.len, pos = 0;
    while (pos < n) {
        if (n - pos < BATCH_ITEM_SIZE + 2) goto malformed;
        const unsigned char *r = base + pos;
        int32_t total = (int32_t)get32(r), flag = (int32_t)get32(r + BATCH_ITEM_FLAG_AT),
                body_len = (int32_t)get32(r + BATCH_ITEM_BODY_LENGTH_AT);
        if (total < BATCH_ITEM_SIZE + 2 || (Py_ssize_t)total > n - pos || body_len < 0 || BATCH_ITEM_SIZE + (long long)body_len + 2 > total)
            goto malformed;
        Py_ssize_t plen = ((Py_ssize_t)r[BATCH_ITEM_SIZE + body_len] << 8) | r[BATCH_ITEM_SIZE + 1 + body_len];
        if (BATCH_ITEM_SIZE + (Py_ssize_t)body_len + 2 + plen != total) goto malformed;
        if (PyList_GET_SIZE(out) >= max_messages) goto malformed;
        PyObject *props = properties_dict(r + BATCH_ITEM_SIZE + body_len + 2, plen);
        if (!props) {
            PyErr_Clear();
            goto malformed;
        }
        PyObject *body = PyBytes_FromStringAndSize((const char *)r + BATCH_ITEM_SIZE, body_len);
        PyObject *fl = PyLong_FromLong(flag);
        PyObject *m = body && fl ? tp->tp_alloc(tp, 0) : NULL;
        int bad = !m || SSET(m, s_msg_topic, topic) < 0 || SSET(m, s_body, body) < 0 ||
                  SSET(m, s_queue_id, queue_id) < 0 || SSET(m, s_flag, fl) < 0 || SSET(m, s_properties, props) < 0 ||
                  SSET(m, s_sys_flag, sys_flag) < 0 || SSET(m, s_msg_born_ts, born_ts) < 0 ||
                  SSET(m, s_born_host, born_host) < 0 || SSET(m, s_msg_reconsume, reconsume) < 0 ||
                  SSET(m, s_msg_prepared, zero) < 0 || PyList_Append(out, m) < 0;
        Py_XDECREF(m);
        Py_XDECREF(body);
        Py_XDECREF(fl);
        Py_DECREF(props);
        if (bad) goto done;
        pos += total;
    }
    if (PyList_GET_SIZE(out) == 0) goto malformed;
    result = out;
    out = NULL;
    goto done;
malformed:
    Py_INCREF(Py_None);
    result = Py_None;
done:
    Py_XDECREF(out);
    Py_XDECREF(zero);
    PyBuffer_Release(&b);
    return result;
}

static PyMethodDef methods[] = {
    {"batch_messages", batch_messages, METH_VARARGS, "Split a SEND_BATCH_MESSAGE body into store Messages."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_batch", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__batch(void) {
    if (properties_init() < 0) return NULL;
#define INTERN(var, s) if (!(var = PyUnicode_InternFromString(s))) return NULL
    INTERN(s_body, "body"); INTERN(s_properties, "properties"); INTERN(s_flag, "flag");
    INTERN(s_sys_flag, "sys_flag"); INTERN(s_born_host, "born_host"); INTERN(s_queue_id, "queue_id");
    INTERN(s_msg_topic, "topic"); INTERN(s_msg_born_ts, "born_timestamp"); INTERN(s_msg_reconsume, "reconsume_times");
    INTERN(s_msg_prepared, "prepared_transaction_offset");
    return PyModule_Create(&module);
}
