/* The tap's compiled byte path for ordinary content chunks (see fastrelay.py, which owns its use).
 *
 * One background thread per process waits (epoll) on the upstream sockets of the streams handed to it.
 * For each read it takes the whole HTTP chunks that are exactly one SSE event shaped like the stream's
 * learned content chunk ("data: " + prefix + JSON string body + suffix + "\n\n"), writes them to the
 * client's socket re-framed (one write per read), and keeps what the tap accounts: the text bodies (for
 * the output hash), the inter-token gaps counted per ITL bucket, the last token's time. At the first
 * chunk it does not take (a finish or usage chunk, [DONE], the body's end, anything else), at a short
 * write, a client or upstream error, or after `max_seconds` of ownership, it stops reading that stream
 * and hands it back: the unread bytes, the unsent bytes and the counts, and signals an eventfd that the
 * Python side watches. It never closes a descriptor and never touches a Python object without the GIL.
 *
 * A stream started with `tail` (the tap changes nothing in its last events: see fastrelay.py for when) may
 * end here: from its first chunk that is not an ordinary content chunk on, the thread writes every whole
 * chunk to the client unchanged (at most TAIL_CHUNKS of them) and keeps their raw bytes (`sent`) for the tap
 * to read and count afterwards; at the body's end ("0\r\n\r\n", no trailers) it writes the end of the
 * client's chunked body too, notes the time, and hands the stream back (R_ENDED). `ends_unsettled` counts
 * such ends the tap has not counted yet: raised before the end is written, lowered by `settled()`.
 *
 * Built against the limited API (abi3) of CPython 3.11, so one build serves 3.11 and later.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <sys/types.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_CHUNK (256 * 1024)       /* a bigger HTTP chunk goes back to Python */
#define READ_SIZE (64 * 1024)
#define TABLE_SIZE 4096              /* buckets of the id table (chained): streams held at once, any number */
#define TAIL_CHUNKS 16               /* chunks a stream's tail may take here before it goes back to Python */

enum { ACTIVE = 0, R_UNUSUAL = 1, R_EOF = 2, R_CLIENT = 3, R_PARTIAL = 4, R_FLUSH = 5, R_CANCELLED = 6,
       R_ENDED = 7 };

typedef struct { char *p; size_t len, cap; } Buf;

typedef struct Seg { size_t off, len; int plain; } Seg;

/* A stream the thread holds. Ownership, in one place: from `start` until the loop gets its result (from
 * `done` or `cancel`), the thread is the only reader of `up_fd` and the only writer of `client_fd`; the loop
 * has paused both. The loop names a stream by its id only: no pointer crosses into Python, and an id the
 * table does not hold is an error, never a dereference. */
typedef struct Stream {
    long long id;
    int up_fd, client_fd;
    char *prefix, *suffix;
    size_t lp, ls;
    double *bounds;
    long long *counts;
    int nb;
    double gap_sum, last_ts, since, max_seconds;
    double tail_at, ended_at; /* when the tail's last chunk was read; when the body's end was (0: not yet) */
    long long tokens;
    int state, err, busy;
    int tail_ok, tail_chunks; /* the stream may end here; chunks of its tail written so far */
    Buf in, text, pending;   /* unread bytes; the text bodies; the chunks re-framed for the client, unsent */
    Buf sent;                /* the tail's chunks as read (raw, framing included), written to the client */
    Seg *segs;
    size_t nsegs, capsegs;
    struct Stream *next;     /* the done queue */
    struct Stream *hnext;    /* the id table's chain */
} Stream;

/* `lock` guards the stream states, the id table, the done queue and the epoll set; the thread holds it only
 * between streams, never across a read or a write, so the event loop's calls wait at most for one stream's
 * processing (`busy`, signalled on `idle`). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t idle = PTHREAD_COND_INITIALIZER;
static int epfd = -1, donefd = -1;
static pthread_t thread;
static Stream *done_head = NULL, *done_tail = NULL;
static Stream *table[TABLE_SIZE];
static long long next_id = 1;
static long long ends_unsettled = 0;  /* atomic: ends written here (R_ENDED) the tap has not counted yet */

/* Allocation-failure injection for the tests (`_fail_allocation`): the n-th allocation from now fails. */
static long fail_countdown = 0;

static int allocation_fails(void) {
    long left = __atomic_load_n(&fail_countdown, __ATOMIC_RELAXED);
    if (left <= 0) return 0;
    return __atomic_sub_fetch(&fail_countdown, 1, __ATOMIC_RELAXED) == 0;
}

static void *xrealloc(void *p, size_t n) { return allocation_fails() ? NULL : realloc(p, n); }
static void *xmalloc(size_t n) { return allocation_fails() ? NULL : malloc(n); }
static void *xcalloc(size_t n, size_t size) { return allocation_fails() ? NULL : calloc(n, size); }

static Stream *find(long long id) {
    for (Stream *s = table[(unsigned long long)id % TABLE_SIZE]; s; s = s->hnext)
        if (s->id == id) return s;
    return NULL;
}

static void forget(Stream *s) {
    Stream **at = &table[(unsigned long long)s->id % TABLE_SIZE];
    while (*at != s) at = &(*at)->hnext;
    *at = s->hnext;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  /* what time.perf_counter() reads on Linux */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Room for `n` more bytes; nothing changes where the allocation fails (-1). */
static int buf_reserve(Buf *b, size_t n) {
    if (b->len + n <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n) cap *= 2;
    char *q = xrealloc(b->p, cap);
    if (!q) return -1;
    b->p = q;
    b->cap = cap;
    return 0;
}

/* Append into room reserved before. */
static void buf_put(Buf *b, const char *p, size_t n) {
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

static void stream_free(Stream *s) {
    free(s->prefix); free(s->suffix); free(s->bounds); free(s->counts);
    free(s->in.p); free(s->text.p); free(s->pending.p); free(s->sent.p); free(s->segs);
    free(s);
}

/* The body of a JSON string as the tap's pattern accepts it: no raw control characters or quotes,
 * escapes \" \\ \/ \b \f \n \r \t \uXXXX, UTF-8 (surrogates allowed, as json.loads' surrogatepass).
 * Returns 1: plain ASCII without escapes, 2: valid otherwise, 0: not a body the pattern would take. */
static int body_class(const unsigned char *p, size_t n) {
    int plain = 1;
    size_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x20 || c == '"') return 0;
        if (c == '\\') {
            plain = 0;
            if (i + 1 >= n) return 0;
            unsigned char e = p[i + 1];
            if (e == 'u') {
                if (i + 6 > n) return 0;
                for (int k = 2; k < 6; k++) {
                    unsigned char h = p[i + k];
                    if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F'))) return 0;
                }
                i += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' ||
                       e == 't') {
                i += 2;
            } else {
                return 0;
            }
            continue;
        }
        if (c < 0x80) { i++; continue; }
        plain = 0;
        size_t len;
        unsigned int cp;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
        else return 0;
        if (i + len > n) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
        i += len;
    }
    return plain ? 1 : 2;
}

/* Room for one more text segment of `n` bytes; nothing changes where an allocation fails (-1). */
static int reserve_seg(Stream *s, size_t n) {
    if (s->nsegs == s->capsegs) {
        size_t cap = s->capsegs ? s->capsegs * 2 : 16;
        Seg *q = xrealloc(s->segs, cap * sizeof(Seg));
        if (!q) return -1;
        s->segs = q;
        s->capsegs = cap;
    }
    return buf_reserve(&s->text, n);
}

static void put_seg(Stream *s, const char *p, size_t n, int plain) {
    Seg *last = s->nsegs ? &s->segs[s->nsegs - 1] : NULL;
    if (plain && last && last->plain && last->off + last->len == s->text.len)
        last->len += n;  /* plain runs merge: one hash update for them */
    else
        s->segs[s->nsegs++] = (Seg){s->text.len, n, plain};
    buf_put(&s->text, p, n);
}

static void hand_back(Stream *s, int reason) {
    /* under the lock: no more reads of this stream here; it stays in the id table until the loop has its result */
    epoll_ctl(epfd, EPOLL_CTL_DEL, s->up_fd, NULL);
    s->state = reason;
    s->next = NULL;
    if (done_tail) done_tail->next = s; else done_head = s;
    done_tail = s;
    uint64_t one = 1;
    ssize_t w = write(donefd, &one, sizeof one);
    (void)w;  /* the eventfd's counter cannot overflow at one write per stream */
}

/* Write s->pending to the client; what does not go stays in s->pending. Returns ACTIVE, or why the stream
 * goes back (the client is slow, or gone). */
static int send_pending(Stream *s) {
    size_t sent = 0;
    int reason = ACTIVE;
    while (sent < s->pending.len) {
        /* send, not write: a client gone mid-write is EPIPE here, never a SIGPIPE for the whole process */
        ssize_t w = send(s->client_fd, s->pending.p + sent, s->pending.len - sent, MSG_NOSIGNAL);
        if (w > 0) { sent += (size_t)w; continue; }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            reason = R_PARTIAL;
        } else {
            s->err = w < 0 ? errno : EPIPE;
            reason = R_CLIENT;
        }
        break;
    }
    memmove(s->pending.p, s->pending.p + sent, s->pending.len - sent);
    s->pending.len -= sent;
    return reason;
}

/* One whole chunk of a stream's tail (`tail_ok`): written to the client as it came and kept raw in s->sent.
 * Returns ACTIVE, or R_UNUSUAL where it is not taken (no room, or the tail is longer than TAIL_CHUNKS). */
static int take_tail(Stream *s, const char *raw, size_t need, const char *payload, size_t size, double now) {
    if (s->tail_chunks >= TAIL_CHUNKS) return R_UNUSUAL;
    char head[24];
    int hl = snprintf(head, sizeof head, "%zx\r\n", size);
    if (buf_reserve(&s->pending, (size_t)hl + size + 2) < 0 || buf_reserve(&s->sent, need) < 0) return R_UNUSUAL;
    buf_put(&s->pending, head, (size_t)hl);
    buf_put(&s->pending, payload, size);
    buf_put(&s->pending, "\r\n", 2);
    buf_put(&s->sent, raw, need);
    s->tail_chunks += 1;
    s->tail_at = now;
    return ACTIVE;
}

/* Take the whole chunks in s->in that are ordinary content events (and, for a stream that may end here, its
 * tail and the body's end); write them to the client. Returns ACTIVE to keep reading, or the reason to hand the
 * stream back. A chunk is taken whole or not at all: its room in every buffer is reserved before anything is
 * counted, so an allocation failure leaves it unread, for Python. */
static int take(Stream *s, double now) {
    const char *b = s->in.p;
    size_t n = s->in.len, pos = 0;
    int reason = ACTIVE;
    while (pos < n) {
        size_t left = n - pos, eol = 0;
        const char *line = b + pos;
        while (eol < left && eol < 17 && line[eol] != '\r') eol++;
        if (eol == 17 || (eol < left && eol == 0)) { reason = R_UNUSUAL; break; }  /* no size of <= 16 digits */
        if (eol == left || eol + 1 == left) break;       /* the size line is not complete yet */
        if (line[eol + 1] != '\n') { reason = R_UNUSUAL; break; }
        size_t size = 0;
        int bad = 0;
        for (size_t k = 0; k < eol; k++) {
            char h = line[k];
            int v = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                    : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (v < 0) { bad = 1; break; }
            size = size * 16 + (size_t)v;
        }
        if (bad || size > MAX_CHUNK) { reason = R_UNUSUAL; break; }
        if (size == 0) {                                 /* the body's end: here only for a stream's tail */
            if (!s->tail_ok || !s->tail_chunks) { reason = R_UNUSUAL; break; }
            if (left < eol + 4) break;                   /* its empty line is not here yet */
            if (line[eol + 2] != '\r' || line[eol + 3] != '\n') { reason = R_UNUSUAL; break; }  /* trailers */
            if (buf_reserve(&s->pending, 5) < 0 || buf_reserve(&s->sent, eol + 4) < 0) { reason = R_UNUSUAL; break; }
            buf_put(&s->pending, "0\r\n\r\n", 5);
            buf_put(&s->sent, line, eol + 4);
            __atomic_add_fetch(&ends_unsettled, 1, __ATOMIC_SEQ_CST);  /* before the end leaves (send below) */
            s->ended_at = now;
            pos += eol + 4;
            reason = R_ENDED;
            break;
        }
        size_t need = eol + 2 + size + 2;
        if (left < need) break;                          /* the chunk is not complete yet */
        const char *payload = line + eol + 2;
        if (payload[size] != '\r' || payload[size + 1] != '\n') { reason = R_UNUSUAL; break; }
        size_t fixed = 6 + s->lp + s->ls + 2;
        int cls = 0;
        if (size >= fixed && memcmp(payload, "data: ", 6) == 0 && memcmp(payload + 6, s->prefix, s->lp) == 0 &&
            memcmp(payload + size - 2 - s->ls, s->suffix, s->ls) == 0 && payload[size - 2] == '\n' &&
            payload[size - 1] == '\n')
            cls = body_class((const unsigned char *)payload + 6 + s->lp, size - fixed);
        if (cls == 0 || s->tail_chunks) {
            /* not an ordinary content chunk, or one after the tail began (its text must follow the tail's in the
             * tap's count): the tail goes on here where the stream may end here, else the stream goes back */
            if (!s->tail_ok || (cls != 0 && s->tail_chunks)) { reason = R_UNUSUAL; break; }
            reason = take_tail(s, line, need, payload, size, now);
            if (reason != ACTIVE) break;
            pos += need;
            continue;
        }
        const char *body = payload + 6 + s->lp;
        size_t blen = size - fixed;
        char head[24];
        int hl = snprintf(head, sizeof head, "%zx\r\n", size);
        if (buf_reserve(&s->pending, (size_t)hl + size + 2) < 0 || (blen && reserve_seg(s, blen) < 0)) {
            reason = R_UNUSUAL; break;                   /* no room: this chunk and the rest go back unread */
        }
        if (blen) {
            put_seg(s, body, blen, cls == 1);
            double gap = now - s->last_ts;
            int lo = 0, hi = s->nb - 1;                  /* bisect_left: the first bound >= gap */
            while (lo < hi) { int mid = (lo + hi) / 2; if (s->bounds[mid] < gap) lo = mid + 1; else hi = mid; }
            s->counts[lo] += 1;
            s->gap_sum += gap;
            s->last_ts = now;
            s->tokens += 1;
        }
        buf_put(&s->pending, head, (size_t)hl);
        buf_put(&s->pending, payload, size);
        buf_put(&s->pending, "\r\n", 2);
        pos += need;
    }
    /* what was taken goes to the client now; the rest stays in s->in (a partial chunk, or from the chunk not
     * taken onwards) */
    if (s->pending.len) {
        int sending = send_pending(s);
        if (sending == R_CLIENT || (sending == R_PARTIAL && reason == ACTIVE)) reason = sending;
    }
    if (pos) {
        memmove(s->in.p, s->in.p + pos, n - pos);
        s->in.len = n - pos;
    }
    if (reason == ACTIVE && s->in.len > MAX_CHUNK + 32) reason = R_UNUSUAL;
    if (reason == ACTIVE && now - s->since >= s->max_seconds) reason = R_FLUSH;
    return reason;
}

/* One readable stream, without the lock (the stream is `busy`): ACTIVE, or why it goes back. The read lands
 * in room reserved first, so no byte read is ever lost to an allocation failure. */
static int on_readable(Stream *s) {
    if (buf_reserve(&s->in, READ_SIZE) < 0) return R_UNUSUAL;  /* nothing read: Python reads it */
    ssize_t r = read(s->up_fd, s->in.p + s->in.len, READ_SIZE);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return ACTIVE;
    if (r <= 0) return R_EOF;       /* EOF or an error: left unread for Python, whose read sees it again */
    s->in.len += (size_t)r;
    return take(s, now_s());
}

static void *run(void *arg) {
    (void)arg;
    struct epoll_event events[256];
    for (;;) {
        int n = epoll_wait(epfd, events, 256, -1);
        if (n < 0) { if (errno == EINTR) continue; return NULL; }
        pthread_mutex_lock(&lock);
        for (int i = 0; i < n; i++) {
            /* by id: a stream the loop took back meanwhile is gone from the table (an event may still name it) */
            Stream *s = find((long long)events[i].data.u64);
            if (!s || s->state != ACTIVE) continue;
            s->busy = 1;
            pthread_mutex_unlock(&lock);
            int reason = on_readable(s);
            pthread_mutex_lock(&lock);
            s->busy = 0;
            if (reason != ACTIVE) hand_back(s, reason);
            pthread_cond_broadcast(&idle);
        }
        pthread_mutex_unlock(&lock);
    }
}

/* ---- the Python side ------------------------------------------------------------------------- */

static pid_t owner = 0;

static void close_relay_fds(void) {
    if (epfd >= 0) close(epfd);
    if (donefd >= 0) close(donefd);
    epfd = donefd = -1;
}

/* init() -> the eventfd to watch. A failure (no eventfd, no thread) leaves nothing half started: the
 * descriptors are closed, `start` refuses, and the tap relays in Python. */
static PyObject *py_init(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    if (epfd >= 0 && owner == getpid()) return PyLong_FromLong(donefd);
    if (epfd >= 0) {  /* a forked child: the parent's thread did not come along; start afresh */
        close_relay_fds();
        done_head = done_tail = NULL;  /* the parent's streams, not ours (leaked, not freed) */
        memset(table, 0, sizeof table);
        ends_unsettled = 0;
        pthread_mutex_init(&lock, NULL);
        pthread_cond_init(&idle, NULL);
    }
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) { PyErr_SetFromErrno(PyExc_OSError); close_relay_fds(); return NULL; }
    donefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (donefd < 0) { PyErr_SetFromErrno(PyExc_OSError); close_relay_fds(); return NULL; }
    int rc = pthread_create(&thread, NULL, run, NULL);
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        close_relay_fds();
        return NULL;
    }
    pthread_detach(thread);
    owner = getpid();
    return PyLong_FromLong(donefd);
}

static char *copy_bytes(PyObject *b, size_t *len) {
    char *p;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(b, &p, &n) < 0) return NULL;
    char *q = xmalloc(n ? (size_t)n : 1);
    if (q) memcpy(q, p, (size_t)n);
    *len = (size_t)n;
    return q;
}

/* start(up_fd, client_fd, prefix, suffix, bounds: tuple[float], last_ts, max_seconds, tail) -> the stream's id;
 * `tail` (0 or 1): the stream may end here (its tail and the body's end written by the thread) */
static PyObject *py_start(PyObject *self, PyObject *args) {
    (void)self;
    int up_fd, client_fd, tail_ok = 0;
    PyObject *prefix, *suffix, *bounds;
    double last_ts, max_seconds;
    if (!PyArg_ParseTuple(args, "iiSSO!dd|p", &up_fd, &client_fd, &prefix, &suffix, &PyTuple_Type, &bounds,
                          &last_ts, &max_seconds, &tail_ok))
        return NULL;
    if (epfd < 0 || owner != getpid()) {
        PyErr_SetString(PyExc_RuntimeError, "fastrelay: init() first");
        return NULL;
    }
    Py_ssize_t nb = PyTuple_Size(bounds);
    if (nb < 1 || nb > 1024) { PyErr_SetString(PyExc_ValueError, "fastrelay: 1 to 1024 bounds"); return NULL; }
    Stream *s = xcalloc(1, sizeof *s);
    if (!s) return PyErr_NoMemory();
    s->up_fd = up_fd; s->client_fd = client_fd;
    s->last_ts = last_ts; s->since = now_s(); s->max_seconds = max_seconds;
    s->nb = (int)nb;
    s->tail_ok = tail_ok;
    s->prefix = copy_bytes(prefix, &s->lp);
    s->suffix = copy_bytes(suffix, &s->ls);
    s->bounds = xmalloc((size_t)nb * sizeof(double));
    s->counts = xcalloc((size_t)nb, sizeof(long long));
    if (!s->prefix || !s->suffix || !s->bounds || !s->counts) {
        stream_free(s);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < nb; i++) s->bounds[i] = PyFloat_AsDouble(PyTuple_GetItem(bounds, i));
    if (PyErr_Occurred()) { stream_free(s); return NULL; }
    pthread_mutex_lock(&lock);
    s->id = next_id++;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)s->id};
    int rc = epoll_ctl(epfd, EPOLL_CTL_ADD, up_fd, &ev);
    if (rc == 0) {
        s->hnext = table[(unsigned long long)s->id % TABLE_SIZE];
        table[(unsigned long long)s->id % TABLE_SIZE] = s;
    }
    pthread_mutex_unlock(&lock);
    if (rc < 0) { PyErr_SetFromErrno(PyExc_OSError); stream_free(s); return NULL; }
    return PyLong_FromLongLong(s->id);
}

static PyObject *result(Stream *s);

/* cancel(id) -> the stream's result when the thread still had it (the stream is the loop's again; reason
 * CANCELLED), None when the thread had handed it back already (its result comes from done()). KeyError for
 * an id the thread does not hold. Where the result cannot be built (no memory) the stream is handed back
 * instead: None, and done() delivers it. */
static PyObject *py_cancel(PyObject *self, PyObject *arg) {
    (void)self;
    long long id = PyLong_AsLongLong(arg);
    if (id == -1 && PyErr_Occurred()) return NULL;
    PyObject *out = NULL;
    pthread_mutex_lock(&lock);
    Stream *s = find(id);
    if (!s) {
        pthread_mutex_unlock(&lock);
        PyErr_Format(PyExc_KeyError, "fastrelay: no stream %lld is held by the relay thread", id);
        return NULL;
    }
    while (s->busy) pthread_cond_wait(&idle, &lock);  /* at most one stream's read and write */
    if (s->state == ACTIVE) {
        epoll_ctl(epfd, EPOLL_CTL_DEL, s->up_fd, NULL);
        s->state = R_CANCELLED;
        out = result(s);
        if (out) {
            forget(s);
            stream_free(s);
        } else {
            PyErr_Clear();
            hand_back(s, R_CANCELLED);  /* its result from done(), when there is memory for it */
        }
    }
    pthread_mutex_unlock(&lock);
    if (out == NULL) Py_RETURN_NONE;
    return out;
}

static PyObject *result(Stream *s) {
    if (allocation_fails()) return PyErr_NoMemory();
    PyObject *segs = PyList_New((Py_ssize_t)s->nsegs);
    PyObject *counts = PyTuple_New(s->nb);
    if (!segs || !counts) { Py_XDECREF(segs); Py_XDECREF(counts); return NULL; }
    for (size_t i = 0; i < s->nsegs; i++) {
        PyObject *item = Py_BuildValue("(y#O)", s->text.p + s->segs[i].off, (Py_ssize_t)s->segs[i].len,
                                       s->segs[i].plain ? Py_True : Py_False);
        if (!item) { Py_DECREF(segs); Py_DECREF(counts); return NULL; }
        PyList_SetItem(segs, (Py_ssize_t)i, item);
    }
    for (int i = 0; i < s->nb; i++) {
        PyObject *v = PyLong_FromLongLong(s->counts[i]);
        if (!v) { Py_DECREF(segs); Py_DECREF(counts); return NULL; }
        PyTuple_SetItem(counts, i, v);
    }
    return Py_BuildValue("(LiIy#y#NNddLy#dd)", s->id, s->state, (unsigned int)s->err,
                         s->in.p ? s->in.p : "", (Py_ssize_t)s->in.len,
                         s->pending.p ? s->pending.p : "", (Py_ssize_t)s->pending.len,
                         segs, counts, s->gap_sum, s->last_ts, s->tokens,
                         s->sent.p ? s->sent.p : "", (Py_ssize_t)s->sent.len, s->tail_at, s->ended_at);
}

/* done() -> list of (id, reason, errno, unread, unsent, segments, counts, gap_sum, last_ts, tokens, sent, tail_at,
 * ended_at). A result
 * that cannot be built (no memory) stays queued with the ones after it, and the eventfd is signalled again:
 * the stream comes back with its bytes once there is memory. */
static PyObject *py_done(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    uint64_t v;
    ssize_t r = read(donefd, &v, sizeof v);
    (void)r;  /* EAGAIN: nothing was signalled since the last call; the queue says what there is */
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    pthread_mutex_lock(&lock);
    while (done_head) {
        Stream *s = done_head;
        PyObject *item = result(s);
        if (!item || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            uint64_t one = 1;
            ssize_t w = write(donefd, &one, sizeof one);
            (void)w;
            break;
        }
        Py_DECREF(item);
        done_head = s->next;
        if (!done_head) done_tail = NULL;
        forget(s);
        stream_free(s);
    }
    pthread_mutex_unlock(&lock);
    if (PyErr_Occurred()) {
        if (PyList_Size(list) == 0) { Py_DECREF(list); return NULL; }
        PyErr_Clear();  /* what was built goes back now; the rest, queued, at the next signal */
    }
    return list;
}

/* settled() -> None: the tap has counted a stream whose end the thread wrote (a result with ended_at > 0). */
static PyObject *py_settled(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    __atomic_sub_fetch(&ends_unsettled, 1, __ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

/* unsettled() -> the ends written here that the tap has not counted yet (0 once every one is). */
static PyObject *py_unsettled(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    return PyLong_FromLongLong(__atomic_load_n(&ends_unsettled, __ATOMIC_SEQ_CST));
}

/* _fail_allocation(n): the n-th allocation from now fails (0: none). For the tests of every failure path. */
static PyObject *py_fail_allocation(PyObject *self, PyObject *arg) {
    (void)self;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    __atomic_store_n(&fail_countdown, n, __ATOMIC_RELAXED);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"init", py_init, METH_NOARGS, "Start the relay thread (once per process); returns the eventfd to watch."},
    {"start", py_start, METH_VARARGS, "Hand a stream to the relay thread; returns its id."},
    {"cancel", py_cancel, METH_O, "Take a stream back by id before the thread hands it back: its result, or None."},
    {"done", py_done, METH_NOARGS, "The streams handed back since the last call."},
    {"settled", py_settled, METH_NOARGS, "The tap has counted a stream whose end the thread wrote."},
    {"unsettled", py_unsettled, METH_NOARGS, "Ends written by the thread that the tap has not counted yet."},
    {"_fail_allocation", py_fail_allocation, METH_O, "Tests: the n-th allocation from now fails (0: none)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastrelay", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastrelay(void) { return PyModule_Create(&module); }
