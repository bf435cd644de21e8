/*
 * pymq.store._dispatchc: the reput's dispatch (consume queues, index) and record checks.
 *
 * An optional accelerator, picked once at import by pymq.common.native.load_native when it was
 * built (setup.py) and PYMQ_PURE_PYTHON is not set; else a function's Python twin (same
 * signature; tests/unit/test_twins.py) or, without one, the Python module's general path.
 */
#include "../common/_native.h"

/* --- index_put ---------------------------------------------------------------------------- */

#define INDEX_HEADER 40
#define INDEX_ENTRY 20

/* One key's entry written as index_file.index_put_py writes it: h (Java's hash, made non-negative)
 * chained into its slot, the entry at *count, *slot_count and *begin updated as the file's
 * header fields (the caller checked that the entry fits). */
static void index_write_entry(unsigned char *b, long long slot_num, long long entries_at,
                              long h, long long phy, long long store_ts, long long *count,
                              long long *slot_count, long long *begin) {
    unsigned char *slot = b + INDEX_HEADER + (h % slot_num) * 4;
    int32_t slot_value = (int32_t)get32(slot);
    if (slot_value <= 0 || slot_value > *count) {
        slot_value = 0;
        (*slot_count)++;
    }
    long long diff = 0;
    if (*begin > 0) {
        diff = (store_ts - *begin) / 1000;
        diff = diff < 0 ? 0 : (diff > I32_MAX ? I32_MAX : diff);
    }
    unsigned char *e = b + entries_at + *count * INDEX_ENTRY;
    put32(e, (uint32_t)h);
    put64(e + 4, (uint64_t)phy);
    put32(e + 12, (uint32_t)diff);
    put32(e + 16, (uint32_t)slot_value);
    put32(slot, (uint32_t)*count);
    if (*count <= 1) *begin = store_ts;
    (*count)++;
}

static PyObject *py_index_put(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) return PyErr_Format(PyExc_TypeError, "index_put takes 11 arguments");
    long long slot_num, index_num, entries_at, count, slot_count, begin, prefix, phy, store_ts;
    if (arg_int(args[1], "slot_num", 1, I32_MAX, &slot_num) < 0 ||
        arg_int(args[2], "index_num", 0, I32_MAX, &index_num) < 0 ||
        arg_int(args[3], "entries_at", 0, PY_SSIZE_T_MAX, &entries_at) < 0 ||
        arg_int(args[4], "count", 0, I32_MAX, &count) < 0 ||
        arg_int(args[5], "slot_count", I32_MIN, I32_MAX, &slot_count) < 0 ||
        arg_int(args[6], "begin_timestamp", LLONG_MIN, LLONG_MAX, &begin) < 0 ||
        arg_int(args[7], "prefix_hash", I32_MIN, 0xFFFFFFFFLL, &prefix) < 0 ||
        arg_int(args[9], "phy_offset", LLONG_MIN, LLONG_MAX, &phy) < 0 ||
        arg_int(args[10], "store_timestamp", LLONG_MIN, LLONG_MAX, &store_ts) < 0)
        return NULL;
    PyObject *keys = PySequence_Fast(args[8], "keys must be a sequence of str");
    if (keys == NULL) return NULL;
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_WRITABLE) < 0) {
        Py_DECREF(keys);
        return NULL;
    }
    unsigned char *b = buf.buf;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys), done = 0;
    if (INDEX_HEADER + slot_num * 4 > buf.len ||
        entries_at + index_num * INDEX_ENTRY > (long long)buf.len) {
        PyErr_SetString(PyExc_ValueError, "index layout does not fit the buffer");
        goto fail;
    }
    for (; done < n && count < index_num; done++) {
        PyObject *hash = java_hash_from((uint32_t)prefix, PySequence_Fast_GET_ITEM(keys, done));
        if (hash == NULL) goto fail;
        long h = PyLong_AsLong(hash);
        Py_DECREF(hash);
        h = h == I32_MIN ? 0 : (h < 0 ? -h : h); /* Java's indexKeyHashMethod */
        index_write_entry(b, slot_num, entries_at, h, phy, store_ts, &count, &slot_count, &begin);
    }
    PyBuffer_Release(&buf);
    Py_DECREF(keys);
    return Py_BuildValue("(LLLn)", count, slot_count, begin, done);
fail:
    PyBuffer_Release(&buf);
    Py_DECREF(keys);
    return NULL;
}

/* --- dispatch_hinted ------------------------------------------------------------------------ */

/* Attribute names read and written by dispatch_hinted, interned once. */
static PyObject *a_queue, *a_files, *a_wrote_position, *a_file_from_offset, *a_allocated,
    *a_file_size, *a_mm, *a_max_physic_offset, *a_index_count, *a_index_num, *a_end_phy_offset,
    *a_mf, *a_entries_at, *a_hash_slot_num, *a_hash_slot_count, *a_begin_timestamp,
    *a_begin_phy_offset, *a_end_timestamp, *a_prefix_hashes, *a_popleft;

static int intern_dispatch_names(void) {
    struct { PyObject **slot; const char *name; } names[] = {
        {&a_queue, "queue"}, {&a_files, "files"}, {&a_wrote_position, "wrote_position"},
        {&a_file_from_offset, "file_from_offset"}, {&a_allocated, "allocated"},
        {&a_file_size, "file_size"}, {&a_mm, "mm"}, {&a_max_physic_offset, "max_physic_offset"},
        {&a_index_count, "index_count"}, {&a_index_num, "index_num"},
        {&a_end_phy_offset, "end_phy_offset"}, {&a_mf, "mf"}, {&a_entries_at, "_entries_at"},
        {&a_hash_slot_num, "hash_slot_num"}, {&a_hash_slot_count, "hash_slot_count"},
        {&a_begin_timestamp, "begin_timestamp"}, {&a_begin_phy_offset, "begin_phy_offset"},
        {&a_end_timestamp, "end_timestamp"}, {&a_prefix_hashes, "_prefix_hashes"},
        {&a_popleft, "popleft"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (*names[i].slot == NULL && (*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL)
            return -1;
    }
    return 0;
}

/* obj.name as a C long long: 0, or -1 with an exception set. */
static int attr_ll(PyObject *obj, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int set_attr_ll(PyObject *obj, PyObject *name, long long value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) return -1;
    int rc = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return rc;
}

/* The last item of list attribute obj.name (a new reference), NULL without an exception when
 * the list is empty, or NULL with one. */
static PyObject *last_of(PyObject *obj, PyObject *name) {
    PyObject *list = PyObject_GetAttr(obj, name);
    if (list == NULL) return NULL;
    PyObject *item = NULL;
    if (!PyList_Check(list)) PyErr_SetString(PyExc_TypeError, "expected a list");
    else if (PyList_GET_SIZE(list) > 0) item = Py_NewRef(PyList_GET_ITEM(list, PyList_GET_SIZE(list) - 1));
    Py_DECREF(list);
    return item;
}

/* Whether a hint's str field (None or str) holds a property separator, \x01 or \x02; -1 for a
 * field of another type. */
static int has_separator(PyObject *s) {
    if (s == Py_None) return 0;
    if (!PyUnicode_Check(s)) return -1;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (n == 0) return 0;
    if (PyUnicode_FindChar(s, 1, 0, n, 1) != -1 || PyUnicode_FindChar(s, 2, 0, n, 1) != -1) return 1;
    return 0;
}

static int str_nonempty(PyObject *s) { return s != Py_None && PyUnicode_GET_LENGTH(s) > 0; }

/* Java's hash of a str as a signed 32-bit value (java_hash_from without the int object). */
static int java_hash32(uint32_t h, PyObject *s, int32_t *out) {
    PyObject *v = java_hash_from(h, s);
    if (v == NULL) return -1;
    *out = (int32_t)PyLong_AsLong(v);
    Py_DECREF(v);
    return 0;
}

/* Java's hash continued from h over code points [a, b) of a ready str (UTF-16 units). */
static uint32_t java_hash_range(uint32_t h, PyObject *s, Py_ssize_t a, Py_ssize_t b) {
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    for (Py_ssize_t i = a; i < b; i++) {
        Py_UCS4 cp = PyUnicode_READ(kind, data, i);
        if (cp >= 0x10000) {
            cp -= 0x10000;
            h = 31 * h + (0xD800 + (cp >> 10));
            h = 31 * h + (0xDC00 + (cp & 0x3FF));
        } else {
            h = 31 * h + cp;
        }
    }
    return h;
}

/* The keys of a record as IndexService.build_index lists them: UNIQ_KEY (when not empty), then
 * each non-empty piece of KEYS split at spaces; written as (start, end) ranges, the UNIQ_KEY's
 * marked by start -1.  Returns how many, at most max (more: max + 1). */
static int index_keys(PyObject *uniq, PyObject *keys, Py_ssize_t (*ranges)[2], int max) {
    int n = 0;
    if (str_nonempty(uniq)) {
        ranges[n][0] = -1;
        ranges[n][1] = PyUnicode_GET_LENGTH(uniq);
        n++;
    }
    if (str_nonempty(keys)) {
        int kind = PyUnicode_KIND(keys);
        const void *data = PyUnicode_DATA(keys);
        Py_ssize_t len = PyUnicode_GET_LENGTH(keys), i = 0;
        while (i < len) {
            while (i < len && PyUnicode_READ(kind, data, i) == ' ') i++;
            Py_ssize_t start = i;
            while (i < len && PyUnicode_READ(kind, data, i) != ' ') i++;
            if (i > start) {
                if (n == max) return max + 1;
                ranges[n][0] = start;
                ranges[n][1] = i;
                n++;
            }
        }
    }
    return n;
}

#define DISPATCH_MAX_KEYS 32

/* A writable buffer over obj.mm: 0, or -1 with an exception set. */
static int writable_mm(PyObject *obj, Py_buffer *view) {
    PyObject *mm = PyObject_GetAttr(obj, a_mm);
    if (mm == NULL) return -1;
    int rc = PyObject_GetBuffer(mm, view, PyBUF_WRITABLE);
    Py_DECREF(mm);
    return rc;
}

/* A consume queue dispatch_hinted has written to (or read) during one call: its attributes are
 * read once and written back once (dq_flush), and the file's buffer is held meanwhile.  Nothing
 * between two records runs Python code (the listener is called only after a flush of all), so
 * nothing else reads or changes them in between. */
typedef struct {
    PyObject *cq, *mf;  /* strong references; mf NULL until an entry is to be written */
    long long max_phy;  /* cq.max_physic_offset */
    long long pos, from, limit; /* mf.wrote_position, file_from_offset, min(allocated, size) */
    Py_buffer buf;
    int have_buf, dirty;
} dq_entry;

#define DQ_ENTRIES 32

/* The newest index file, likewise: read once, written back once. */
typedef struct {
    PyObject *file, *mf; /* strong references; file NULL: not read yet (or no file: none) */
    int loaded, full;    /* loaded: file (maybe NULL) and the first three fields read; full: all */
    long long end_phy, count, num, entries_at, slot_num, slots, begin, begin_phy, end_ts;
    long long allocated, file_size;
    Py_buffer buf;
    int have_buf, dirty;
} dq_index;

/* The first of several failures, kept while the other steps go on: first_error_note after
 * each step that failed (its exception set), first_error_end once all are done. */
typedef struct {
    PyObject *type, *value, *tb;
    int failed;
} first_error;

static void first_error_note(first_error *f) {
    if (!f->failed) PyErr_Fetch(&f->type, &f->value, &f->tb);
    else PyErr_Clear();
    f->failed = 1;
}

/* 0, or -1 with the first failure's exception set again. */
static int first_error_end(first_error *f) {
    if (!f->failed) return 0;
    PyErr_Restore(f->type, f->value, f->tb);
    return -1;
}

/* Set each objs[i].names[i] = values[i], all of them even when one fails: 0, or -1 with the
 * first failure's exception set. */
static int set_attrs_ll(PyObject *const *objs, PyObject *const *names, const long long *values,
                        int n) {
    first_error err = {0};
    for (int i = 0; i < n; i++)
        if (set_attr_ll(objs[i], names[i], values[i]) < 0) first_error_note(&err);
    return first_error_end(&err);
}

/* Write an entry's fields back and let it go: 0, or -1 with an exception set (it is let go
 * either way). */
static int dq_flush_entry(dq_entry *e) {
    int rc = 0;
    if (e->have_buf) PyBuffer_Release(&e->buf);
    e->have_buf = 0;
    if (e->dirty) {
        PyObject *objs[2] = {e->mf, e->cq};
        PyObject *names[2] = {a_wrote_position, a_max_physic_offset};
        long long values[2] = {e->pos, e->max_phy};
        rc = set_attrs_ll(objs, names, values, 2);
    }
    e->dirty = 0;
    Py_CLEAR(e->mf);
    Py_CLEAR(e->cq);
    return rc;
}

static int dq_flush_index(dq_index *x) {
    int rc = 0;
    if (x->have_buf) PyBuffer_Release(&x->buf);
    x->have_buf = 0;
    if (x->dirty) {
        PyObject *objs[6] = {x->file, x->file, x->file, x->file, x->file, x->file};
        PyObject *names[6] = {a_begin_timestamp, a_index_count, a_hash_slot_count,
                              a_end_phy_offset, a_end_timestamp, a_begin_phy_offset};
        long long values[6] = {x->begin, x->count, x->slots, x->end_phy, x->end_ts,
                               x->begin_phy};
        rc = set_attrs_ll(objs, names, values, 6);
    }
    x->dirty = 0;
    x->loaded = x->full = 0;
    Py_CLEAR(x->mf);
    Py_CLEAR(x->file);
    return rc;
}

/* Flush every cached queue and, unless x is NULL, the index: 0, or -1 with the first failure's
 * exception set (all are let go, and the rest written back, either way). */
static int dq_flush_all(dq_entry *entries, int *n, dq_index *x) {
    first_error err = {0};
    for (int i = 0; i < *n; i++)
        if (dq_flush_entry(&entries[i]) < 0) first_error_note(&err);
    *n = 0;
    if (x != NULL && dq_flush_index(x) < 0) first_error_note(&err);
    return first_error_end(&err);
}

/* The cached entry of cq, read (max_physic_offset) and added when new: NULL with an exception
 * set on failure.  A full cache is flushed first. */
static dq_entry *dq_entry_for(dq_entry *entries, int *n, PyObject *cq) {
    for (int i = 0; i < *n; i++)
        if (entries[i].cq == cq) return &entries[i];
    /* Many queues in one run: write them all back, and start again. */
    if (*n == DQ_ENTRIES && dq_flush_all(entries, n, NULL) < 0) return NULL;
    dq_entry *e = &entries[*n];
    memset(e, 0, sizeof *e);
    if (attr_ll(cq, a_max_physic_offset, &e->max_phy) < 0) return NULL;
    e->cq = Py_NewRef(cq);
    (*n)++;
    return e;
}

/*
 * dispatch_hinted(hints, log, pos, end, offset, limit, queues, listener, index[, wanted])
 *     -> (done, pos, offset, last_store_timestamp, exception or None)
 *
 * reput.ReputMessageService._dispatch_some's loop over the put path's dispatch hints, for the
 * common record: what ``_hint_for`` then ``ConsumeQueueTable.dispatch_fields`` do for it, in one
 * call for a run of records.  ``hints`` is the commit log's deque of DispatchHint tuples, ``log``
 * the commit-log file's bytes (``pos``/``end`` positions in it, ``offset`` the commit-log offset
 * at ``pos``), ``queues`` ConsumeQueueTable.queues (topic -> {queue id -> ConsumeQueue}),
 * ``listener`` the arrival listener or None, ``index`` the IndexService or None, ``wanted``
 * None or the container of the topics whose records the listener is called for.
 *
 * Each record is judged whole before anything is written: the hint is the head of the deque for
 * ``offset`` (stale ones are dropped as _hint_for drops them), the record is all below ``end``
 * and begins with the hinted size and the message magic, no tags/keys/UNIQ_KEY value holds a
 * separator, its consume queue exists and takes the entry as ConsumeQueue.put's first case (the
 * next entry of the last file, its blocks allocated), and the index either needs nothing or
 * takes the UNIQ_KEY as IndexService.build_index's first case (blocks allocated for it).  The
 * first record that is not so stops the run with nothing of it done: the Python loop then serves
 * it.  A consume-queue entry is written as ConsumeQueue.put writes it (the tags code is Java's
 * hash of TAGS, 0 without), the index entry and header as IndexFile.put_keys and write_header
 * do, and the listener is called after both (dispatch_fields calls it before the index: nothing
 * it does reads the index).  ``last_store_timestamp`` is the store timestamp of the last record
 * given a queue entry, -1 when none was.  An exception (from the listener, say) does not
 * propagate: it is returned with the records done before it (the listener's record among them,
 * its hint taken), for the caller to count them before it raises it, as the Python loop counts
 * each record as it is done.
 *
 * The queues' and the index file's attributes are read once per call (up to DQ_ENTRIES queues
 * at a time) and written back at its end, before each call of the listener, and whenever a
 * queue past DQ_ENTRIES comes: nothing else runs in between (the GIL is held and no Python
 * code is called), so what Python reads afterwards is what a write per record would leave.
 */
static PyObject *py_dispatch_hinted(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 && nargs != 10)
        return PyErr_Format(PyExc_TypeError, "dispatch_hinted takes 9 or 10 arguments");
    PyObject *hints = args[0], *queues = args[6], *listener = args[7], *index = args[8];
    PyObject *wanted = nargs == 10 && args[9] != Py_None ? args[9] : NULL;
    long long pos, end, offset, limit;
    if (arg_int(args[2], "pos", 0, PY_SSIZE_T_MAX, &pos) < 0 ||
        arg_int(args[3], "end", 0, PY_SSIZE_T_MAX, &end) < 0 ||
        arg_int(args[4], "offset", 0, LLONG_MAX, &offset) < 0 ||
        arg_int(args[5], "limit", 0, LLONG_MAX, &limit) < 0)
        return NULL;
    if (!PyDict_Check(queues)) return PyErr_Format(PyExc_TypeError, "queues must be a dict");
    if (listener == Py_None) listener = NULL;
    if (index == Py_None) index = NULL;
    if (intern_dispatch_names() < 0) return NULL;
    Py_buffer log;
    if (PyObject_GetBuffer(args[1], &log, PyBUF_SIMPLE) < 0) return NULL;
    if (end > log.len) end = log.len;
    const unsigned char *b = log.buf;
    long long done = 0, last_ts = -1;
    PyObject *hint = NULL;
    PyObject *prefix_hashes = NULL;
    int failed = 0;
    dq_entry entries[DQ_ENTRIES];
    int n_entries = 0;
    dq_index ix;
    memset(&ix, 0, sizeof ix);

    while (done < limit && pos < end) {
        Py_CLEAR(hint);
        Py_ssize_t n = PyObject_Size(hints);
        if (n < 0) { failed = 1; break; }
        if (n == 0) break;
        if ((hint = PySequence_GetItem(hints, 0)) == NULL) { failed = 1; break; }
        if (!PyTuple_Check(hint) || PyTuple_GET_SIZE(hint) != 10) break;
        PyObject **f = &PyTuple_GET_ITEM(hint, 0);
        long long phy = PyLong_AsLongLong(f[0]);
        if (phy == -1 && PyErr_Occurred()) { failed = 1; break; }
        if (phy < offset) { /* stale: dropped, as _hint_for drops it */
            PyObject *r = PyObject_CallMethodNoArgs(hints, a_popleft);
            if (r == NULL) { failed = 1; break; }
            Py_DECREF(r);
            continue;
        }
        if (phy != offset) break;
        long long size = PyLong_AsLongLong(f[1]);
        long long queue_id = PyLong_AsLongLong(f[3]);
        long long queue_offset = PyLong_AsLongLong(f[4]);
        long long store_ts = PyLong_AsLongLong(f[6]);
        long long sys_flag = PyLong_AsLongLong(f[7]);
        if (PyErr_Occurred()) { failed = 1; break; }
        PyObject *topic = f[2], *tags = f[5], *keys = f[8], *uniq = f[9];
        if (size < 8 || size > I32_MAX || pos + size > end) break; /* not all written yet, or odd: Python */
        if ((long long)get32(b + pos) != size || get32(b + pos + 4) != MESSAGE_MAGIC) break;
        if (!PyUnicode_Check(topic) || has_separator(tags) != 0 || has_separator(keys) != 0 ||
            has_separator(uniq) != 0 || queue_id < 0 || queue_id > I32_MAX || queue_offset < 0 ||
            queue_offset > LLONG_MAX / 20 - 1 || phy > LLONG_MAX - size)
            break;

        /* The consume queue's part, judged. */
        int cq_put = !(sys_flag & 0x4); /* not PREPARED (0x4) nor ROLLBACK (0xC) */
        dq_entry *e = NULL;
        if (cq_put) {
            PyObject *by_id = PyDict_GetItemWithError(queues, topic);
            if (by_id == NULL) { if (PyErr_Occurred()) failed = 1; break; }
            if (!PyDict_Check(by_id)) break;
            PyObject *cq = PyDict_GetItemWithError(by_id, f[3]);
            if (cq == NULL) { if (PyErr_Occurred()) failed = 1; break; }
            if ((e = dq_entry_for(entries, &n_entries, cq)) == NULL) { failed = 1; break; }
            if (phy + size <= e->max_phy) {
                cq_put = 0; /* already there (re-dispatch): no entry, no listener */
            } else {
                if (e->mf == NULL) {
                    PyObject *q = PyObject_GetAttr(cq, a_queue);
                    if (q == NULL) { failed = 1; break; }
                    PyObject *mf = last_of(q, a_files);
                    Py_DECREF(q);
                    if (mf == NULL) { if (PyErr_Occurred()) failed = 1; break; }
                    long long allocated, file_size;
                    if (attr_ll(mf, a_wrote_position, &e->pos) < 0 ||
                        attr_ll(mf, a_file_from_offset, &e->from) < 0 ||
                        attr_ll(mf, a_allocated, &allocated) < 0 ||
                        attr_ll(mf, a_file_size, &file_size) < 0) {
                        Py_DECREF(mf);
                        failed = 1;
                        break;
                    }
                    e->mf = mf;
                    e->limit = allocated < file_size ? allocated : file_size;
                }
                if (e->from + e->pos != queue_offset * 20 || e->pos + 20 > e->limit) break;
            }
        }

        /* The index's part, judged: index_put is how many keys go into the newest file. */
        int index_put = 0;
        int32_t prefix = 0;
        Py_ssize_t ranges[DISPATCH_MAX_KEYS][2];
        if (index != NULL) {
            if (!ix.loaded) {
                ix.file = last_of(index, a_files);
                if (ix.file == NULL && PyErr_Occurred()) { failed = 1; break; }
                if (ix.file != NULL && (attr_ll(ix.file, a_end_phy_offset, &ix.end_phy) < 0 ||
                                        attr_ll(ix.file, a_index_count, &ix.count) < 0 ||
                                        attr_ll(ix.file, a_index_num, &ix.num) < 0)) {
                    Py_CLEAR(ix.file);
                    failed = 1;
                    break;
                }
                ix.loaded = 1;
            }
            int nkeys = index_keys(uniq, keys, ranges, DISPATCH_MAX_KEYS);
            if (ix.file != NULL && phy < ix.end_phy) {
                /* already indexed (re-dispatch after recovery) */
            } else if ((sys_flag & 0xC) == 0xC) {
                /* rolled back: not indexed */
            } else if (ix.file == NULL || ix.count >= ix.num || nkeys > DISPATCH_MAX_KEYS) {
                break; /* no file yet, a full one (Python rolls), or very many keys */
            } else if (nkeys == 0 && str_nonempty(keys)) {
                break; /* KEYS of spaces only: build_index writes the header and caches the
                          topic's prefix hash (a fresh file's index_count 1 goes to disk) */
            } else if (nkeys > 0) {
                if (prefix_hashes == NULL &&
                    (prefix_hashes = PyObject_GetAttr(index, a_prefix_hashes)) == NULL) { failed = 1; break; }
                if (!PyDict_Check(prefix_hashes)) break;
                PyObject *p = PyDict_GetItemWithError(prefix_hashes, topic);
                if (p == NULL) { if (PyErr_Occurred()) failed = 1; break; }
                long pv = PyLong_AsLong(p);
                if (pv == -1 && PyErr_Occurred()) { failed = 1; break; }
                prefix = (int32_t)pv;
                if (ix.count + nkeys > ix.num) break; /* rolls in the middle: Python */
                if (!ix.full) {
                    if ((ix.mf = PyObject_GetAttr(ix.file, a_mf)) == NULL) { failed = 1; break; }
                    if (attr_ll(ix.mf, a_allocated, &ix.allocated) < 0 ||
                        attr_ll(ix.mf, a_file_size, &ix.file_size) < 0 ||
                        attr_ll(ix.file, a_entries_at, &ix.entries_at) < 0 ||
                        attr_ll(ix.file, a_hash_slot_num, &ix.slot_num) < 0 ||
                        attr_ll(ix.file, a_hash_slot_count, &ix.slots) < 0 ||
                        attr_ll(ix.file, a_begin_timestamp, &ix.begin) < 0 ||
                        attr_ll(ix.file, a_begin_phy_offset, &ix.begin_phy) < 0 ||
                        attr_ll(ix.file, a_end_timestamp, &ix.end_ts) < 0) {
                        Py_CLEAR(ix.mf);
                        failed = 1;
                        break;
                    }
                    ix.full = 1;
                }
                long long need = ix.entries_at + (ix.count + nkeys) * INDEX_ENTRY;
                if (need > ix.file_size) need = ix.file_size;
                if (need > ix.allocated || ix.slot_num < 1) break; /* blocks first: Python */
                index_put = nkeys;
            }
            /* else: no key to index, the header stays as it is */
        }

        /* Judged: both buffers taken and checked before anything is written (a layout that
         * does not fit is left to the Python loop, which raises as it would). */
        int32_t code = 0;
        if (str_nonempty(tags) && java_hash32(0, tags, &code) < 0) { failed = 1; break; }
        if (cq_put && !e->have_buf) {
            if (writable_mm(e->mf, &e->buf) < 0) { failed = 1; break; }
            e->have_buf = 1;
        }
        if (index_put && !ix.have_buf) {
            if (writable_mm(ix.mf, &ix.buf) < 0) { failed = 1; break; }
            ix.have_buf = 1;
        }
        if (cq_put && e->pos + 20 > e->buf.len) break;
        if (index_put && !(INDEX_HEADER + ix.slot_num * 4 <= ix.buf.len &&
                           ix.entries_at + ix.num * INDEX_ENTRY <= (long long)ix.buf.len))
            break;
        if (cq_put) {
            unsigned char *q = (unsigned char *)e->buf.buf + e->pos;
            put64(q, (uint64_t)phy);
            put32(q + 8, (uint32_t)size);
            put64(q + 12, (uint64_t)(int64_t)code);
            e->pos += 20;
            e->max_phy = phy + size;
            e->dirty = 1;
            last_ts = store_ts;
        }
        if (index_put) {
            long long first = ix.count;
            unsigned char *ib_b = ix.buf.buf;
            for (int k = 0; k < index_put; k++) {
                uint32_t hu = ranges[k][0] < 0
                    ? java_hash_range((uint32_t)prefix, uniq, 0, ranges[k][1])
                    : java_hash_range((uint32_t)prefix, keys, ranges[k][0], ranges[k][1]);
                int32_t hv = (int32_t)hu;
                long h = hv == I32_MIN ? 0 : (hv < 0 ? -(long)hv : hv); /* indexKeyHashMethod */
                index_write_entry(ib_b, ix.slot_num, ix.entries_at, h, phy, store_ts, &ix.count,
                                  &ix.slots, &ix.begin);
            }
            if (first <= 1) ix.begin_phy = phy;
            /* IndexFile.write_header: begin/end timestamp, begin/end offset, slots, count. */
            put64(ib_b, (uint64_t)ix.begin);
            put64(ib_b + 8, (uint64_t)store_ts);
            put64(ib_b + 16, (uint64_t)ix.begin_phy);
            put64(ib_b + 24, (uint64_t)phy);
            put32(ib_b + 32, (uint32_t)ix.slots);
            put32(ib_b + 36, (uint32_t)ix.count);
            ix.end_phy = phy;
            ix.end_ts = store_ts;
            ix.dirty = 1;
        }
        PyObject *r = PyObject_CallMethodNoArgs(hints, a_popleft);
        if (r == NULL) { failed = 1; break; }
        Py_DECREF(r);
        pos += size;
        offset += size;
        done++;
        int notify = cq_put && listener != NULL;
        if (notify && wanted != NULL) {
            notify = PySequence_Contains(wanted, topic);
            if (notify < 0) { failed = 1; break; } /* the record is done: counted, as below */
        }
        if (notify) {
            /* The listener is Python code: what it may read is written back first. */
            if (dq_flush_all(entries, &n_entries, &ix) < 0) { failed = 1; break; }
            PyObject *largs[5] = {topic, f[3], NULL, NULL, f[6]};
            largs[2] = PyLong_FromLongLong(queue_offset + 1);
            largs[3] = PyLong_FromLong(code);
            PyObject *lr = NULL;
            if (largs[2] != NULL && largs[3] != NULL) lr = PyObject_Vectorcall(listener, largs, 5, NULL);
            Py_XDECREF(largs[2]);
            Py_XDECREF(largs[3]);
            if (lr == NULL) { failed = 1; break; }
            Py_DECREF(lr);
        }
    }
    Py_XDECREF(hint);
    Py_XDECREF(prefix_hashes);
    /* What the run wrote goes back into the queues' and the index's attributes (an error
     * that stopped the run is the one returned). */
    first_error err = {0};
    if (failed) first_error_note(&err);
    if (dq_flush_all(entries, &n_entries, &ix) < 0) first_error_note(&err);
    failed = first_error_end(&err) < 0;
    PyBuffer_Release(&log);
    PyObject *exc = Py_NewRef(Py_None);
    if (failed) {
        /* The records before (and, for the listener, this one) are done: their hints are
         * taken, so the caller must count them before it raises. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (value == NULL) {
            Py_DECREF(exc);
            return NULL;
        }
        if (tb != NULL) PyException_SetTraceback(value, tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
        Py_SETREF(exc, value);
    }
    return tuple_of(5, PyLong_FromLongLong(done), PyLong_FromLongLong(pos),
                    PyLong_FromLongLong(offset), PyLong_FromLongLong(last_ts), exc);
}


/* --- record_is ------------------------------------------------------------------------------ */

/* record_is(data, size): whether bytes ``data`` are ``size`` long and begin as a message record of
 * that size (TOTALSIZE, then the message magic code): the pull's check of what a consume-queue
 * entry points to, per served message. */
static PyObject *py_record_is(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0]))
        return PyErr_Format(PyExc_TypeError, "record_is(data: bytes, size: int)");
    long long size = PyLong_AsLongLong(args[1]);
    if (size == -1 && PyErr_Occurred()) return NULL;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    if (PyBytes_GET_SIZE(args[0]) != size || size < 8 || (long long)get32(p) != size ||
        get32(p + 4) != MESSAGE_MAGIC)
        Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}


/* --- record_hints ---------------------------------------------------------------------------- */

/* The TAGS, KEYS and UNIQ_KEY values of a record (NULL when absent). */
typedef struct {
    const unsigned char *tags, *keys, *uniq;
    Py_ssize_t tags_len, keys_len, uniq_len;
} hint_names;

/* The three values from the properties [p, p + n) when they are strictly formed (each item
 * name\x01value\x02, the last \x02 optional, names and values non-empty and without \x01,
 * none of the three named twice): 0, with property_value's reading of each.  -1 for anything
 * else, which the Python loop must judge (plain_record has ruled out NUL and non-ASCII). */
static int strict_hint_names(const unsigned char *p, Py_ssize_t n, hint_names *out) {
    memset(out, 0, sizeof *out);
    Py_ssize_t i = 0;
    int seen_tags = 0, seen_keys = 0, seen_uniq = 0;
    while (i < n) {
        Py_ssize_t name = i;
        while (i < n && p[i] != 1 && p[i] != 2) i++;
        if (i == n || p[i] != 1 || i == name) return -1;
        Py_ssize_t name_len = i - name, value = ++i;
        while (i < n && p[i] != 1 && p[i] != 2) i++;
        if ((i < n && p[i] == 1) || i == value) return -1;
        Py_ssize_t value_len = i - value;
        if (i < n) i++; /* the \x02 */
        const unsigned char *nm = p + name;
        if (bytes_is(nm, name_len, "TAGS")) {
            if (seen_tags++) return -1;
            out->tags = p + value, out->tags_len = value_len;
        } else if (bytes_is(nm, name_len, "KEYS")) {
            if (seen_keys++) return -1;
            out->keys = p + value, out->keys_len = value_len;
        } else if (bytes_is(nm, name_len, "UNIQ_KEY")) {
            if (seen_uniq++) return -1;
            out->uniq = p + value, out->uniq_len = value_len;
        }
    }
    return 0;
}

static PyObject *hint_text(const unsigned char *p, Py_ssize_t n) {
    if (p == NULL) Py_RETURN_NONE;
    return PyUnicode_FromStringAndSize((const char *)p, n);
}

/* record_hints(buf, pos, end, file_from_offset, max_rows, skip_topic, hint_type)
 * The dispatch hints the put path leaves for the records at buf[pos:end] (a commit-log file
 * from file_from_offset), made by reading the records back: for records appended without one
 * (an HA slave's, recovery's, or past DISPATCH_HINTS_MAX), so that dispatch_hinted can take
 * them.  Each row is what reput's Python loop reads of the record (read_record_info, then
 * property_value of TAGS, KEYS and UNIQ_KEY), as an instance of hint_type (DispatchHint).
 * Returns (rows, stop): at most max_rows rows, and where it stopped: end, or the first record
 * the Python loop must judge (not a plain record at its own physical offset, see plain_record;
 * a blank; a record of skip_topic, whose tags code is its deliver time; properties that are
 * not strictly formed). */
static PyObject *py_record_hints(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) return PyErr_Format(PyExc_TypeError, "record_hints takes 7 arguments");
    long long pos, end, file_from, max_rows;
    if (arg_int(args[1], "pos", 0, PY_SSIZE_T_MAX, &pos) < 0 ||
        arg_int(args[2], "end", 0, PY_SSIZE_T_MAX, &end) < 0 ||
        arg_int(args[3], "file_from_offset", 0, LLONG_MAX / 2, &file_from) < 0 ||
        arg_int(args[4], "max_rows", 0, PY_SSIZE_T_MAX, &max_rows) < 0)
        return NULL;
    PyTypeObject *hint_type = NULL;
    if (!PyBytes_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "skip_topic must be bytes");
        return NULL;
    }
    if (hint_type_arg(args[6], &hint_type) < 0) return NULL;
    const char *skip = PyBytes_AS_STRING(args[5]);
    Py_ssize_t skip_len = PyBytes_GET_SIZE(args[5]);
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (end > buf.len) end = buf.len;
    const unsigned char *b = buf.buf;
    PyObject *rows = PyList_New(0), *topic = NULL;
    if (rows == NULL) goto fail;
    while (pos < end && PyList_GET_SIZE(rows) < max_rows) {
        int64_t total = plain_record(b, pos, end, 0, 1, file_from);
        if (total <= 0) break;
        const unsigned char *r = b + pos;
        int64_t q = V4_HEADER + (int32_t)get32(r + 84);
        Py_ssize_t topic_len = r[q];
        const char *t = (const char *)r + q + 1;
        if (topic_len == skip_len && memcmp(t, skip, skip_len) == 0) break;
        hint_names names;
        const unsigned char *props = r + q + 1 + topic_len + 2;
        if (strict_hint_names(props, total - (q + 1 + topic_len + 2), &names) < 0) break;
        if (topic == NULL || PyUnicode_GET_LENGTH(topic) != topic_len ||
            memcmp(PyUnicode_DATA(topic), t, topic_len) != 0) {
            Py_XDECREF(topic);
            topic = PyUnicode_FromStringAndSize(t, topic_len); /* ASCII: plain_record */
            if (topic == NULL) goto fail;
        }
        PyObject *row = hint_type != NULL ? hint_type->tp_alloc(hint_type, 10) : PyTuple_New(10);
        if (row == NULL) goto fail;
        PyObject *v[10] = {PyLong_FromLongLong(get64(r + 28)),
                           PyLong_FromLongLong(total),
                           Py_NewRef(topic),
                           PyLong_FromLong((int32_t)get32(r + 12)),
                           PyLong_FromLongLong(get64(r + 20)),
                           hint_text(names.tags, names.tags_len),
                           PyLong_FromLongLong(get64(r + 56)),
                           PyLong_FromLong((int32_t)get32(r + 36)),
                           hint_text(names.keys, names.keys_len),
                           hint_text(names.uniq, names.uniq_len)};
        int ok = 1;
        for (int i = 0; i < 10; i++) {
            if (v[i] == NULL) ok = 0;
            PyTuple_SET_ITEM(row, i, v[i]);
        }
        if (!ok || PyList_Append(rows, row) < 0) {
            Py_DECREF(row);
            goto fail;
        }
        Py_DECREF(row);
        pos += total;
    }
    Py_XDECREF(topic);
    PyBuffer_Release(&buf);
    return Py_BuildValue("(NL)", rows, pos);
fail:
    Py_XDECREF(topic);
    Py_XDECREF(rows);
    PyBuffer_Release(&buf);
    return NULL;
}



static PyMethodDef methods[] = {
    {"index_put", (PyCFunction)(void (*)(void))py_index_put, METH_FASTCALL,
     "index_put(buf, slot_num, index_num, entries_at, count, slot_count, begin_timestamp,"
     " prefix_hash, keys, phy_offset, store_timestamp): index keys into one index file."},
    {"dispatch_hinted", (PyCFunction)(void (*)(void))py_dispatch_hinted, METH_FASTCALL,
     "dispatch_hinted(hints, log, pos, end, offset, limit, queues, listener, index): a run of"
     " hinted records dispatched to their consume queues and the index; (done, pos, offset,"
     " last_store_timestamp, exception or None)."},
    {"record_is", (PyCFunction)(void (*)(void))py_record_is, METH_FASTCALL,
     "record_is(data, size): whether data is size bytes beginning as a message record of that"
     " size (TOTALSIZE, magic code)."},
    {"record_hints", (PyCFunction)(void (*)(void))py_record_hints, METH_FASTCALL,
     "record_hints(buf, pos, end, file_from_offset, max_rows, skip_topic, hint_type): the"
     " dispatch hints of the records at buf[pos:end], read back; (rows, stop)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pymq.store._dispatchc", "pymq.store._dispatchc: the reput's dispatch (consume queues, index) and record checks.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__dispatchc(void) {
    if (pymq_native_init() < 0) return NULL;
    return PyModule_Create(&module);
}
