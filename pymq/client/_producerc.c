/*
 * pymq.client._producerc: the producer's send frames and batch bodies.
 *
 * An optional accelerator, picked once at import by pymq.common.native.load_native when it was
 * built (setup.py) and PYMQ_PURE_PYTHON is not set; else a function's Python twin (same
 * signature; tests/unit/test_twins.py) or, without one, the Python module's general path.
 */
#include "../common/_native.h"

/* --- batch_body (the client's SEND_BATCH_MESSAGE body) ------------------------------------- */

/* One message of a batch, as batch_body reads it: references held until the body is written. */
typedef struct {
    PyObject *body, *tags; /* bytes; str or NULL (no tags) */
    const char *tags_utf8;
    Py_ssize_t tags_len, props_len;
    int32_t flag;
} batch_item;

static PyObject *batch_names[7]; /* body, tags, keys, properties, flag, delay_level, topic */

static int intern_batch_names(void) {
    static const char *const names[7] = {"body", "tags", "keys", "properties", "flag",
                                         "delay_level", "topic"};
    for (int i = 0; i < 7; i++) {
        if (batch_names[i] != NULL) continue;
        batch_names[i] = PyUnicode_InternFromString(names[i]);
        if (batch_names[i] == NULL) return -1;
    }
    return 0;
}

/* Read msg (exactly of type cls) into item if it is a plain message: bytes body, no properties
 * (an empty dict), no keys (None or ""), delay_level 0, tags None or a str, an int32 flag, and
 * topic (unless NULL) as its topic.
 * 1: read (item holds references); 0: not plain (nothing held); -1: an error. Only exact
 * built-in types are accepted, so no Python code runs while the batch is read. */
static int batch_read_item(PyObject *cls, PyObject *msg, PyObject *topic, batch_item *item) {
    if ((PyObject *)Py_TYPE(msg) != cls) return 0;
    if (topic != NULL) { /* the batch's topic, which every message must name */
        PyObject *t = PyObject_GetAttr(msg, batch_names[6]);
        if (t == NULL) return -1;
        int same = t == topic || (PyUnicode_CheckExact(t) && PyUnicode_Compare(t, topic) == 0);
        Py_DECREF(t);
        if (!same) return 0;
    }
    PyObject *v[6];
    for (int i = 0; i < 6; i++) {
        v[i] = PyObject_GetAttr(msg, batch_names[i]);
        if (v[i] == NULL) {
            for (int j = 0; j < i; j++) Py_DECREF(v[j]);
            return -1;
        }
    }
    PyObject *body = v[0], *tags = v[1], *keys = v[2], *props = v[3], *flag = v[4], *delay = v[5];
    int plain = PyBytes_CheckExact(body) && (tags == Py_None || PyUnicode_CheckExact(tags)) &&
                (keys == Py_None || (PyUnicode_CheckExact(keys) && PyUnicode_GET_LENGTH(keys) == 0)) &&
                PyDict_CheckExact(props) && PyDict_GET_SIZE(props) == 0 && PyLong_CheckExact(flag) &&
                PyLong_CheckExact(delay);
    long long f = 0, d = 0;
    if (plain) {
        f = PyLong_AsLongLong(flag);
        d = PyLong_AsLongLong(delay);
        if (PyErr_Occurred()) { /* past a long long: left to the Python writer */
            PyErr_Clear();
            plain = 0;
        }
        plain = plain && f >= I32_MIN && f <= I32_MAX && d == 0 &&
                PyBytes_GET_SIZE(body) <= I32_MAX;
    }
    item->tags_utf8 = NULL;
    item->tags_len = 0;
    if (plain && tags != Py_None && PyUnicode_GET_LENGTH(tags) > 0) {
        item->tags_utf8 = PyUnicode_AsUTF8AndSize(tags, &item->tags_len);
        if (item->tags_utf8 == NULL) { /* a lone surrogate: the Python writer raises */
            PyErr_Clear();
            plain = 0;
        }
    }
    Py_DECREF(keys);
    Py_DECREF(props);
    Py_DECREF(flag);
    Py_DECREF(delay);
    if (!plain) {
        Py_DECREF(body);
        Py_DECREF(tags);
        return 0;
    }
    item->body = body;
    item->tags = tags;
    item->flag = (int32_t)f;
    return 1;
}

/* batch_body(cls, msgs, ids[, topic]): the SEND_BATCH_MESSAGE body of msgs (a list or tuple of
 * cls, the client's Message, each of topic when given), each with its unique id from ids (ASCII
 * strs) and WAIT=true, as the
 * producer's Python writer makes it: per message TOTALSIZE, MAGICCODE 0, BODYCRC 0, FLAG,
 * BODYLEN, the body, PROPERTIESLENGTH (int16) and the properties text
 * [TAGS\1tags\2]UNIQ_KEY\1id\2WAIT\1true.  None when a message is not plain (properties, keys,
 * a delay, or anything not of the expected built-in types) or its text would not fit: the
 * Python writer then does the whole batch. */
static PyObject *py_batch_body(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 && nargs != 4)
        return PyErr_Format(PyExc_TypeError, "batch_body takes 3 or 4 arguments");
    PyObject *cls = args[0], *msgs = args[1], *ids = args[2];
    PyObject *topic = nargs == 4 ? args[3] : NULL;
    if (!PyType_Check(cls)) return PyErr_Format(PyExc_TypeError, "cls must be a type");
    if (topic != NULL && !PyUnicode_CheckExact(topic))
        return PyErr_Format(PyExc_TypeError, "topic must be a str");
    if (!PyList_CheckExact(msgs) && !PyTuple_CheckExact(msgs)) Py_RETURN_NONE;
    if (!PyList_CheckExact(ids)) return PyErr_Format(PyExc_TypeError, "ids must be a list");
    if (intern_batch_names() < 0) return NULL;
    /* A reference to each sequence: nothing below runs Python code, but keep them whole. */
    Py_INCREF(msgs);
    Py_INCREF(ids);
    PyObject *result = NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(msgs), read = 0;
    batch_item *items = NULL;
    if (PyList_GET_SIZE(ids) != count) {
        PyErr_Format(PyExc_ValueError, "%zd messages but %zd ids", count,
                     PyList_GET_SIZE(ids));
        goto done;
    }
    items = PyMem_Malloc(sizeof(batch_item) * (count ? count : 1));
    if (items == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    static const char tags_head[] = "TAGS\x01", uniq_head[] = "UNIQ_KEY\x01",
                      wait_tail[] = "\x02WAIT\x01true";
    const Py_ssize_t tags_fixed = sizeof(tags_head) - 1 + 1, /* TAGS\1 ... \2 */
        uniq_fixed = sizeof(uniq_head) - 1 + sizeof(wait_tail) - 1;
    Py_ssize_t total = 0;
    for (; read < count; read++) {
        PyObject *id = PyList_GET_ITEM(ids, read);
        if (!PyUnicode_CheckExact(id) || !PyUnicode_IS_ASCII(id)) break;
        int got = batch_read_item(cls, PySequence_Fast_GET_ITEM(msgs, read), topic, &items[read]);
        if (got < 0) goto done;
        if (got == 0) break;
        batch_item *it = &items[read];
        Py_ssize_t props = uniq_fixed + PyUnicode_GET_LENGTH(id) +
                           (it->tags_len ? tags_fixed + it->tags_len : 0);
        Py_ssize_t size = 20 + PyBytes_GET_SIZE(it->body) + 2 + props;
        it->props_len = props;
        if (props > 32767 || size > I32_MAX) { /* the Python writer's struct raises */
            read++;
            goto none;
        }
        total += size;
    }
    if (read < count) goto none;
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < count; i++) {
        batch_item *it = &items[i];
        PyObject *id = PyList_GET_ITEM(ids, i);
        Py_ssize_t blen = PyBytes_GET_SIZE(it->body), idlen = PyUnicode_GET_LENGTH(id);
        put32(w, (uint32_t)(20 + blen + 2 + it->props_len));
        put32(w + 4, 0); /* MAGICCODE (BATCH_ITEM_MAGIC) */
        put32(w + 8, 0); /* BODYCRC */
        put32(w + 12, (uint32_t)it->flag);
        put32(w + 16, (uint32_t)blen);
        w += 20;
        memcpy(w, PyBytes_AS_STRING(it->body), blen);
        w += blen;
        w[0] = (unsigned char)(it->props_len >> 8);
        w[1] = (unsigned char)it->props_len;
        w += 2;
        if (it->tags_len) {
            memcpy(w, tags_head, sizeof(tags_head) - 1);
            w += sizeof(tags_head) - 1;
            memcpy(w, it->tags_utf8, it->tags_len);
            w += it->tags_len;
            *w++ = '\x02';
        }
        memcpy(w, uniq_head, sizeof(uniq_head) - 1);
        w += sizeof(uniq_head) - 1;
        memcpy(w, PyUnicode_1BYTE_DATA(id), idlen);
        w += idlen;
        memcpy(w, wait_tail, sizeof(wait_tail) - 1);
        w += sizeof(wait_tail) - 1;
    }
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    if (items != NULL) {
        for (Py_ssize_t i = 0; i < read && i < count; i++) {
            Py_DECREF(items[i].body);
            Py_XDECREF(items[i].tags);
        }
        PyMem_Free(items);
    }
    Py_DECREF(msgs);
    Py_DECREF(ids);
    return result;
}

/* --- send_frame (the client's SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE frame) ------------------- */

/* ASCII text s as a JSON string, as json.encoder.encode_basestring_ascii writes it (", \, the
 * short escapes, other controls and DEL as \u00xx in lower case): the length written at w (room for
 * 6 * n + 2). */
static Py_ssize_t json_quote_ascii(unsigned char *w, const Py_UCS1 *s, Py_ssize_t n) {
    static const char hex[] = "0123456789abcdef";
    unsigned char *start = w;
    *w++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
            *w++ = c;
            continue;
        }
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
            *w++ = 'u';
            *w++ = '0';
            *w++ = '0';
            *w++ = (unsigned char)hex[c >> 4];
            *w++ = (unsigned char)hex[c & 15];
        }
    }
    *w++ = '"';
    return w - start;
}

/* send_frame(head, opaque, fixed, queue_id, sys_flag, born, flag, props, tail, body): the whole
 * frame of a producer's send as Producer._v2_frame writes it: TOTAL and HEADER lengths, then the
 * JSON header head + opaque + fixed + "e":"queue_id","f":"sys_flag","g":"born","h":"flag",
 * "i":<props quoted> , tail, then body.  head, fixed and tail are bytes; the five numbers ints
 * (as Python's str() writes them).  None when body is not exactly bytes, props not an ASCII str
 * or a number does not fit a long long: _v2_frame then writes it in Python. */
static PyObject *py_send_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) return PyErr_Format(PyExc_TypeError, "send_frame takes 10 arguments");
    PyObject *head = args[0], *fixed = args[2], *props = args[7], *tail = args[8],
             *body = args[9];
    if (!PyBytes_CheckExact(head) || !PyBytes_CheckExact(fixed) || !PyBytes_CheckExact(tail))
        return PyErr_Format(PyExc_TypeError, "head, fixed and tail must be bytes");
    /* Another bytes-like body (a bytearray, a memoryview), or a str subclass: Python's. */
    if (!PyBytes_CheckExact(body) || !PyUnicode_CheckExact(props) || !PyUnicode_IS_ASCII(props))
        Py_RETURN_NONE;
    long long nums[5]; /* opaque, queue_id, sys_flag, born, flag */
    const int at[5] = {1, 3, 4, 5, 6};
    for (int i = 0; i < 5; i++) {
        PyObject *v = args[at[i]];
        if (!PyLong_CheckExact(v)) Py_RETURN_NONE;
        int overflow = 0;
        nums[i] = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow) Py_RETURN_NONE;
        if (nums[i] == -1 && PyErr_Occurred()) return NULL;
    }
    static const char *const keys[4] = {"\"e\":\"", "\",\"f\":\"", "\",\"g\":\"", "\",\"h\":\""};
    Py_ssize_t plen = PyUnicode_GET_LENGTH(props);
    if (plen > (PY_SSIZE_T_MAX - 4096) / 6 - PyBytes_GET_SIZE(head) - PyBytes_GET_SIZE(fixed) -
                   PyBytes_GET_SIZE(tail))
        return PyErr_NoMemory();
    Py_ssize_t cap = PyBytes_GET_SIZE(head) + PyBytes_GET_SIZE(fixed) + PyBytes_GET_SIZE(tail) +
                     5 * 21 + 40 + 6 * plen + 2;
    unsigned char stack[2048];
    unsigned char *hdr = cap <= (Py_ssize_t)sizeof stack ? stack : PyMem_Malloc(cap);
    if (hdr == NULL) return PyErr_NoMemory();
    unsigned char *w = hdr;
    memcpy(w, PyBytes_AS_STRING(head), PyBytes_GET_SIZE(head));
    w += PyBytes_GET_SIZE(head);
    w += fmt_ll((char *)w, nums[0]);
    memcpy(w, PyBytes_AS_STRING(fixed), PyBytes_GET_SIZE(fixed));
    w += PyBytes_GET_SIZE(fixed);
    for (int i = 0; i < 4; i++) {
        w += put_lit((char *)w, keys[i]);
        w += fmt_ll((char *)w, nums[i + 1]);
    }
    w += put_lit((char *)w, "\",\"i\":");
    w += json_quote_ascii(w, PyUnicode_1BYTE_DATA(props), plen);
    *w++ = ',';
    memcpy(w, PyBytes_AS_STRING(tail), PyBytes_GET_SIZE(tail));
    w += PyBytes_GET_SIZE(tail);
    Py_ssize_t hlen = w - hdr, blen = PyBytes_GET_SIZE(body);
    PyObject *out = NULL;
    if (hlen > I32_MAX - 4 || blen > I32_MAX - 4 - hlen) {
        PyErr_SetString(PyExc_OverflowError, "the frame is too long");
    } else if ((out = PyBytes_FromStringAndSize(NULL, 8 + hlen + blen)) != NULL) {
        unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
        put32(o, (uint32_t)(4 + hlen + blen));
        put32(o + 4, (uint32_t)hlen);
        memcpy(o + 8, hdr, hlen);
        memcpy(o + 8 + hlen, PyBytes_AS_STRING(body), blen);
    }
    if (hdr != stack) PyMem_Free(hdr);
    return out;
}


static PyMethodDef methods[] = {
    {"send_frame", (PyCFunction)(void (*)(void))py_send_frame, METH_FASTCALL,
     "send_frame(head, opaque, fixed, queue_id, sys_flag, born, flag, props, tail, body): a"
     " producer's send frame as Producer._v2_frame writes it; None when props is not ASCII."},
    {"batch_body", (PyCFunction)(void (*)(void))py_batch_body, METH_FASTCALL,
     "batch_body(cls, msgs, ids[, topic]): the client's SEND_BATCH_MESSAGE body of plain"
     " messages of type cls (and topic) with their ids; None when one is not plain."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pymq.client._producerc", "pymq.client._producerc: the producer's send frames and batch bodies.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__producerc(void) {
    if (pymq_native_init() < 0) return NULL;
    return PyModule_Create(&module);
}
