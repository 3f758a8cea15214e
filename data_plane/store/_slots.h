/* Attribute access through __slots__ offsets, shared by the compiled modules. It reads CPython
 * 3.11's internals (_PyType_Lookup, tp_version_tag, member descriptors), the version the modules
 * are tested on: any other CPython fails to build them, loudly, and the pure-Python twins serve
 * (setup.py builds them as optional extensions). */
#ifndef ORBIT_SLOTS_H
#define ORBIT_SLOTS_H
#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030C0000
#error "built and tested against CPython 3.11 internals only: the pure-Python twin serves here"
#endif
#include <structmember.h>

/* ---- attribute access through __slots__ offsets ------------------------------------------
 * Messages, MappedFiles and ConsumeQueues keep their fields in __slots__. Each call site keeps,
 * for the last exact type it saw (and that type's version tag, which changes when the class
 * does), either the slot's offset — then it reads or writes the slot directly, what the member
 * descriptor would do without the lookup — or -1: not a slot, go through PyObject_GetAttr /
 * PyObject_SetAttr without asking again. */
typedef struct {
    PyTypeObject *tp; /* strong reference */
    unsigned int ver;
    Py_ssize_t off; /* -1: not a writable object slot */
} slot_t;

static inline int slot_known(PyObject *o, PyObject *name, slot_t *c) {
    PyTypeObject *tp = Py_TYPE(o);
    if (tp == c->tp && tp->tp_version_tag == c->ver && c->ver != 0) return 1;
    PyObject *d = _PyType_Lookup(tp, name); /* borrowed; assigns the version tag */
    Py_ssize_t off = -1;
    if (d && Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READONLY)) off = m->offset;
    }
    Py_INCREF(tp);
    Py_XSETREF(c->tp, tp);
    c->ver = tp->tp_version_tag;
    c->off = off;
    return c->ver != 0;
}

static inline PyObject *sget(PyObject *o, PyObject *name, slot_t *c) {
    if (slot_known(o, name, c) && c->off >= 0) {
        PyObject *v = *(PyObject **)((char *)o + c->off);
        if (v) {
            Py_INCREF(v);
            return v;
        }
    }
    return PyObject_GetAttr(o, name); /* not a slot, or unset: AttributeError as usual */
}

static inline int sset(PyObject *o, PyObject *name, slot_t *c, PyObject *v) {
    if (slot_known(o, name, c) && c->off >= 0) {
        PyObject **addr = (PyObject **)((char *)o + c->off), *old = *addr;
        Py_INCREF(v);
        *addr = v;
        Py_XDECREF(old);
        return 0;
    }
    return PyObject_SetAttr(o, name, v);
}

#define SGET(o, name) ({ static slot_t _c; sget((o), (name), &_c); })
#define SSET(o, name, v) ({ static slot_t _c; sset((o), (name), &_c, (v)); })

static inline int get_ll_v(PyObject *v, long long *out) {
    if (!v) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (*out == -1 && PyErr_Occurred()) return -1;
    return 0;
}
#define GET_LL(o, name, out) get_ll_v(SGET((o), (name)), (out))

/* ``cls`` as the type objects are made of, or NULL with TypeError. */
static inline PyTypeObject *as_type(PyObject *cls, const char *fn) {
    if (PyType_Check(cls)) return (PyTypeObject *)cls;
    PyErr_Format(PyExc_TypeError, "%s: cls must be a type", fn);
    return NULL;
}

#endif
