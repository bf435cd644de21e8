/*
 * pymq.remoting._codecc: remoting frames and JSON request headers read without a general JSON decoder.
 *
 * An optional accelerator, picked once at import by pymq.common.native.load_native when it was
 * built (setup.py) and PYMQ_PURE_PYTHON is not set; else a function's Python twin (same
 * signature; tests/unit/test_twins.py) or, without one, the Python module's general path.
 */
#include "../common/_native.h"

/* --- json_command ------------------------------------------------------------------------------ */

/* A Java int read from the header dict: present or ``dflt``; 0 when the value is not an exact
 * int within Java's int range. */
static int java_int_item(PyObject *dict, PyObject *key, long dflt, PyObject **out) {
    PyObject *v = PyDict_GetItemWithError(dict, key);
    if (v == NULL) {
        if (PyErr_Occurred()) return -1;
        *out = PyLong_FromLong(dflt);
        return *out == NULL ? -1 : 1;
    }
    if (!PyLong_CheckExact(v)) return 0;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (overflow || x < I32_MIN || x > I32_MAX) return 0;
    *out = Py_NewRef(v);
    return 1;
}

/* The C++ client writes numbers and booleans in extFields: a copy of ``ext`` with booleans as
 * "true" / "false", exact ints in decimal, nulls left out and strings kept (as
 * codec._decode_json_header normalises them); NULL with no error set when a value is anything
 * else (a float, a list, an object), for the Python code to judge. */
static PyObject *plain_ext(PyObject *ext) {
    PyObject *plain = PyDict_New();
    if (plain == NULL) return NULL;
    Py_ssize_t i = 0;
    PyObject *key, *value;
    while (PyDict_Next(ext, &i, &key, &value)) {
        PyObject *text;
        if (PyUnicode_CheckExact(value)) text = Py_NewRef(value);
        else if (value == Py_True) text = PyUnicode_FromString("true");
        else if (value == Py_False) text = PyUnicode_FromString("false");
        else if (PyLong_CheckExact(value)) text = PyObject_Str(value);
        else if (value == Py_None) continue;
        else {
            Py_DECREF(plain);
            return NULL;
        }
        if (text == NULL || PyDict_SetItem(plain, key, text) < 0) {
            Py_XDECREF(text);
            Py_DECREF(plain);
            return NULL;
        }
        Py_DECREF(text);
    }
    return plain;
}

static PyObject *k_opaque, *k_code, *k_flag, *k_version, *k_ext, *k_remark, *k_language;

/* codec._decode_json_header's plain case after orjson: a header dict whose code, opaque, flag
 * and version are Java ints (opaque, flag, version default 0), extFields a dict of str (or
 * absent: empty; or of the C++ client's booleans, ints and nulls too, see plain_ext), remark
 * absent or a str, language a non-empty str, as
 * cls(code, ext, b"", opaque, flag, remark, language, version, serialize_type); None for
 * anything else, which the Python code judges. */
static PyObject *py_json_command(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) return PyErr_Format(PyExc_TypeError, "json_command takes 3 arguments");
    PyObject *h = args[0];
    if (!PyDict_CheckExact(h)) Py_RETURN_NONE;
    if (k_opaque == NULL) {
        if ((k_opaque = PyUnicode_InternFromString("opaque")) == NULL ||
            (k_code = PyUnicode_InternFromString("code")) == NULL ||
            (k_flag = PyUnicode_InternFromString("flag")) == NULL ||
            (k_version = PyUnicode_InternFromString("version")) == NULL ||
            (k_ext = PyUnicode_InternFromString("extFields")) == NULL ||
            (k_remark = PyUnicode_InternFromString("remark")) == NULL ||
            (k_language = PyUnicode_InternFromString("language")) == NULL)
            return NULL;
    }
    PyObject *items[9] = {NULL};
    PyObject *result = NULL;
    int ok;
    /* items: code, ext, body, opaque, flag, remark, language, version, serialize_type */
    PyObject *code = PyDict_GetItemWithError(h, k_code); /* required: no default */
    if (code == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    if ((ok = java_int_item(h, k_code, 0, &items[0])) <= 0) goto out;
    if ((ok = java_int_item(h, k_opaque, 0, &items[3])) <= 0) goto out;
    if ((ok = java_int_item(h, k_flag, 0, &items[4])) <= 0) goto out;
    if ((ok = java_int_item(h, k_version, 0, &items[7])) <= 0) goto out;
    PyObject *ext = PyDict_GetItemWithError(h, k_ext);
    if (ext == NULL && PyErr_Occurred()) goto fail;
    if (ext == NULL || ext == Py_None) {
        if ((items[1] = PyDict_New()) == NULL) goto fail;
    } else {
        ok = 0;
        if (!PyDict_CheckExact(ext)) goto out;
        Py_ssize_t i = 0;
        PyObject *key, *value;
        int plain = 1;
        while (PyDict_Next(ext, &i, &key, &value))
            if (!PyUnicode_CheckExact(value)) {
                plain = 0;
                break;
            }
        if (plain) {
            items[1] = Py_NewRef(ext);
        } else if ((items[1] = plain_ext(ext)) == NULL) {
            if (PyErr_Occurred()) goto fail;
            goto out;
        }
    }
    ok = 0;
    PyObject *remark = PyDict_GetItemWithError(h, k_remark);
    if (remark == NULL && PyErr_Occurred()) goto fail;
    if (remark != NULL && remark != Py_None && !PyUnicode_CheckExact(remark)) goto out;
    PyObject *language = PyDict_GetItemWithError(h, k_language);
    if (language == NULL && PyErr_Occurred()) goto fail;
    if (language == NULL || !PyUnicode_CheckExact(language) || PyUnicode_GET_LENGTH(language) == 0)
        goto out;
    items[5] = Py_NewRef(remark != NULL ? remark : Py_None);
    items[6] = Py_NewRef(language);
    if ((items[2] = PyBytes_FromStringAndSize(NULL, 0)) == NULL) goto fail;
    items[8] = Py_NewRef(args[2]);
    result = PyObject_Vectorcall(args[1], items, 9, NULL);
    goto done;
out:
    if (ok < 0) goto fail;
    result = Py_NewRef(Py_None);
    goto done;
fail:
    result = NULL;
done:
    for (int i = 0; i < 9; i++) Py_XDECREF(items[i]);
    return result;
}

/* --- json_header ------------------------------------------------------------------------------- */

/* A minimal reader of the plain JSON request header, for json_header below.  Every function
 * returns 1 when it read its part, 0 when the text is outside the plain subset (the caller
 * then returns None and the general decoder judges the whole header), -1 on an error. */
typedef struct {
    const unsigned char *p, *end;
} jreader;

static void j_ws(jreader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static int j_hex4(const unsigned char *p, Py_UCS4 *out) {
    Py_UCS4 v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return 0;
    }
    *out = v;
    return 1;
}

/* Short ASCII strings the headers repeat (extFields' names, "0", "false", "JAVA", ...): one
 * str object each, kept in a direct-mapped table, so that a header's names are neither
 * allocated nor hashed again (a str caches its hash). */
#define SHORT_STR_MAX 16
#define SHORT_STR_SLOTS 256
static PyObject *short_strs[SHORT_STR_SLOTS];

static PyObject *ascii_str(const unsigned char *s, Py_ssize_t n) {
    if (n > SHORT_STR_MAX) {
        PyObject *out = PyUnicode_New(n, 127);
        if (out != NULL) memcpy(PyUnicode_1BYTE_DATA(out), s, n);
        return out;
    }
    uint32_t h = 2166136261u;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    h = (h ^ (uint32_t)n) * 16777619u;
    PyObject **slot = &short_strs[h % SHORT_STR_SLOTS];
    PyObject *hit = *slot;
    if (hit != NULL && PyUnicode_GET_LENGTH(hit) == n && memcmp(PyUnicode_1BYTE_DATA(hit), s, n) == 0)
        return Py_NewRef(hit);
    PyObject *out = PyUnicode_New(n, 127);
    if (out == NULL) return NULL;
    memcpy(PyUnicode_1BYTE_DATA(out), s, n);
    Py_XSETREF(*slot, Py_NewRef(out));
    return out;
}

/* The bytes a string's or a name's plain text runs over (1): ASCII from 0x20 but '"' and '\\'.
 * One table load per byte in the scans below, not four comparisons. */
static const unsigned char j_plain[256] = {
    [0x20] = 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x22 '"' */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, /* 0x5C '\\' */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* to 0x7F */
};

/* Size of the code point buffer kept on the stack for a string with escapes. */
#define J_STACK_CHARS 512

/* A JSON string at r->p (its opening quote) as a str: ASCII text and escapes (\uXXXX outside
 * the surrogates); raw bytes past ASCII, control characters and surrogate escapes are left to
 * the general decoder (it validates UTF-8 and pairs surrogates as json does). */
static int j_string(jreader *r, PyObject **out) {
    if (r->p >= r->end || *r->p != '"') return 0;
    const unsigned char *s = ++r->p;
    const unsigned char *q = s;
    while (q < r->end && j_plain[*q]) q++;
    if (q >= r->end) return 0;
    if (*q == '"') { /* the common case: no escape */
        *out = ascii_str(s, q - s);
        if (*out == NULL) return -1;
        r->p = q + 1;
        return 1;
    }
    if (*q != '\\') return 0; /* a control character or a byte past ASCII */
    /* With escapes: code points gathered (on the stack for a short rest of header), then one
     * str of the narrowest kind. */
    Py_ssize_t cap = r->end - s, n = 0;
    Py_UCS4 stack[J_STACK_CHARS];
    Py_UCS4 *buf = cap <= J_STACK_CHARS ? stack : PyMem_Malloc(cap * sizeof(Py_UCS4) + 1);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = 0;
    for (q = s; q < r->end;) {
        while (q < r->end && j_plain[*q]) buf[n++] = *q++; /* a run of plain text */
        if (q >= r->end) break;
        unsigned char c = *q;
        if (c == '"') {
            Py_UCS4 max = 0;
            for (Py_ssize_t i = 0; i < n; i++) max |= buf[i];
            if (max < 0x80) { /* ASCII (a properties string's \u0001 and \u0002) */
                *out = PyUnicode_New(n, 127);
                if (*out != NULL)
                    for (Py_ssize_t i = 0; i < n; i++) PyUnicode_1BYTE_DATA(*out)[i] = (Py_UCS1)buf[i];
            } else {
                *out = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, buf, n);
            }
            rc = *out == NULL ? -1 : 1;
            r->p = q + 1;
            break;
        }
        if (c < 0x20 || c >= 0x80) break;
        if (c != '\\') {
            buf[n++] = c;
            q++;
            continue;
        }
        if (q + 1 >= r->end) break;
        unsigned char e = q[1];
        Py_UCS4 v;
        if (e == '"' || e == '\\' || e == '/') v = e;
        else if (e == 'b') v = '\b';
        else if (e == 'f') v = '\f';
        else if (e == 'n') v = '\n';
        else if (e == 'r') v = '\r';
        else if (e == 't') v = '\t';
        else if (e == 'u') {
            if (q + 6 > r->end || !j_hex4(q + 2, &v) || (v >= 0xD800 && v <= 0xDFFF)) break;
            buf[n++] = v;
            q += 6;
            continue;
        } else break;
        buf[n++] = v;
        q += 2;
    }
    if (buf != stack) PyMem_Free(buf);
    return rc;
}

/* A JSON integer at r->p as a long long: -?(0|[1-9][0-9]*), at most 18 digits, no fraction or
 * exponent. */
static int j_int(jreader *r, long long *out) {
    const unsigned char *p = r->p;
    int neg = 0;
    if (p < r->end && *p == '-') {
        neg = 1;
        p++;
    }
    const unsigned char *digits = p;
    long long v = 0;
    while (p < r->end && *p >= '0' && *p <= '9') {
        if (p - digits >= 18) return 0;
        v = v * 10 + (*p - '0');
        p++;
    }
    if (p == digits || (*digits == '0' && p - digits > 1)) return 0;
    if (p < r->end && (*p == '.' || *p == 'e' || *p == 'E')) return 0;
    *out = neg ? -v : v;
    r->p = p;
    return 1;
}

static int j_literal(jreader *r, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, lit, n) != 0) return 0;
    r->p += n;
    return 1;
}

/* A JSON string at r->p read as j_string reads it (the same text refused), without the str:
 * plain ASCII scanned here, a string with escapes read by j_string. */
static int j_string_read(jreader *r) {
    if (r->p >= r->end || *r->p != '"') return 0;
    const unsigned char *q = r->p + 1;
    while (q < r->end && j_plain[*q]) q++;
    if (q < r->end && *q != '"' && *q != '\\') return 0; /* as j_string refuses it */
    if (q < r->end && *q == '"') {
        r->p = q + 1;
        return 1;
    }
    PyObject *s = NULL;
    int rc = j_string(r, &s);
    Py_XDECREF(s);
    return rc;
}

/* A value of a member pymq does not read: a string, an integer, true, false or null. */
static int j_skip(jreader *r) {
    if (r->p >= r->end) return 0;
    unsigned char c = *r->p;
    if (c == '"') return j_string_read(r);
    if (c == 't') return j_literal(r, "true");
    if (c == 'f') return j_literal(r, "false");
    if (c == 'n') return j_literal(r, "null");
    long long ignored;
    return j_int(r, &ignored);
}

/* extFields: an object of strings (or null: an empty dict). */
static int j_ext(jreader *r, PyObject **out) {
    if (j_literal(r, "null")) {
        *out = PyDict_New();
        return *out == NULL ? -1 : 1;
    }
    if (r->p >= r->end || *r->p != '{') return 0;
    r->p++;
    PyObject *d = PyDict_New();
    if (d == NULL) return -1;
    j_ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
        *out = d;
        return 1;
    }
    for (;;) {
        PyObject *k = NULL, *v = NULL;
        int rc = j_string(r, &k);
        if (rc <= 0) goto member_out;
        j_ws(r);
        rc = 0;
        if (r->p >= r->end || *r->p != ':') goto member_out;
        r->p++;
        j_ws(r);
        if ((rc = j_string(r, &v)) <= 0) goto member_out;
        if (PyDict_SetItem(d, k, v) < 0) {
            rc = -1;
            goto member_out;
        }
        Py_DECREF(k);
        Py_DECREF(v);
        j_ws(r);
        if (r->p >= r->end) break;
        if (*r->p == ',') {
            r->p++;
            j_ws(r);
            continue;
        }
        if (*r->p == '}') {
            r->p++;
            *out = d;
            return 1;
        }
        break;
    member_out:
        Py_XDECREF(k);
        Py_XDECREF(v);
        Py_DECREF(d);
        return rc;
    }
    Py_DECREF(d);
    return 0;
}

/* A member's name at r->p (plain ASCII, no escapes) and the ':' after it: 1, or 0 when not so. */
static int j_member_name(jreader *r, const unsigned char **k, Py_ssize_t *kn) {
    if (r->p >= r->end || *r->p != '"') return 0;
    const unsigned char *s = ++r->p;
    while (r->p < r->end && j_plain[*r->p]) r->p++;
    if (r->p >= r->end || *r->p != '"') return 0;
    *k = s;
    *kn = r->p - s;
    r->p++;
    j_ws(r);
    if (r->p >= r->end || *r->p != ':') return 0;
    r->p++;
    j_ws(r);
    return 1;
}

/* After a member's value: 1 past a ',' (more members follow), 0 past the closing '}', -1 for
 * anything else. */
static int j_after_member(jreader *r) {
    j_ws(r);
    if (r->p >= r->end) return -1;
    if (*r->p == ',') {
        r->p++;
        j_ws(r);
        return 1;
    }
    if (*r->p != '}') return -1;
    r->p++;
    return 0;
}

/* A request header's numbers, and which of its members were read. */
typedef struct {
    long long code, opaque, flag, version;
    int seen; /* bits: code 1, opaque 2, flag 4, version 8, ext 16, remark 32, language 64 */
} jheader;

/* The bit of a header member's name (0: a member pymq does not read) and, for a number, where
 * it goes. */
static int header_member(jheader *h, const unsigned char *k, Py_ssize_t kn, long long **num) {
    *num = NULL;
    switch (kn) {
    case 4:
        if (memcmp(k, "code", 4) == 0) return *num = &h->code, 1;
        if (memcmp(k, "flag", 4) == 0) return *num = &h->flag, 4;
        return 0;
    case 6:
        if (memcmp(k, "opaque", 6) == 0) return *num = &h->opaque, 2;
        if (memcmp(k, "remark", 6) == 0) return 32;
        return 0;
    case 7:
        if (memcmp(k, "version", 7) == 0) return *num = &h->version, 8;
        return 0;
    case 8:
        return memcmp(k, "language", 8) == 0 ? 64 : 0;
    case 9:
        return memcmp(k, "extFields", 9) == 0 ? 16 : 0;
    }
    return 0;
}

/* Reads the extFields member's value at r->p for its caller (ctx): as the j_* readers return. */
typedef int (*ext_reader)(jreader *r, void *ctx);

/* The request header's JSON object over all of r, for json_header and send_fields: the numbers
 * into h (Java ints), language (required, not empty) and remark (a string or null; dropped when
 * remark is NULL) kept, extFields read by read_ext, any other member's plain value skipped, each
 * known member once.  1 when read; 0 when outside that subset; -1 on an error. */
static int j_header(jreader *r, jheader *h, PyObject **language, PyObject **remark,
                    ext_reader read_ext, void *ctx) {
    j_ws(r);
    if (r->p >= r->end || *r->p != '{') return 0;
    r->p++;
    j_ws(r);
    int more = 1, rc;
    if (r->p < r->end && *r->p == '}') {
        r->p++;
        more = 0;
    }
    while (more) {
        const unsigned char *k;
        Py_ssize_t kn;
        long long *num;
        if (!j_member_name(r, &k, &kn)) return 0;
        int bit = header_member(h, k, kn, &num);
        if (h->seen & bit) return 0; /* a duplicate: the general decoder */
        h->seen |= bit;
        if (num != NULL) {
            if ((rc = j_int(r, num)) <= 0) return rc;
            if (*num < I32_MIN || *num > I32_MAX) return 0;
        } else if (bit == 16) {
            if ((rc = read_ext(r, ctx)) <= 0) return rc;
        } else if (bit == 32) {
            if (!j_literal(r, "null")) {
                PyObject *text = NULL;
                if ((rc = j_string(r, &text)) <= 0) return rc;
                if (remark != NULL) *remark = text;
                else Py_DECREF(text); /* a send's answer does not echo it */
            }
        } else if (bit == 64) {
            if ((rc = j_string(r, language)) <= 0) return rc;
        } else if ((rc = j_skip(r)) <= 0) {
            return rc;
        }
        if ((more = j_after_member(r)) < 0) return 0;
    }
    j_ws(r);
    return r->p == r->end && *language != NULL && PyUnicode_GET_LENGTH(*language) > 0;
}

static int ext_dict(jreader *r, void *ctx) { return j_ext(r, (PyObject **)ctx); }

/*
 * json_header(buf, start, end, cls, serialize_type)
 *
 * codec._decode_json_header's plain case read straight from the header's bytes buf[start:end],
 * without orjson's dict: a JSON object whose members are plain (escape-free ASCII) names with
 * code, opaque, flag and version Java ints (opaque, flag, version 0 when absent; code
 * required), extFields an object of strings or null, remark a string or null, language a
 * non-empty string, and any other member a string, integer, true, false or null.  Returns
 * cls(code, ext, b"", opaque, flag, remark, language, version, serialize_type) as json_command
 * does for the same header after orjson, or None for everything else (non-ASCII text, numbers
 * with a fraction, nested values, duplicate members, ...), which the general decoder judges.
 */
static PyObject *py_json_header(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) return PyErr_Format(PyExc_TypeError, "json_header takes 5 arguments");
    long long start, end;
    if (arg_int(args[1], "start", 0, PY_SSIZE_T_MAX, &start) < 0 ||
        arg_int(args[2], "end", 0, PY_SSIZE_T_MAX, &end) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL, *ext = NULL, *remark = NULL, *language = NULL;
    jheader h = {0};
    if (end > view.len || start > end) goto plain_none;
    jreader r = {(const unsigned char *)view.buf + start, (const unsigned char *)view.buf + end};
    int rc = j_header(&r, &h, &language, &remark, ext_dict, &ext);
    if (rc < 0) goto fail;
    if (rc == 0 || !(h.seen & 1)) goto plain_none;
    if (ext == NULL && (ext = PyDict_New()) == NULL) goto fail;
    PyObject *items[9] = {NULL};
    items[0] = PyLong_FromLongLong(h.code);
    items[1] = ext;
    items[2] = PyBytes_FromStringAndSize(NULL, 0);
    items[3] = PyLong_FromLongLong(h.opaque);
    items[4] = PyLong_FromLongLong(h.flag);
    items[5] = remark != NULL ? remark : Py_None;
    items[6] = language;
    items[7] = PyLong_FromLongLong(h.version);
    items[8] = args[4];
    if (items[0] != NULL && items[2] != NULL && items[3] != NULL && items[4] != NULL &&
        items[7] != NULL)
        result = PyObject_Vectorcall(args[3], items, 9, NULL);
    Py_XDECREF(items[0]);
    Py_XDECREF(items[2]);
    Py_XDECREF(items[3]);
    Py_XDECREF(items[4]);
    Py_XDECREF(items[7]);
    goto done;
plain_none:
    result = Py_NewRef(Py_None);
    goto done;
fail:
    result = NULL;
done:
    Py_XDECREF(ext);
    Py_XDECREF(remark);
    Py_XDECREF(language);
    PyBuffer_Release(&view);
    return result;
}

/* --- send_header -------------------------------------------------------------------------------- */

/* A plain non-negative decimal of at most ``max_digits`` ASCII digits as a Python int, NULL with
 * no error set for anything else (headers.java_int's and java_long's fast case). */
static PyObject *plain_number(PyObject *v, Py_ssize_t max_digits) {
    if (!PyUnicode_CheckExact(v) || !PyUnicode_IS_ASCII(v)) return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(v);
    if (n == 0 || n > max_digits) return NULL;
    const Py_UCS1 *p = PyUnicode_1BYTE_DATA(v);
    long long x = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return NULL;
        x = x * 10 + (p[i] - '0');
    }
    return PyLong_FromLongLong(x);
}

/* "true" or "false" exactly as a bool, and the C++ client's "1" and "0" (headers.java_bool
 * reads those alike); NULL with no error set for anything else. */
static PyObject *plain_bool(PyObject *v) {
    if (!PyUnicode_CheckExact(v)) return NULL;
    if (PyUnicode_CompareWithASCIIString(v, "true") == 0) Py_RETURN_TRUE;
    if (PyUnicode_CompareWithASCIIString(v, "false") == 0) Py_RETURN_FALSE;
    if (PyUnicode_CompareWithASCIIString(v, "1") == 0) Py_RETURN_TRUE;
    if (PyUnicode_CompareWithASCIIString(v, "0") == 0) Py_RETURN_FALSE;
    return NULL;
}

/* headers.SendMessageRequestHeader.from_ext's common case: every required field present, the
 * numbers plain decimals, the booleans "true", "false", "1" or "0", as cls(...); None for
 * anything else, which the Python decoder judges and words.  names: the 13 wire names in the
 * header's field order; batch_code: the request is a SEND_BATCH_MESSAGE. */
static PyObject *py_send_header(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) return PyErr_Format(PyExc_TypeError, "send_header takes 4 arguments");
    PyObject *ext = args[0], *names = args[1];
    if (!PyDict_CheckExact(ext) || !PyTuple_CheckExact(names) || PyTuple_GET_SIZE(names) != 13)
        Py_RETURN_NONE;
    int batch_code = PyObject_IsTrue(args[3]);
    if (batch_code < 0) return NULL;
    PyObject *raw[13], *items[13] = {NULL}, *result = NULL;
    for (int i = 0; i < 13; i++) {
        raw[i] = PyDict_GetItemWithError(ext, PyTuple_GET_ITEM(names, i));
        if (raw[i] == NULL && PyErr_Occurred()) return NULL;
    }
    for (int i = 0; i < 8; i++)
        if (raw[i] == NULL) Py_RETURN_NONE; /* a required field missing: the Python error */
    for (int i = 0; i < 3; i++) /* a required str that is null (JSON null) or no str: the same */
        if (!PyUnicode_CheckExact(raw[i])) Py_RETURN_NONE;
    for (int i = 0; i < 3; i++) items[i] = Py_NewRef(raw[i]);
    static const int ints[] = {3, 4, 5, 7};
    for (int k = 0; k < 4; k++)
        if ((items[ints[k]] = plain_number(raw[ints[k]], 9)) == NULL) goto plain_none;
    if ((items[6] = plain_number(raw[6], 18)) == NULL) goto plain_none;
    items[8] = Py_NewRef(raw[8] != NULL ? raw[8] : Py_None);
    if (raw[9] == NULL) items[9] = Py_NewRef(Py_None);
    else if ((items[9] = plain_number(raw[9], 9)) == NULL) goto plain_none;
    if (raw[10] == NULL) items[10] = Py_NewRef(Py_False);
    else if ((items[10] = plain_bool(raw[10])) == NULL) goto plain_none;
    if (raw[11] == NULL) items[11] = Py_NewRef(Py_None);
    else if ((items[11] = plain_number(raw[11], 9)) == NULL) goto plain_none;
    if (batch_code) items[12] = Py_NewRef(Py_True);
    else if (raw[12] == NULL) items[12] = Py_NewRef(Py_False);
    else if ((items[12] = plain_bool(raw[12])) == NULL) goto plain_none;
    result = PyObject_Vectorcall(args[2], items, 13, NULL);
    goto done;
plain_none:
    if (!PyErr_Occurred()) result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < 13; i++) Py_XDECREF(items[i]);
    return result;
}

/* --- plain_header -------------------------------------------------------------------------------- */

/* A typed request header's common case from its extFields: spec is a tuple of (wire name, kind)
 * pairs in the class's field order, kind one of "s" (a required str), "S" (an optional str,
 * None when absent), "i" / "l" (a required Java int / long written as a plain decimal), "b" (a
 * boolean, "true", "false", "1" or "0", False when absent); the header is cls(*values), or
 * None when any field is absent where required or not plain, for the Python decoder to judge
 * and word. */
static PyObject *py_plain_header(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) return PyErr_Format(PyExc_TypeError, "plain_header takes 3 arguments");
    PyObject *ext = args[0], *spec = args[1];
    if (!PyDict_CheckExact(ext) || !PyTuple_CheckExact(spec) || PyTuple_GET_SIZE(spec) > 16)
        Py_RETURN_NONE;
    Py_ssize_t n = PyTuple_GET_SIZE(spec);
    PyObject *items[16] = {NULL}, *result = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(spec, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) goto plain_none;
        const char *kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(pair, 1));
        if (kind == NULL) goto done;
        PyObject *v = PyDict_GetItemWithError(ext, PyTuple_GET_ITEM(pair, 0));
        if (v == NULL && PyErr_Occurred()) goto done;
        switch (kind[0]) {
        case 's':
            if (v == NULL || !PyUnicode_CheckExact(v)) goto plain_none;
            items[i] = Py_NewRef(v);
            break;
        case 'S':
            if (v != NULL && !PyUnicode_CheckExact(v)) goto plain_none;
            items[i] = Py_NewRef(v != NULL ? v : Py_None);
            break;
        case 'i':
        case 'l':
            if (v == NULL || (items[i] = plain_number(v, kind[0] == 'i' ? 9 : 18)) == NULL)
                goto plain_none;
            break;
        case 'b':
            if (v == NULL) items[i] = Py_NewRef(Py_False);
            else if ((items[i] = plain_bool(v)) == NULL) goto plain_none;
            break;
        default:
            goto plain_none;
        }
    }
    result = PyObject_Vectorcall(args[2], items, n, NULL);
    goto done;
plain_none:
    if (!PyErr_Occurred()) result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < 16; i++) Py_XDECREF(items[i]);
    return result;
}

/*
 * send_fields(buf, start, end)
 *
 * A plain single send read for the broker's raw send path: the frame buf[start:end] (its length
 * field stripped) with a JSON header of plain ASCII names and nothing nested but extFields,
 * flag 0 (a request expecting its answer), and either code 310 (SEND_MESSAGE_V2) or 320
 * (SEND_BATCH_MESSAGE) with V2's one-letter names, or code 10 (SEND_MESSAGE) with the long
 * names (other names ignored, as an ACL client's AccessKey and Signature), each
 * name once, its value a string or the C++ client's number, boolean or null (read as codec's
 * plain_ext reads them), which SendMessageRequestHeader.from_ext's common case takes
 * (send_header: the first eight present, plain decimals, booleans true/false/1/0), batch true
 * for code 320 and false or absent otherwise.  Returns (opaque, topic, queue_id, sys_flag,
 * born_timestamp, flag, properties or None, reconsume_times or None, body_start, batch);
 * None for every other frame, which the usual path decodes, checks and answers.
 */
/* codec.MAX_JSON_HEADER_LENGTH: the longest JSON header the usual path decodes. */
#define SEND_MAX_JSON_HEADER (1 << 20)

/* SendMessageRequestHeader's wire names in field order (headers.V2_NAMES' values). */
static const char *const send_long_names[13] = {
    "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
    "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes",
    "batch",
};

/* send_fields' extFields: the values of SendMessageRequestHeader's fields by slot (a..m order). */
typedef struct {
    PyObject *ext[13];
    int names;     /* bits: 1 a one-letter name seen, 2 a long name */
    int slot_seen; /* bits: the slots given */
    const jheader *h; /* the header's members read so far (code, flag) */
} send_ext;

/* The JSON header of the frame buf[start:end] (its length field stripped) as a reader over it,
 * and where it ends: 0 when the frame is shorter than its header, the header is not JSON, or
 * it is past codec.MAX_JSON_HEADER_LENGTH (a ProtocolError there, the connection closed: never
 * answered here). */
static int json_frame_header(const Py_buffer *view, long long start, long long end, jreader *r,
                             long long *header_end) {
    if (end > view->len || start > end || end - start < 4) return 0;
    const unsigned char *f = (const unsigned char *)view->buf + start;
    uint32_t field = get32(f);
    *header_end = start + 4 + (field & 0xFFFFFF);
    if ((field >> 24) != 0 || *header_end > end || (field & 0xFFFFFF) > SEND_MAX_JSON_HEADER)
        return 0;
    r->p = f + 4;
    r->end = (const unsigned char *)view->buf + *header_end;
    return 1;
}

/* extFields for send_fields: V2's one-letter names or SEND_MESSAGE's long ones, once each; the
 * C++ client's numbers, booleans and nulls read as codec's plain_ext reads them (decimal text,
 * "true"/"false", absent); other names' values skipped.  As the j_* readers return. */
/* Whether a sysFlag value (a str of ASCII digits, at most 9) has a transaction's half or
 * rollback bits (0x4, 0xC); 0 for anything else (left to send_header's checks). */
static int transaction_flags(PyObject *value) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(value);
    if (!PyUnicode_IS_ASCII(value) || n < 1 || n > 9) return 0;
    const unsigned char *d = PyUnicode_1BYTE_DATA(value);
    long long v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (d[i] < '0' || d[i] > '9') return 0;
        v = v * 10 + (d[i] - '0');
    }
    return (v & 0xC) != 0;
}

static int ext_slots(jreader *r, void *ctx) {
    send_ext *e = ctx;
    /* No send's frame (another code, or a response: send_fields_at declines it once read):
     * declined before its extFields are read (an END_TRANSACTION between a transaction's
     * halves, a consumer's pull). */
    const jheader *h = e->h;
    if (((h->seen & 1) && h->code != 10 && h->code != 310 && h->code != 320) ||
        ((h->seen & 4) && h->flag != 0))
        return 0;
    if (r->p >= r->end || *r->p != '{') return 0;
    r->p++;
    j_ws(r);
    if (r->p < r->end && *r->p == '}') return 0; /* no field: the usual path */
    for (int more = 1; more;) {
        const unsigned char *k;
        Py_ssize_t kn;
        int rc;
        if (!j_member_name(r, &k, &kn)) return 0;
        int slot = -1;
        if (kn == 1 && k[0] >= 'a' && k[0] <= 'm') {
            slot = k[0] - 'a';
            e->names |= 1;
        } else {
            for (int i = 0; i < 13; i++)
                if ((size_t)kn == strlen(send_long_names[i]) &&
                    memcmp(k, send_long_names[i], kn) == 0) {
                    slot = i;
                    e->names |= 2;
                    break;
                }
        }
        if (slot < 0) {
            if ((rc = j_skip(r)) <= 0) return rc;
        } else {
            if (e->slot_seen & (1 << slot)) return 0; /* twice: the usual path */
            e->slot_seen |= 1 << slot;
            unsigned char c = r->p < r->end ? *r->p : 0;
            if (c == '"' && (slot == 0 || slot == 2)) {
                /* The producer group and the default topic: send_fields only needs them given
                 * (send_header's rule), so their text is read, not made into a str. */
                if ((rc = j_string_read(r)) <= 0) return rc;
                e->ext[slot] = Py_NewRef(Py_True);
            } else if (c == '"') {
                if ((rc = j_string(r, &e->ext[slot])) <= 0) return rc;
            } else if (c == 't' || c == 'f') {
                int t = j_literal(r, "true");
                if (!t && !j_literal(r, "false")) return 0;
                if ((e->ext[slot] = PyUnicode_FromString(t ? "true" : "false")) == NULL) return -1;
            } else if (c == 'n') {
                if (!j_literal(r, "null")) return 0; /* absent */
            } else {
                const unsigned char *digits = r->p;
                long long ignored;
                if ((rc = j_int(r, &ignored)) <= 0) return rc;
                if (*digits == '-') return 0; /* not a plain decimal */
                if ((e->ext[slot] = ascii_str(digits, r->p - digits)) == NULL) return -1;
            }
        }
        /* A transaction's half or rollback (sysFlag, slot f, with 0x4 or 0xC) is the usual
         * path's (send_fields_at declines it anyway): declined here, before the members
         * after it (the long properties) are made into strings. */
        if (slot == 5 && e->ext[5] != NULL && transaction_flags(e->ext[5])) return 0;
        if ((more = j_after_member(r)) < 0) return 0;
    }
    return 1;
}


/* send_fields of view[start:end]: a new reference to the fields tuple or to None, NULL with an
 * exception set. */
static PyObject *send_fields_at(const Py_buffer *view, long long start, long long end) {
    PyObject *result = NULL, *language = NULL, *typed[13] = {NULL};
    jheader h = {0};
    send_ext e = {{NULL}, 0, 0, &h};
    PyObject **ext = e.ext;
    jreader r;
    long long header_end;
    if (!json_frame_header(view, start, end, &r, &header_end)) goto plain_none;
    /* The code first, as Java's, the C++ client's and pymq's writers put it: a frame that is no
     * send's (an END_TRANSACTION, a pull) declined before the rest of its header is read. */
    if (r.end - r.p > 8 && memcmp(r.p, "{\"code\":", 8) == 0) {
        jreader peek = {r.p + 8, r.end};
        long long code;
        if (j_int(&peek, &code) > 0 && code != 10 && code != 310 && code != 320) goto plain_none;
    }
    int rc = j_header(&r, &h, &language, NULL, ext_slots, &e);
    if (rc < 0) goto fail;
    if (rc == 0 || !(h.seen & 16) || h.flag != 0) goto plain_none;
    /* V2 (310) and SEND_BATCH_MESSAGE (320): the one-letter names; SEND_MESSAGE (10): the long
     * names; other names ignored, as from_ext ignores them (an ACL client's AccessKey,
     * Signature and SecurityToken, the C++ client's OnsChannel). */
    if (!(((h.code == 310 || h.code == 320) && e.names == 1) || (h.code == 10 && e.names == 2)))
        goto plain_none;
    /* send_header's common case over the slots (a..m in the header's field order). */
    for (int i = 0; i < 8; i++)
        if (ext[i] == NULL) goto plain_none;
    static const int ints[] = {3, 4, 5, 7};
    for (int i = 0; i < 4; i++)
        if ((typed[ints[i]] = plain_number(ext[ints[i]], 9)) == NULL) goto none_or_error;
    if ((typed[6] = plain_number(ext[6], 18)) == NULL) goto none_or_error;
    if (ext[9] != NULL && (typed[9] = plain_number(ext[9], 9)) == NULL) goto none_or_error;
    if (ext[10] != NULL && (typed[10] = plain_bool(ext[10])) == NULL) goto none_or_error;
    if (ext[11] != NULL && (typed[11] = plain_number(ext[11], 9)) == NULL) goto none_or_error;
    if (ext[12] != NULL && (typed[12] = plain_bool(ext[12])) == NULL) goto none_or_error;
    /* A batch is SEND_BATCH_MESSAGE with batch "true"; the other mixes are the usual path's. */
    int batch = typed[12] == Py_True;
    if (batch != (h.code == 320)) goto plain_none;
    /* A transaction's half or rollback: the store puts it as a message (the usual path). */
    long long sys_flag = PyLong_AsLongLong(typed[5]);
    if (sys_flag == -1 && PyErr_Occurred()) goto fail;
    if (sys_flag & 0xC) goto plain_none;
    result = tuple_of(10, PyLong_FromLongLong(h.opaque), Py_NewRef(ext[1]), Py_NewRef(typed[4]),
                      Py_NewRef(typed[5]), Py_NewRef(typed[6]), Py_NewRef(typed[7]),
                      Py_NewRef(ext[8] != NULL ? ext[8] : Py_None),
                      Py_NewRef(typed[9] != NULL ? typed[9] : Py_None),
                      PyLong_FromLongLong(header_end), Py_NewRef(batch ? Py_True : Py_False));
    goto done;
none_or_error:
    if (PyErr_Occurred()) goto fail;
plain_none:
    result = Py_NewRef(Py_None);
    goto done;
fail:
    result = NULL;
done:
    for (int i = 0; i < 13; i++) {
        Py_XDECREF(ext[i]);
        Py_XDECREF(typed[i]);
    }
    Py_XDECREF(language);
    return result;
}

static PyObject *py_send_fields(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) return PyErr_Format(PyExc_TypeError, "send_fields takes 3 arguments");
    long long start, end;
    if (arg_int(args[1], "start", 0, PY_SSIZE_T_MAX, &start) < 0 ||
        arg_int(args[2], "end", 0, PY_SSIZE_T_MAX, &end) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = send_fields_at(&view, start, end);
    PyBuffer_Release(&view);
    return result;
}

/* send_run_fields(buf, bounds, first, stop, judge, entries, parsed): send_fields of frames
 * first, first+1, ... of a run (frame i is buf[bounds[2i]:bounds[2i+1]]), each plain single
 * send added to ``entries`` as the tuple SendProcessor._send_singles puts, (topic, queue id,
 * body, properties or "", flag, sys flag, born timestamp, reconsume times or 0), and its fields
 * to ``parsed``, while its topic's queue count (``judge(topic)``, an int, or None to stop;
 * called again only when the topic changes) bounds its queue id.  Returns (i, fields): the
 * first frame not added and its fields, None when it has none or i == stop. */
static PyObject *py_send_run_fields(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) return PyErr_Format(PyExc_TypeError, "send_run_fields takes 7 arguments");
    PyObject *bounds = args[1], *judge = args[4], *entries = args[5], *parsed = args[6];
    if (!PyList_CheckExact(bounds) || !PyCallable_Check(judge) || !PyList_CheckExact(entries) ||
        !PyList_CheckExact(parsed))
        return PyErr_Format(PyExc_TypeError,
                            "send_run_fields: bounds list, judge callable, entries and parsed "
                            "lists");
    long long first, stop;
    if (arg_int(args[2], "first", 0, PY_SSIZE_T_MAX / 2, &first) < 0 ||
        arg_int(args[3], "stop", 0, PY_SSIZE_T_MAX / 2, &stop) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *fields = NULL, *result = NULL, *last = NULL; /* last: the topic judged last */
    long long count = -1;                                  /* its queue count; -1: None */
    long long i = first;
    for (; i < stop; i++) {
        long long start = 0, end = 0;
        /* Checked each time: judge runs Python, which could change the list. */
        if (2 * i + 1 >= PyList_GET_SIZE(bounds)) {
            PyErr_SetString(PyExc_ValueError, "send_run_fields: stop past the bounds");
            goto fail;
        }
        /* Held: an item's __index__ runs Python, which could change the list too. */
        PyObject *start_obj = Py_NewRef(PyList_GET_ITEM(bounds, 2 * i));
        PyObject *end_obj = Py_NewRef(PyList_GET_ITEM(bounds, 2 * i + 1));
        int bad = arg_int(start_obj, "start", 0, PY_SSIZE_T_MAX, &start) < 0 ||
                  arg_int(end_obj, "end", 0, PY_SSIZE_T_MAX, &end) < 0;
        Py_DECREF(start_obj);
        Py_DECREF(end_obj);
        if (bad) goto fail;
        if ((fields = send_fields_at(&view, start, end)) == NULL) goto fail;
        if (fields == Py_None) break;
        /* (opaque, topic, queue_id, sys_flag, born_timestamp, flag, props, reconsume, body_at,
         * batch): send_fields' tuple, its types as built there. */
        if (PyTuple_GET_ITEM(fields, 9) == Py_True) break;
        PyObject *topic = PyTuple_GET_ITEM(fields, 1);
        int same = 0;
        if (last != NULL && (same = PyObject_RichCompareBool(topic, last, Py_EQ)) < 0) goto fail;
        if (!same) {
            PyObject *verdict = PyObject_CallOneArg(judge, topic);
            if (verdict == NULL) goto fail;
            if (verdict == Py_None) {
                count = -1;
            } else {
                count = PyLong_AsLongLong(verdict);
                if (count == -1 && PyErr_Occurred()) {
                    Py_DECREF(verdict);
                    goto fail;
                }
                if (count < 0) count = 0;
            }
            Py_DECREF(verdict);
            Py_XSETREF(last, Py_NewRef(topic));
        }
        long long q = PyLong_AsLongLong(PyTuple_GET_ITEM(fields, 2));
        if (q == -1 && PyErr_Occurred()) goto fail;
        if (count < 0 || q < 0 || q >= count) break;
        long long body_at = PyLong_AsLongLong(PyTuple_GET_ITEM(fields, 8));
        if (body_at == -1 && PyErr_Occurred()) goto fail;
        if (body_at < start || body_at > end || end > view.len) {
            PyErr_SetString(PyExc_ValueError, "send_run_fields: a body outside its frame");
            goto fail;
        }
        PyObject *props = PyTuple_GET_ITEM(fields, 6), *reconsume = PyTuple_GET_ITEM(fields, 7);
        PyObject *body = PyBytes_FromStringAndSize((const char *)view.buf + body_at, end - body_at);
        if (body == NULL) goto fail;
        PyObject *entry = PyTuple_Pack(
            8, topic, PyTuple_GET_ITEM(fields, 2), body, props == Py_None ? empty_str : props,
            PyTuple_GET_ITEM(fields, 5), PyTuple_GET_ITEM(fields, 3), PyTuple_GET_ITEM(fields, 4),
            reconsume == Py_None ? zero_int : reconsume);
        Py_DECREF(body);
        if (entry == NULL) goto fail;
        int rc = PyList_Append(entries, entry);
        Py_DECREF(entry);
        if (rc < 0 || PyList_Append(parsed, fields) < 0) goto fail;
        Py_CLEAR(fields);
    }
    if (i >= stop) {
        Py_XDECREF(fields);
        fields = Py_NewRef(Py_None);
    }
    result = tuple_of(2, PyLong_FromLongLong(i), fields);
    fields = NULL;
fail:
    Py_XDECREF(fields);
    Py_XDECREF(last);
    PyBuffer_Release(&view);
    return result;
}

/* --- send_answer_fields --------------------------------------------------------------------- */

/* The extFields of a send's answer: msgId, queueId, queueOffset and transactionId (strings,
 * each once), any other member skipped. */
typedef struct {
    PyObject *v[4];
    int seen;
} answer_ext;

static const char *const answer_names[4] = {"msgId", "queueId", "queueOffset", "transactionId"};

static int ext_answer(jreader *r, void *ctx) {
    answer_ext *e = ctx;
    if (r->p >= r->end || *r->p != '{') return 0;
    r->p++;
    j_ws(r);
    if (r->p < r->end && *r->p == '}') return 0; /* no field: the usual path */
    for (int more = 1; more;) {
        const unsigned char *k;
        Py_ssize_t kn;
        int rc, slot = -1;
        if (!j_member_name(r, &k, &kn)) return 0;
        for (int i = 0; i < 4; i++)
            if ((size_t)kn == strlen(answer_names[i]) && memcmp(k, answer_names[i], kn) == 0) {
                slot = i;
                break;
            }
        if (slot < 0) {
            /* A timer message's recall handle (RocketMQ 5): the usual path reads it. */
            if ((size_t)kn == 12 && memcmp(k, "recallHandle", 12) == 0) return 0;
            if ((rc = j_skip(r)) <= 0) return rc;
        } else {
            if (e->seen & (1 << slot)) return 0; /* twice: the usual path */
            e->seen |= 1 << slot;
            if (r->p >= r->end || *r->p != '"') return 0; /* not a string: the usual path */
            if ((rc = j_string(r, &e->v[slot])) <= 0) return rc;
        }
        if ((more = j_after_member(r)) < 0) return 0;
    }
    return 1;
}

/*
 * send_answer_fields(buf, start, end) -> (opaque, msg_id, queue_id, queue_offset,
 *                                          transaction_id or None) or None
 *
 * A send's plain successful answer read for the client's raw answer path: the frame
 * buf[start:end] (its length field stripped) with a JSON header (as send_fields reads one),
 * code 0 (SUCCESS), flag 1 (a response), no remark, no body, and extFields with msgId and the
 * plain decimals queueId (at most 9 digits) and queueOffset (at most 18) as strings, which
 * SendMessageResponseHeader.from_ext reads the same; its strings ASCII (escapes included) and
 * every member it skips a plain value, as send_fields reads them.  None for every other frame,
 * which the usual path decodes and answers (errors, FLUSH_DISK_TIMEOUT and the like among them,
 * and a timer message's answer with its recallHandle).
 */
static PyObject *py_send_answer_fields(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) return PyErr_Format(PyExc_TypeError, "send_answer_fields takes 3 arguments");
    long long start, end;
    if (arg_int(args[1], "start", 0, PY_SSIZE_T_MAX, &start) < 0 ||
        arg_int(args[2], "end", 0, PY_SSIZE_T_MAX, &end) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL, *language = NULL, *remark = NULL, *queue_id = NULL, *offset = NULL;
    answer_ext e = {{NULL}, 0};
    jheader h = {0};
    jreader r;
    long long header_end;
    /* The header is the whole frame: an answer with a body is the usual path's. */
    if (!json_frame_header(&view, start, end, &r, &header_end) || header_end != end)
        goto plain_none;
    int rc = j_header(&r, &h, &language, &remark, ext_answer, &e);
    if (rc < 0) goto fail;
    if (rc == 0 || (h.seen & 23) != 23 || h.code != 0 || h.flag != 1 || remark != NULL)
        goto plain_none;
    if (e.v[0] == NULL || e.v[1] == NULL || e.v[2] == NULL) goto plain_none;
    if ((queue_id = plain_number(e.v[1], 9)) == NULL || (offset = plain_number(e.v[2], 18)) == NULL)
        goto none_or_error;
    result = tuple_of(5, PyLong_FromLongLong(h.opaque), Py_NewRef(e.v[0]), Py_NewRef(queue_id),
                      Py_NewRef(offset), Py_NewRef(e.v[3] != NULL ? e.v[3] : Py_None));
    goto done;
none_or_error:
    if (PyErr_Occurred()) goto fail;
plain_none:
    result = Py_NewRef(Py_None);
    goto done;
fail:
    result = NULL;
done:
    for (int i = 0; i < 4; i++) Py_XDECREF(e.v[i]);
    Py_XDECREF(queue_id);
    Py_XDECREF(offset);
    Py_XDECREF(language);
    Py_XDECREF(remark);
    PyBuffer_Release(&view);
    return result;
}


/* ---- fast failure: SYSTEM_BUSY answers to a run of JSON requests, without decoding them ----
 *
 * busy_answers(buf, bounds, first, stop, head, tails, refused) -> (answers, next)
 *
 * For frames first, first+1, ... of buf (bounds: [start, end, ...], each start at the frame's
 * header-length field), while each is a JSON request whose header begins as pymq's and the C++
 * client's writers order it (the regex pymq.remoting.codec.JSON_REQUEST_PREFIX), whose code has
 * a tail bytes in the dict tails, and whose flag has no response bit: append the answer frame
 * (int32 4 + n, int32 n, head, the opaque in decimal, tails[code]; nothing for a oneway) and
 * count the code in the dict refused.  Stops at the first frame it cannot answer so; returns
 * the answers joined and that frame's index.  The Python twin is
 * pymq.remoting.codec.busy_answers_py; tests/unit/test_recordc.py checks they agree.
 */
static int skip_lit(const unsigned char *b, Py_ssize_t *p, Py_ssize_t end, const char *lit) {
    Py_ssize_t n = (Py_ssize_t)strlen(lit);
    if (end - *p < n || memcmp(b + *p, lit, (size_t)n) != 0) return 0;
    *p += n;
    return 1;
}

static int read_num(const unsigned char *b, Py_ssize_t *p, Py_ssize_t end, int neg_ok,
                    long long *out) {
    Py_ssize_t q = *p;
    int neg = 0;
    if (neg_ok && q < end && b[q] == '-') { neg = 1; q++; }
    Py_ssize_t first = q;
    long long v = 0;
    while (q < end && b[q] >= '0' && b[q] <= '9') {
        if (q - first == 10) return 0; /* eleven digits: not the shape (the regex's \d{1,10}) */
        v = v * 10 + (b[q] - '0');
        q++;
    }
    if (q == first) return 0;
    *out = neg ? -v : v;
    *p = q;
    return 1;
}

/* code, opaque, flag of a JSON header in the usual order; 0 when it is not that shape. */
static int json_prefix(const unsigned char *b, Py_ssize_t p, Py_ssize_t end, long long *code,
                       long long *opaque, long long *flag) {
    long long version;
    while (p < end && (b[p] == ' ' || (b[p] >= '\t' && b[p] <= '\r'))) p++;
    if (!skip_lit(b, &p, end, "{\"code\":") || !read_num(b, &p, end, 1, code)) return 0;
    if (!skip_lit(b, &p, end, ",\"language\":\"")) return 0;
    Py_ssize_t name = p;
    while (p < end && ((b[p] >= 'A' && b[p] <= 'Z') || b[p] == '_') && p - name < 16) p++;
    if (p == name) return 0;
    if (!skip_lit(b, &p, end, "\",\"version\":") || !read_num(b, &p, end, 1, &version)) return 0;
    if (!skip_lit(b, &p, end, ",\"opaque\":") || !read_num(b, &p, end, 1, opaque)) return 0;
    if (!skip_lit(b, &p, end, ",\"flag\":") || !read_num(b, &p, end, 0, flag)) return 0;
    return 1;
}

/*
 * frame_bounds(buf, limit)
 *
 * codec.FrameDecoder.feed_frames' walk over the whole frames at the start of buf: each a
 * big-endian int32 length, then that many bytes.  Returns (bounds, pos, bad): bounds the
 * frames' [start, end, ...] without their length fields, pos where the walk stopped (the start
 * of an unfinished frame, or of a bad length), and bad that length when it is outside
 * 4..limit (else None).
 */
static PyObject *py_frame_bounds(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) return PyErr_Format(PyExc_TypeError, "frame_bounds takes 2 arguments");
    long long limit;
    if (arg_int(args[1], "limit", LLONG_MIN, LLONG_MAX, &limit) < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *b = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len, pos = 0;
    PyObject *bounds = PyList_New(0), *bad = NULL, *result = NULL;
    if (bounds == NULL) goto done;
    while (n - pos >= 4) {
        int32_t length = (int32_t)get32(b + pos);
        if (length < 4 || length > limit) {
            bad = PyLong_FromLong((long)length);
            if (bad == NULL) goto done;
            break;
        }
        Py_ssize_t end = pos + 4 + (Py_ssize_t)length;
        if (end > n) break;
        PyObject *start_obj = PyLong_FromSsize_t(pos + 4);
        if (start_obj == NULL) goto done;
        int failed = PyList_Append(bounds, start_obj);
        Py_DECREF(start_obj);
        if (failed < 0) goto done;
        PyObject *end_obj = PyLong_FromSsize_t(end);
        if (end_obj == NULL) goto done;
        failed = PyList_Append(bounds, end_obj);
        Py_DECREF(end_obj);
        if (failed < 0) goto done;
        pos = end;
    }
    result = tuple_of(3, Py_NewRef(bounds), PyLong_FromSsize_t(pos),
                      Py_NewRef(bad != NULL ? bad : Py_None));
done:
    Py_XDECREF(bounds);
    Py_XDECREF(bad);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *py_busy_answers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "busy_answers takes 7 arguments");
        return NULL;
    }
    PyObject *bounds = args[1], *head = args[4], *tails = args[5], *refused = args[6];
    if (!PyList_Check(bounds) || !PyBytes_Check(head) || !PyDict_Check(tails) ||
        !PyDict_Check(refused)) {
        PyErr_SetString(PyExc_TypeError, "busy_answers: bad argument types");
        return NULL;
    }
    Py_ssize_t first = PyLong_AsSsize_t(args[2]), stop = PyLong_AsSsize_t(args[3]);
    if ((first == -1 || stop == -1) && PyErr_Occurred()) return NULL;
    if (first < 0 || stop < first || 2 * stop > PyList_GET_SIZE(bounds)) {
        PyErr_SetString(PyExc_ValueError, "busy_answers: frames out of the bounds list");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *b = (const unsigned char *)view.buf;
    const char *hd = PyBytes_AS_STRING(head);
    Py_ssize_t hlen = PyBytes_GET_SIZE(head);
    char *out = NULL;
    Py_ssize_t used = 0, cap = 0, i = first;
    PyObject *result = NULL;
    for (; i < stop; i++) {
        Py_ssize_t start = PyLong_AsSsize_t(PyList_GET_ITEM(bounds, 2 * i));
        Py_ssize_t end = PyLong_AsSsize_t(PyList_GET_ITEM(bounds, 2 * i + 1));
        if ((start == -1 || end == -1) && PyErr_Occurred()) goto done;
        if (start < 0 || end > view.len || end - start < 4) break;
        uint32_t field = ((uint32_t)b[start] << 24) | ((uint32_t)b[start + 1] << 16) |
                         ((uint32_t)b[start + 2] << 8) | (uint32_t)b[start + 3];
        if (field >> 24) break; /* not JSON */
        Py_ssize_t header_end = start + 4 + (Py_ssize_t)field;
        if (header_end > end) header_end = end;
        long long code, opaque, flag;
        if (!json_prefix(b, start + 4, header_end, &code, &opaque, &flag)) break;
        if (flag & 1) break; /* a response */
        PyObject *key = PyLong_FromLongLong(code);
        if (key == NULL) goto done;
        PyObject *tail = PyDict_GetItemWithError(tails, key); /* borrowed */
        if (tail == NULL || tail == Py_None || !PyBytes_Check(tail)) {
            Py_DECREF(key);
            if (PyErr_Occurred()) goto done;
            break;
        }
        PyObject *count = PyDict_GetItemWithError(refused, key);
        long long n = 0;
        if (count == NULL && PyErr_Occurred()) { Py_DECREF(key); goto done; }
        if (count != NULL) {
            n = PyLong_AsLongLong(count);
            if (n == -1 && PyErr_Occurred()) { Py_DECREF(key); goto done; }
        }
        PyObject *next = PyLong_FromLongLong(n + 1);
        if (next == NULL || PyDict_SetItem(refused, key, next) < 0) {
            Py_XDECREF(next);
            Py_DECREF(key);
            goto done;
        }
        Py_DECREF(next);
        Py_DECREF(key);
        if (flag & 2) continue; /* oneway: counted, not answered */
        char digits[24];
        int dlen = fmt_ll(digits, opaque);
        Py_ssize_t tlen = PyBytes_GET_SIZE(tail);
        Py_ssize_t header = hlen + dlen + tlen, need = 8 + header;
        if (used + need > cap) {
            Py_ssize_t grow = cap ? cap * 2 : 4096;
            while (grow < used + need) grow *= 2;
            char *bigger = PyMem_Realloc(out, (size_t)grow);
            if (bigger == NULL) { PyErr_NoMemory(); goto done; }
            out = bigger;
            cap = grow;
        }
        uint32_t total = (uint32_t)(4 + header), hl = (uint32_t)header;
        unsigned char *o = (unsigned char *)out + used;
        o[0] = total >> 24; o[1] = total >> 16; o[2] = total >> 8; o[3] = total;
        o[4] = hl >> 24; o[5] = hl >> 16; o[6] = hl >> 8; o[7] = hl;
        memcpy(o + 8, hd, (size_t)hlen);
        memcpy(o + 8 + hlen, digits, (size_t)dlen);
        memcpy(o + 8 + hlen + dlen, PyBytes_AS_STRING(tail), (size_t)tlen);
        used += need;
    }
    result = Py_BuildValue("(y#n)", out ? out : "", used, i);
done:
    PyMem_Free(out);
    PyBuffer_Release(&view);
    return result;
}


static PyMethodDef methods[] = {
    {"json_command", (PyCFunction)(void (*)(void))py_json_command, METH_FASTCALL,
     "json_command(header, cls, serialize_type): the plain JSON header dict as cls(...), or None"
     " (remoting.codec._decode_json_header's first case)."},
    {"json_header", (PyCFunction)(void (*)(void))py_json_header, METH_FASTCALL,
     "json_header(buf, start, end, cls, serialize_type): the plain JSON header at"
     " buf[start:end] as cls(...), read without a dict, or None (json_command's case)."},
    {"send_run_fields", (PyCFunction)(void (*)(void))py_send_run_fields, METH_FASTCALL,
     "send_run_fields(buf, bounds, first, stop, judge, entries, parsed): the leading plain "
     "single sends of a run whose queue ids judge(topic)'s queue count bounds, added to entries "
     "and parsed; (first frame not added, its fields or None)."},
    {"send_fields", (PyCFunction)(void (*)(void))py_send_fields, METH_FASTCALL,
     "send_fields(buf, start, end): a plain single send's or batch's frame's fields for the"
     " broker's raw send path, or None."},
    {"send_answer_fields", (PyCFunction)(void (*)(void))py_send_answer_fields, METH_FASTCALL,
     "send_answer_fields(buf, start, end): a send's plain successful answer's fields for the"
     " client's raw answer path, or None."},
    {"send_header", (PyCFunction)(void (*)(void))py_send_header, METH_FASTCALL,
     "send_header(ext, names, cls, batch_code): SendMessageRequestHeader.from_ext's common"
     " case as cls(...), or None."},
    {"plain_header", (PyCFunction)(void (*)(void))py_plain_header, METH_FASTCALL,
     "plain_header(ext, spec, cls): a typed header's common case from its extFields as"
     " cls(*values), or None."},
    {"frame_bounds", (PyCFunction)(void (*)(void))py_frame_bounds, METH_FASTCALL,
     "frame_bounds(buf, limit): the whole frames at the start of buf, as feed_frames walks"
     " them; (bounds, pos, bad length or None)."},
    {"busy_answers", (PyCFunction)(void (*)(void))py_busy_answers, METH_FASTCALL,
     "busy_answers(buf, bounds, first, stop, head, tails, refused): SYSTEM_BUSY answers to a"
     " run of JSON requests, without decoding them; returns (answers, next index)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pymq.remoting._codecc", "pymq.remoting._codecc: remoting frames and JSON request headers read without a general JSON decoder.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__codecc(void) {
    if (pymq_native_init() < 0) return NULL;
    return PyModule_Create(&module);
}
