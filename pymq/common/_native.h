/*
 * Shared by pymq's C accelerators (pymq/common/_recordc.c, pymq/remoting/_codecc.c,
 * pymq/broker/_sendc.c, pymq/store/_commitlogc.c, pymq/store/_dispatchc.c,
 * pymq/client/_producerc.c, pymq/export/_columnsc.c): the commit-log record's layout constants,
 * CRC-32, big-endian access, number formatting and argument checks.  Each module that includes
 * it gets its own copy (all static) and calls pymq_native_init() from its PyInit function.
 *
 * Record layout (RocketMQ 4.x CommitLog, big-endian): TOTALSIZE i32, MAGICCODE u32, BODYCRC i32,
 * QUEUEID i32, FLAG i32, QUEUEOFFSET i64, PHYSICALOFFSET i64, SYSFLAG i32, BORNTIMESTAMP i64,
 * BORNHOST (4 or 16 bytes) + port i32, STORETIMESTAMP i64, STOREHOST (4 or 16) + port i32,
 * RECONSUMETIMES i32, PREPAREDTRANSACTIONOFFSET i64, BODYLENGTH i32, BODY, TOPICLENGTH i8,
 * TOPIC, PROPERTIESLENGTH i16, PROPERTIES.
 */
#ifndef PYMQ_NATIVE_H
#define PYMQ_NATIVE_H
#define PYMQ_SHARED static __attribute__((unused))
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

PYMQ_SHARED uint32_t crc_tables[8][256];

PYMQ_SHARED void crc_init(void) {
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
PYMQ_SHARED uint32_t crc_tables_update(uint32_t state, const unsigned char *p, Py_ssize_t n) {
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
PYMQ_SHARED int use_clmul;

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
PYMQ_SHARED uint32_t crc_update(uint32_t crc, const unsigned char *p, Py_ssize_t n) {
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

PYMQ_SHARED inline void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* v in decimal at p (room for 20 characters): the length written, as "%lld" writes it. */
PYMQ_SHARED int fmt_ll(char *p, long long v) {
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
PYMQ_SHARED int put_lit(char *p, const char *lit) {
    size_t n = strlen(lit);
    memcpy(p, lit, n);
    return (int)n;
}

PYMQ_SHARED inline void put64(unsigned char *p, uint64_t v) {
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

PYMQ_SHARED inline uint32_t get32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

PYMQ_SHARED inline int64_t get64(const unsigned char *p) {
    return (int64_t)((uint64_t)get32(p) << 32 | get32(p + 4));
}

/* --- argument helpers ----------------------------------------------------------------------- */

PYMQ_SHARED int arg_int(PyObject *v, const char *what, long long lo, long long hi, long long *out) {
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

/* A tuple of the n references given, each a new one it takes over (Py_NewRef for a borrowed
 * one), built by hand: Py_BuildValue parses its format on every call, which cost a lone send's
 * fields several times the tuple.  NULL with an error set when one of them is NULL (an error
 * making it) or the tuple cannot be made; the references are released then. */
PYMQ_SHARED PyObject *tuple_of(Py_ssize_t n, ...) {
    PyObject *t = PyTuple_New(n);
    int bad = t == NULL;
    va_list ap;
    va_start(ap, n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = va_arg(ap, PyObject *);
        if (o == NULL) bad = 1;
        if (t != NULL)
            PyTuple_SET_ITEM(t, i, o); /* a NULL slot is skipped by the tuple's dealloc */
        else
            Py_XDECREF(o);
    }
    va_end(ap);
    if (bad && t != NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "tuple_of: a NULL item");
        Py_CLEAR(t);
    }
    return t;
}

PYMQ_SHARED int bytes_is(const unsigned char *p, Py_ssize_t n, const char *s) {
    size_t m = strlen(s);
    return (size_t)n == m && memcmp(p, s, m) == 0;
}

/* The hint_type argument of encode_run and dispatch's record readers: the tuple subclass their
 * rows are made as (DispatchHint), or None for plain tuples.  0, or -1 with an error set. */
PYMQ_SHARED int hint_type_arg(PyObject *arg, PyTypeObject **out) {
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

PYMQ_SHARED PyObject *java_hash_from(uint32_t h, PyObject *s) {
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

/* send_answer_frame(opaque, msg_id, queue_id, queue_offset, quoted_region, trace_on, version):
 * the whole frame of a successful send's JSON answer, byte for byte what
 * codec.json_response_frame writes for SendProcessor._success_json's members (msgId, queueId,
 * queueOffset, MSG_REGION already JSON-quoted as UTF-8 bytes, TRACE_ON).  The message id must
 * be ASCII (hex ids, comma-separated for a batch): anything else raises ValueError. */
/* A record's physical offset as the 16 uppercase hex digits that end its message id
 * (offset_msg_id), written at w. */
PYMQ_SHARED void put_offset_hex(Py_UCS1 *w, unsigned long long v) {
    static const char digits[] = "0123456789ABCDEF";
    for (int i = 15; i >= 0; i--, v >>= 4) w[i] = digits[v & 15];
}

/* True when n bytes are all printable-or-control ASCII other than NUL. */
PYMQ_SHARED inline int plain_text(const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] == 0 || p[i] >= 0x80) return 0;
    return 1;
}

/* The size of the plain, valid record at b[pos:limit] (IPv4 hosts, ASCII topic and
 * properties without NUL, lengths that add up, CRC when asked), or 0. */
PYMQ_SHARED int64_t plain_record(const unsigned char *b, long long pos, long long limit, int check_crc,
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


PYMQ_SHARED PyObject *empty_str, *zero_int; /* "" and 0, made at import */

/* The tables, the CPU's CRC path and the constants above; 0, or -1 with an exception set. */
PYMQ_SHARED int pymq_native_init(void) {
    crc_init();
#ifdef HAVE_CLMUL_PATH
    __builtin_cpu_init();
    use_clmul = __builtin_cpu_supports("pclmul") && !getenv("PYMQ_NO_CLMUL");
#endif
    if ((empty_str = PyUnicode_FromStringAndSize("", 0)) == NULL ||
        (zero_int = PyLong_FromLong(0)) == NULL)
        return -1;
    return 0;
}
#endif
