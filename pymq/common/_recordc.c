/*
 * pymq.common._recordc: the commit-log record codec's hot loops (pymq.common.record, message_ext, message_id, batch, clock).
 *
 * An optional accelerator, picked once at import by pymq.common.native.load_native when it was
 * built (setup.py) and PYMQ_PURE_PYTHON is not set; else a function's Python twin (same
 * signature; tests/unit/test_twins.py) or, without one, the Python module's general path.
 */
#include "_native.h"

/* --- crc32 ---------------------------------------------------------------------------------- */

static PyObject *py_crc32(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I:crc32", &data, &value)) return NULL;
    uint32_t crc;
    if (data.len >= 65536) {
        Py_BEGIN_ALLOW_THREADS
        crc = crc_update(value, data.buf, data.len);
        Py_END_ALLOW_THREADS
    } else {
        crc = crc_update(value, data.buf, data.len);
    }
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

/* For tests: turn the carry-less-multiplication CRC path on or off; returns whether it was on.
 * It can only be turned on where the CPU has it. */
static PyObject *py_set_clmul(PyObject *self, PyObject *arg) {
    int want = PyObject_IsTrue(arg);
    if (want < 0) return NULL;
#ifdef HAVE_CLMUL_PATH
    int was = use_clmul;
    use_clmul = want && __builtin_cpu_supports("pclmul");
    return PyBool_FromLong(was);
#else
    Py_RETURN_FALSE;
#endif
}

/* --- properties_bytes ---------------------------------------------------------------------- */

static PyObject *py_properties_bytes(PyObject *self, PyObject *props) {
    if (!PyDict_Check(props)) return PyErr_Format(PyExc_TypeError, "properties must be a dict");
    Py_ssize_t n = PyDict_GET_SIZE(props), i = 0, k = 0, size = 0;
    if (n == 0) return PyBytes_FromStringAndSize(NULL, 0);
    /* One pass over the dict collects each name's and value's UTF-8 (cached on the str), the
     * copy runs from that list: the dict is not read twice. */
    struct piece {
        const char *p;
        Py_ssize_t n;
    } stack[32], *parts = stack;
    if (2 * n > 32) {
        parts = PyMem_Malloc(sizeof(struct piece) * 2 * n);
        if (parts == NULL) return PyErr_NoMemory();
    }
    PyObject *key, *value, *out = NULL;
    while (PyDict_Next(props, &i, &key, &value)) {
        if (!PyUnicode_Check(key) || !PyUnicode_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "property names and values must be str");
            goto done;
        }
        parts[k].p = PyUnicode_AsUTF8AndSize(key, &parts[k].n);
        if (parts[k].p == NULL) goto done;
        parts[k + 1].p = PyUnicode_AsUTF8AndSize(value, &parts[k + 1].n);
        if (parts[k + 1].p == NULL) goto done;
        size += parts[k].n + 1 + parts[k + 1].n + 1;
        k += 2;
    }
    out = PyBytes_FromStringAndSize(NULL, size - 1); /* no trailing separator */
    if (out == NULL) goto done;
    char *w = PyBytes_AS_STRING(out);
    for (Py_ssize_t m = 0; m < k; m += 2) {
        if (m) *w++ = '\x02';
        memcpy(w, parts[m].p, parts[m].n);
        w += parts[m].n;
        *w++ = '\x01';
        memcpy(w, parts[m + 1].p, parts[m + 1].n);
        w += parts[m + 1].n;
    }
done:
    if (parts != stack) PyMem_Free(parts);
    return out;
}

/* --- decode_properties --------------------------------------------------------------------- */

/* message_ext.decode_properties: ``name\x01value`` items separated by \x02; an item is kept only
 * when its name and value are both non-empty (the value runs to the next \x02 and may hold
 * \x01).  Works on the str's own storage (any of PEP 393's kinds): the separators are ASCII. */
static PyObject *py_decode_properties(PyObject *self, PyObject *text) {
    if (!PyUnicode_Check(text)) return PyErr_Format(PyExc_TypeError, "properties must be a str");
    if (PyUnicode_READY(text) < 0) return NULL;
    PyObject *out = PyDict_New();
    if (out == NULL) return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t start = 0;
    while (start <= n && n > 0) {
        Py_ssize_t end = start, sep = -1;
        while (end < n) {
            Py_UCS4 c = PyUnicode_READ(kind, data, end);
            if (c == 2) break;
            if (c == 1 && sep < 0) sep = end;
            end++;
        }
        /* name: [start, sep), value: (sep, end) */
        if (sep > start && end > sep + 1) {
            PyObject *name = PyUnicode_Substring(text, start, sep);
            if (name == NULL) goto fail;
            PyObject *value = PyUnicode_Substring(text, sep + 1, end);
            if (value == NULL) {
                Py_DECREF(name);
                goto fail;
            }
            int rc = PyDict_SetItem(out, name, value);
            Py_DECREF(name);
            Py_DECREF(value);
            if (rc < 0) goto fail;
        }
        start = end + 1;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* --- decode_batch ------------------------------------------------------------------------------ */

static PyObject *batch_error(PyObject *error_cls, const char *format, ...) {
    va_list va;
    va_start(va, format);
    PyObject *text = PyUnicode_FromFormatV(format, va);
    va_end(va);
    if (text != NULL) {
        PyErr_SetObject(error_cls, text);
        Py_DECREF(text);
    }
    return NULL;
}

/* batch.decode_batch_body: the items of a SEND_BATCH_MESSAGE body (totalSize, magic, bodyCRC,
 * flag, bodyLen, body, propertiesLength, properties; magic and CRC ignored) as
 * cls(body, flag, properties dict), raising error_cls with the Python twin's words for
 * truncated or inconsistent bytes; properties that are no UTF-8 are read with U+FFFD for the bad
 * bytes, as Java's new String(bytes, UTF_8) reads them. */
static PyObject *py_decode_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) return PyErr_Format(PyExc_TypeError, "decode_batch takes 3 arguments");
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *cls = args[1], *error_cls = args[2];
    const unsigned char *p = view.buf;
    Py_ssize_t pos = 0, end = view.len;
    PyObject *items = PyList_New(0);
    if (items == NULL) goto fail;
    while (pos < end) {
        if (pos + 20 > end) {
            batch_error(error_cls, "batch item at %zd truncated", pos);
            goto fail;
        }
        int32_t total = (int32_t)get32(p + pos);
        int32_t flag = (int32_t)get32(p + pos + 12);
        int32_t body_len = (int32_t)get32(p + pos + 16);
        Py_ssize_t q = pos + 20;
        if (body_len < 0 || q + body_len + 2 > end) {
            batch_error(error_cls, "batch item at %zd: body length %d overruns", pos, (int)body_len);
            goto fail;
        }
        Py_ssize_t body_at = q;
        q += body_len;
        int16_t props_len = (int16_t)((uint16_t)p[q] << 8 | p[q + 1]);
        q += 2;
        if (props_len < 0 || q + props_len > end) {
            batch_error(error_cls, "batch item at %zd: properties length %d overruns", pos,
                        (int)props_len);
            goto fail;
        }
        PyObject *props;
        if (props_len == 0) {
            props = PyDict_New();
        } else {
            PyObject *text = PyUnicode_DecodeUTF8((const char *)p + q, props_len, "replace");
            if (text == NULL) goto fail;
            props = py_decode_properties(NULL, text);
            Py_DECREF(text);
        }
        if (props == NULL) goto fail;
        q += props_len;
        if ((Py_ssize_t)total != q - pos) {
            Py_DECREF(props);
            batch_error(error_cls, "batch item at %zd: totalSize %d != %zd", pos, (int)total,
                        q - pos);
            goto fail;
        }
        PyObject *item_args[3] = {PyBytes_FromStringAndSize((const char *)p + body_at, body_len),
                                  PyLong_FromLong(flag), props};
        PyObject *item = NULL;
        if (item_args[0] != NULL && item_args[1] != NULL)
            item = PyObject_Vectorcall(cls, item_args, 3, NULL);
        for (int i = 0; i < 3; i++) Py_XDECREF(item_args[i]);
        if (item == NULL) goto fail;
        int rc = PyList_Append(items, item);
        Py_DECREF(item);
        if (rc < 0) goto fail;
        pos = q;
    }
    PyBuffer_Release(&view);
    return items;
fail:
    Py_XDECREF(items);
    PyBuffer_Release(&view);
    return NULL;
}


/* --- decode_plain ---------------------------------------------------------------------------- */

/* The dotted text of an IPv4 address, the last one of each kind kept (one born host and one
 * store host make most records of a broker). */
typedef struct {
    uint32_t ip;
    PyObject *text;
} ip_text;

static PyObject *ipv4_text(ip_text *cache, const unsigned char *p) {
    uint32_t ip = get32(p);
    if (cache->text == NULL || cache->ip != ip) {
        char tmp[16];
        int n = snprintf(tmp, sizeof tmp, "%u.%u.%u.%u", p[0], p[1], p[2], p[3]);
        PyObject *text = PyUnicode_FromStringAndSize(tmp, n);
        if (text == NULL) return NULL;
        Py_XSETREF(cache->text, text);
        cache->ip = ip;
    }
    Py_INCREF(cache->text);
    return cache->text;
}

static ip_text born_text, store_text;

static PyObject *host_tuple(ip_text *cache, const unsigned char *p) {
    PyObject *ip = ipv4_text(cache, p);
    if (ip == NULL) return NULL;
    PyObject *port = PyLong_FromLong((long)(int32_t)get32(p + 4));
    if (port == NULL) {
        Py_DECREF(ip);
        return NULL;
    }
    PyObject *t = PyTuple_Pack(2, ip, port);
    Py_DECREF(ip);
    Py_DECREF(port);
    return t;
}

/* record._decode_plain_py: the common record at buf[pos:] (IPv4 hosts, lengths that add up, a
 * body matching its CRC when asked, UTF-8 topic and properties without NUL) as
 * cls(topic, body, flag, properties, queue_id, queue_offset, physical_offset, sys_flag,
 * born_timestamp, born_host, store_timestamp, store_host, reconsume_times,
 * prepared_transaction_offset, body_crc, store_size); None for anything else, which the careful
 * parser judges (and words). */
static PyObject *py_decode_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) return PyErr_Format(PyExc_TypeError, "decode_plain takes 4 arguments");
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred()) return NULL;
    int check_crc = PyObject_IsTrue(args[2]);
    if (check_crc < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL, *items[16] = {NULL};
    const unsigned char *b = view.buf;
    Py_ssize_t limit = view.len;
    if (pos < 0 || pos > limit - V4_HEADER) goto plain_none;
    const unsigned char *r = b + pos;
    int64_t total = (int32_t)get32(r);
    int32_t body_len = (int32_t)get32(r + 84);
    uint32_t sys_flag = get32(r + 36);
    if (get32(r + 4) != MESSAGE_MAGIC || (sys_flag & (BORNHOST_V6 | STOREHOST_V6)) ||
        total < V4_HEADER + 3 || total > limit - pos || body_len < 0 ||
        V4_HEADER + (int64_t)body_len + 3 > total)
        goto plain_none;
    const unsigned char *body = r + V4_HEADER, *q = body + body_len, *end = r + total;
    if (check_crc && body_len &&
        (crc_update(0, body, body_len) & 0x7FFFFFFFu) != get32(r + 8))
        goto plain_none;
    Py_ssize_t topic_len = q[0];
    const unsigned char *t1 = q + 1 + topic_len;
    if (topic_len > MAX_TOPIC || t1 + 2 > end) goto plain_none;
    int16_t props_len = (int16_t)((t1[0] << 8) | t1[1]);
    if (t1 + 2 + props_len != end) goto plain_none;
    if (memchr(q + 1, 0, topic_len) || memchr(t1 + 2, 0, props_len)) goto plain_none;
    PyObject *topic = PyUnicode_DecodeUTF8((const char *)q + 1, topic_len, NULL);
    if (topic == NULL) goto plain_decode_error;
    items[0] = topic;
    PyObject *props_text = PyUnicode_DecodeUTF8((const char *)t1 + 2, props_len, NULL);
    if (props_text == NULL) goto plain_decode_error;
    items[3] = py_decode_properties(NULL, props_text);
    Py_DECREF(props_text);
    if (items[3] == NULL) goto done;
    if ((items[1] = PyBytes_FromStringAndSize((const char *)body, body_len)) == NULL ||
        (items[2] = PyLong_FromLong((long)(int32_t)get32(r + 16))) == NULL ||
        (items[4] = PyLong_FromLong((long)(int32_t)get32(r + 12))) == NULL ||
        (items[5] = PyLong_FromLongLong(get64(r + 20))) == NULL ||
        (items[6] = PyLong_FromLongLong(get64(r + 28))) == NULL ||
        (items[7] = PyLong_FromLong((long)(int32_t)sys_flag)) == NULL ||
        (items[8] = PyLong_FromLongLong(get64(r + 40))) == NULL ||
        (items[9] = host_tuple(&born_text, r + 48)) == NULL ||
        (items[10] = PyLong_FromLongLong(get64(r + 56))) == NULL ||
        (items[11] = host_tuple(&store_text, r + 64)) == NULL ||
        (items[12] = PyLong_FromLong((long)(int32_t)get32(r + 72))) == NULL ||
        (items[13] = PyLong_FromLongLong(get64(r + 76))) == NULL ||
        (items[14] = PyLong_FromLong((long)(int32_t)get32(r + 8))) == NULL ||
        (items[15] = PyLong_FromLongLong(total)) == NULL)
        goto done;
    result = PyObject_Vectorcall(args[3], items, 16, NULL);
    goto done;
plain_decode_error:
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) goto done;
    PyErr_Clear();
plain_none:
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < 16; i++) Py_XDECREF(items[i]);
    PyBuffer_Release(&view);
    return result;
}


/* --- Java String.hashCode ------------------------------------------------------------------ */


static PyObject *py_java_hash(PyObject *self, PyObject *s) { return java_hash_from(0, s); }

static PyObject *py_java_hash_after(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) return PyErr_Format(PyExc_TypeError, "java_hash_after takes 2 arguments");
    long long prefix;
    if (arg_int(args[0], "prefix_hash", I32_MIN, 0xFFFFFFFFLL, &prefix) < 0) return NULL;
    return java_hash_from((uint32_t)prefix, args[1]);
}


/* --- offset_msg_id ------------------------------------------------------------------------ */

static PyObject *py_offset_msg_id(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) return PyErr_Format(PyExc_TypeError, "offset_msg_id takes 2 arguments");
    PyObject *prefix = args[0];
    if (!PyUnicode_Check(prefix) || !PyUnicode_IS_ASCII(prefix))
        return PyErr_Format(PyExc_TypeError, "the prefix must be an ASCII str");
    long long offset;
    if (arg_int(args[1], "offset", 0, LLONG_MAX, &offset) < 0) return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(prefix);
    PyObject *out = PyUnicode_New(n + 16, 127);
    if (out == NULL) return NULL;
    Py_UCS1 *w = PyUnicode_1BYTE_DATA(out);
    memcpy(w, PyUnicode_1BYTE_DATA(prefix), n);
    put_offset_hex(w + n, (unsigned long long)offset);
    return out;
}

/* offset_msg_ids(prefix, rows): the message ids of rows' records (each row's first item, its
 * physical offset), joined with commas: a batch's msgId. */
static PyObject *py_offset_msg_ids(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) return PyErr_Format(PyExc_TypeError, "offset_msg_ids takes 2 arguments");
    PyObject *prefix = args[0], *rows = args[1];
    if (!PyUnicode_Check(prefix) || !PyUnicode_IS_ASCII(prefix))
        return PyErr_Format(PyExc_TypeError, "the prefix must be an ASCII str");
    if (!PyList_Check(rows)) return PyErr_Format(PyExc_TypeError, "rows must be a list");
    Py_ssize_t count = PyList_GET_SIZE(rows), n = PyUnicode_GET_LENGTH(prefix);
    if (count == 0) return PyUnicode_New(0, 127);
    if (count > (PY_SSIZE_T_MAX - 1) / (n + 17))
        return PyErr_Format(PyExc_OverflowError, "too many rows");
    PyObject *out = PyUnicode_New(count * (n + 17) - 1, 127);
    if (out == NULL) return NULL;
    Py_UCS1 *w = PyUnicode_1BYTE_DATA(out);
    for (Py_ssize_t r = 0; r < count; r++) {
        PyObject *row = PyList_GET_ITEM(rows, r);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) < 1) {
            Py_DECREF(out);
            return PyErr_Format(PyExc_TypeError, "each row must be a non-empty tuple");
        }
        long long offset;
        PyObject *first = PyTuple_GET_ITEM(row, 0);
        if (!PyLong_CheckExact(first)) { /* no __index__: no Python code while rows is read */
            Py_DECREF(out);
            return PyErr_Format(PyExc_TypeError, "each row's offset must be an int");
        }
        if (arg_int(first, "offset", 0, LLONG_MAX, &offset) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        if (r > 0) *w++ = ',';
        memcpy(w, PyUnicode_1BYTE_DATA(prefix), n);
        w += n;
        put_offset_hex(w, (unsigned long long)offset);
        w += 16;
    }
    return out;
}


/* --- now_ms ------------------------------------------------------------------------------- */

static PyObject *py_now_ms(PyObject *self, PyObject *unused) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLongLong((long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}


/* --- scan ----------------------------------------------------------------------------------- */



static PyObject *py_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "scan takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    long long pos, limit, base = 0;
    if (arg_int(args[1], "pos", 0, PY_SSIZE_T_MAX, &pos) < 0 ||
        arg_int(args[2], "limit", 0, PY_SSIZE_T_MAX, &limit) < 0)
        return NULL;
    int check_crc = PyObject_IsTrue(args[3]);
    if (check_crc < 0) return NULL;
    int has_base = args[4] != Py_None;
    if (has_base && arg_int(args[4], "physical_base", LLONG_MIN, LLONG_MAX, &base) < 0)
        return NULL;
    PyObject *select = args[5] == Py_None ? NULL : args[5];
    PyObject *selected = args[6];
    if (!PyList_Check(selected)) {
        PyErr_SetString(PyExc_TypeError, "selected must be a list");
        return NULL;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (limit > buf.len) limit = buf.len;
    const unsigned char *b = buf.buf;
    PyObject *last_topic = NULL; /* reused while records keep the same topic */
    int failed = 0;
    if (select == NULL) {
        /* Nothing to call back: walk without the GIL, so that a recovery scan of a large file
         * (the buffer export keeps it mapped) does not hold up the event loop's thread. */
        int64_t total;
        Py_BEGIN_ALLOW_THREADS
        while (pos < limit && (total = plain_record(b, pos, limit, check_crc, has_base, base)) > 0)
            pos += total;
        Py_END_ALLOW_THREADS
    }
    while (select != NULL && pos < limit) {
        int64_t total = plain_record(b, pos, limit, check_crc, has_base, base);
        if (total <= 0) break;
        const unsigned char *r = b + pos;
        int64_t phy = get64(r + 28);
        int64_t q = V4_HEADER + (int32_t)get32(r + 84);
        int64_t topic_len = r[q];
        const char *t = (const char *)r + q + 1;
        if (last_topic == NULL || PyBytes_GET_SIZE(last_topic) != topic_len ||
            memcmp(PyBytes_AS_STRING(last_topic), t, topic_len) != 0) {
            Py_XDECREF(last_topic);
            last_topic = PyBytes_FromStringAndSize(t, topic_len);
            if (last_topic == NULL) {
                failed = 1;
                break;
            }
        }
        PyObject *call[4];
        call[0] = last_topic;
        call[1] = PyLong_FromLong((int32_t)get32(r + 12));
        call[2] = PyLong_FromLongLong(phy);
        call[3] = PyLong_FromLongLong(total);
        PyObject *hit = NULL;
        if (call[1] && call[2] && call[3]) hit = PyObject_Vectorcall(select, call, 4, NULL);
        Py_XDECREF(call[1]);
        Py_XDECREF(call[2]);
        Py_XDECREF(call[3]);
        if (hit == NULL) {
            failed = 1;
            break;
        }
        int yes = PyObject_IsTrue(hit);
        Py_DECREF(hit);
        if (yes < 0) {
            failed = 1;
            break;
        }
        if (yes) {
            PyObject *at = PyLong_FromLongLong(pos);
            if (at == NULL || PyList_Append(selected, at) < 0) {
                Py_XDECREF(at);
                failed = 1;
                break;
            }
            Py_DECREF(at);
        }
        pos += total;
    }
    Py_XDECREF(last_topic);
    PyBuffer_Release(&buf);
    if (failed) return NULL;
    return PyLong_FromLongLong(pos);
}


static PyMethodDef methods[] = {
    {"crc32", py_crc32, METH_VARARGS, "crc32(data, value=0): zlib-compatible CRC-32."},
    {"set_clmul", py_set_clmul, METH_O,
     "set_clmul(flag): use the PCLMULQDQ CRC path where the CPU has it; returns the old state."},
    {"properties_bytes", py_properties_bytes, METH_O,
     "properties_bytes(props): the UTF-8 PROPERTIES field of a dict of str."},
    {"decode_batch", (PyCFunction)(void (*)(void))py_decode_batch, METH_FASTCALL,
     "decode_batch(data, cls, error_cls): the items of a batch body as cls(body, flag, props)"
     " (batch.decode_batch_body)."},
    {"decode_properties", py_decode_properties, METH_O,
     "decode_properties(text): the dict of a properties string (message.decode_properties)."},
    {"decode_plain", (PyCFunction)(void (*)(void))py_decode_plain, METH_FASTCALL,
     "decode_plain(buf, pos, check_crc, cls): the common record at buf[pos:] as cls(...), or"
     " None for the careful parser (record._decode_plain_py)."},
    {"java_hash", py_java_hash, METH_O, "java_hash(s): Java's String.hashCode of s."},
    {"java_hash_after", (PyCFunction)(void (*)(void))py_java_hash_after, METH_FASTCALL,
     "java_hash_after(prefix_hash, s): java_hash(prefix + s) from java_hash(prefix)."},
    {"offset_msg_id", (PyCFunction)(void (*)(void))py_offset_msg_id, METH_FASTCALL,
     "offset_msg_id(prefix, offset): prefix + offset as 16 uppercase hex digits."},
    {"offset_msg_ids", (PyCFunction)(void (*)(void))py_offset_msg_ids, METH_FASTCALL,
     "offset_msg_ids(prefix, rows): offset_msg_id of each row's first item, comma-joined."},
    {"now_ms", py_now_ms, METH_NOARGS, "now_ms(): milliseconds since the epoch (wall clock)."},
    {"scan", (PyCFunction)(void (*)(void))py_scan, METH_FASTCALL,
     "scan(buf, pos, limit, check_crc, physical_base, select, selected): walk plain records,"
     " return where the walk stopped."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pymq.common._recordc", "pymq.common._recordc: the commit-log record codec's hot loops (pymq.common.record, message_ext, message_id, batch, clock).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__recordc(void) {
    if (pymq_native_init() < 0) return NULL;
    return PyModule_Create(&module);
}
