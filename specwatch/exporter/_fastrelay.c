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

enum { ACTIVE = 0, R_UNUSUAL = 1, R_EOF = 2, R_CLIENT = 3, R_PARTIAL = 4, R_FLUSH = 5, R_CANCELLED = 6 };

typedef struct { char *p; size_t len, cap; } Buf;

typedef struct Seg { size_t off, len; int plain; } Seg;

typedef struct Stream {
    long long id;
    int up_fd, client_fd;
    char *prefix, *suffix;
    size_t lp, ls;
    double *bounds;
    long long *counts;
    int nb;
    double gap_sum, last_ts, since, max_seconds;
    long long tokens;
    int state, err, busy;
    long long dead_gen;
    Buf in, text, pending;
    Seg *segs;
    size_t nsegs, capsegs;
    struct Stream *next;   /* done queue, or graveyard */
} Stream;

/* `lock` guards the stream states, the queues and the epoll set; the thread holds it only between streams,
 * never across a read or a write, so the event loop's calls wait at most for one stream's processing
 * (`busy`, signalled on `idle`). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t idle = PTHREAD_COND_INITIALIZER;
static int epfd = -1, donefd = -1;
static pthread_t thread;
static Stream *done_head = NULL, *done_tail = NULL, *graveyard = NULL;
static long long batch_no = 0;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  /* what time.perf_counter() reads on Linux */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int buf_add(Buf *b, const char *p, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return -1;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

static void stream_free(Stream *s) {
    free(s->prefix); free(s->suffix); free(s->bounds); free(s->counts);
    free(s->in.p); free(s->text.p); free(s->pending.p); free(s->segs);
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

static int add_seg(Stream *s, const char *p, size_t n, int plain) {
    if (plain && s->nsegs && s->segs[s->nsegs - 1].plain && s->segs[s->nsegs - 1].off + s->segs[s->nsegs - 1].len ==
        s->text.len) {
        s->segs[s->nsegs - 1].len += n;  /* plain runs merge: one hash update for them */
    } else {
        if (s->nsegs == s->capsegs) {
            size_t cap = s->capsegs ? s->capsegs * 2 : 16;
            Seg *q = realloc(s->segs, cap * sizeof(Seg));
            if (!q) return -1;
            s->segs = q;
            s->capsegs = cap;
        }
        s->segs[s->nsegs++] = (Seg){s->text.len, n, plain};
    }
    return buf_add(&s->text, p, n);
}

static void hand_back(Stream *s, int reason) {
    /* under the lock, on the relay thread: no more reads of this stream here */
    epoll_ctl(epfd, EPOLL_CTL_DEL, s->up_fd, NULL);
    s->state = reason;
    s->next = NULL;
    if (done_tail) done_tail->next = s; else done_head = s;
    done_tail = s;
    uint64_t one = 1;
    ssize_t w = write(donefd, &one, sizeof one);
    (void)w;
}

/* Take the whole chunks in s->in that are ordinary content events; write them to the client.
 * Returns ACTIVE to keep reading, or the reason to hand the stream back. */
static int take(Stream *s, double now) {
    const char *b = s->in.p;
    size_t n = s->in.len, pos = 0;
    Buf out = {0};
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
        if (bad || size == 0 || size > MAX_CHUNK) { reason = R_UNUSUAL; break; }
        size_t need = eol + 2 + size + 2;
        if (left < need) break;                          /* the chunk is not complete yet */
        const char *payload = line + eol + 2;
        if (payload[size] != '\r' || payload[size + 1] != '\n') { reason = R_UNUSUAL; break; }
        size_t fixed = 6 + s->lp + s->ls + 2;
        if (size < fixed || memcmp(payload, "data: ", 6) != 0 || memcmp(payload + 6, s->prefix, s->lp) != 0 ||
            memcmp(payload + size - 2 - s->ls, s->suffix, s->ls) != 0 || payload[size - 2] != '\n' ||
            payload[size - 1] != '\n') {
            reason = R_UNUSUAL; break;
        }
        const char *body = payload + 6 + s->lp;
        size_t blen = size - fixed;
        int cls = body_class((const unsigned char *)body, blen);
        if (cls == 0) { reason = R_UNUSUAL; break; }
        if (blen) {
            if (add_seg(s, body, blen, cls == 1) < 0) { reason = R_UNUSUAL; break; }
            double gap = now - s->last_ts;
            int lo = 0, hi = s->nb - 1;                  /* bisect_left: the first bound >= gap */
            while (lo < hi) { int mid = (lo + hi) / 2; if (s->bounds[mid] < gap) lo = mid + 1; else hi = mid; }
            s->counts[lo] += 1;
            s->gap_sum += gap;
            s->last_ts = now;
            s->tokens += 1;
        }
        char head[24];
        int hl = snprintf(head, sizeof head, "%zx\r\n", size);
        if (buf_add(&out, head, (size_t)hl) < 0 || buf_add(&out, payload, size) < 0 || buf_add(&out, "\r\n", 2) < 0) {
            reason = R_UNUSUAL; break;
        }
        pos += need;
    }
    /* what was taken goes to the client now; the rest stays in s->in (a partial chunk, or from the
     * chunk not taken onwards) */
    if (out.len) {
        size_t sent = 0;
        while (sent < out.len) {
            /* send, not write: a client gone mid-write is EPIPE here, never a SIGPIPE for the whole process */
            ssize_t w = send(s->client_fd, out.p + sent, out.len - sent, MSG_NOSIGNAL);
            if (w > 0) { sent += (size_t)w; continue; }
            if (w < 0 && errno == EINTR) continue;
            if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                if (reason == ACTIVE) reason = R_PARTIAL;
            } else {
                s->err = errno;
                reason = R_CLIENT;
            }
            buf_add(&s->pending, out.p + sent, out.len - sent);
            break;
        }
    }
    free(out.p);
    if (pos) {
        memmove(s->in.p, s->in.p + pos, n - pos);
        s->in.len = n - pos;
    }
    if (reason == ACTIVE && s->in.len > MAX_CHUNK + 32) reason = R_UNUSUAL;
    if (reason == ACTIVE && now - s->since >= s->max_seconds) reason = R_FLUSH;
    return reason;
}

/* One readable stream, without the lock (the stream is `busy`): ACTIVE, or why it goes back. */
static int on_readable(Stream *s) {
    char chunk[READ_SIZE];
    ssize_t r = read(s->up_fd, chunk, sizeof chunk);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return ACTIVE;
    if (r <= 0) return R_EOF;       /* EOF or an error: left unread for Python, whose read sees it again */
    if (buf_add(&s->in, chunk, (size_t)r) < 0) return R_UNUSUAL;
    return take(s, now_s());
}

static void *run(void *arg) {
    (void)arg;
    struct epoll_event events[256];
    for (;;) {
        int n = epoll_wait(epfd, events, 256, -1);
        if (n < 0) { if (errno == EINTR) continue; return NULL; }
        pthread_mutex_lock(&lock);
        batch_no += 1;
        for (int i = 0; i < n; i++) {
            Stream *s = events[i].data.ptr;
            if (s->state != ACTIVE) continue;  /* taken back by the loop meanwhile */
            s->busy = 1;
            pthread_mutex_unlock(&lock);
            int reason = on_readable(s);
            pthread_mutex_lock(&lock);
            s->busy = 0;
            if (reason != ACTIVE) hand_back(s, reason);
            pthread_cond_broadcast(&idle);
        }
        Stream **at = &graveyard;    /* streams cancelled two batches ago: no event can name them now */
        while (*at) {
            Stream *s = *at;
            if (batch_no >= s->dead_gen + 2) { *at = s->next; stream_free(s); } else at = &s->next;
        }
        pthread_mutex_unlock(&lock);
    }
}

/* ---- the Python side ------------------------------------------------------------------------- */

static pid_t owner = 0;

static PyObject *py_init(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    if (epfd >= 0 && owner == getpid()) return PyLong_FromLong(donefd);
    if (epfd >= 0) {  /* a forked child: the parent's thread did not come along; start afresh */
        close(epfd);
        close(donefd);
        done_head = done_tail = graveyard = NULL;  /* the parent's streams, not ours (leaked, not freed) */
        pthread_mutex_init(&lock, NULL);
        pthread_cond_init(&idle, NULL);
    }
    owner = getpid();
    epfd = epoll_create1(EPOLL_CLOEXEC);
    donefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epfd < 0 || donefd < 0) return PyErr_SetFromErrno(PyExc_OSError);
    if (pthread_create(&thread, NULL, run, NULL) != 0) {
        PyErr_SetString(PyExc_OSError, "fastrelay: cannot start the relay thread");
        return NULL;
    }
    pthread_detach(thread);
    return PyLong_FromLong(donefd);
}

static char *copy_bytes(PyObject *b, size_t *len) {
    char *p;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(b, &p, &n) < 0) return NULL;
    char *q = malloc(n ? (size_t)n : 1);
    if (q) memcpy(q, p, (size_t)n);
    *len = (size_t)n;
    return q;
}

/* start(id, up_fd, client_fd, prefix, suffix, bounds: tuple[float], last_ts, max_seconds) -> handle */
static PyObject *py_start(PyObject *self, PyObject *args) {
    (void)self;
    long long id;
    int up_fd, client_fd;
    PyObject *prefix, *suffix, *bounds;
    double last_ts, max_seconds;
    if (!PyArg_ParseTuple(args, "LiiSSO!dd", &id, &up_fd, &client_fd, &prefix, &suffix, &PyTuple_Type, &bounds,
                          &last_ts, &max_seconds))
        return NULL;
    if (epfd < 0) { PyErr_SetString(PyExc_RuntimeError, "fastrelay: init() first"); return NULL; }
    Stream *s = calloc(1, sizeof *s);
    if (!s) return PyErr_NoMemory();
    s->id = id; s->up_fd = up_fd; s->client_fd = client_fd;
    s->last_ts = last_ts; s->since = now_s(); s->max_seconds = max_seconds;
    s->prefix = copy_bytes(prefix, &s->lp);
    s->suffix = copy_bytes(suffix, &s->ls);
    Py_ssize_t nb = PyTuple_Size(bounds);
    s->nb = (int)nb;
    s->bounds = malloc((size_t)(nb > 0 ? nb : 1) * sizeof(double));
    s->counts = calloc((size_t)(nb > 0 ? nb : 1), sizeof(long long));
    if (!s->prefix || !s->suffix || !s->bounds || !s->counts || nb < 1) {
        stream_free(s);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "fastrelay: bad arguments");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nb; i++) {
        s->bounds[i] = PyFloat_AsDouble(PyTuple_GetItem(bounds, i));
    }
    if (PyErr_Occurred()) { stream_free(s); return NULL; }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = s};
    pthread_mutex_lock(&lock);
    int rc = epoll_ctl(epfd, EPOLL_CTL_ADD, up_fd, &ev);
    pthread_mutex_unlock(&lock);
    if (rc < 0) { stream_free(s); return PyErr_SetFromErrno(PyExc_OSError); }
    return PyLong_FromVoidPtr(s);
}

static PyObject *result(Stream *s);

/* cancel(handle) -> the stream's result when the thread still had it (it is the loop's again; reason
 * CANCELLED), None when the thread had handed it back already (its result comes from done()). */
static PyObject *py_cancel(PyObject *self, PyObject *arg) {
    (void)self;
    Stream *target = PyLong_AsVoidPtr(arg);
    if (!target && PyErr_Occurred()) return NULL;
    PyObject *out = NULL;
    pthread_mutex_lock(&lock);
    while (target->busy) pthread_cond_wait(&idle, &lock);  /* at most one stream's read and write */
    if (target->state == ACTIVE) {
        epoll_ctl(epfd, EPOLL_CTL_DEL, target->up_fd, NULL);
        target->state = R_CANCELLED;
        out = result(target);  /* the struct lives on in the graveyard until no event can name it */
        target->dead_gen = batch_no;
        target->next = graveyard;
        graveyard = target;
    }
    pthread_mutex_unlock(&lock);
    if (out == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
    return out;
}

static PyObject *result(Stream *s) {
    PyObject *segs = PyList_New((Py_ssize_t)s->nsegs);
    PyObject *counts = PyTuple_New(s->nb);
    if (!segs || !counts) { Py_XDECREF(segs); Py_XDECREF(counts); return NULL; }
    for (size_t i = 0; i < s->nsegs; i++) {
        PyObject *item = Py_BuildValue("(y#O)", s->text.p + s->segs[i].off, (Py_ssize_t)s->segs[i].len,
                                       s->segs[i].plain ? Py_True : Py_False);
        if (!item) { Py_DECREF(segs); Py_DECREF(counts); return NULL; }
        PyList_SetItem(segs, (Py_ssize_t)i, item);
    }
    for (int i = 0; i < s->nb; i++) PyTuple_SetItem(counts, i, PyLong_FromLongLong(s->counts[i]));
    PyObject *out = Py_BuildValue("(LiIy#y#NNddL)", s->id, s->state, (unsigned int)s->err,
                                  s->in.p ? s->in.p : "", (Py_ssize_t)s->in.len,
                                  s->pending.p ? s->pending.p : "", (Py_ssize_t)s->pending.len,
                                  segs, counts, s->gap_sum, s->last_ts, s->tokens);
    return out;
}

/* done() -> list of (id, reason, errno, unread, unsent, segments, counts, gap_sum, last_ts, tokens) */
static PyObject *py_done(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    uint64_t v;
    ssize_t r = read(donefd, &v, sizeof v);
    (void)r;
    pthread_mutex_lock(&lock);
    Stream *s = done_head;
    done_head = done_tail = NULL;
    pthread_mutex_unlock(&lock);
    PyObject *list = PyList_New(0);
    while (s) {
        Stream *next = s->next;
        PyObject *item = list ? result(s) : NULL;
        if (item) { PyList_Append(list, item); Py_DECREF(item); }
        stream_free(s);
        s = next;
    }
    if (PyErr_Occurred()) { Py_XDECREF(list); return NULL; }
    return list;
}

static PyMethodDef methods[] = {
    {"init", py_init, METH_NOARGS, "Start the relay thread (once per process); returns the eventfd to watch."},
    {"start", py_start, METH_VARARGS, "Hand a stream to the relay thread; returns its handle."},
    {"cancel", py_cancel, METH_O, "Take a stream back before the thread hands it back: its result, or None."},
    {"done", py_done, METH_NOARGS, "The streams handed back since the last call."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastrelay", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastrelay(void) { return PyModule_Create(&module); }
