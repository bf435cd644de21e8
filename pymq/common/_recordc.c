/*
 * pymq.common._recordc: the commit-log record codec's two hot loops in C.
 *
 * pymq/common/message.py holds the codec and stays the reference: this module is an optional
 * accelerator with the same contracts, used when it was built (see setup.py) and not turned off
 * with PYMQ_PURE_PYTHON=1.  tests/unit/test_recordc.py checks both against each other.
 *
 *   crc32(data, value=0)        zlib-compatible CRC-32 (reflected polynomial 0xEDB88320), by
 *                               carry-less multiplication where the CPU has PCLMULQDQ, else by
 *                               tables; set_clmul(flag) switches for tests.
 *   encode_into(buf, pos, body, topic, properties, queue_id, flag, queue_offset,
 *               physical_offset, sys_flag, born_timestamp, born_ip, born_port,
 *               store_timestamp, store_ip, store_port, reconsume_times,
 *               prepared_transaction_offset) -> size
 *                               message.encode_record_into with the body CRC computed here:
 *                               one record written at buf[pos:].
 *   properties_bytes(props)     message.properties_bytes: the PROPERTIES field (UTF-8) of a
 *                               dict of str, ``name\x01value\x02...`` without a trailing \x02.
 *   decode_batch(data, cls, error_cls)
 *                               batch.decode_batch_body: the items of a SEND_BATCH_MESSAGE body.
 *   encode_batch(buf, pos, limit, data, first_queue_offset, file_from_offset, topic_b, ...)
 *                               store.commitlog.CommitLog.append_batch_body: a batch request's
 *                               items written as records with the broker's stored properties,
 *                               or None for the Python path (see the function).
 *   encode_single(buf, pos, limit, body, properties, flag, queue_offset, ...)
 *                               CommitLog.append_single_fast: the same for one send.  Both make
 *                               their rows as the hint type given last (DispatchHint).
 *   offset_msg_ids(prefix, rows)
 *                               message_id.offset_msg_ids: a batch's comma-joined msgId.
 *   send_answer_frame(opaque, msg_id, queue_id, queue_offset, quoted_region, trace_on, version)
 *                               broker.processors.send.SendProcessor._answer_now's frame.
 *   populate_write(buf, start, length)
 *                               MADV_POPULATE_WRITE over buf[start:start+length] with the GIL
 *                               released (mapped_file.MappedFile.populate); 0 or the errno.
 *   sync_worker_new/_fileno/_submit/_collect/_stop
 *                               a thread that calls fdatasync and never takes the GIL, its end
 *                               reported through an eventfd (mapped_file_queue.NativeSyncThread).
 *   decode_properties(text)     message.decode_properties: the dict of a properties string
 *                               (items without a name or a value skipped, the last of a name
 *                               kept at the place of its first).
 *   json_command(header, cls, serialize_type)
 *                               remoting.codec._decode_json_header's plain case: a request's
 *                               JSON header dict (as orjson parsed it) as a RemotingCommand
 *                               built by calling cls, or None for the Python code to judge.
 *   json_header(buf, start, end, cls, serialize_type)
 *                               json_command's case read straight from the header's bytes
 *                               (plain ASCII JSON, nothing nested but extFields' strings),
 *                               without orjson's dict; None for the general decoder.
 *   send_fields(buf, start, end)
 *                               a plain single send's or batch's fields (SEND_MESSAGE_V2 or
 *                               SEND_BATCH_MESSAGE, or the C++ client's SEND_MESSAGE) (opaque,
 *                               topic, queue id, sys flag, born timestamp, flag, properties,
 *                               reconsume times, body start, batch) for the broker's raw send
 *                               path, or None.
 *   send_header(ext, names, cls, batch_code)
 *                               remoting.headers.SendMessageRequestHeader.from_ext's common
 *                               case (required fields present, plain decimals, "true",
 *                               "false", "1" or "0"): the header built by calling cls, or None.
 *   plain_header(ext, spec, cls)
 *                               the same for a header given as ((wire name, kind), ...): kinds
 *                               s / S (required / optional str), i / l (plain decimal Java int /
 *                               long), b (true / false / 1 / 0, False when absent).
 *   decode_plain(buf, pos, check_crc, cls)
 *                               record._decode_plain_py: the common record (IPv4 hosts, sane
 *                               lengths, UTF-8 text without NUL) as a MessageExt built by
 *                               calling cls, or None for the careful parser.
 *   java_hash(s), java_hash_after(prefix_hash, s)
 *                               message.java_string_hash(_after): Java's String.hashCode over
 *                               UTF-16 code units, as a signed 32-bit int.
 *   index_put(buf, slot_num, index_num, entries_at, count, slot_count, begin_timestamp,
 *             prefix_hash, keys, phy_offset, store_timestamp)
 *                               store.index_file.IndexFile.put_keys: index each key (its hash
 *                               java_hash_after(prefix_hash, key), made non-negative) into one
 *                               index file; returns (count, slot_count, begin_timestamp, done).
 *   dispatch_hinted(hints, log, pos, end, offset, limit, queues, listener, index)
 *                               store.reput's loop over the put path's dispatch hints: a run
 *                               of common records given their consume-queue entries and
 *                               UNIQ_KEY index entries; (done, pos, offset, last timestamp,
 *                               the exception that stopped it or None).
 *   offset_msg_id(prefix, offset)
 *                               prefix + the offset as 16 uppercase hex digits (the broker's
 *                               message id from its store-host prefix), as f"{p}{o:016X}".
 *   now_ms()                    time.time_ns() // 1_000_000 (CLOCK_REALTIME), without a frame.
 *   scan(buf, pos, limit, check_crc, physical_base, select, selected) -> pos
 *                               message._scan_plain: walk plain records (IPv4 hosts, ASCII
 *                               topic and properties) until limit or the first record that
 *                               needs the careful parser; positions of records for which
 *                               select(topic, queue_id, physical_offset, size) is true are
 *                               appended to the list ``selected``.
 *   export_columns(buf, pos, stop, physical_base, stop_timestamp, max_rows, max_body_bytes,
 *                  inflate, host6)
 *                               the Spark export's decoder: a run of valid records as Arrow
 *                               column buffers (pymq.export.columns builds the arrays).
 *
 * Record layout (RocketMQ 4.x CommitLog, big-endian): TOTALSIZE i32, MAGICCODE u32, BODYCRC i32,
 * QUEUEID i32, FLAG i32, QUEUEOFFSET i64, PHYSICALOFFSET i64, SYSFLAG i32, BORNTIMESTAMP i64,
 * BORNHOST (4 or 16 bytes) + port i32, STORETIMESTAMP i64, STOREHOST (4 or 16) + port i32,
 * RECONSUMETIMES i32, PREPAREDTRANSACTIONOFFSET i64, BODYLENGTH i32, BODY, TOPICLENGTH i8,
 * TOPIC, PROPERTIESLENGTH i16, PROPERTIES.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#define MESSAGE_MAGIC 0xDAA320A7u
#define BORNHOST_V6 0x10
#define STOREHOST_V6 0x20
#define V4_HEADER 88 /* header size with two IPv4 hosts, BODYLENGTH included */
#define MAX_TOPIC 127
#define MAX_PROPERTIES 32767

/* --- CRC-32, slicing by eight --------------------------------------------------------------- */

static uint32_t crc_tables[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        crc_tables[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_tables[0][i];
        for (int t = 1; t < 8; t++) {
            c = crc_tables[0][c & 0xFF] ^ (c >> 8);
            crc_tables[t][i] = c;
        }
    }
}

/* The CRC register (not inverted) advanced over n bytes, a byte or eight at a time. */
static uint32_t crc_tables_update(uint32_t state, const unsigned char *p, Py_ssize_t n) {
    while (n && ((uintptr_t)p & 7)) {
        state = crc_tables[0][(state ^ *p++) & 0xFF] ^ (state >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                      (uint32_t)p[3] << 24;
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        lo ^= state;
        state = crc_tables[7][lo & 0xFF] ^ crc_tables[6][(lo >> 8) & 0xFF] ^
                crc_tables[5][(lo >> 16) & 0xFF] ^ crc_tables[4][lo >> 24] ^
                crc_tables[3][hi & 0xFF] ^ crc_tables[2][(hi >> 8) & 0xFF] ^
                crc_tables[1][(hi >> 16) & 0xFF] ^ crc_tables[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) state = crc_tables[0][(state ^ *p++) & 0xFF] ^ (state >> 8);
    return state;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_CLMUL_PATH 1
static int use_clmul;

/*
 * Carry-less multiplication folding (Gopal et al., "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ Instruction", Intel 2009) for the reflected CRC-32 polynomial.
 * n >= 64 and a multiple of 16.  Constants are x^k mod P (bit-reflected, shifted by one) for
 * folding across 512 bits (K1, K2) and 128 bits (K3, K4), K5 for 64 -> 32 bits, then Barrett
 * reduction with P and mu = floor(x^64 / P).
 */
__attribute__((target("pclmul,sse2"))) static uint32_t crc_clmul_update(uint32_t state,
                                                                         const unsigned char *p,
                                                                         Py_ssize_t n) {
    const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124LL);
    const __m128i poly_mu = _mm_set_epi64x(0x1f7011641LL, 0x1db710641LL);
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x0 = _mm_loadu_si128((const __m128i *)p);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 48));
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)state));
    p += 64;
    n -= 64;
#define FOLD(x, k, data)                                                                          \
    _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), \
                  data)
    while (n >= 64) {
        x0 = FOLD(x0, k1k2, _mm_loadu_si128((const __m128i *)p));
        x1 = FOLD(x1, k1k2, _mm_loadu_si128((const __m128i *)(p + 16)));
        x2 = FOLD(x2, k1k2, _mm_loadu_si128((const __m128i *)(p + 32)));
        x3 = FOLD(x3, k1k2, _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        n -= 64;
    }
    x0 = FOLD(x0, k3k4, x1);
    x0 = FOLD(x0, k3k4, x2);
    x0 = FOLD(x0, k3k4, x3);
    while (n >= 16) {
        x0 = FOLD(x0, k3k4, _mm_loadu_si128((const __m128i *)p));
        p += 16;
        n -= 16;
    }
#undef FOLD
    /* 128 -> 64 bits */
    x0 = _mm_xor_si128(_mm_clmulepi64_si128(x0, k3k4, 0x10), _mm_srli_si128(x0, 8));
    /* 64 -> 32 bits */
    x0 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x0, mask32), k5, 0x00),
                       _mm_srli_si128(x0, 4));
    /* Barrett reduction */
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x0, mask32), poly_mu, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), poly_mu, 0x00);
    x0 = _mm_xor_si128(x0, t);
    return (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(x0, 4));
}
#endif

/* zlib's crc32(crc, p, n). */
static uint32_t crc_update(uint32_t crc, const unsigned char *p, Py_ssize_t n) {
    uint32_t state = ~crc;
#ifdef HAVE_CLMUL_PATH
    if (use_clmul && n >= 64) {
        Py_ssize_t chunk = n & ~(Py_ssize_t)15;
        state = crc_clmul_update(state, p, chunk);
        p += chunk;
        n -= chunk;
    }
#endif
    return ~crc_tables_update(state, p, n);
}

/* --- big-endian access ---------------------------------------------------------------------- */

static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* v in decimal at p (room for 20 characters): the length written, as "%lld" writes it. */
static int fmt_ll(char *p, long long v) {
    char tmp[20];
    int n = 0, len = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) p[len++] = '-';
    while (n) p[len++] = tmp[--n];
    return len;
}

/* The C string lit at p: the length written. */
static int put_lit(char *p, const char *lit) {
    size_t n = strlen(lit);
    memcpy(p, lit, n);
    return (int)n;
}

static inline void put64(unsigned char *p, uint64_t v) {
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

static inline uint32_t get32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline int64_t get64(const unsigned char *p) {
    return (int64_t)((uint64_t)get32(p) << 32 | get32(p + 4));
}

/* --- argument helpers ----------------------------------------------------------------------- */

static int arg_int(PyObject *v, const char *what, long long lo, long long hi, long long *out) {
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (x < lo || x > hi) {
        PyErr_Format(PyExc_OverflowError, "%s = %lld does not fit its record field", what, x);
        return -1;
    }
    *out = x;
    return 0;
}

#define I32_MIN (-2147483647LL - 1)
#define I32_MAX 2147483647LL

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

/* --- encode_into ---------------------------------------------------------------------------- */

static PyObject *py_encode_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 18) {
        PyErr_Format(PyExc_TypeError, "encode_into takes 18 arguments (%zd given)", nargs);
        return NULL;
    }
    /* Fields come as arguments: Python's specialised attribute loads are cheaper than
     * PyObject_GetAttr from here. */
    long long pos, queue_id, flag, queue_offset, phy, sys_flag, born_ts, born_port, store_ts,
        store_port, reconsume, prepared;
    if (arg_int(args[1], "pos", 0, PY_SSIZE_T_MAX, &pos) < 0 ||
        arg_int(args[5], "queue_id", I32_MIN, I32_MAX, &queue_id) < 0 ||
        arg_int(args[6], "flag", I32_MIN, I32_MAX, &flag) < 0 ||
        arg_int(args[7], "queue_offset", LLONG_MIN, LLONG_MAX, &queue_offset) < 0 ||
        arg_int(args[8], "physical_offset", LLONG_MIN, LLONG_MAX, &phy) < 0 ||
        arg_int(args[9], "sys_flag", I32_MIN, I32_MAX, &sys_flag) < 0 ||
        arg_int(args[10], "born_timestamp", LLONG_MIN, LLONG_MAX, &born_ts) < 0 ||
        arg_int(args[12], "born_port", I32_MIN, I32_MAX, &born_port) < 0 ||
        arg_int(args[13], "store_timestamp", LLONG_MIN, LLONG_MAX, &store_ts) < 0 ||
        arg_int(args[15], "store_port", I32_MIN, I32_MAX, &store_port) < 0 ||
        arg_int(args[16], "reconsume_times", I32_MIN, I32_MAX, &reconsume) < 0 ||
        arg_int(args[17], "prepared_transaction_offset", LLONG_MIN, LLONG_MAX, &prepared) < 0)
        return NULL;
    PyObject *body_obj = args[2], *topic = args[3], *props = args[4], *born_ip = args[11],
             *store_ip = args[14];
    if (!PyBytes_Check(topic) || !PyBytes_Check(props) || !PyBytes_Check(born_ip) ||
        !PyBytes_Check(store_ip)) {
        PyErr_SetString(PyExc_TypeError, "topic, properties and host addresses must be bytes");
        return NULL;
    }
    Py_ssize_t topic_len = PyBytes_GET_SIZE(topic), props_len = PyBytes_GET_SIZE(props);
    Py_ssize_t born_len = (sys_flag & BORNHOST_V6) ? 16 : 4;
    Py_ssize_t store_len = (sys_flag & STOREHOST_V6) ? 16 : 4;
    if (topic_len > MAX_TOPIC || props_len > MAX_PROPERTIES) {
        PyErr_SetString(PyExc_ValueError, "topic or properties too long for the record layout");
        return NULL;
    }
    if (PyBytes_GET_SIZE(born_ip) != born_len || PyBytes_GET_SIZE(store_ip) != store_len) {
        PyErr_SetString(PyExc_ValueError, "host address lengths disagree with the sys flag");
        return NULL;
    }

    Py_buffer body, buf;
    if (PyObject_GetBuffer(body_obj, &body, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&body);
        return NULL;
    }
    Py_ssize_t header = V4_HEADER - 8 + born_len + store_len;
    long long total = (long long)header + body.len + 1 + topic_len + 2 + props_len;
    if (total > I32_MAX || pos > buf.len || total > buf.len - pos) {
        PyBuffer_Release(&body);
        PyBuffer_Release(&buf);
        PyErr_Format(PyExc_ValueError, "a record of %lld bytes does not fit at %lld", total, pos);
        return NULL;
    }
    unsigned char *p = (unsigned char *)buf.buf + pos;
    put32(p, (uint32_t)total);
    put32(p + 4, MESSAGE_MAGIC);
    put32(p + 8, crc_update(0, body.buf, body.len) & 0x7FFFFFFFu);
    put32(p + 12, (uint32_t)queue_id);
    put32(p + 16, (uint32_t)flag);
    put64(p + 20, (uint64_t)queue_offset);
    put64(p + 28, (uint64_t)phy);
    put32(p + 36, (uint32_t)sys_flag);
    put64(p + 40, (uint64_t)born_ts);
    p += 48;
    memcpy(p, PyBytes_AS_STRING(born_ip), born_len);
    put32(p + born_len, (uint32_t)born_port);
    p += born_len + 4;
    put64(p, (uint64_t)store_ts);
    memcpy(p + 8, PyBytes_AS_STRING(store_ip), store_len);
    put32(p + 8 + store_len, (uint32_t)store_port);
    p += 8 + store_len + 4;
    put32(p, (uint32_t)reconsume);
    put64(p + 4, (uint64_t)prepared);
    put32(p + 12, (uint32_t)body.len);
    p += 16;
    memmove(p, body.buf, body.len); /* the body may be a view of buf itself */
    p += body.len;
    *p++ = (unsigned char)topic_len;
    memcpy(p, PyBytes_AS_STRING(topic), topic_len);
    p += topic_len;
    p[0] = (unsigned char)(props_len >> 8);
    p[1] = (unsigned char)props_len;
    memcpy(p + 2, PyBytes_AS_STRING(props), props_len);
    PyBuffer_Release(&body);
    PyBuffer_Release(&buf);
    return PyLong_FromLongLong(total);
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

/* --- encode_batch, encode_single ------------------------------------------------------------- */

/* The items of one message's properties, as message_ext.decode_properties reads them. */
typedef struct {
    const unsigned char *name, *value;
    Py_ssize_t name_len, value_len;
} batch_prop;

#define BATCH_PROPS_MAX 32

static int bytes_is(const unsigned char *p, Py_ssize_t n, const char *s) {
    size_t m = strlen(s);
    return (size_t)n == m && memcmp(p, s, m) == 0;
}

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

static PyObject *item_value(const batch_prop *it) {
    if (it == NULL) Py_RETURN_NONE;
    return PyUnicode_FromStringAndSize((const char *)it->value, it->value_len);
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

/* Write at p (room bytes left) the record the Python path stores for a message with this body,
 * flag and properties: its properties as the broker stores them (WAIT=true left out, CLUSTER
 * added last), the rest from fp.  Returns the record's size, or -1 (nothing to undo: bytes past
 * the write position are junk) when the Python path must judge the message: see
 * split_plain_properties, an own CLUSTER, a DELAY other than "0" (any DELAY or a TRAN_MSG for a
 * single send), a body and properties over max_bp, or no room.  items holds the split
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
    put32(p, (uint32_t)size);
    put32(p + 4, MESSAGE_MAGIC);
    put32(p + 8, crc_update(0, body, body_len) & 0x7FFFFFFFu);
    put32(p + 12, (uint32_t)fp->queue_id);
    put32(p + 16, (uint32_t)flag);
    put64(p + 20, (uint64_t)queue_offset);
    put64(p + 28, (uint64_t)phy);
    put32(p + 36, (uint32_t)fp->sys_flag);
    put64(p + 40, (uint64_t)fp->born_ts);
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

/* The arguments both functions share (args[first:first + 13]): topic_b, cluster_b, topic,
 * queue_id, sys_flag, born_timestamp, born_ip, born_port, store_timestamp, store_ip,
 * store_port, reconsume_times, max_body_properties.  1 when fp is filled, 0 when the fast path
 * does not apply (IPv6 hosts, a cluster name that is not plain ASCII), -1 on an error. */
static int fast_put_args(PyObject *const *args, fast_put *fp, PyObject **topic) {
    if (arg_int(args[3], "queue_id", I32_MIN, I32_MAX, &fp->queue_id) < 0 ||
        arg_int(args[4], "sys_flag", I32_MIN, I32_MAX, &fp->sys_flag) < 0 ||
        arg_int(args[5], "born_timestamp", LLONG_MIN, LLONG_MAX, &fp->born_ts) < 0 ||
        arg_int(args[7], "born_port", I32_MIN, I32_MAX, &fp->born_port) < 0 ||
        arg_int(args[8], "store_timestamp", LLONG_MIN, LLONG_MAX, &fp->store_ts) < 0 ||
        arg_int(args[10], "store_port", I32_MIN, I32_MAX, &fp->store_port) < 0 ||
        arg_int(args[11], "reconsume_times", I32_MIN, I32_MAX, &fp->reconsume) < 0 ||
        arg_int(args[12], "max_body_properties", 0, I32_MAX, &fp->max_bp) < 0)
        return -1;
    PyObject *topic_b = args[0], *cluster_b = args[1], *born_ip = args[6], *store_ip = args[9];
    *topic = args[2];
    if (!PyBytes_Check(topic_b) || !PyBytes_Check(cluster_b) || !PyUnicode_Check(*topic) ||
        !PyBytes_Check(born_ip) || !PyBytes_Check(store_ip)) {
        PyErr_SetString(PyExc_TypeError, "fast put: bytes or str expected");
        return -1;
    }
    if ((fp->sys_flag & (BORNHOST_V6 | STOREHOST_V6)) || PyBytes_GET_SIZE(born_ip) != 4 ||
        PyBytes_GET_SIZE(store_ip) != 4)
        return 0; /* IPv6 hosts: the Python path */
    fp->topic = (const unsigned char *)PyBytes_AS_STRING(topic_b);
    fp->topic_len = PyBytes_GET_SIZE(topic_b);
    fp->cluster = (const unsigned char *)PyBytes_AS_STRING(cluster_b);
    fp->cluster_len = PyBytes_GET_SIZE(cluster_b);
    fp->born_ip = (const unsigned char *)PyBytes_AS_STRING(born_ip);
    fp->store_ip = (const unsigned char *)PyBytes_AS_STRING(store_ip);
    return fast_put_topic_ok(fp) && fast_put_cluster_ok(fp);
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

/* The optional last argument of encode_batch and encode_single: the tuple subclass their rows
 * are made as (DispatchHint), or None for plain tuples.  0, or -1 with an error set. */
static int hint_type_arg(PyObject *arg, PyTypeObject **out) {
    *out = NULL;
    if (arg == Py_None) return 0;
    if (!PyType_Check(arg) || !PyType_IsSubtype((PyTypeObject *)arg, &PyTuple_Type) ||
        (PyTypeObject *)arg == &PyTuple_Type) {
        PyErr_SetString(PyExc_TypeError, "hint_type must be a subclass of tuple, or None");
        return -1;
    }
    *out = (PyTypeObject *)arg;
    return 0;
}

/* encode_batch(buf, pos, limit, data, first_queue_offset, file_from_offset, <the 13 shared
 *              arguments, see fast_put_args>)
 * The send path's batch in one call: each item of the SEND_BATCH_MESSAGE body ``data`` becomes
 * the record the Python path (SendProcessor._batch_messages, then CommitLog.append_messages)
 * writes for it, at buf[pos:], with the broker's stored properties (WAIT=true left out,
 * CLUSTER added last) and consecutive queue offsets from first_queue_offset.  Returns (end,
 * rows, wait): the write position after the last record, one tuple per record in
 * DispatchHint's field order, and the first item's stored WAIT value (None when absent).
 * Returns None, having committed nothing (bytes past pos are junk), for anything the Python
 * path must judge or word: a body that does not parse, an empty batch, an item that
 * write_stored_record leaves to Python, or records that do not fit below limit. */
static PyObject *py_encode_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 19 && nargs != 20)
        return PyErr_Format(PyExc_TypeError, "encode_batch takes 19 or 20 arguments");
    PyTypeObject *hint_type = NULL;
    if (nargs == 20 && hint_type_arg(args[19], &hint_type) < 0) return NULL;
    long long pos, limit, queue_offset, file_from;
    if (arg_int(args[1], "pos", 0, PY_SSIZE_T_MAX, &pos) < 0 ||
        arg_int(args[2], "limit", 0, PY_SSIZE_T_MAX, &limit) < 0 ||
        arg_int(args[4], "first_queue_offset", 0, LLONG_MAX / 2, &queue_offset) < 0 ||
        arg_int(args[5], "file_from_offset", 0, LLONG_MAX / 2, &file_from) < 0)
        return NULL;
    fast_put fp = {.single = 0};
    PyObject *topic;
    int usable = fast_put_args(args + 6, &fp, &topic);
    if (usable < 0) return NULL;
    if (usable == 0) Py_RETURN_NONE;
    Py_buffer data, buf;
    if (PyObject_GetBuffer(args[3], &data, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (limit > buf.len) limit = buf.len;
    long long w = pos;
    PyObject *rows = PyList_New(0), *wait = NULL, *result = NULL;
    if (rows == NULL) goto done;
    const unsigned char *d = data.buf;
    Py_ssize_t at = 0, n = data.len;
    batch_prop items[BATCH_PROPS_MAX];
    while (at < n) {
        /* The item, as decode_batch reads it. */
        if (at + 20 > n) goto fallback;
        int32_t total = (int32_t)get32(d + at);
        int32_t flag = (int32_t)get32(d + at + 12);
        int32_t body_len = (int32_t)get32(d + at + 16);
        Py_ssize_t q = at + 20;
        if (body_len < 0 || q + body_len + 2 > n) goto fallback;
        const unsigned char *body = d + q;
        q += body_len;
        int16_t props_len = (int16_t)((uint16_t)d[q] << 8 | d[q + 1]);
        q += 2;
        if (props_len < 0 || q + props_len > n) goto fallback;
        const unsigned char *props = d + q;
        q += props_len;
        if ((Py_ssize_t)total != q - at) goto fallback;
        at = q;
        if (w > limit) goto fallback;
        stored_names names;
        long long size =
            write_stored_record((unsigned char *)buf.buf + w, limit - w, &fp, body, body_len, flag,
                                props, props_len, queue_offset, file_from + w, items, &names);
        if (size < 0) goto fallback;
        if (wait == NULL && (wait = item_value(names.wait)) == NULL) goto done;
        PyObject *row =
            hint_row(file_from + w, size, topic, &fp, queue_offset, &names, hint_type);
        if (row == NULL) goto done;
        int rc = PyList_Append(rows, row);
        Py_DECREF(row);
        if (rc < 0) goto done;
        w += size;
        queue_offset++;
    }
    if (PyList_GET_SIZE(rows) == 0) goto fallback; /* an empty batch: refused in Python */
    result = Py_BuildValue("(LOO)", w, rows, wait);
    goto done;
fallback:
    result = Py_NewRef(Py_None);
done:
    /* Left to Python or failed: the items written before are whole records past the write
     * position.  Zero them (write_stored_record writes nothing when it refuses), or a recovery
     * after a restart could take them as stored if Python refuses the batch (CommitLog._scrub). */
    if ((result == NULL || result == Py_None) && w > pos)
        memset((unsigned char *)buf.buf + pos, 0, (size_t)(w - pos));
    Py_XDECREF(rows);
    Py_XDECREF(wait);
    PyBuffer_Release(&data);
    PyBuffer_Release(&buf);
    return result;
}

/* encode_single(buf, pos, limit, body, properties, flag, queue_offset, file_from_offset,
 *               <the 13 shared arguments, see fast_put_args>)
 * A single send's record as the Python path (SendProcessor._single_message, then
 * CommitLog.append_message) writes it, at buf[pos:], from the request's properties str.
 * Returns (size, row, wait) as encode_batch does for one item, or None (nothing committed)
 * when the Python path must judge it: properties that are not ASCII, or that write_stored_record
 * leaves to Python (any DELAY or TRAN_MSG included), or a record past limit. */
static PyObject *py_encode_single(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 21 && nargs != 22)
        return PyErr_Format(PyExc_TypeError, "encode_single takes 21 or 22 arguments");
    PyTypeObject *hint_type = NULL;
    if (nargs == 22 && hint_type_arg(args[21], &hint_type) < 0) return NULL;
    long long pos, limit, flag, queue_offset, file_from;
    if (arg_int(args[1], "pos", 0, PY_SSIZE_T_MAX, &pos) < 0 ||
        arg_int(args[2], "limit", 0, PY_SSIZE_T_MAX, &limit) < 0 ||
        arg_int(args[5], "flag", I32_MIN, I32_MAX, &flag) < 0 ||
        arg_int(args[6], "queue_offset", 0, LLONG_MAX / 2, &queue_offset) < 0 ||
        arg_int(args[7], "file_from_offset", 0, LLONG_MAX / 2, &file_from) < 0)
        return NULL;
    PyObject *props = args[4];
    if (!PyUnicode_Check(props))
        return PyErr_Format(PyExc_TypeError, "encode_single: properties must be a str");
    if (!PyUnicode_IS_ASCII(props) || PyUnicode_GET_LENGTH(props) > 65535) Py_RETURN_NONE;
    fast_put fp = {.single = 1};
    PyObject *topic;
    int usable = fast_put_args(args + 8, &fp, &topic);
    if (usable < 0) return NULL;
    if (usable == 0) Py_RETURN_NONE;
    Py_buffer body, buf;
    if (PyObject_GetBuffer(args[3], &body, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&body);
        return NULL;
    }
    PyObject *result = NULL;
    if (limit > buf.len) limit = buf.len;
    batch_prop items[BATCH_PROPS_MAX];
    stored_names names;
    long long size = -1;
    if (pos <= limit && body.len <= I32_MAX)
        size = write_stored_record((unsigned char *)buf.buf + pos, limit - pos, &fp, body.buf,
                                   body.len, (int32_t)flag, PyUnicode_1BYTE_DATA(props),
                                   PyUnicode_GET_LENGTH(props), queue_offset, file_from + pos,
                                   items, &names);
    if (size < 0) {
        result = Py_NewRef(Py_None);
    } else {
        PyObject *row =
            hint_row(file_from + pos, size, topic, &fp, queue_offset, &names, hint_type);
        PyObject *wait = row == NULL ? NULL : item_value(names.wait);
        if (wait != NULL) result = Py_BuildValue("(LOO)", size, row, wait);
        Py_XDECREF(row);
        Py_XDECREF(wait);
    }
    PyBuffer_Release(&body);
    PyBuffer_Release(&buf);
    return result;
}

/* encode_singles(buf, pos, limit, file_from_offset, entries, topic_bytes, queue_table, clock,
 *                cluster_b, born_ip, born_port, store_ip, store_port, max_body_properties,
 *                stop_flags, stop_topic, hint_type)
 * encode_single of each of entries in turn, a run of single sends appended together: each
 * entry a tuple (topic, queue_id, body, properties, flag, sys_flag, born_timestamp,
 * reconsume_times), its topic's bytes from the dict topic_bytes, its queue offset from the dict
 * queue_table keyed by (topic, queue_id) (0 when absent; set to the next once the record is
 * written), its store time from clock() (None: the wall clock in milliseconds, as
 * clock.now_ms; called only for an entry past the stops below and encode_single's own
 * refusals of hosts and properties).  Stops at the first entry whose topic is missing from
 * topic_bytes, whose sys_flag has a bit of stop_flags, whose topic is stop_topic (checked in
 * that order, before its other fields are read), or that encode_single would leave to Python.
 * The body must be bytes (encode_single takes any buffer).
 * Returns (end, rows, waits, stamp, error): the write position after the last record written,
 * their hint rows and stored WAIT values, the last one's store time (0 if none) and None; or,
 * when an error stops it after entries were committed (queue_table updated), that exception in
 * place of None: what was committed stands.  Raises only when nothing was committed. */
static PyObject *py_encode_singles(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 17) return PyErr_Format(PyExc_TypeError, "encode_singles takes 17 arguments");
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
    PyObject *entries = args[4], *topic_bytes = args[5], *table = args[6], *clock = args[7];
    PyObject *cluster_b = args[8], *born_ip = args[9], *store_ip = args[11];
    PyObject *stop_topic = args[15];
    if (!PyList_Check(entries) || !PyDict_Check(topic_bytes) || !PyDict_Check(table) ||
        !PyBytes_Check(cluster_b) || !PyBytes_Check(born_ip) || !PyBytes_Check(store_ip) ||
        !PyUnicode_Check(stop_topic) || (clock != Py_None && !PyCallable_Check(clock)))
        return PyErr_Format(PyExc_TypeError, "encode_singles: bad argument types");
    fast_put fp = {.single = 1, .born_port = born_port, .store_port = store_port,
                   .max_bp = max_bp};
    fp.cluster = (const unsigned char *)PyBytes_AS_STRING(cluster_b);
    fp.cluster_len = PyBytes_GET_SIZE(cluster_b);
    fp.born_ip = (const unsigned char *)PyBytes_AS_STRING(born_ip);
    fp.store_ip = (const unsigned char *)PyBytes_AS_STRING(store_ip);
    int usable = PyBytes_GET_SIZE(born_ip) == 4 && PyBytes_GET_SIZE(store_ip) == 4 &&
                 fast_put_cluster_ok(&fp); /* else the Python path (IPv6 hosts) */
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_WRITABLE) < 0) return NULL;
    if (limit > buf.len) limit = buf.len;
    PyObject *rows = PyList_New(0), *waits = PyList_New(0), *error = NULL, *result = NULL;
    /* The entry and its topic's bytes are held for the iteration: the clock is Python code,
     * which could change the list or the dict they are borrowed from. */
    PyObject *entry = NULL, *topic_b = NULL;
    long long stamp = 0;
    Py_ssize_t count = 0;
    if (rows == NULL || waits == NULL) goto done;
    batch_prop items[BATCH_PROPS_MAX];
    for (Py_ssize_t e = 0; usable && e < PyList_GET_SIZE(entries); e++) {
        Py_CLEAR(entry);
        Py_CLEAR(topic_b);
        entry = Py_NewRef(PyList_GET_ITEM(entries, e));
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 8) {
            PyErr_SetString(PyExc_TypeError, "encode_singles: an entry is not an 8-tuple");
            goto failed;
        }
        PyObject *topic = PyTuple_GET_ITEM(entry, 0), *queue_id = PyTuple_GET_ITEM(entry, 1);
        PyObject *body = PyTuple_GET_ITEM(entry, 2), *props = PyTuple_GET_ITEM(entry, 3);
        long long flag;
        if (!PyUnicode_Check(topic)) {
            PyErr_SetString(PyExc_TypeError, "encode_singles: the topic is not a str");
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
        int is_stop = PyUnicode_Compare(topic, stop_topic);
        if (is_stop == -1 && PyErr_Occurred()) goto failed;
        if (is_stop == 0) break;
        if (!PyBytes_Check(body) || !PyUnicode_Check(props)) {
            PyErr_SetString(PyExc_TypeError, "encode_singles: body bytes, properties str");
            goto failed;
        }
        if (arg_int(queue_id, "queue_id", I32_MIN, I32_MAX, &fp.queue_id) < 0 ||
            arg_int(PyTuple_GET_ITEM(entry, 4), "flag", I32_MIN, I32_MAX, &flag) < 0 ||
            arg_int(PyTuple_GET_ITEM(entry, 6), "born_timestamp", LLONG_MIN, LLONG_MAX,
                    &fp.born_ts) < 0 ||
            arg_int(PyTuple_GET_ITEM(entry, 7), "reconsume_times", I32_MIN, I32_MAX,
                    &fp.reconsume) < 0)
            goto failed;
        /* What encode_single leaves to Python (its None). */
        if ((fp.sys_flag & (BORNHOST_V6 | STOREHOST_V6)) || !PyUnicode_IS_ASCII(props) ||
            PyUnicode_GET_LENGTH(props) > 65535 || !PyBytes_Check(topic_b))
            break;
        fp.topic = (const unsigned char *)PyBytes_AS_STRING(topic_b);
        fp.topic_len = PyBytes_GET_SIZE(topic_b);
        if (!fast_put_topic_ok(&fp)) break;
        PyObject *key = PyTuple_Pack(2, topic, queue_id);
        if (key == NULL) goto failed;
        PyObject *known = PyDict_GetItemWithError(table, key); /* borrowed */
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
        if (clock == Py_None) {
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
        stored_names names;
        long long size = -1;
        if (pos <= limit && PyBytes_GET_SIZE(body) <= I32_MAX)
            size = write_stored_record((unsigned char *)buf.buf + pos, limit - pos, &fp,
                                       (const unsigned char *)PyBytes_AS_STRING(body),
                                       PyBytes_GET_SIZE(body), (int32_t)flag,
                                       PyUnicode_1BYTE_DATA(props), PyUnicode_GET_LENGTH(props),
                                       queue_offset, file_from + pos, items, &names);
        if (size < 0) {
            Py_DECREF(key);
            break; /* the Python path judges it; bytes past pos are junk */
        }
        /* Everything that can fail before the commit (the table's entry is the commit). */
        PyObject *row = hint_row(file_from + pos, size, topic, &fp, queue_offset, &names, hint_type);
        PyObject *wait = row == NULL ? NULL : item_value(names.wait);
        PyObject *next = wait == NULL ? NULL : PyLong_FromLongLong(queue_offset + 1);
        int ok = next != NULL && PyList_Append(rows, row) == 0;
        if (ok && PyList_Append(waits, wait) < 0) {
            ok = 0;
            PyList_SetSlice(rows, count, count + 1, NULL);
        }
        if (ok && PyDict_SetItem(table, key, next) < 0) {
            ok = 0;
            PyList_SetSlice(rows, count, count + 1, NULL);
            PyList_SetSlice(waits, count, count + 1, NULL);
        }
        Py_DECREF(key);
        Py_XDECREF(row);
        Py_XDECREF(wait);
        Py_XDECREF(next);
        if (!ok) {
            /* Not committed: no whole record may lie past the write position (as _scrub). */
            memset((unsigned char *)buf.buf + pos, 0, (size_t)size);
            goto failed;
        }
        count++;
        pos += size;
        stamp = fp.store_ts;
    }
    goto finish;
failed:
    if (count == 0) goto done; /* nothing committed: raise */
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
    result = Py_BuildValue("(LOOLO)", pos, rows, waits, stamp, error != NULL ? error : Py_None);
done:
    Py_XDECREF(entry);
    Py_XDECREF(topic_b);
    Py_XDECREF(rows);
    Py_XDECREF(waits);
    Py_XDECREF(error);
    PyBuffer_Release(&buf);
    return result;
}

/* --- send_answer_frame --------------------------------------------------------------------- */

/* send_answer_frame(opaque, msg_id, queue_id, queue_offset, quoted_region, trace_on, version):
 * the whole frame of a successful send's JSON answer, byte for byte what
 * codec.json_response_frame writes for SendProcessor._success_json's members (msgId, queueId,
 * queueOffset, MSG_REGION already JSON-quoted as UTF-8 bytes, TRACE_ON).  The message id must
 * be ASCII (hex ids, comma-separated for a batch): anything else raises ValueError. */
/* A record's physical offset as the 16 uppercase hex digits that end its message id
 * (offset_msg_id), written at w. */
static void put_offset_hex(Py_UCS1 *w, unsigned long long v) {
    static const char digits[] = "0123456789ABCDEF";
    for (int i = 15; i >= 0; i--, v >>= 4) w[i] = digits[v & 15];
}

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
    PyObject *row = Py_BuildValue("(OLL)", topic, count, size);
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
    return Py_BuildValue("(NN)", out, totals);
fail:
    Py_XDECREF(hint);
    Py_XDECREF(fields);
    Py_XDECREF(topic);
    Py_XDECREF(out);
    Py_XDECREF(totals);
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

/* A JSON string at r->p (its opening quote) as a str: ASCII text and escapes (\uXXXX outside
 * the surrogates); raw bytes past ASCII, control characters and surrogate escapes are left to
 * the general decoder (it validates UTF-8 and pairs surrogates as json does). */
static int j_string(jreader *r, PyObject **out) {
    if (r->p >= r->end || *r->p != '"') return 0;
    const unsigned char *s = ++r->p;
    const unsigned char *q = s;
    while (q < r->end && *q != '"' && *q != '\\') {
        if (*q < 0x20 || *q >= 0x80) return 0;
        q++;
    }
    if (q >= r->end) return 0;
    if (*q == '"') { /* the common case: no escape */
        *out = ascii_str(s, q - s);
        if (*out == NULL) return -1;
        r->p = q + 1;
        return 1;
    }
    /* With escapes: code points gathered, then one str of the narrowest kind. */
    Py_ssize_t cap = r->end - s, n = 0;
    Py_UCS4 *buf = PyMem_Malloc(cap * sizeof(Py_UCS4) + 1);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = 0;
    for (q = s; q < r->end;) {
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
    PyMem_Free(buf);
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

/* A value of a member pymq does not read: a string, an integer, true, false or null. */
static int j_skip(jreader *r) {
    if (r->p >= r->end) return 0;
    unsigned char c = *r->p;
    if (c == '"') {
        PyObject *s = NULL;
        int rc = j_string(r, &s);
        Py_XDECREF(s);
        return rc;
    }
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
    while (r->p < r->end && *r->p != '"' && *r->p != '\\' && *r->p >= 0x20 && *r->p < 0x80)
        r->p++;
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
 * (SEND_BATCH_MESSAGE) with V2's one-letter names only, or code 10 (SEND_MESSAGE) with the long
 * names (other names ignored, as the C++ client's AccessKey, OnsChannel and Signature), each
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
    int others;    /* a name of neither kind seen (its value skipped) */
    int slot_seen; /* bits: the slots given */
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
static int ext_slots(jreader *r, void *ctx) {
    send_ext *e = ctx;
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
            e->others = 1;
            if ((rc = j_skip(r)) <= 0) return rc;
        } else {
            if (e->slot_seen & (1 << slot)) return 0; /* twice: the usual path */
            e->slot_seen |= 1 << slot;
            unsigned char c = r->p < r->end ? *r->p : 0;
            if (c == '"') {
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
        if ((more = j_after_member(r)) < 0) return 0;
    }
    return 1;
}

static PyObject *empty_str, *zero_int; /* "" and 0, made at import */

/* send_fields of view[start:end]: a new reference to the fields tuple or to None, NULL with an
 * exception set. */
static PyObject *send_fields_at(const Py_buffer *view, long long start, long long end) {
    PyObject *result = NULL, *language = NULL, *typed[13] = {NULL};
    send_ext e = {{NULL}, 0, 0, 0};
    PyObject **ext = e.ext;
    jheader h = {0};
    jreader r;
    long long header_end;
    if (!json_frame_header(view, start, end, &r, &header_end)) goto plain_none;
    int rc = j_header(&r, &h, &language, NULL, ext_slots, &e);
    if (rc < 0) goto fail;
    if (rc == 0 || !(h.seen & 16) || h.flag != 0) goto plain_none;
    /* V2 (310) and SEND_BATCH_MESSAGE (320): the one-letter names only; SEND_MESSAGE (10): the
     * long names, others ignored (the C++ client's AccessKey, OnsChannel and Signature). */
    if (!(((h.code == 310 || h.code == 320) && e.names == 1 && !e.others) ||
          (h.code == 10 && e.names == 2)))
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
    result = Py_BuildValue("(LOOOOOOOLO)", h.opaque, ext[1], typed[4], typed[5], typed[6],
                           typed[7], ext[8] != NULL ? ext[8] : Py_None,
                           typed[9] != NULL ? typed[9] : Py_None, header_end,
                           batch ? Py_True : Py_False);
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
    result = Py_BuildValue("(LN)", i, fields);
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
 * which the usual path decodes and answers (errors, FLUSH_DISK_TIMEOUT and the like among them).
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
    result = Py_BuildValue("(LOOOO)", h.opaque, e.v[0], queue_id, offset,
                           e.v[3] != NULL ? e.v[3] : Py_None);
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

/* --- Java String.hashCode ------------------------------------------------------------------ */

static PyObject *java_hash_from(uint32_t h, PyObject *s) {
    if (!PyUnicode_Check(s)) return PyErr_Format(PyExc_TypeError, "java_hash needs a str");
    if (PyUnicode_READY(s) < 0) return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *c = data;
        for (Py_ssize_t i = 0; i < n; i++) h = 31 * h + c[i];
    } else if (kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *c = data;
        for (Py_ssize_t i = 0; i < n; i++) h = 31 * h + c[i];
    } else {
        const Py_UCS4 *c = data;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS4 cp = c[i];
            if (cp >= 0x10000) { /* a surrogate pair in UTF-16 */
                cp -= 0x10000;
                h = 31 * h + (0xD800 + (cp >> 10));
                h = 31 * h + (0xDC00 + (cp & 0x3FF));
            } else {
                h = 31 * h + cp;
            }
        }
    }
    return PyLong_FromLong((int32_t)h);
}

static PyObject *py_java_hash(PyObject *self, PyObject *s) { return java_hash_from(0, s); }

static PyObject *py_java_hash_after(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) return PyErr_Format(PyExc_TypeError, "java_hash_after takes 2 arguments");
    long long prefix;
    if (arg_int(args[0], "prefix_hash", I32_MIN, 0xFFFFFFFFLL, &prefix) < 0) return NULL;
    return java_hash_from((uint32_t)prefix, args[1]);
}

/* --- index_put ---------------------------------------------------------------------------- */

#define INDEX_HEADER 40
#define INDEX_ENTRY 20

/* One key's entry written as IndexFile.put_hash writes it: h (Java's hash, made non-negative)
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
    return Py_BuildValue("(LLLLN)", done, pos, offset, last_ts, exc);
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

/* --- now_ms ------------------------------------------------------------------------------- */

static PyObject *py_now_ms(PyObject *self, PyObject *unused) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLongLong((long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
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

/* --- scan ----------------------------------------------------------------------------------- */

/* True when n bytes are all printable-or-control ASCII other than NUL. */
static inline int plain_text(const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] == 0 || p[i] >= 0x80) return 0;
    return 1;
}

/* The size of the plain, valid record at b[pos:limit] (IPv4 hosts, ASCII topic and
 * properties without NUL, lengths that add up, CRC when asked), or 0. */
static int64_t plain_record(const unsigned char *b, long long pos, long long limit, int check_crc,
                            int has_base, long long base) {
    if (limit - pos < V4_HEADER) return 0;
    const unsigned char *r = b + pos;
    int64_t total = (int32_t)get32(r);
    if (get32(r + 4) != MESSAGE_MAGIC) return 0;
    int32_t sys_flag = (int32_t)get32(r + 36);
    if (sys_flag & (BORNHOST_V6 | STOREHOST_V6)) return 0;
    if (total < V4_HEADER + 3 || total > limit - pos) return 0;
    long long want;
    if (has_base && (__builtin_add_overflow(base, pos, &want) || get64(r + 28) != want)) return 0;
    int64_t body_len = (int32_t)get32(r + 84);
    if (body_len < 0 || V4_HEADER + body_len + 3 > total) return 0;
    if (check_crc && body_len) {
        uint32_t crc = crc_update(0, r + V4_HEADER, body_len) & 0x7FFFFFFFu;
        if (crc != get32(r + 8)) return 0;
    }
    int64_t q = V4_HEADER + body_len;
    int64_t topic_len = r[q];
    int64_t t1 = q + 1 + topic_len;
    if (topic_len > MAX_TOPIC || t1 + 2 > total) return 0;
    int64_t props_len = (int16_t)((uint16_t)r[t1] << 8 | r[t1 + 1]);
    if (t1 + 2 + props_len != total) return 0;
    if (!plain_text(r + q + 1, topic_len) || !plain_text(r + t1 + 2, props_len)) return 0;
    return total;
}

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

/* --- module --------------------------------------------------------------------------------- */

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
    result = Py_BuildValue("(OnO)", bounds, pos, bad != NULL ? bad : Py_None);
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
    {"crc32", py_crc32, METH_VARARGS, "crc32(data, value=0): zlib-compatible CRC-32."},
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
    {"set_clmul", py_set_clmul, METH_O,
     "set_clmul(flag): use the PCLMULQDQ CRC path where the CPU has it; returns the old state."},
    {"encode_into", (PyCFunction)(void (*)(void))py_encode_into, METH_FASTCALL,
     "encode_into(buf, pos, body, topic, properties, queue_id, flag, queue_offset,"
     " physical_offset, sys_flag, born_timestamp, born_ip, born_port, store_timestamp, store_ip,"
     " store_port, reconsume_times, prepared_transaction_offset): write one record, return its"
     " size (the body CRC is computed here)."},
    {"properties_bytes", py_properties_bytes, METH_O,
     "properties_bytes(props): the UTF-8 PROPERTIES field of a dict of str."},
    {"encode_batch", (PyCFunction)(void (*)(void))py_encode_batch, METH_FASTCALL,
     "encode_batch(buf, pos, limit, data, first_queue_offset, file_from_offset, topic_b,"
     " cluster_b, topic, queue_id, sys_flag, born_timestamp, born_ip, born_port,"
     " store_timestamp, store_ip, store_port, reconsume_times, max_body_properties[,"
     " hint_type]): a"
     " SEND_BATCH_MESSAGE body's records written as the Python path writes them; (end, rows,"
     " wait) or None."},
    {"encode_single", (PyCFunction)(void (*)(void))py_encode_single, METH_FASTCALL,
     "encode_single(buf, pos, limit, body, properties, flag, queue_offset, file_from_offset,"
     " topic_b, cluster_b, topic, queue_id, sys_flag, born_timestamp, born_ip, born_port,"
     " store_timestamp, store_ip, store_port, reconsume_times, max_body_properties[,"
     " hint_type]): a single"
     " send's record as the Python path writes it; (size, row, wait) or None."},
    {"encode_singles", (PyCFunction)(void (*)(void))py_encode_singles, METH_FASTCALL,
     "encode_singles(buf, pos, limit, file_from_offset, entries, topic_bytes, queue_table,"
     " clock, cluster_b, born_ip, born_port, store_ip, store_port, max_body_properties,"
     " stop_flags, stop_topic, hint_type): encode_single of each entry in turn; (end, rows,"
     " waits, stamp, error)."},
    {"send_answer_frame", (PyCFunction)(void (*)(void))py_send_answer_frame, METH_FASTCALL,
     "send_answer_frame(opaque, msg_id, queue_id, queue_offset, quoted_region, trace_on,"
     " version): a successful send's JSON answer frame, as codec.json_response_frame writes it."},
    {"decode_batch", (PyCFunction)(void (*)(void))py_decode_batch, METH_FASTCALL,
     "decode_batch(data, cls, error_cls): the items of a batch body as cls(body, flag, props)"
     " (batch.decode_batch_body)."},
    {"decode_properties", py_decode_properties, METH_O,
     "decode_properties(text): the dict of a properties string (message.decode_properties)."},
    {"decode_plain", (PyCFunction)(void (*)(void))py_decode_plain, METH_FASTCALL,
     "decode_plain(buf, pos, check_crc, cls): the common record at buf[pos:] as cls(...), or"
     " None for the careful parser (record._decode_plain_py)."},
    {"json_command", (PyCFunction)(void (*)(void))py_json_command, METH_FASTCALL,
     "json_command(header, cls, serialize_type): the plain JSON header dict as cls(...), or None"
     " (remoting.codec._decode_json_header's first case)."},
    {"json_header", (PyCFunction)(void (*)(void))py_json_header, METH_FASTCALL,
     "json_header(buf, start, end, cls, serialize_type): the plain JSON header at"
     " buf[start:end] as cls(...), read without a dict, or None (json_command's case)."},
    {"send_answer_run", (PyCFunction)(void (*)(void))py_send_answer_run, METH_FASTCALL,
     "send_answer_run(parsed, hints, prefix, quoted_region, trace_on, version): a run's "
     "answers joined, and [topic, count, size] per run of one topic."},
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
    {"java_hash", py_java_hash, METH_O, "java_hash(s): Java's String.hashCode of s."},
    {"java_hash_after", (PyCFunction)(void (*)(void))py_java_hash_after, METH_FASTCALL,
     "java_hash_after(prefix_hash, s): java_hash(prefix + s) from java_hash(prefix)."},
    {"index_put", (PyCFunction)(void (*)(void))py_index_put, METH_FASTCALL,
     "index_put(buf, slot_num, index_num, entries_at, count, slot_count, begin_timestamp,"
     " prefix_hash, keys, phy_offset, store_timestamp): index keys into one index file."},
    {"dispatch_hinted", (PyCFunction)(void (*)(void))py_dispatch_hinted, METH_FASTCALL,
     "dispatch_hinted(hints, log, pos, end, offset, limit, queues, listener, index): a run of"
     " hinted records dispatched to their consume queues and the index; (done, pos, offset,"
     " last_store_timestamp, exception or None)."},
    {"offset_msg_id", (PyCFunction)(void (*)(void))py_offset_msg_id, METH_FASTCALL,
     "offset_msg_id(prefix, offset): prefix + offset as 16 uppercase hex digits."},
    {"offset_msg_ids", (PyCFunction)(void (*)(void))py_offset_msg_ids, METH_FASTCALL,
     "offset_msg_ids(prefix, rows): offset_msg_id of each row's first item, comma-joined."},
    {"send_frame", (PyCFunction)(void (*)(void))py_send_frame, METH_FASTCALL,
     "send_frame(head, opaque, fixed, queue_id, sys_flag, born, flag, props, tail, body): a"
     " producer's send frame as Producer._v2_frame writes it; None when props is not ASCII."},
    {"batch_body", (PyCFunction)(void (*)(void))py_batch_body, METH_FASTCALL,
     "batch_body(cls, msgs, ids[, topic]): the client's SEND_BATCH_MESSAGE body of plain"
     " messages of type cls (and topic) with their ids; None when one is not plain."},
    {"record_is", (PyCFunction)(void (*)(void))py_record_is, METH_FASTCALL,
     "record_is(data, size): whether data is size bytes beginning as a message record of that"
     " size (TOTALSIZE, magic code)."},
    {"now_ms", py_now_ms, METH_NOARGS, "now_ms(): milliseconds since the epoch (wall clock)."},
    {"record_hints", (PyCFunction)(void (*)(void))py_record_hints, METH_FASTCALL,
     "record_hints(buf, pos, end, file_from_offset, max_rows, skip_topic, hint_type): the"
     " dispatch hints of the records at buf[pos:end], read back; (rows, stop)."},
    {"scan", (PyCFunction)(void (*)(void))py_scan, METH_FASTCALL,
     "scan(buf, pos, limit, check_crc, physical_base, select, selected): walk plain records,"
     " return where the walk stopped."},
    {"export_columns", (PyCFunction)(void (*)(void))py_export_columns, METH_FASTCALL,
     "export_columns(buf, pos, stop, physical_base, stop_timestamp, max_rows, max_body_bytes,"
     " inflate, host6):"
     " a run of valid records as Arrow column buffers; returns (pos, rows, record_bytes,"
     " body_bytes, buffers)."},
    {"frame_bounds", (PyCFunction)(void (*)(void))py_frame_bounds, METH_FASTCALL,
     "frame_bounds(buf, limit): the whole frames at the start of buf, as feed_frames walks"
     " them; (bounds, pos, bad length or None)."},
    {"busy_answers", (PyCFunction)(void (*)(void))py_busy_answers, METH_FASTCALL,
     "busy_answers(buf, bounds, first, stop, head, tails, refused): SYSTEM_BUSY answers to a"
     " run of JSON requests, without decoding them; returns (answers, next index)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pymq.common._recordc",
    "The commit-log record codec's hot loops in C (see pymq.common.message).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__recordc(void) {
    crc_init();
#ifdef HAVE_CLMUL_PATH
    __builtin_cpu_init();
    use_clmul = __builtin_cpu_supports("pclmul") && !getenv("PYMQ_NO_CLMUL");
#endif
    if ((empty_str = PyUnicode_FromStringAndSize("", 0)) == NULL ||
        (zero_int = PyLong_FromLong(0)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
