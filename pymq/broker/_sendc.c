/*
 * pymq.broker._sendc: the send processor's answer frames.
 *
 * An optional accelerator, picked once at import by pymq.common.native.load_native when it was
 * built (setup.py) and PYMQ_PURE_PYTHON is not set; else a function's Python twin (same
 * signature; tests/unit/test_twins.py) or, without one, the Python module's general path.
 */
#include "../common/_native.h"

/* --- send_answer_frame --------------------------------------------------------------------- */


/* The most a send_answer_frame frame's fixed parts take (the head, middle and tail literals
 * with their numbers, and the 8 length bytes); its message id and region come on top. */
#define ANSWER_FIXED_MAX (8 + 160 + 120 + 64)

/* send_answer_frame's frame written at p (room for ANSWER_FIXED_MAX + id_len + region_len);
 * returns its length, or -1 when its header would not fit its 24-bit length. */
static Py_ssize_t answer_frame_into(unsigned char *p, long long opaque, const Py_UCS1 *id,
                                    Py_ssize_t id_len, long long queue_id, long long queue_offset,
                                    const char *region, Py_ssize_t region_len, int trace,
                                    long long version) {
    char head[160], mid[120];
    int head_len = put_lit(head, "{\"code\":0,\"language\":\"JAVA\",\"version\":");
    head_len += fmt_ll(head + head_len, version);
    head_len += put_lit(head + head_len, ",\"opaque\":");
    head_len += fmt_ll(head + head_len, opaque);
    head_len += put_lit(head + head_len, ",\"flag\":1,\"extFields\":{\"msgId\":\"");
    int mid_len = put_lit(mid, "\",\"queueId\":\"");
    mid_len += fmt_ll(mid + mid_len, queue_id);
    mid_len += put_lit(mid + mid_len, "\",\"queueOffset\":\"");
    mid_len += fmt_ll(mid + mid_len, queue_offset);
    mid_len += put_lit(mid + mid_len, "\",\"MSG_REGION\":");
    const char *tail = trace ? ",\"TRACE_ON\":\"true\"},\"serializeTypeCurrentRPC\":\"JSON\"}"
                             : ",\"TRACE_ON\":\"false\"},\"serializeTypeCurrentRPC\":\"JSON\"}";
    Py_ssize_t tail_len = (Py_ssize_t)strlen(tail);
    Py_ssize_t header = head_len + id_len + mid_len + region_len + tail_len;
    if (header > 0xFFFFFF) return -1;
    unsigned char *start = p;
    put32(p, (uint32_t)(4 + header));
    put32(p + 4, (uint32_t)header); /* serialize type JSON (0) in the top byte */
    p += 8;
    memcpy(p, head, head_len);
    p += head_len;
    memcpy(p, id, id_len);
    p += id_len;
    memcpy(p, mid, mid_len);
    p += mid_len;
    memcpy(p, region, region_len);
    p += region_len;
    memcpy(p, tail, tail_len);
    p += tail_len;
    return p - start;
}

/* send_answer_frame(opaque, msg_id, queue_id, queue_offset, quoted_region, trace_on, version):
 * the whole frame of a successful send's JSON answer, byte for byte what
 * codec.json_response_frame writes for SendProcessor._success_json's members (msgId, queueId,
 * queueOffset, MSG_REGION already JSON-quoted as UTF-8 bytes, TRACE_ON).  The message id must
 * be ASCII (hex ids, comma-separated for a batch): anything else raises ValueError. */
static PyObject *py_send_answer_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) return PyErr_Format(PyExc_TypeError, "send_answer_frame takes 7 arguments");
    long long opaque, queue_id, queue_offset, version;
    if (arg_int(args[0], "opaque", I32_MIN, I32_MAX, &opaque) < 0 ||
        arg_int(args[2], "queue_id", I32_MIN, I32_MAX, &queue_id) < 0 ||
        arg_int(args[3], "queue_offset", LLONG_MIN, LLONG_MAX, &queue_offset) < 0 ||
        arg_int(args[6], "version", I32_MIN, I32_MAX, &version) < 0)
        return NULL;
    PyObject *msg_id = args[1], *region = args[4];
    if (!PyUnicode_Check(msg_id) || !PyBytes_Check(region))
        return PyErr_Format(PyExc_TypeError, "send_answer_frame: msg_id str, region bytes");
    if (!PyUnicode_IS_ASCII(msg_id))
        return PyErr_Format(PyExc_ValueError, "send_answer_frame: the message id is not ASCII");
    int trace = PyObject_IsTrue(args[5]);
    if (trace < 0) return NULL;
    Py_ssize_t id_len = PyUnicode_GET_LENGTH(msg_id), region_len = PyBytes_GET_SIZE(region);
    if (id_len > 0xFFFFFF || region_len > 0xFFFFFF)
        return PyErr_Format(PyExc_ValueError, "send_answer_frame: too long");
    PyObject *out = PyBytes_FromStringAndSize(NULL, ANSWER_FIXED_MAX + id_len + region_len);
    if (out == NULL) return NULL;
    Py_ssize_t n = answer_frame_into((unsigned char *)PyBytes_AS_STRING(out), opaque,
                                     PyUnicode_1BYTE_DATA(msg_id), id_len, queue_id, queue_offset,
                                     PyBytes_AS_STRING(region), region_len, trace, version);
    if (n < 0) {
        Py_DECREF(out);
        return PyErr_Format(PyExc_ValueError, "send_answer_frame: too long");
    }
    if (_PyBytes_Resize(&out, n) < 0) return NULL;
    return out;
}

/* (topic, count, size) appended to totals; -1 with an exception set. */
static int append_total(PyObject *totals, PyObject *topic, long long count, long long size) {
    PyObject *row = tuple_of(3, Py_NewRef(topic), PyLong_FromLongLong(count),
                             PyLong_FromLongLong(size));
    if (row == NULL) return -1;
    int rc = PyList_Append(totals, row);
    Py_DECREF(row);
    return rc;
}

/* send_answer_run(parsed, hints, prefix, quoted_region, trace_on, version): the answers of a
 * run of single sends put together, joined: for each hint (DispatchHint: physical offset,
 * size, topic, queue id, queue offset, ...) and the fields send_fields read of its frame (at
 * the same index of ``parsed``, the opaque first), send_answer_frame's frame with the message
 * id offset_msg_id(prefix, physical offset) gives.  Returns (frames, totals): totals are
 * [topic, count, size] per run of hints of one topic, in order, as BrokerStats.on_put counts
 * them.  ``parsed`` may be longer than ``hints``. */
static PyObject *py_send_answer_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) return PyErr_Format(PyExc_TypeError, "send_answer_run takes 6 arguments");
    PyObject *parsed = args[0], *hints = args[1], *prefix = args[2], *region = args[3];
    if (!PyList_CheckExact(parsed) || !PyList_CheckExact(hints) || !PyUnicode_Check(prefix) ||
        !PyBytes_Check(region))
        return PyErr_Format(PyExc_TypeError,
                            "send_answer_run: parsed and hints lists, prefix str, region bytes");
    if (!PyUnicode_IS_ASCII(prefix) || PyUnicode_GET_LENGTH(prefix) > 64)
        return PyErr_Format(PyExc_ValueError, "send_answer_run: the prefix must be short ASCII");
    long long version;
    if (arg_int(args[5], "version", I32_MIN, I32_MAX, &version) < 0) return NULL;
    int trace = PyObject_IsTrue(args[4]);
    if (trace < 0) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(hints), region_len = PyBytes_GET_SIZE(region);
    if (PyList_GET_SIZE(parsed) < count)
        return PyErr_Format(PyExc_ValueError, "send_answer_run: fewer fields than hints");
    if (region_len > 0xFFFFFF)
        return PyErr_Format(PyExc_ValueError, "send_answer_run: the region is too long");
    Py_ssize_t prefix_len = PyUnicode_GET_LENGTH(prefix), id_len = prefix_len + 16;
    Py_UCS1 id[64 + 16];
    memcpy(id, PyUnicode_1BYTE_DATA(prefix), prefix_len);
    Py_ssize_t each = ANSWER_FIXED_MAX + id_len + region_len;
    if (count > PY_SSIZE_T_MAX / each)
        return PyErr_Format(PyExc_OverflowError, "send_answer_run: too many answers");
    PyObject *out = PyBytes_FromStringAndSize(NULL, count * each), *totals = PyList_New(0);
    PyObject *topic = NULL; /* the current run's (a reference held) */
    PyObject *hint = NULL, *fields = NULL; /* the k-th, held: __index__ and __eq__ run Python */
    long long run_count = 0, run_size = 0;
    if (out == NULL || totals == NULL) goto fail;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t k = 0; k < count; k++) {
        if (k >= PyList_GET_SIZE(hints) || k >= PyList_GET_SIZE(parsed)) {
            PyErr_SetString(PyExc_ValueError, "send_answer_run: hints or parsed changed");
            goto fail;
        }
        Py_XSETREF(hint, Py_NewRef(PyList_GET_ITEM(hints, k)));
        Py_XSETREF(fields, Py_NewRef(PyList_GET_ITEM(parsed, k)));
        if (!PyTuple_Check(hint) || PyTuple_GET_SIZE(hint) < 5 || !PyTuple_Check(fields) ||
            PyTuple_GET_SIZE(fields) < 1) {
            PyErr_SetString(PyExc_TypeError, "send_answer_run: a hint or fields not a tuple");
            goto fail;
        }
        long long opaque, phy, size, queue_id, queue_offset;
        if (arg_int(PyTuple_GET_ITEM(fields, 0), "opaque", I32_MIN, I32_MAX, &opaque) < 0 ||
            arg_int(PyTuple_GET_ITEM(hint, 0), "offset", 0, LLONG_MAX, &phy) < 0 ||
            arg_int(PyTuple_GET_ITEM(hint, 1), "size", 0, I32_MAX, &size) < 0 ||
            arg_int(PyTuple_GET_ITEM(hint, 3), "queue_id", I32_MIN, I32_MAX, &queue_id) < 0 ||
            arg_int(PyTuple_GET_ITEM(hint, 4), "queue_offset", LLONG_MIN, LLONG_MAX,
                    &queue_offset) < 0)
            goto fail;
        put_offset_hex(id + prefix_len, (unsigned long long)phy);
        Py_ssize_t n = answer_frame_into(p, opaque, id, id_len, queue_id, queue_offset,
                                         PyBytes_AS_STRING(region), region_len, trace, version);
        if (n < 0) {
            PyErr_SetString(PyExc_ValueError, "send_answer_run: an answer too long");
            goto fail;
        }
        p += n;
        PyObject *hint_topic = PyTuple_GET_ITEM(hint, 2);
        int same = 0;
        if (topic != NULL && (same = PyObject_RichCompareBool(hint_topic, topic, Py_EQ)) < 0)
            goto fail;
        if (!same) {
            if (topic != NULL && append_total(totals, topic, run_count, run_size) < 0) goto fail;
            Py_XSETREF(topic, Py_NewRef(hint_topic));
            run_count = run_size = 0;
        }
        run_count++;
        run_size += size;
    }
    if (topic != NULL && append_total(totals, topic, run_count, run_size) < 0) goto fail;
    Py_CLEAR(topic);
    Py_CLEAR(hint);
    Py_CLEAR(fields);
    if (_PyBytes_Resize(&out, p - (unsigned char *)PyBytes_AS_STRING(out)) < 0) {
        Py_DECREF(totals);
        return NULL;
    }
    return tuple_of(2, out, totals);
fail:
    Py_XDECREF(hint);
    Py_XDECREF(fields);
    Py_XDECREF(topic);
    Py_XDECREF(out);
    Py_XDECREF(totals);
    return NULL;
}


static PyMethodDef methods[] = {
    {"send_answer_frame", (PyCFunction)(void (*)(void))py_send_answer_frame, METH_FASTCALL,
     "send_answer_frame(opaque, msg_id, queue_id, queue_offset, quoted_region, trace_on,"
     " version): a successful send's JSON answer frame, as codec.json_response_frame writes it."},
    {"send_answer_run", (PyCFunction)(void (*)(void))py_send_answer_run, METH_FASTCALL,
     "send_answer_run(parsed, hints, prefix, quoted_region, trace_on, version): a run's "
     "answers joined, and [topic, count, size] per run of one topic."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pymq.broker._sendc", "pymq.broker._sendc: the send processor's answer frames.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__sendc(void) {
    if (pymq_native_init() < 0) return NULL;
    return PyModule_Create(&module);
}
