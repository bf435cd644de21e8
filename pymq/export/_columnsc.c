/*
 * pymq.export._columnsc: Arrow columns of a run of commit-log records.
 *
 * An optional accelerator, picked once at import by pymq.common.native.load_native when it was
 * built (setup.py) and PYMQ_PURE_PYTHON is not set; else a function's Python twin (same
 * signature; tests/unit/test_twins.py) or, without one, the Python module's general path.
 */
#include "../common/_native.h"

/* --- export_columns ------------------------------------------------------------------------ */

/*
 * export_columns(buf, pos, stop, physical_base, stop_timestamp, max_rows, max_body_bytes,
 *                inflate, host6) -> (pos, rows, record_bytes, body_bytes, buffers)
 *
 * The Spark export's decoder: the run of records starting at buf[pos:] turned into Arrow column
 * buffers (little-endian int32 offsets, LSB-first validity bitmaps) for pymq.export.columns,
 * with no Python object per row.  Each record must be valid as message.decode_record judges it
 * (CRC checked, PHYSICALOFFSET = physical_base + its position, UTF-8 topic and properties
 * without NUL) and start before ``stop``.  A compressed body is replaced by what
 * inflate(stored_body, physical_offset) returns (bytes), an IPv6 host's text is what
 * host6(ip_bytes, port) returns (bytes).  The run ends, without consuming the record, at the
 * first one that is not so, is compressed while inflate is None, has an IPv6 host while host6
 * is None, was stored after stop_timestamp (None: no bound), has a timestamp the microsecond
 * columns cannot hold, has more than EXPORT_MAX_ITEMS properties, or would take the rows past
 * max_rows or (after the first row) the bodies past max_body_bytes: the caller's careful
 * per-record path judges that one.  ``buffers`` is a tuple in the order of EXPORT_BUFFER_NAMES in pymq/export/columns.py.
 */

#define COMPRESSED_FLAG 0x1
#define EXPORT_MAX_ITEMS 256
#define EXPORT_MAX_ROWS (1 << 20)
#define EXPORT_MAX_BODY (1LL << 30)

enum {
    B_TOPIC_OFF, B_TOPIC, B_QUEUE_ID, B_QUEUE_OFFSET, B_PHY, B_MSGID_OFF, B_MSGID,
    B_UNIQ_VALID, B_UNIQ_OFF, B_UNIQ, B_TAGS_VALID, B_TAGS_OFF, B_TAGS, B_KEYS_LIST_OFF,
    B_KEYS_OFF, B_KEYS, B_FLAG, B_BORN_TS, B_BORN_HOST_OFF, B_BORN_HOST, B_STORE_TS,
    B_STORE_HOST_OFF, B_STORE_HOST, B_RECONSUME, B_SYS_FLAG, B_PROPS_OFF, B_PKEY_OFF, B_PKEY,
    B_PVAL_OFF, B_PVAL, B_BODY_OFF, B_SIZES, B_COUNT
};

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} gbuf;

static int gbuf_reserve(gbuf *g, Py_ssize_t extra) {
    if (extra > PY_SSIZE_T_MAX / 2 - g->len) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t need = g->len + extra;
    if (need <= g->cap) return 0;
    Py_ssize_t cap = g->cap ? g->cap : 1024;
    while (cap < need) cap *= 2;
    char *p = PyMem_Realloc(g->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    g->p = p;
    g->cap = cap;
    return 0;
}

static int gbuf_put(gbuf *g, const void *src, Py_ssize_t n) {
    if (gbuf_reserve(g, n) < 0) return -1;
    if (n) memcpy(g->p + g->len, src, (size_t)n);
    g->len += n;
    return 0;
}

static inline int gbuf_i32(gbuf *g, int32_t v) { return gbuf_put(g, &v, 4); }
static inline int gbuf_i64(gbuf *g, int64_t v) { return gbuf_put(g, &v, 8); }
static inline int gbuf_u8(gbuf *g, unsigned char v) { return gbuf_put(g, &v, 1); }

/* The next int32 offset of a variable-length column: its data's length so far. */
static inline int gbuf_end(gbuf *off, const gbuf *data) {
    if (data->len > I32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "export batch column over 2 GiB");
        return -1;
    }
    return gbuf_i32(off, (int32_t)data->len);
}

/* Strict UTF-8 as Python's decoder accepts it (no overlongs, surrogates or values past
 * U+10FFFF), and no NUL byte. */
static int utf8_text(const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x80) {
            if (c == 0) return 0;
            i++;
        } else if (c < 0xC2) {
            return 0;
        } else if (c < 0xE0) {
            if (n - i < 2 || (p[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c < 0xF0) {
            if (n - i < 3 || (p[i + 1] & 0xC0) != 0x80 || (p[i + 2] & 0xC0) != 0x80) return 0;
            if ((c == 0xE0 && p[i + 1] < 0xA0) || (c == 0xED && p[i + 1] >= 0xA0)) return 0;
            i += 3;
        } else if (c < 0xF5) {
            if (n - i < 4 || (p[i + 1] & 0xC0) != 0x80 || (p[i + 2] & 0xC0) != 0x80 ||
                (p[i + 3] & 0xC0) != 0x80)
                return 0;
            if ((c == 0xF0 && p[i + 1] < 0x90) || (c == 0xF4 && p[i + 1] >= 0x90)) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* Where a record's fields sit after the born host: IPv4 or IPv6 hosts, per the sys flag. */
typedef struct {
    int born_len, store_len;
    int64_t store_ts, store_host, reconsume, body_len, header;
} record_layout;

static void layout_of(int32_t sys_flag, record_layout *l) {
    l->born_len = (sys_flag & BORNHOST_V6) ? 16 : 4;
    l->store_len = (sys_flag & STOREHOST_V6) ? 16 : 4;
    l->store_ts = 48 + l->born_len + 4;
    l->store_host = l->store_ts + 8;
    l->reconsume = l->store_host + l->store_len + 4;
    l->body_len = l->reconsume + 4 + 8; /* after PREPAREDTRANSACTIONOFFSET */
    l->header = l->body_len + 4;
}

/* The size of the valid record at b[pos:limit] (decode_record's checks, CRC included), or 0
 * when the careful parser must judge it (also for IPv6 hosts unless allow_v6). */
static int64_t export_record(const unsigned char *b, long long pos, long long limit,
                             long long base, int allow_v6, record_layout *l) {
    if (limit - pos < V4_HEADER) return 0;
    const unsigned char *r = b + pos;
    int64_t total = (int32_t)get32(r);
    if (get32(r + 4) != MESSAGE_MAGIC) return 0;
    int32_t sys_flag = (int32_t)get32(r + 36);
    if (!allow_v6 && (sys_flag & (BORNHOST_V6 | STOREHOST_V6))) return 0;
    layout_of(sys_flag, l);
    if (total < V4_HEADER + 3 || total > limit - pos || l->header + 3 > total) return 0;
    long long want;
    if (__builtin_add_overflow(base, pos, &want) || get64(r + 28) != want) return 0;
    int64_t body_len = (int32_t)get32(r + l->body_len);
    if (body_len < 0 || l->header + body_len + 3 > total) return 0;
    int64_t q = l->header + body_len;
    int64_t topic_len = r[q];
    int64_t t1 = q + 1 + topic_len;
    if (topic_len > MAX_TOPIC || t1 + 2 > total) return 0;
    int64_t props_len = (int16_t)((uint16_t)r[t1] << 8 | r[t1 + 1]);
    if (props_len < 0 || t1 + 2 + props_len != total) return 0;
    if (!utf8_text(r + q + 1, topic_len) || !utf8_text(r + t1 + 2, props_len)) return 0;
    if (body_len && (crc_update(0, r + l->header, body_len) & 0x7FFFFFFFu) != get32(r + 8))
        return 0;
    return total;
}

typedef struct {
    const unsigned char *name, *value;
    Py_ssize_t name_len, value_len;
} prop_item;

/* message_ext.decode_properties into items: ``name\x01value`` separated by \x02, an item kept
 * only when name and value are non-empty, a repeated name keeping its first place and its last
 * value (a dict's behaviour).  Returns the item count, or -1 when there are more than max. */
static int parse_items(const unsigned char *p, Py_ssize_t n, prop_item *items, int max) {
    int count = 0;
    const unsigned char *end = p + n;
    if (n == 0) return 0;
    for (;;) {
        const unsigned char *e = memchr(p, 0x02, (size_t)(end - p));
        if (e == NULL) e = end;
        const unsigned char *s = memchr(p, 0x01, (size_t)(e - p));
        if (s != NULL && s > p && s + 1 < e) {
            Py_ssize_t name_len = s - p;
            int j;
            for (j = 0; j < count; j++)
                if (items[j].name_len == name_len && memcmp(items[j].name, p, name_len) == 0)
                    break;
            if (j == count) {
                if (count == max) return -1;
                items[count].name = p;
                items[count].name_len = name_len;
                count++;
            }
            items[j].value = s + 1;
            items[j].value_len = e - (s + 1);
        }
        if (e == end) break;
        p = e + 1;
    }
    return count;
}

static const prop_item *find_item(const prop_item *items, int count, const char *name) {
    Py_ssize_t n = (Py_ssize_t)strlen(name);
    for (int j = 0; j < count; j++)
        if (items[j].name_len == n && memcmp(items[j].name, name, n) == 0) return &items[j];
    return NULL;
}

/* A nullable string column's row: the value, or a null (validity 0, empty slot). */
static int put_nullable(gbuf *valid, gbuf *off, gbuf *data, const prop_item *item) {
    if (item != NULL && gbuf_put(data, item->value, item->value_len) < 0) return -1;
    if (gbuf_u8(valid, item != NULL) < 0) return -1;
    return gbuf_end(off, data);
}

/* Decimal digits of v at w; returns how many. */
static int put_decimal(char *w, long long v) {
    char tmp[24];
    int n = 0, len = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) w[len++] = '-';
    while (n) w[len++] = tmp[--n];
    return len;
}

/* A host column's last value: hosts repeat (one per producer connection, one per broker), so
 * the text is made once per change: str(IPv4Address) + ":" + str(port) here, an IPv6 host's by
 * host6(ip_bytes, port) -> bytes (Python's ipaddress has the final word on IPv6 text). */
typedef struct {
    int valid, len, key_len;
    unsigned char key[20];
    char text[64];
} host_text;

static int put_host(gbuf *off, gbuf *data, const unsigned char *h, int ip_len, host_text *last,
                    PyObject *host6) {
    int key_len = ip_len + 4;
    if (!last->valid || last->key_len != key_len || memcmp(last->key, h, key_len) != 0) {
        last->valid = 0;
        if (ip_len == 4) {
            char *w = last->text;
            for (int i = 0; i < 4; i++) {
                w += put_decimal(w, h[i]);
                *w++ = i < 3 ? '.' : ':';
            }
            w += put_decimal(w, (int32_t)get32(h + 4));
            last->len = (int)(w - last->text);
        } else {
            PyObject *text = PyObject_CallFunction(host6, "y#l", (const char *)h,
                                                   (Py_ssize_t)ip_len, (long)(int32_t)get32(h + ip_len));
            if (text == NULL) return -1;
            if (!PyBytes_Check(text) || PyBytes_GET_SIZE(text) >= (Py_ssize_t)sizeof last->text) {
                Py_DECREF(text);
                PyErr_SetString(PyExc_ValueError, "export_columns: host6 must return short bytes");
                return -1;
            }
            last->len = (int)PyBytes_GET_SIZE(text);
            memcpy(last->text, PyBytes_AS_STRING(text), (size_t)last->len);
            Py_DECREF(text);
        }
        memcpy(last->key, h, key_len);
        last->key_len = key_len;
        last->valid = 1;
    }
    if (gbuf_put(data, last->text, last->len) < 0) return -1;
    return gbuf_end(off, data);
}

static int put_hex(gbuf *data, const unsigned char *p, int64_t n) {
    static const char digits[] = "0123456789ABCDEF";
    if (gbuf_reserve(data, 2 * n) < 0) return -1;
    char *w = data->p + data->len;
    for (int64_t i = 0; i < n; i++) {
        w[2 * i] = digits[p[i] >> 4];
        w[2 * i + 1] = digits[p[i] & 15];
    }
    data->len += 2 * n;
    return 0;
}

/* Byte-per-row validity (0 or 1) packed into an Arrow bitmap, as bytes. */
static PyObject *pack_bitmap(const gbuf *g) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, (g->len + 7) / 8);
    if (out == NULL) return NULL;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    memset(w, 0, (size_t)((g->len + 7) / 8));
    for (Py_ssize_t i = 0; i < g->len; i++)
        if (g->p[i]) w[i >> 3] |= (unsigned char)(1u << (i & 7));
    return out;
}

#define TS_LIMIT (LLONG_MAX / 1000)


static PyObject *py_export_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_Format(PyExc_TypeError, "export_columns takes 9 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *inflate = args[7] == Py_None ? NULL : args[7], *inflated = NULL;
    PyObject *host6 = args[8] == Py_None ? NULL : args[8];
    long long pos, stop, base, stop_ts = 0, max_rows, max_body;
    if (arg_int(args[1], "pos", 0, PY_SSIZE_T_MAX, &pos) < 0 ||
        arg_int(args[2], "stop", 0, PY_SSIZE_T_MAX, &stop) < 0 ||
        arg_int(args[3], "physical_base", LLONG_MIN, LLONG_MAX, &base) < 0 ||
        arg_int(args[5], "max_rows", 1, EXPORT_MAX_ROWS, &max_rows) < 0 ||
        arg_int(args[6], "max_body_bytes", 1, EXPORT_MAX_BODY, &max_body) < 0)
        return NULL;
    int has_stop_ts = args[4] != Py_None;
    if (has_stop_ts && arg_int(args[4], "stop_timestamp", LLONG_MIN, LLONG_MAX, &stop_ts) < 0)
        return NULL;
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *b = buf.buf;
    long long limit = buf.len;
    gbuf g[B_COUNT];
    memset(g, 0, sizeof g);
    PyObject *body = NULL, *result = NULL;
    Py_ssize_t body_len_total = 0, body_cap = 0;
    long long rows = 0, record_bytes = 0;
    prop_item items[EXPORT_MAX_ITEMS];
    host_text born_host = {0}, store_host = {0};

    /* Offsets columns start with 0. */
    if (gbuf_i32(&g[B_TOPIC_OFF], 0) < 0 || gbuf_i32(&g[B_MSGID_OFF], 0) < 0 ||
        gbuf_i32(&g[B_UNIQ_OFF], 0) < 0 || gbuf_i32(&g[B_TAGS_OFF], 0) < 0 ||
        gbuf_i32(&g[B_KEYS_LIST_OFF], 0) < 0 || gbuf_i32(&g[B_KEYS_OFF], 0) < 0 ||
        gbuf_i32(&g[B_BORN_HOST_OFF], 0) < 0 || gbuf_i32(&g[B_STORE_HOST_OFF], 0) < 0 ||
        gbuf_i32(&g[B_PROPS_OFF], 0) < 0 || gbuf_i32(&g[B_PKEY_OFF], 0) < 0 ||
        gbuf_i32(&g[B_PVAL_OFF], 0) < 0 || gbuf_i32(&g[B_BODY_OFF], 0) < 0)
        goto done;
    body_cap = 1 << 16;
    body = PyByteArray_FromStringAndSize(NULL, body_cap);
    if (body == NULL) goto done;
    if (stop > limit) stop = limit;
    while (pos < stop && rows < max_rows) {
        record_layout l;
        int64_t total = export_record(b, pos, limit, base, host6 != NULL, &l);
        if (total <= 0) break;
        const unsigned char *r = b + pos;
        int32_t sys_flag = (int32_t)get32(r + 36);
        int64_t born_ts = get64(r + 40), store_ts = get64(r + l.store_ts);
        if ((sys_flag & COMPRESSED_FLAG) && inflate == NULL) break;
        if (has_stop_ts && store_ts > stop_ts) break;
        if (born_ts > TS_LIMIT || born_ts < -TS_LIMIT || store_ts > TS_LIMIT ||
            store_ts < -TS_LIMIT)
            break;
        int64_t stored_len = (int32_t)get32(r + l.body_len), body_len = stored_len;
        const unsigned char *body_src = r + l.header;
        Py_CLEAR(inflated);
        if (sys_flag & COMPRESSED_FLAG) {
            inflated = PyObject_CallFunction(inflate, "y#L", (const char *)body_src,
                                             (Py_ssize_t)stored_len, (long long)get64(r + 28));
            if (inflated == NULL) goto done;
            if (!PyBytes_Check(inflated)) {
                PyErr_SetString(PyExc_TypeError, "export_columns: inflate must return bytes");
                goto done;
            }
            body_src = (const unsigned char *)PyBytes_AS_STRING(inflated);
            body_len = PyBytes_GET_SIZE(inflated);
        }
        if (rows > 0 && body_len_total + body_len > max_body) break;
        if (body_len_total + body_len > I32_MAX) break; /* int32 offsets: left to the caller */
        int64_t q = l.header + stored_len;
        int64_t topic_len = r[q];
        int64_t t1 = q + 1 + topic_len;
        int64_t props_len = total - t1 - 2;
        int count = parse_items(r + t1 + 2, props_len, items, EXPORT_MAX_ITEMS);
        if (count < 0) break;

        /* The body first: its buffer is the one that can be large. */
        if (body_len_total + body_len > body_cap) {
            Py_ssize_t cap = body_cap;
            while (cap < body_len_total + body_len) cap *= 2;
            if (PyByteArray_Resize(body, cap) < 0) goto done;
            body_cap = cap;
        }
        if (body_len)
            memcpy(PyByteArray_AS_STRING(body) + body_len_total, body_src, (size_t)body_len);
        body_len_total += body_len;
        if (gbuf_i32(&g[B_BODY_OFF], (int32_t)body_len_total) < 0) goto done;

        if (gbuf_put(&g[B_TOPIC], r + q + 1, topic_len) < 0 ||
            gbuf_end(&g[B_TOPIC_OFF], &g[B_TOPIC]) < 0 ||
            gbuf_i32(&g[B_QUEUE_ID], (int32_t)get32(r + 12)) < 0 ||
            gbuf_i64(&g[B_QUEUE_OFFSET], get64(r + 20)) < 0 ||
            gbuf_i64(&g[B_PHY], get64(r + 28)) < 0 || put_hex(&g[B_MSGID], r + l.store_host, l.store_len + 4) < 0 ||
            put_hex(&g[B_MSGID], r + 28, 8) < 0 || gbuf_end(&g[B_MSGID_OFF], &g[B_MSGID]) < 0 ||
            put_nullable(&g[B_UNIQ_VALID], &g[B_UNIQ_OFF], &g[B_UNIQ],
                         find_item(items, count, "UNIQ_KEY")) < 0 ||
            put_nullable(&g[B_TAGS_VALID], &g[B_TAGS_OFF], &g[B_TAGS],
                         find_item(items, count, "TAGS")) < 0)
            goto done;
        const prop_item *keys = find_item(items, count, "KEYS");
        if (keys != NULL) { /* split on spaces, empty pieces dropped */
            const unsigned char *k = keys->value, *kend = keys->value + keys->value_len;
            while (k < kend) {
                const unsigned char *sp = memchr(k, ' ', (size_t)(kend - k));
                if (sp == NULL) sp = kend;
                if (sp > k && (gbuf_put(&g[B_KEYS], k, sp - k) < 0 ||
                               gbuf_end(&g[B_KEYS_OFF], &g[B_KEYS]) < 0))
                    goto done;
                k = sp + 1;
            }
        }
        if (gbuf_i32(&g[B_KEYS_LIST_OFF], (int32_t)(g[B_KEYS_OFF].len / 4 - 1)) < 0 ||
            gbuf_i32(&g[B_FLAG], (int32_t)get32(r + 16)) < 0 ||
            gbuf_i64(&g[B_BORN_TS], born_ts * 1000) < 0 ||
            put_host(&g[B_BORN_HOST_OFF], &g[B_BORN_HOST], r + 48, l.born_len, &born_host,
                     host6) < 0 ||
            gbuf_i64(&g[B_STORE_TS], store_ts * 1000) < 0 ||
            put_host(&g[B_STORE_HOST_OFF], &g[B_STORE_HOST], r + l.store_host, l.store_len,
                     &store_host, host6) < 0 ||
            gbuf_i32(&g[B_RECONSUME], (int32_t)get32(r + l.reconsume)) < 0 ||
            gbuf_i32(&g[B_SYS_FLAG], sys_flag) < 0)
            goto done;
        for (int j = 0; j < count; j++) {
            if (gbuf_put(&g[B_PKEY], items[j].name, items[j].name_len) < 0 ||
                gbuf_end(&g[B_PKEY_OFF], &g[B_PKEY]) < 0 ||
                gbuf_put(&g[B_PVAL], items[j].value, items[j].value_len) < 0 ||
                gbuf_end(&g[B_PVAL_OFF], &g[B_PVAL]) < 0)
                goto done;
        }
        if (gbuf_i32(&g[B_PROPS_OFF], (int32_t)(g[B_PKEY_OFF].len / 4 - 1)) < 0 ||
            gbuf_i32(&g[B_SIZES], (int32_t)total) < 0)
            goto done;
        record_bytes += total;
        rows++;
        pos += total;
    }
    if (PyByteArray_Resize(body, body_len_total) < 0) goto done;
    PyObject *buffers = PyTuple_New(B_COUNT + 1);
    if (buffers == NULL) goto done;
    for (int i = 0; i < B_COUNT; i++) {
        PyObject *item = (i == B_UNIQ_VALID || i == B_TAGS_VALID)
                             ? pack_bitmap(&g[i])
                             : PyBytes_FromStringAndSize(g[i].p ? g[i].p : "", g[i].len);
        if (item == NULL) {
            Py_DECREF(buffers);
            goto done;
        }
        PyTuple_SET_ITEM(buffers, i, item);
    }
    Py_INCREF(body);
    PyTuple_SET_ITEM(buffers, B_COUNT, body);
    result = Py_BuildValue("(LLLnN)", pos, rows, record_bytes, body_len_total, buffers);
done:
    for (int i = 0; i < B_COUNT; i++) PyMem_Free(g[i].p);
    Py_XDECREF(inflated);
    Py_XDECREF(body);
    PyBuffer_Release(&buf);
    return result;
}


static PyMethodDef methods[] = {
    {"export_columns", (PyCFunction)(void (*)(void))py_export_columns, METH_FASTCALL,
     "export_columns(buf, pos, stop, physical_base, stop_timestamp, max_rows, max_body_bytes,"
     " inflate, host6):"
     " a run of valid records as Arrow column buffers; returns (pos, rows, record_bytes,"
     " body_bytes, buffers)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pymq.export._columnsc", "pymq.export._columnsc: Arrow columns of a run of commit-log records.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__columnsc(void) {
    if (pymq_native_init() < 0) return NULL;
    return PyModule_Create(&module);
}
