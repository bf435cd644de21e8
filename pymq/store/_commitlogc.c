/*
 * pymq.store._commitlogc: the commit log's record encoder (encode_run), page population and the fdatasync thread.
 *
 * An optional accelerator, picked once at import by pymq.common.native.load_native when it was
 * built (setup.py) and PYMQ_PURE_PYTHON is not set; else a function's Python twin (same
 * signature; tests/unit/test_twins.py) or, without one, the Python module's general path.
 */
#include "../common/_native.h"

/* --- encode_run: the one record encoder ------------------------------------------------------ */

/* The items of one message's properties, as message_ext.decode_properties reads them. */
typedef struct {
    const unsigned char *name, *value;
    Py_ssize_t name_len, value_len;
} batch_prop;

#define BATCH_PROPS_MAX 32
#define TRANSACTION_PREPARED 0x4 /* MessageSysFlag: set in PREPARED (0x4) and ROLLBACK (0xC) */


/* The properties [p, p + n) split as decode_properties splits them (items without a name or a
 * value skipped); -1 when the fast path must leave them to the Python code: a byte that is
 * NUL or not ASCII (which UTF-8 decoding might change), more than BATCH_PROPS_MAX items, or a
 * name given twice. */
static int split_plain_properties(const unsigned char *p, Py_ssize_t n, batch_prop *items) {
    int k = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] == 0 || p[i] >= 0x80) return -1;
    Py_ssize_t start = 0;
    while (n > 0 && start <= n) {
        Py_ssize_t end = start, sep = -1;
        while (end < n && p[end] != 2) {
            if (p[end] == 1 && sep < 0) sep = end;
            end++;
        }
        if (sep > start && end > sep + 1) {
            if (k == BATCH_PROPS_MAX) return -1;
            batch_prop it = {p + start, p + sep + 1, sep - start, end - sep - 1};
            for (int j = 0; j < k; j++)
                if (items[j].name_len == it.name_len && !memcmp(items[j].name, it.name, it.name_len))
                    return -1;
            items[k++] = it;
        }
        start = end + 1;
    }
    return k;
}

/* A property's value as a str: a send's are ASCII; a stored message's bytes that are no UTF-8
 * read with U+FFFD. */
static PyObject *item_value(const batch_prop *it) {
    if (it == NULL) Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8((const char *)it->value, it->value_len, "replace");
}

/* What every record of one fast put shares. */
typedef struct {
    const unsigned char *topic, *cluster, *born_ip, *store_ip;
    Py_ssize_t topic_len, cluster_len;
    long long queue_id, sys_flag, born_ts, born_port, store_ts, store_port, reconsume, max_bp;
    int single; /* a single send: any DELAY or TRAN_MSG goes to Python (delays, half messages) */
} fast_put;

/* The properties a stored record names (NULL when absent). */
typedef struct {
    const batch_prop *tags, *keys, *uniq, *wait;
} stored_names;

/* The first nine fields of a record, which every writer below shares (bytes 0-47):
 * TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG and
 * BORNTIMESTAMP. */
static inline void put_record_head(unsigned char *p, long long size, const fast_put *fp,
                                   const unsigned char *body, Py_ssize_t body_len, int32_t flag,
                                   long long queue_offset, long long phy) {
    put32(p, (uint32_t)size);
    put32(p + 4, MESSAGE_MAGIC);
    put32(p + 8, crc_update(0, body, body_len) & 0x7FFFFFFFu);
    put32(p + 12, (uint32_t)fp->queue_id);
    put32(p + 16, (uint32_t)flag);
    put64(p + 20, (uint64_t)queue_offset);
    put64(p + 28, (uint64_t)phy);
    put32(p + 36, (uint32_t)fp->sys_flag);
    put64(p + 40, (uint64_t)fp->born_ts);
}

/* encode_run's entry_header: each record as the body of a DLedger 0.2.6 entry of its own, after
 * its 48-byte header (pymq.dledger.store: magic 1, size, index, term, pos, channel 0, chain CRC
 * 0, body CRC 0, body length), the entries' indexes consecutive from index. */
#define ENTRY_HEADER 48
typedef struct {
    long long index, term;
} entry_header;

static inline void put_entry_header(unsigned char *p, long long record_size,
                                    const entry_header *eh, long long index, long long pos) {
    put32(p, 1);
    put32(p + 4, (uint32_t)(ENTRY_HEADER + record_size));
    put64(p + 8, (uint64_t)index);
    put64(p + 16, (uint64_t)eh->term);
    put64(p + 24, (uint64_t)pos);
    put32(p + 32, 0);
    put32(p + 36, 0);
    put32(p + 40, 0);
    put32(p + 44, (uint32_t)record_size);
}

/* Write at p (room bytes left) the record the Python path stores for a message with this body,
 * flag and properties: its properties as the broker stores them (WAIT=true left out, CLUSTER
 * added last), the rest from fp.  Returns the record's size, or -1 (nothing to undo: bytes past
 * the write position are junk) when the Python path must judge the message: see
 * split_plain_properties, an own CLUSTER, a DELAY other than "0" (any DELAY or a TRAN_MSG for a
 * single send), any TIMER_ property, a body and properties over max_bp, or no room.  items holds the split
 * properties afterwards, which names points into. */
static long long write_stored_record(unsigned char *p, long long room, const fast_put *fp,
                                     const unsigned char *body, Py_ssize_t body_len, int32_t flag,
                                     const unsigned char *props, Py_ssize_t props_len,
                                     long long queue_offset, long long phy, batch_prop *items,
                                     stored_names *names) {
    int k = split_plain_properties(props, props_len, items);
    if (k < 0) return -1;
    stored_names found = {NULL, NULL, NULL, NULL};
    int skip = -1;
    long long out_len = 0;
    for (int j = 0; j < k; j++) {
        const batch_prop *it = &items[j];
        if (bytes_is(it->name, it->name_len, "CLUSTER")) return -1;
        if (bytes_is(it->name, it->name_len, "DELAY") &&
            (fp->single || !bytes_is(it->value, it->value_len, "0")))
            return -1;
        if (fp->single && bytes_is(it->name, it->name_len, "TRAN_MSG")) return -1;
        /* TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS (and the broker's own TIMER_*):
         * the timer rewrite is Python's (pymq/store/timer/rewrite.py). */
        if (it->name_len > 6 && memcmp(it->name, "TIMER_", 6) == 0) return -1;
        if (bytes_is(it->name, it->name_len, "WAIT")) {
            if (it->value_len == 4 && (it->value[0] | 0x20) == 't' &&
                (it->value[1] | 0x20) == 'r' && (it->value[2] | 0x20) == 'u' &&
                (it->value[3] | 0x20) == 'e') {
                skip = j;
                continue;
            }
            found.wait = it;
        } else if (bytes_is(it->name, it->name_len, "TAGS")) {
            found.tags = it;
        } else if (bytes_is(it->name, it->name_len, "KEYS")) {
            found.keys = it;
        } else if (bytes_is(it->name, it->name_len, "UNIQ_KEY")) {
            found.uniq = it;
        }
        out_len += it->name_len + 1 + it->value_len + 1;
    }
    out_len += 8 + fp->cluster_len; /* CLUSTER\x01name */
    if (out_len > MAX_PROPERTIES || (long long)body_len + out_len > fp->max_bp) return -1;
    long long size = V4_HEADER + (long long)body_len + 1 + fp->topic_len + 2 + out_len;
    if (size > room) return -1;
    put_record_head(p, size, fp, body, body_len, flag, queue_offset, phy);
    memcpy(p + 48, fp->born_ip, 4);
    put32(p + 52, (uint32_t)fp->born_port);
    put64(p + 56, (uint64_t)fp->store_ts);
    memcpy(p + 64, fp->store_ip, 4);
    put32(p + 68, (uint32_t)fp->store_port);
    put32(p + 72, (uint32_t)fp->reconsume);
    put64(p + 76, 0); /* prepared transaction offset */
    put32(p + 84, (uint32_t)body_len);
    p += V4_HEADER;
    memmove(p, body, body_len);
    p += body_len;
    *p++ = (unsigned char)fp->topic_len;
    memcpy(p, fp->topic, fp->topic_len);
    p += fp->topic_len;
    p[0] = (unsigned char)(out_len >> 8);
    p[1] = (unsigned char)out_len;
    p += 2;
    for (int j = 0; j < k; j++) {
        if (j == skip) continue;
        memcpy(p, items[j].name, items[j].name_len);
        p += items[j].name_len;
        *p++ = 1;
        memcpy(p, items[j].value, items[j].value_len);
        p += items[j].value_len;
        *p++ = 2;
    }
    memcpy(p, "CLUSTER\x01", 8);
    memcpy(p + 8, fp->cluster, fp->cluster_len);
    *names = found;
    return size;
}

/* The TAGS, KEYS and UNIQ_KEY items of properties p[0:n] (the hint row's; a stored run reports
 * no WAIT) as decode_properties reads them (an item without a name or a value skipped, the last
 * of a name kept), into slots, which names points into. */
static void find_names(const unsigned char *p, Py_ssize_t n, batch_prop slots[4],
                       stored_names *names) {
    const batch_prop *found[4] = {NULL, NULL, NULL, NULL};
    const unsigned char *q = p, *stop = p + n;
    while (n > 0 && q <= stop) { /* memchr: the properties of a stored message are long */
        const unsigned char *end = memchr(q, 2, (size_t)(stop - q));
        if (end == NULL) end = stop;
        /* An item's name is what precedes its first \x01: TAGS (say) exactly when the item
         * starts with "TAGS\x01".  One test of its first byte passes over most items (no
         * search for their \x01). */
        Py_ssize_t len = 0;
        int j = -1;
        if (end - q > 5 && (*q == 'T' || *q == 'K') && q[4] == 1) {
            if (!memcmp(q, "TAGS", 4)) j = 0;
            else if (!memcmp(q, "KEYS", 4)) j = 1;
            len = 4;
        } else if (end - q > 9 && *q == 'U' && q[8] == 1 && !memcmp(q, "UNIQ_KEY", 8)) {
            j = 2;
            len = 8;
        }
        if (j >= 0) { /* a value of at least a byte (end - q > len + 1 above) */
            slots[j] = (batch_prop){q, q + len + 1, len, end - q - len - 1};
            found[j] = &slots[j];
        }
        q = end + 1;
    }
    *names = (stored_names){found[0], found[1], found[2], NULL};
}

/* Write at p (room bytes left) a stored message's record: its properties exactly as given
 * (their order already tear-safe: CommitLog), hosts of 4 or 16 bytes (fp->sys_flag carrying
 * their flags), the prepared transaction offset.  Returns its size, or -1 (nothing written)
 * for properties over MAX_PROPERTIES or no room. */
static long long write_as_given(unsigned char *p, long long room, const fast_put *fp,
                                const unsigned char *body, Py_ssize_t body_len, int32_t flag,
                                const unsigned char *props, Py_ssize_t props_len,
                                Py_ssize_t born_len, Py_ssize_t store_len, long long prepared,
                                long long queue_offset, long long phy) {
    long long size = V4_HEADER + (born_len - 4) + (store_len - 4) + (long long)body_len + 1 +
                     fp->topic_len + 2 + props_len;
    if (props_len > MAX_PROPERTIES || size > room) return -1;
    put_record_head(p, size, fp, body, body_len, flag, queue_offset, phy);
    unsigned char *q = p + 48;
    memcpy(q, fp->born_ip, born_len);
    put32(q + born_len, (uint32_t)fp->born_port);
    q += born_len + 4;
    put64(q, (uint64_t)fp->store_ts);
    memcpy(q + 8, fp->store_ip, store_len);
    put32(q + 8 + store_len, (uint32_t)fp->store_port);
    q += 12 + store_len;
    put32(q, (uint32_t)fp->reconsume);
    put64(q + 4, (uint64_t)prepared);
    put32(q + 12, (uint32_t)body_len);
    q += 16;
    memmove(q, body, body_len);
    q += body_len;
    *q++ = (unsigned char)fp->topic_len;
    memcpy(q, fp->topic, fp->topic_len);
    q += fp->topic_len;
    q[0] = (unsigned char)(props_len >> 8);
    q[1] = (unsigned char)props_len;
    memcpy(q + 2, props, props_len);
    return size;
}

/* What the fast puts leave to the Python path (0), beside IPv6 hosts: a topic longer than
 * MAX_TOPIC or holding a NUL, a cluster name that is empty or not plain ASCII. */
static int fast_put_topic_ok(const fast_put *fp) {
    return fp->topic_len <= MAX_TOPIC && memchr(fp->topic, 0, fp->topic_len) == NULL;
}

static int fast_put_cluster_ok(const fast_put *fp) {
    if (fp->cluster_len == 0) return 0;
    for (Py_ssize_t i = 0; i < fp->cluster_len; i++)
        if (fp->cluster[i] < 3 || fp->cluster[i] >= 0x80) return 0;
    return 1;
}

/* A dispatch hint's fields in DispatchHint's order. */
static PyObject *hint_row(long long phy, long long size, PyObject *topic, const fast_put *fp,
                          long long queue_offset, const stored_names *names,
                          PyTypeObject *hint_type) {
    /* An instance of hint_type (a tuple subclass of 10 fields: DispatchHint) when given, as
     * tuple.__new__(hint_type, row) makes it, or else a plain tuple. */
    PyObject *row = hint_type != NULL ? hint_type->tp_alloc(hint_type, 10) : PyTuple_New(10);
    if (row == NULL) return NULL;
    PyObject *v[10] = {PyLong_FromLongLong(phy),          PyLong_FromLongLong(size),
                       Py_NewRef(topic),                  PyLong_FromLongLong(fp->queue_id),
                       PyLong_FromLongLong(queue_offset), item_value(names->tags),
                       PyLong_FromLongLong(fp->store_ts), PyLong_FromLongLong(fp->sys_flag),
                       item_value(names->keys),           item_value(names->uniq)};
    int ok = 1;
    for (int i = 0; i < 10; i++) {
        if (v[i] == NULL) ok = 0;
        PyTuple_SET_ITEM(row, i, v[i]); /* NULL slots are skipped by the tuple's dealloc */
    }
    if (!ok) {
        Py_DECREF(row);
        return NULL;
    }
    return row;
}


/* The records of the SEND_BATCH_MESSAGE body d[0:n] (items as decode_batch reads them), one per
 * item, written from buf + pos with consecutive queue offsets from queue_offset, below limit:
 * their hint rows appended to rows, the first item's stored WAIT value to *wait (a new
 * reference).  Returns the write position after the last record; -1 when Python must judge
 * the batch (a body that does not parse, no item, an item write_stored_record leaves to
 * Python, no room), -2 on an error (set).  On -1 and -2, rows and *wait are as they were and
 * the records written are zeroed: whole records past the write position could be taken as
 * stored by a recovery after a restart (CommitLog._scrub). */
static long long write_batch_body(unsigned char *buf, long long pos, long long limit,
                                  long long file_from, const fast_put *fp,
                                  const unsigned char *d, Py_ssize_t n, long long queue_offset,
                                  PyObject *topic, PyTypeObject *hint_type, PyObject *rows,
                                  PyObject **wait, const entry_header *eh) {
    Py_ssize_t first = PyList_GET_SIZE(rows), at = 0;
    long long prefix = eh != NULL ? ENTRY_HEADER : 0, index = eh != NULL ? eh->index : 0;
    long long w = pos, written = pos, failed = -1; /* written: the end of what was written */
    PyObject *first_wait = NULL;
    batch_prop items[BATCH_PROPS_MAX];
    while (at < n) {
        if (at + 20 > n) goto undo;
        int32_t total = (int32_t)get32(d + at);
        int32_t flag = (int32_t)get32(d + at + 12);
        int32_t body_len = (int32_t)get32(d + at + 16);
        Py_ssize_t q = at + 20;
        if (body_len < 0 || q + body_len + 2 > n) goto undo;
        const unsigned char *body = d + q;
        q += body_len;
        int16_t props_len = (int16_t)((uint16_t)d[q] << 8 | d[q + 1]);
        q += 2;
        if (props_len < 0 || q + props_len > n) goto undo;
        const unsigned char *props = d + q;
        q += props_len;
        if ((Py_ssize_t)total != q - at || w + prefix > limit) goto undo;
        at = q;
        stored_names names;
        long long size = write_stored_record(buf + w + prefix, limit - w - prefix, fp, body,
                                             body_len, flag, props, props_len, queue_offset,
                                             file_from + w + prefix, items, &names);
        if (size < 0) goto undo;
        written = w + prefix + size;
        if (eh != NULL) put_entry_header(buf + w, size, eh, index++, file_from + w);
        failed = -2;
        if (first_wait == NULL && (first_wait = item_value(names.wait)) == NULL) goto undo;
        PyObject *row = hint_row(file_from + w + prefix, size, topic, fp, queue_offset, &names,
                                 hint_type);
        if (row == NULL) goto undo;
        int rc = PyList_Append(rows, row);
        Py_DECREF(row);
        if (rc < 0) goto undo;
        failed = -1;
        w += prefix + size;
        queue_offset++;
    }
    if (first_wait == NULL) goto undo; /* an empty batch: refused in Python */
    *wait = first_wait;
    return w;
undo:
    Py_XDECREF(first_wait);
    if (PyList_GET_SIZE(rows) > first) PyList_SetSlice(rows, first, PyList_GET_SIZE(rows), NULL);
    if (written > pos) memset(buf + pos, 0, (size_t)(written - pos));
    return failed;
}

/* encode_run(buf, pos, limit, file_from_offset, entries, topic_bytes, queue_table, clock,
 *            cluster_b, born_ip, born_port, store_ip, store_port, max_body_properties,
 *            stop_flags, stop_topic, hint_type)
 * The store's one record encoder: a run of sends' records written into the writable buffer
 * buf from buf[pos] (below limit), buf[0] being the commit log's physical offset
 * file_from_offset, each as the general path (SendProcessor._single_message or
 * _batch_messages, then CommitLog.append_stored) stores it: the broker's stored properties
 * (WAIT=true left out, CLUSTER added last).  Each entry is a tuple (topic, queue_id, body,
 * properties, flag, sys_flag, born_timestamp, reconsume_times), the body any buffer: a single
 * send (properties its request's str; any DELAY or TRAN_MSG is Python's), or, with properties
 * None, a SEND_BATCH_MESSAGE body (flag unused) whose items become records of that topic
 * and queue with consecutive queue offsets, all or none (a DELAY other than "0" is Python's).
 * Its topic's bytes come from the dict topic_bytes, its queue offset from the dict queue_table
 * keyed by (topic, queue_id) (0 when absent; set past the entry's records once they are
 * written: the commit), its store time from clock() (None: the wall clock in milliseconds, as
 * clock.now_ms; called only for an entry past the stops below and the refusals of hosts and
 * properties).  Stops at the first entry whose topic is missing from topic_bytes, whose
 * sys_flag has a bit of stop_flags, whose topic is stop_topic (checked in that order, before
 * its other fields are read), or that Python must judge (write_stored_record's refusals, IPv6
 * hosts, properties not ASCII or over 65535, a batch body that does not parse or is empty,
 * no room below limit).
 * Returns (end, rows, waits, stamp, error): the write position after the last record written,
 * their hint rows (DispatchHint's fields, as hint_type: one per record) and stored WAIT values
 * (one per entry; a batch's is its first item's), the last entry's store time (0 if none) and
 * None; or, when an error stops it after entries were committed (queue_table updated), that
 * exception in place of None: what was committed stands.  Raises only when nothing was
 * committed.
 * A run of stored messages (CommitLog.append_stored; the first entry an 11-tuple, as all must
 * be) has entries (topic, queue_id, body, properties bytes, flag, sys_flag, born_timestamp,
 * reconsume_times, born_ip, born_port, prepared_transaction_offset): each record holds its
 * properties exactly as given (refused only over MAX_PROPERTIES; no size limit), its own born
 * host, the host flags its born IP's and store_ip's lengths (4 or 16) imply in place of
 * sys_flag's, and the prepared transaction offset; cluster_b, born_ip, born_port and
 * max_body_properties are unused, the clock is read once (every record shares the first's
 * store time), and its WAIT values are None (its callers hold the messages' properties: no
 * decode per put).  It is all or nothing: queue offsets reach queue_table once every entry is
 * written; a stop zeroes buf from pos and returns (pos, [], [], 0, None); an error is raised.
 * Any entry whose sys_flag has 0x4 (a prepared or rolled-back transaction message) takes queue
 * offset 0 and leaves queue_table as it is (RocketMQ's CommitLog).
 * entry_header, an 18th argument (None when left out), as (first_index, term): each record is
 * written as the body of a DLedger 0.2.6 entry of its own (pymq.store.dledger_commitlog), after
 * that entry's 48-byte header (put_entry_header) at the entry's position: the record's
 * physical offset (its PHYSICALOFFSET and its hint row's) is its entry's + 48, the indexes run
 * from first_index, one a record (each batch item's too) in the rows' order, and the room
 * below limit counts the headers. */
static PyObject *py_encode_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 17 && nargs != 18)
        return PyErr_Format(PyExc_TypeError, "encode_run takes 17 or 18 arguments");
    PyTypeObject *hint_type = NULL;
    if (hint_type_arg(args[16], &hint_type) < 0) return NULL;
    long long pos, limit, file_from, born_port, store_port, max_bp, stop_flags;
    if (arg_int(args[1], "pos", 0, PY_SSIZE_T_MAX, &pos) < 0 ||
        arg_int(args[2], "limit", 0, PY_SSIZE_T_MAX, &limit) < 0 ||
        arg_int(args[3], "file_from_offset", 0, LLONG_MAX / 2, &file_from) < 0 ||
        arg_int(args[10], "born_port", I32_MIN, I32_MAX, &born_port) < 0 ||
        arg_int(args[12], "store_port", I32_MIN, I32_MAX, &store_port) < 0 ||
        arg_int(args[13], "max_body_properties", 0, I32_MAX, &max_bp) < 0 ||
        arg_int(args[14], "stop_flags", I32_MIN, I32_MAX, &stop_flags) < 0)
        return NULL;
    /* entry_header: None, or (the first entry's index, the term): see put_entry_header. */
    entry_header header, *eh = NULL;
    if (nargs == 18 && args[17] != Py_None) {
        PyObject *given = args[17];
        if (!PyTuple_Check(given) || PyTuple_GET_SIZE(given) != 2)
            return PyErr_Format(PyExc_TypeError,
                                "encode_run: entry_header must be None or (index, term)");
        if (arg_int(PyTuple_GET_ITEM(given, 0), "entry index", 0, LLONG_MAX / 2, &header.index) <
                0 ||
            arg_int(PyTuple_GET_ITEM(given, 1), "entry term", 0, LLONG_MAX, &header.term) < 0)
            return NULL;
        eh = &header;
    }
    const long long prefix = eh != NULL ? ENTRY_HEADER : 0;
    PyObject *entries = args[4], *topic_bytes = args[5], *table = args[6], *clock = args[7];
    PyObject *cluster_b = args[8], *born_ip = args[9], *store_ip = args[11];
    PyObject *stop_topic = args[15];
    if (!PyList_Check(entries) || !PyDict_Check(topic_bytes) || !PyDict_Check(table) ||
        !PyBytes_Check(cluster_b) || !PyBytes_Check(born_ip) || !PyBytes_Check(store_ip) ||
        !PyUnicode_Check(stop_topic) || (clock != Py_None && !PyCallable_Check(clock)))
        return PyErr_Format(PyExc_TypeError, "encode_run: bad argument types");
    fast_put fp = {.single = 1, .born_port = born_port, .store_port = store_port,
                   .max_bp = max_bp};
    fp.cluster = (const unsigned char *)PyBytes_AS_STRING(cluster_b);
    fp.cluster_len = PyBytes_GET_SIZE(cluster_b);
    fp.born_ip = (const unsigned char *)PyBytes_AS_STRING(born_ip);
    fp.store_ip = (const unsigned char *)PyBytes_AS_STRING(store_ip);
    Py_ssize_t n_entries = PyList_GET_SIZE(entries), store_len = PyBytes_GET_SIZE(store_ip);
    /* A run of stored messages (11-tuples: the first entry says) is all or nothing. */
    PyObject *head = n_entries > 0 ? PyList_GET_ITEM(entries, 0) : NULL;
    int stored_run = head != NULL && PyTuple_Check(head) && PyTuple_GET_SIZE(head) == 11;
    int usable = stored_run ? store_len == 4 || store_len == 16
                            : PyBytes_GET_SIZE(born_ip) == 4 && store_len == 4 &&
                                  fast_put_cluster_ok(&fp); /* else the Python path (IPv6) */
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_WRITABLE) < 0) return NULL;
    if (limit > buf.len) limit = buf.len;
    unsigned char *base = (unsigned char *)buf.buf;
    PyObject *rows = PyList_New(0), *waits = PyList_New(0), *error = NULL, *result = NULL;
    /* Where queue offsets are committed: a stored run's go to the table at its end (a lone
     * stored message's at once: it is all or nothing by itself). */
    PyObject *pending = stored_run && n_entries > 1 ? PyDict_New() : Py_NewRef(table);
    long long start = pos;
    /* The entry and its topic's bytes are held for the iteration: the clock is Python code,
     * which could change the list or the dict they are borrowed from. */
    PyObject *entry = NULL, *topic_b = NULL;
    long long stamp = 0;
    Py_ssize_t count = 0;
    if (rows == NULL || waits == NULL || pending == NULL) goto done;
    batch_prop items[BATCH_PROPS_MAX];
    for (Py_ssize_t e = 0; usable && e < PyList_GET_SIZE(entries); e++) {
        Py_CLEAR(entry);
        Py_CLEAR(topic_b);
        entry = Py_NewRef(PyList_GET_ITEM(entries, e));
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != (stored_run ? 11 : 8)) {
            PyErr_SetString(PyExc_TypeError, stored_run
                                                 ? "encode_run: an entry is not an 11-tuple"
                                                 : "encode_run: an entry is not an 8-tuple");
            goto failed;
        }
        PyObject *topic = PyTuple_GET_ITEM(entry, 0), *queue_id = PyTuple_GET_ITEM(entry, 1);
        PyObject *body = PyTuple_GET_ITEM(entry, 2), *props = PyTuple_GET_ITEM(entry, 3);
        long long flag;
        if (!PyUnicode_Check(topic)) {
            PyErr_SetString(PyExc_TypeError, "encode_run: the topic is not a str");
            goto failed;
        }
        /* The stops first, in CommitLog's order: the topic's bytes, the sys flag, the topic. */
        topic_b = PyDict_GetItemWithError(topic_bytes, topic);
        if (topic_b == NULL) {
            if (PyErr_Occurred()) goto failed;
            break;
        }
        Py_INCREF(topic_b);
        if (arg_int(PyTuple_GET_ITEM(entry, 5), "sys_flag", I32_MIN, I32_MAX, &fp.sys_flag) < 0)
            goto failed;
        if (fp.sys_flag & stop_flags) break;
        /* stop_topic (a stored run's "" stops none): compared only when as long. */
        if (PyUnicode_GET_LENGTH(topic) == PyUnicode_GET_LENGTH(stop_topic)) {
            int is_stop = PyUnicode_Compare(topic, stop_topic);
            if (is_stop == -1 && PyErr_Occurred()) goto failed;
            if (is_stop == 0) break;
        }
        int batch = props == Py_None;
        PyObject *given_born = stored_run ? PyTuple_GET_ITEM(entry, 8) : NULL;
        long long prepared = 0;
        if (stored_run) {
            if (!PyBytes_Check(props) || !PyBytes_Check(given_born)) {
                PyErr_SetString(PyExc_TypeError,
                                "encode_run: a stored message's properties and born host must "
                                "be bytes");
                goto failed;
            }
        } else if (!batch && !PyUnicode_Check(props)) {
            PyErr_SetString(PyExc_TypeError, "encode_run: properties must be a str or None");
            goto failed;
        }
        if (arg_int(queue_id, "queue_id", I32_MIN, I32_MAX, &fp.queue_id) < 0 ||
            arg_int(PyTuple_GET_ITEM(entry, 4), "flag", I32_MIN, I32_MAX, &flag) < 0 ||
            arg_int(PyTuple_GET_ITEM(entry, 6), "born_timestamp", LLONG_MIN, LLONG_MAX,
                    &fp.born_ts) < 0 ||
            arg_int(PyTuple_GET_ITEM(entry, 7), "reconsume_times", I32_MIN, I32_MAX,
                    &fp.reconsume) < 0)
            goto failed;
        if (stored_run) {
            /* Its own born host; the host flags follow the addresses' lengths. */
            if (arg_int(PyTuple_GET_ITEM(entry, 9), "born_port", I32_MIN, I32_MAX,
                        &fp.born_port) < 0 ||
                arg_int(PyTuple_GET_ITEM(entry, 10), "prepared_transaction_offset", LLONG_MIN,
                        LLONG_MAX, &prepared) < 0)
                goto failed;
            Py_ssize_t born_len = PyBytes_GET_SIZE(given_born);
            if ((born_len != 4 && born_len != 16) || !PyBytes_Check(topic_b)) break;
            fp.born_ip = (const unsigned char *)PyBytes_AS_STRING(given_born);
            fp.sys_flag = (fp.sys_flag & ~(long long)(BORNHOST_V6 | STOREHOST_V6)) |
                          (born_len == 16 ? BORNHOST_V6 : 0) | (store_len == 16 ? STOREHOST_V6 : 0);
        } else if ((fp.sys_flag & (BORNHOST_V6 | STOREHOST_V6)) || !PyBytes_Check(topic_b) ||
                   (!batch && (!PyUnicode_IS_ASCII(props) || PyUnicode_GET_LENGTH(props) > 65535)))
            break; /* what Python judges: IPv6 hosts, properties not plain, an odd topic */
        fp.topic = (const unsigned char *)PyBytes_AS_STRING(topic_b);
        fp.topic_len = PyBytes_GET_SIZE(topic_b);
        fp.single = !batch;
        if (!fast_put_topic_ok(&fp)) break;
        /* A prepared or rolled-back transaction message (sys flag 0x4 or 0xC) takes no queue
         * offset (RocketMQ's CommitLog): 0, the table untouched. */
        PyObject *key = (fp.sys_flag & TRANSACTION_PREPARED) ? Py_NewRef(Py_None)
                                                             : PyTuple_Pack(2, topic, queue_id);
        if (key == NULL) goto failed;
        PyObject *known = key == Py_None ? NULL : PyDict_GetItemWithError(pending, key);
        if (known == NULL && pending != table && key != Py_None && !PyErr_Occurred())
            known = PyDict_GetItemWithError(table, key); /* borrowed */
        long long queue_offset = 0;
        if (known != NULL) {
            if (arg_int(known, "queue_offset", 0, LLONG_MAX / 2, &queue_offset) < 0) {
                Py_DECREF(key);
                goto failed;
            }
        } else if (PyErr_Occurred()) {
            Py_DECREF(key);
            goto failed;
        }
        if (stored_run && count > 0) {
            /* A stored run's records share its first one's store time (a batch's, as Java). */
        } else if (clock == Py_None) {
            struct timespec ts;
            if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
                PyErr_SetFromErrno(PyExc_OSError);
                Py_DECREF(key);
                goto failed;
            }
            fp.store_ts = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
        } else {
            PyObject *now = PyObject_CallNoArgs(clock);
            int bad = now == NULL ||
                      arg_int(now, "store_timestamp", LLONG_MIN, LLONG_MAX, &fp.store_ts) < 0;
            Py_XDECREF(now);
            if (bad) {
                Py_DECREF(key);
                goto failed;
            }
        }
        /* The entry's records, and what can fail before the commit (the table's entry). */
        Py_ssize_t first = PyList_GET_SIZE(rows);
        PyObject *wait = NULL;
        long long end = -1;
        /* The body: any buffer, held while it is read (after the clock, which is Python). */
        Py_buffer data;
        if (PyBytes_CheckExact(body)) {
            data.buf = PyBytes_AS_STRING(body);
            data.len = PyBytes_GET_SIZE(body);
            data.obj = NULL;
        } else if (PyObject_GetBuffer(body, &data, PyBUF_SIMPLE) < 0) {
            Py_DECREF(key);
            goto failed;
        }
        if (stored_run) {
            stored_names names;
            batch_prop slots[4];
            long long size = -1;
            if (pos + prefix <= limit && data.len <= I32_MAX)
                size = write_as_given(base + pos + prefix, limit - pos - prefix, &fp, data.buf,
                                      data.len, (int32_t)flag,
                                      (const unsigned char *)PyBytes_AS_STRING(props),
                                      PyBytes_GET_SIZE(props), PyBytes_GET_SIZE(given_born),
                                      store_len, prepared, queue_offset, file_from + pos + prefix);
            if (size >= 0) {
                end = -2;
                if (eh != NULL) put_entry_header(base + pos, size, eh, eh->index, file_from + pos);
                find_names((const unsigned char *)PyBytes_AS_STRING(props),
                           PyBytes_GET_SIZE(props), slots, &names);
                PyObject *row = hint_row(file_from + pos + prefix, size, topic, &fp, queue_offset,
                                         &names, hint_type);
                /* No WAIT value: the message objects' callers read their own properties. */
                wait = Py_NewRef(Py_None);
                if (row != NULL && PyList_Append(rows, row) == 0) end = pos + prefix + size;
                Py_XDECREF(row);
                if (end < 0) {
                    Py_CLEAR(wait);
                    memset(base + pos, 0, (size_t)(prefix + size));
                }
            }
        } else if (batch) {
            end = write_batch_body(base, pos, limit, file_from, &fp, data.buf, data.len,
                                   queue_offset, topic, hint_type, rows, &wait, eh);
        } else {
            stored_names names;
            long long size = -1;
            if (pos + prefix <= limit && data.len <= I32_MAX)
                size = write_stored_record(base + pos + prefix, limit - pos - prefix, &fp,
                                           data.buf, data.len, (int32_t)flag,
                                           PyUnicode_1BYTE_DATA(props),
                                           PyUnicode_GET_LENGTH(props), queue_offset,
                                           file_from + pos + prefix, items, &names);
            if (size >= 0) {
                end = -2;
                if (eh != NULL) put_entry_header(base + pos, size, eh, eh->index, file_from + pos);
                PyObject *row = hint_row(file_from + pos + prefix, size, topic, &fp, queue_offset,
                                         &names, hint_type);
                if (row != NULL && (wait = item_value(names.wait)) != NULL &&
                    PyList_Append(rows, row) == 0)
                    end = pos + prefix + size;
                Py_XDECREF(row);
                if (end < 0) {
                    Py_CLEAR(wait);
                    memset(base + pos, 0, (size_t)(prefix + size));
                }
            }
        }
        if (data.obj != NULL) PyBuffer_Release(&data);
        if (end < 0) {
            Py_DECREF(key);
            if (end == -1) break; /* Python judges it; bytes past pos are junk */
            goto failed;
        }
        PyObject *next = PyLong_FromLongLong(queue_offset + PyList_GET_SIZE(rows) - first);
        int ok = next != NULL && PyList_Append(waits, wait) == 0;
        if (ok && key != Py_None && PyDict_SetItem(pending, key, next) < 0) {
            ok = 0;
            PyList_SetSlice(waits, count, count + 1, NULL);
        }
        Py_DECREF(key);
        Py_XDECREF(wait);
        Py_XDECREF(next);
        if (!ok) {
            /* Not committed: no whole record may lie past the write position (as _scrub). */
            PyList_SetSlice(rows, first, PyList_GET_SIZE(rows), NULL);
            memset(base + pos, 0, (size_t)(end - pos));
            goto failed;
        }
        if (eh != NULL) eh->index += PyList_GET_SIZE(rows) - first; /* one entry a record */
        count++;
        pos = end;
        stamp = fp.store_ts;
    }
    if (stored_run && count < n_entries) { /* all or nothing: none */
        PyList_SetSlice(rows, 0, PyList_GET_SIZE(rows), NULL);
        PyList_SetSlice(waits, 0, count, NULL);
        memset(base + start, 0, (size_t)(pos - start));
        pos = start;
        stamp = 0;
    } else if (pending != table && PyDict_Update(table, pending) < 0) {
        goto failed;
    }
    goto finish;
failed:
    if (stored_run && pos > start) memset(base + start, 0, (size_t)(pos - start));
    if (count == 0 || stored_run) goto done; /* nothing committed: raise */
    {
#if PY_VERSION_HEX >= 0x030C0000
        error = PyErr_GetRaisedException();
#else
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyErr_NormalizeException(&type, &value, &traceback);
        if (traceback != NULL && value != NULL) PyException_SetTraceback(value, traceback);
        error = value;
        Py_XDECREF(type);
        Py_XDECREF(traceback);
#endif
        if (error == NULL) error = Py_NewRef(Py_None);
    }
finish:
    /* (end, rows, waits, stamp, error), built by hand: Py_BuildValue's format parsing cost a
     * single send's put a tenth of this function. */
    {
        PyObject *end_obj = PyLong_FromLongLong(pos), *stamp_obj = PyLong_FromLongLong(stamp);
        result = end_obj == NULL || stamp_obj == NULL ? NULL : PyTuple_New(5);
        if (result != NULL) {
            PyTuple_SET_ITEM(result, 0, end_obj);
            PyTuple_SET_ITEM(result, 1, Py_NewRef(rows));
            PyTuple_SET_ITEM(result, 2, Py_NewRef(waits));
            PyTuple_SET_ITEM(result, 3, stamp_obj);
            PyTuple_SET_ITEM(result, 4, Py_NewRef(error != NULL ? error : Py_None));
        } else {
            Py_XDECREF(end_obj);
            Py_XDECREF(stamp_obj);
        }
    }
done:
    Py_XDECREF(entry);
    Py_XDECREF(pending);
    Py_XDECREF(topic_b);
    Py_XDECREF(rows);
    Py_XDECREF(waits);
    Py_XDECREF(error);
    PyBuffer_Release(&buf);
    return result;
}
/* --- stored_entries --------------------------------------------------------------------------- */

/* The attributes stored_entries reads of a message, interned once. */
static PyObject *stored_names_str[9];
static const char *const stored_attr_name[9] = {
    "born_host", "body", "topic", "queue_id", "flag", "sys_flag", "born_timestamp",
    "reconsume_times", "prepared_transaction_offset",
};

/* The slots (member descriptors) of the message type stored_entries read last, read through
 * their tp_descr_get: the generic attribute lookup cost each read three times as much.  A type
 * whose attributes are not all slots is read by PyObject_GetAttr. */
static PyObject *stored_type;
static PyObject *stored_slot[9];

/* Whether type's attributes are read through stored_slot (found now if it is another type). */
static int stored_slots_of(PyTypeObject *type) {
    if ((PyObject *)type == stored_type) return 1;
    PyObject *found[9] = {NULL};
    int k = 0;
    while (k < 9) {
        found[k] = PyObject_GetAttr((PyObject *)type, stored_names_str[k]);
        if (found[k] == NULL || !Py_IS_TYPE(found[k], &PyMemberDescr_Type)) break;
        k++;
    }
    if (k < 9) {
        PyErr_Clear();
        for (int j = 0; j < 9; j++) Py_XDECREF(found[j]);
        return 0;
    }
    Py_XSETREF(stored_type, Py_NewRef((PyObject *)type));
    for (k = 0; k < 9; k++) Py_XSETREF(stored_slot[k], found[k]);
    return 1;
}

static PyObject *stored_attr(PyObject *msg, int slots, int k) {
    if (!slots) return PyObject_GetAttr(msg, stored_names_str[k]);
    PyObject *slot = stored_slot[k];
    return Py_TYPE(slot)->tp_descr_get(slot, msg, (PyObject *)Py_TYPE(msg));
}

/* commitlog.BORN_IPS_MAX: the peers' packed addresses kept before the cache is emptied. */
#define BORN_IPS_MAX 65536

/* host packed: from born_ips (a dict), else by pack and kept there; a new reference. */
static PyObject *packed_host(PyObject *born_ips, PyObject *pack, PyObject *host) {
    PyObject *ip = PyDict_GetItemWithError(born_ips, host);
    if (ip != NULL) return Py_NewRef(ip);
    if (PyErr_Occurred() || (ip = PyObject_CallOneArg(pack, host)) == NULL) return NULL;
    if (PyDict_GET_SIZE(born_ips) >= BORN_IPS_MAX) PyDict_Clear(born_ips);
    if (PyDict_SetItem(born_ips, host, ip) < 0) {
        Py_DECREF(ip);
        return NULL;
    }
    return ip;
}

/*
 * stored_entries(msgs, encoded, fixed, pack_ip, born_ips)
 *
 * CommitLog's stored_entries_py in one call: encode_run's 11-tuple entry of each stored message
 * of msgs (encoded: each one's (topic bytes, properties bytes)), the bytes their records take
 * (fixed: a record's fixed part with a 4- and a 16-byte born host, as (v4, v6)), their topics'
 * bytes by topic, and whether any properties hold a NUL; (entries, total, topics, nul).  A
 * born host is packed by pack_ip once and kept in born_ips (CommitLog's dict of its peers'
 * addresses).  Raises as the twin does: pack_ip's error for a born host that is no address,
 * TypeError for a body or bytes without a length.
 */
static PyObject *py_stored_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) return PyErr_Format(PyExc_TypeError, "stored_entries takes 5 arguments");
    PyObject *fixed = args[2], *pack = args[3], *born_ips = args[4];
    if (!PyTuple_Check(fixed) || PyTuple_GET_SIZE(fixed) != 2 || !PyDict_Check(born_ips))
        return PyErr_Format(PyExc_TypeError, "stored_entries: bad argument types");
    long long fixed_v[2];
    for (int k = 0; k < 2; k++) {
        fixed_v[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(fixed, k));
        if (fixed_v[k] == -1 && PyErr_Occurred()) return NULL;
    }
    for (int k = 0; k < 9; k++)
        if (stored_names_str[k] == NULL &&
            (stored_names_str[k] = PyUnicode_InternFromString(stored_attr_name[k])) == NULL)
            return NULL;
    PyObject *seq = PySequence_Fast(args[0], "stored_entries: msgs must be a sequence");
    if (seq == NULL) return NULL;
    PyObject *entries = PyList_New(0), *topics = PyDict_New(), *result = NULL;
    PyObject *pair = NULL, *got[9] = {NULL}, *born_ip = NULL, *port = NULL, *host = NULL;
    long long total = 0;
    int nul = 0;
    if (entries == NULL || topics == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *msg = PySequence_Fast_GET_ITEM(seq, i);
        if ((pair = PySequence_GetItem(args[1], i)) == NULL) goto done;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_ValueError, "stored_entries: an encoded item is no pair");
            goto done;
        }
        PyObject *topic_b = PyTuple_GET_ITEM(pair, 0), *props_b = PyTuple_GET_ITEM(pair, 1);
        int slots = stored_slots_of(Py_TYPE(msg));
        if ((got[0] = stored_attr(msg, slots, 0)) == NULL ||
            (host = PySequence_GetItem(got[0], 0)) == NULL ||
            (born_ip = packed_host(born_ips, pack, host)) == NULL)
            goto done;
        for (int k = 1; k < 3; k++)
            if ((got[k] = stored_attr(msg, slots, k)) == NULL) goto done;
        Py_ssize_t ip_len = PyObject_Size(born_ip), body_len = PyObject_Size(got[1]);
        if (ip_len < 0 || body_len < 0) goto done;
        Py_ssize_t topic_len = PyObject_Size(topic_b), props_len = PyObject_Size(props_b);
        if (topic_len < 0 || props_len < 0) goto done;
        total += fixed_v[ip_len == 16] + body_len + topic_len + props_len;
        for (int k = 3; k < 9; k++)
            if ((got[k] = stored_attr(msg, slots, k)) == NULL) goto done;
        if ((port = PySequence_GetItem(got[0], 1)) == NULL) goto done;
        PyObject *entry = PyTuple_New(11);
        if (entry == NULL) goto done;
        PyObject *items[11] = {got[2], got[3], got[1], props_b, got[4], got[5],
                               got[6], got[7], born_ip, port, got[8]};
        for (int k = 0; k < 11; k++) PyTuple_SET_ITEM(entry, k, Py_NewRef(items[k]));
        int bad = PyList_Append(entries, entry) < 0 || PyDict_SetItem(topics, got[2], topic_b) < 0;
        Py_DECREF(entry);
        if (bad) goto done;
        if (PyBytes_Check(props_b)) {
            if (memchr(PyBytes_AS_STRING(props_b), 0, (size_t)props_len) != NULL) nul = 1;
        } else {
            PyObject *zero = PyLong_FromLong(0);
            int has = zero == NULL ? -1 : PySequence_Contains(props_b, zero);
            Py_XDECREF(zero);
            if (has < 0) goto done;
            if (has) nul = 1;
        }
        Py_CLEAR(pair);
        Py_CLEAR(host);
        Py_CLEAR(born_ip);
        Py_CLEAR(port);
        for (int k = 0; k < 9; k++) Py_CLEAR(got[k]);
    }
    {
        PyObject *total_obj = PyLong_FromLongLong(total);
        if (total_obj != NULL) {
            result = PyTuple_New(4);
            if (result == NULL) {
                Py_DECREF(total_obj);
            } else {
                PyTuple_SET_ITEM(result, 0, Py_NewRef(entries));
                PyTuple_SET_ITEM(result, 1, total_obj);
                PyTuple_SET_ITEM(result, 2, Py_NewRef(topics));
                PyTuple_SET_ITEM(result, 3, Py_NewRef(nul ? Py_True : Py_False));
            }
        }
    }
done:
    Py_XDECREF(pair);
    Py_XDECREF(host);
    Py_XDECREF(born_ip);
    Py_XDECREF(port);
    for (int k = 0; k < 9; k++) Py_XDECREF(got[k]);
    Py_XDECREF(entries);
    Py_XDECREF(topics);
    Py_DECREF(seq);
    return result;
}

/* --- populate_write ------------------------------------------------------------------------- */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* populate_write(buf, start, length): fault in the pages of buf[start:start+length] (a writable
 * shared map) as writes would, without changing a byte, with the GIL released, so that the
 * event loop's writes there find them mapped.  Returns 0, or madvise's errno (EINVAL: a kernel
 * without MADV_POPULATE_WRITE). */
static PyObject *py_populate_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) return PyErr_Format(PyExc_TypeError, "populate_write takes 3 arguments");
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t length = PyLong_AsSsize_t(args[2]);
    if (length == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) return NULL;
    if (start < 0 || length < 0 || start > view.len || length > view.len - start) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "populate_write: range outside the buffer");
    }
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t from = (uintptr_t)view.buf + (uintptr_t)start;
    uintptr_t to = from + (uintptr_t)length;
    from -= from % page; /* a map starts on a page: rounding down stays inside it */
    int rc = 0;
    if (length > 0) {
        Py_BEGIN_ALLOW_THREADS
        if (madvise((void *)from, to - from, MADV_POPULATE_WRITE) != 0) rc = errno;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    return PyLong_FromLong(rc);
}

/* --- sync worker ------------------------------------------------------------------------------ */

/* A thread of its own for the group commit's fdatasync that never takes the GIL: the event loop
 * hands it file descriptors (sync_worker_submit) and learns that the job ended from an eventfd
 * (sync_worker_fileno, readable; sync_worker_collect).  A Python thread needed the GIL twice per
 * sync (to start the call and to report it), and a busy loop held it for up to a millisecond
 * each time.  One job at a time; the state is shared by the capsule and the thread and freed by
 * whichever lets go last. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int *fds;       /* the job handed over and not yet taken (the worker's own duplicates of
                     * the descriptors, -1 where none could be made); NULL: none */
    Py_ssize_t nfds;
    int fds_error;  /* errno of the first descriptor that could not be duplicated (0: none) */
    int busy;       /* a job handed over and not yet finished */
    int done;       /* a finished job not yet collected */
    int result;     /* errno of the finished job (0: every fdatasync succeeded) */
    int stop;
    int efd;
    int refs;       /* the capsule and the thread */
} sync_state;

static void sync_close_fds(int *fds, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (fds[i] >= 0) close(fds[i]);
    }
    free(fds);
}

static void sync_state_release(sync_state *st) {
    pthread_mutex_lock(&st->mu);
    int left = --st->refs;
    pthread_mutex_unlock(&st->mu);
    if (left == 0) {
        close(st->efd);
        if (st->fds != NULL) sync_close_fds(st->fds, st->nfds);
        pthread_mutex_destroy(&st->mu);
        pthread_cond_destroy(&st->cv);
        free(st);
    }
}

static void sync_state_signal(sync_state *st) {
    uint64_t one = 1;
    ssize_t w;
    do {
        w = write(st->efd, &one, sizeof one);
    } while (w < 0 && errno == EINTR);
}

static void *sync_worker_main(void *arg) {
    sync_state *st = (sync_state *)arg;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        while (st->fds == NULL && !st->stop) pthread_cond_wait(&st->cv, &st->mu);
        if (st->fds == NULL) break; /* stopped with nothing to do */
        int *fds = st->fds;
        Py_ssize_t n = st->nfds;
        int rc = st->fds_error;
        st->fds = NULL;
        pthread_mutex_unlock(&st->mu);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (fds[i] >= 0 && fdatasync(fds[i]) != 0 && rc == 0) rc = errno;
        }
        sync_close_fds(fds, n);
        pthread_mutex_lock(&st->mu);
        st->result = rc;
        st->done = 1;
        st->busy = 0;
        sync_state_signal(st);
    }
    pthread_mutex_unlock(&st->mu);
    sync_state_release(st);
    return NULL;
}

static const char SYNC_CAPSULE[] = "pymq.sync_worker";

static void sync_capsule_free(PyObject *capsule) {
    sync_state *st = (sync_state *)PyCapsule_GetPointer(capsule, SYNC_CAPSULE);
    if (st == NULL) return;
    pthread_mutex_lock(&st->mu);
    st->stop = 1;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
    sync_state_release(st);
}

static sync_state *sync_state_of(PyObject *capsule) {
    return (sync_state *)PyCapsule_GetPointer(capsule, SYNC_CAPSULE);
}

/* sync_worker_new() -> capsule: the state and its thread, started. */
static PyObject *py_sync_worker_new(PyObject *self, PyObject *unused) {
    sync_state *st = calloc(1, sizeof *st);
    if (st == NULL) return PyErr_NoMemory();
    st->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (st->efd < 0) {
        free(st);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    st->refs = 2;
    PyObject *capsule = PyCapsule_New(st, SYNC_CAPSULE, NULL);
    if (capsule == NULL) {
        close(st->efd);
        free(st);
        return NULL;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    int rc = pthread_create(&thread, &attr, sync_worker_main, st);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        Py_DECREF(capsule); /* no destructor yet: the state is ours alone */
        close(st->efd);
        pthread_mutex_destroy(&st->mu);
        pthread_cond_destroy(&st->cv);
        free(st);
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (PyCapsule_SetDestructor(capsule, sync_capsule_free) != 0) return NULL;
    return capsule;
}

/* sync_worker_fileno(worker) -> int: the eventfd, readable once a job has ended. */
static PyObject *py_sync_worker_fileno(PyObject *self, PyObject *capsule) {
    sync_state *st = sync_state_of(capsule);
    if (st == NULL) return NULL;
    return PyLong_FromLong(st->efd);
}

/* sync_worker_submit(worker, fds): hand over one job, fdatasync of each file descriptor in
 * order.  RuntimeError while a job is in hand or uncollected, or once stopped.  The worker
 * syncs duplicates made here (F_DUPFD_CLOEXEC, closed by the worker after the job): a file
 * closed after its job is handed over, and its number reused, is still the file synced, never
 * the one that took the number.  A descriptor that cannot be duplicated (-1 for a closed file:
 * EBADF) fails the job with that errno, reported as a failed fdatasync is. */
static PyObject *py_sync_worker_submit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) return PyErr_Format(PyExc_TypeError, "sync_worker_submit takes 2 arguments");
    sync_state *st = sync_state_of(args[0]);
    if (st == NULL) return NULL;
    PyObject *seq = PySequence_Fast(args[1], "sync_worker_submit: fds must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int *fds = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    if (fds == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int overflow = 0;
        long fd = PyLong_AsLongAndOverflow(PySequence_Fast_GET_ITEM(seq, i), &overflow);
        if (fd == -1 && PyErr_Occurred()) {
            free(fds);
            Py_DECREF(seq);
            return NULL;
        }
        fds[i] = (overflow || fd < INT_MIN || fd > INT_MAX) ? -1 : (int)fd;
    }
    Py_DECREF(seq);
    pthread_mutex_lock(&st->mu);
    if (st->busy || st->done || st->stop) {
        pthread_mutex_unlock(&st->mu);
        free(fds);
        return PyErr_Format(PyExc_RuntimeError, "sync worker: a job is in hand, or it stopped");
    }
    int fds_error = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int dup = fds[i] < 0 ? -1 : fcntl(fds[i], F_DUPFD_CLOEXEC, 0);
        if (dup < 0 && fds_error == 0) fds_error = fds[i] < 0 ? EBADF : errno;
        fds[i] = dup;
    }
    st->fds = fds;
    st->nfds = n;
    st->fds_error = fds_error;
    st->busy = 1;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
    Py_RETURN_NONE;
}

/* sync_worker_collect(worker) -> int | None: the errno of the job that ended (0: synced), its
 * report taken; None while none has ended since the last collect. */
static PyObject *py_sync_worker_collect(PyObject *self, PyObject *capsule) {
    sync_state *st = sync_state_of(capsule);
    if (st == NULL) return NULL;
    uint64_t count;
    while (read(st->efd, &count, sizeof count) < 0 && errno == EINTR) {
    }
    pthread_mutex_lock(&st->mu);
    int done = st->done, result = st->result;
    st->done = 0;
    pthread_mutex_unlock(&st->mu);
    if (!done) Py_RETURN_NONE;
    return PyLong_FromLong(result);
}

/* sync_worker_stop(worker): the thread ends once the job in hand (if any) has ended; the
 * eventfd is made readable, so that a task waiting on it looks again. */
static PyObject *py_sync_worker_stop(PyObject *self, PyObject *capsule) {
    sync_state *st = sync_state_of(capsule);
    if (st == NULL) return NULL;
    pthread_mutex_lock(&st->mu);
    st->stop = 1;
    pthread_cond_signal(&st->cv);
    sync_state_signal(st);
    pthread_mutex_unlock(&st->mu);
    Py_RETURN_NONE;
}


static PyMethodDef methods[] = {
    {"sync_worker_new", py_sync_worker_new, METH_NOARGS,
     "sync_worker_new(): a thread for fdatasync that never takes the GIL (a capsule)."},
    {"sync_worker_fileno", py_sync_worker_fileno, METH_O,
     "sync_worker_fileno(worker): its eventfd, readable once a job has ended."},
    {"sync_worker_submit", (PyCFunction)(void (*)(void))py_sync_worker_submit, METH_FASTCALL,
     "sync_worker_submit(worker, fds): fdatasync each of fds in order, in the thread."},
    {"sync_worker_collect", py_sync_worker_collect, METH_O,
     "sync_worker_collect(worker): the errno of the job that ended (0: ok), or None."},
    {"sync_worker_stop", py_sync_worker_stop, METH_O,
     "sync_worker_stop(worker): end the thread after the job in hand."},
    {"populate_write", (PyCFunction)(void (*)(void))py_populate_write, METH_FASTCALL,
     "populate_write(buf, start, length): fault in a writable map's pages as writes would,"
     " with the GIL released; 0 or madvise's errno."},
    {"stored_entries", (PyCFunction)(void (*)(void))py_stored_entries, METH_FASTCALL,
     "stored_entries(msgs, encoded, fixed, pack_ip, born_ips): encode_run's entries of stored"
     " messages,"
     " the bytes their records take, their topics' bytes and whether any properties hold a"
     " NUL; (entries, total, topics, nul)."},
    {"encode_run", (PyCFunction)(void (*)(void))py_encode_run, METH_FASTCALL,
     "encode_run(buf, pos, limit, file_from_offset, entries, topic_bytes, queue_table, clock,"
     " cluster_b, born_ip, born_port, store_ip, store_port, max_body_properties, stop_flags,"
     " stop_topic, hint_type): a run of sends' records (single sends, batch bodies) or of"
     " stored messages written into buf; (end, rows, waits, stamp, error)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pymq.store._commitlogc", "pymq.store._commitlogc: the commit log's record encoder (encode_run), page population and the fdatasync thread.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__commitlogc(void) {
    if (pymq_native_init() < 0) return NULL;
    return PyModule_Create(&module);
}
